"""OpenCLIP models (``open_clip:ARCH`` or ``open_clip:/path/Config.json``): the image
tower, with OpenCLIP's pretrained tags and preprocessing."""

from __future__ import annotations

import fnmatch
import json
import os
from pathlib import Path

import open_clip

from hookcli.errors import UnknownWeightsError, first_line
from hookcli.inputs.preprocess import Preprocess
from hookcli.models.sources.common import (
    hub_cached,
    load_weights_file,
    loaded_model,
    not_cached,
    quietly,
    unknown_model,
)
from hookcli.models.specs import ModelSpec, SourceError
from hookcli.models.state_dicts import seeded
from hookcli.models.weights import looks_like_weights_path

__all__ = [
    "list_models",
    "load",
]


@quietly
def load(spec: ModelSpec, weights: str, seed: int):
    arch = spec.name
    if arch.endswith(".json"):
        path = Path(arch).expanduser()
        try:
            config = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as err:
            raise SourceError(
                f"OpenCLIP model config '{arch}' cannot be read: {first_line(err)}",
                hint="give a JSON model config like OpenCLIP's own",
            ) from None
        if not isinstance(config, dict) or not isinstance(config.get("vision_cfg"), dict):
            raise SourceError(
                f"OpenCLIP model config '{arch}' has no vision_cfg object",
                hint="give a JSON model config like OpenCLIP's own",
            )
        open_clip.add_model_config(path)
        arch = path.stem
    elif arch not in open_clip.list_models() and not arch.startswith("hf-hub:"):
        raise unknown_model(spec, open_clip.list_models(), "hookcli models --source open_clip")
    tag = None
    if weights.lower() not in ("none",) and not looks_like_weights_path(weights):
        tags = open_clip.list_pretrained_tags_by_model(arch)
        tag = (tags[0] if tags else None) if weights.lower() == "default" else weights
        if tag is None:
            raise UnknownWeightsError(
                f"{spec.text} has no pretrained weights in OpenCLIP",
                hint="use --weights none, or a path to a state dict",
            )
        if tag not in tags:
            more = f" and {len(tags) - 8} more" if len(tags) > 8 else ""
            raise UnknownWeightsError(
                f"{spec.text} has no pretrained tag '{tag}' (OpenCLIP has: {', '.join(tags[:8]) or 'no tags'}{more})",
                hint="use DEFAULT, a listed tag or none",
            )
        _require_open_clip_files(spec, arch, tag)
    try:
        with seeded(seed):
            model = open_clip.create_model(arch, pretrained=tag)
    except Exception as err:
        raise SourceError(
            f"cannot build {spec.text}: {first_line(err)}", hint="replace the cached files, or use --weights none"
        ) from None
    module = model.visual
    if tag is not None:
        described: dict = {"source": "open_clip", "name": f"{arch}.{tag}"}
    elif weights.lower() == "none":
        described = {"source": "none", "seed": seed}
    else:
        described = load_weights_file(
            spec, module, Path(weights), part="visual."
        )  # a whole CLIP's file: its image tower
    preprocess = _open_clip_preprocess(open_clip.get_model_preprocess_cfg(model))
    return loaded_model(
        spec, module, described, preprocess, classes=getattr(module, "output_dim", None), scores="embedding"
    )


def _require_open_clip_files(spec: ModelSpec, arch: str, tag: str) -> None:
    config = open_clip.get_pretrained_cfg(arch, tag)
    hub = (config.get("hf_hub") or "").rstrip("/")
    if hub:
        names = ["open_clip_model.safetensors", "open_clip_pytorch_model.bin"]
        if not any(hub_cached(hub, n) for n in names):
            raise not_cached(spec, hub, names[0])
        return
    url = config.get("url", "")
    cached = Path(os.path.expanduser("~/.cache/clip")) / os.path.basename(url)
    if not cached.is_file():
        raise SourceError(
            f"pretrained weights of {spec.text} ({tag}) are not cached, and hookcli does not download: "
            f"place {url} at {cached}",
            hint="or use --weights none",
        )


def _open_clip_preprocess(config: dict):
    size = config["size"]
    side = size if isinstance(size, int) else size[0]
    resize: int | tuple[int, int] = (side, side) if config.get("resize_mode", "shortest") == "squash" else side
    return Preprocess(
        resize=resize,
        crop=side,
        mean=tuple(config["mean"]),
        std=tuple(config["std"]),
        interpolation=config.get("interpolation", "bicubic"),
    )


def list_models(pattern: str | None = None) -> list[dict]:
    """Every OpenCLIP architecture (matching the glob ``pattern``), with its pretrained tags."""

    rows = []
    for arch in open_clip.list_models():
        if pattern and not fnmatch.fnmatchcase(arch, pattern):
            continue
        tags = open_clip.list_pretrained_tags_by_model(arch)
        rows.append(
            {"model": f"open_clip:{arch}", "family": "classification", "default": (tags or [None])[0], "weights": tags}
        )
    return rows
