"""timm models (``timm:NAME``): built by timm, with its pretrained tags and its preprocessing."""

from __future__ import annotations

import contextlib
import math
from pathlib import Path

import timm
import timm.data

from hookcli.errors import UnknownWeightsError, UsageProblem, first_line
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
from hookcli.models.state_dicts import hub_checkpoint_path, seeded
from hookcli.models.weights import looks_like_weights_path
from hookcli.options.run import INTERPOLATIONS

__all__ = [
    "default_tag",
    "list_models",
    "load",
]


@quietly
def load(spec: ModelSpec, weights: str, seed: int):
    name, _, tag = spec.name.partition(".")
    if not timm.is_model(name):
        raise unknown_model(spec, timm.list_models(), "hookcli models --source timm")
    pretrained = weights.lower() != "none" and not looks_like_weights_path(weights)
    if pretrained and tag and weights.lower() != "default" and weights.removeprefix(name + ".") != tag:
        raise UsageProblem(
            f"{spec.text} names the tag '{tag}', and --weights names another, '{weights}'",
            hint=f"name the tag once: timm:{name} -w {weights}, or timm:{spec.name}",
        )
    if pretrained:
        wanted = weights if weights.lower() != "default" else tag
        full = _timm_tag(spec, name, wanted)
        config = timm.models.get_pretrained_cfg(full)
        _require_timm_files(spec, full, config)
        try:
            module = timm.create_model(full, pretrained=True)
        except Exception as err:
            raise SourceError(
                f"cannot load pretrained {spec.text} ({full}): {first_line(err)}",
                hint="replace the cached files, or use --weights none",
            ) from None
        described: dict = {"source": "timm", "name": full}
    else:
        if tag and f"{name}.{tag}" not in (timm.list_pretrained(f"{name}.*") or []):
            raise UnknownWeightsError(
                f"{spec.text} names the pretrained tag '{tag}', which timm does not have",
                hint=f"write timm:{name}, or a tag 'hookcli models --source timm {name}' lists",
            )
        with seeded(seed):
            module = timm.create_model(name, pretrained=False)
        described = (
            {"source": "none", "seed": seed}
            if weights.lower() == "none"
            else load_weights_file(spec, module, Path(weights))
        )
    categories = None
    if pretrained:
        with contextlib.suppress(Exception):  # label names ship with timm for ImageNet subsets
            subset = timm.data.infer_imagenet_subset(module)
            labels = timm.data.ImageNetInfo(subset).label_descriptions() if subset else None
            categories = [d.split(",")[0] for d in labels] if labels else None
    preprocess, notes = _timm_preprocess(timm.data.resolve_model_data_config(module))
    return loaded_model(
        spec,
        module,
        described,
        preprocess,
        categories=categories,
        build_notes=notes,
        classes=getattr(module, "num_classes", None) or None,
    )


def _timm_tag(spec: ModelSpec, name: str, wanted: str) -> str:
    """``name.tag`` for a tag given alone or in full; the model's default tag for an empty one."""
    tags = timm.list_pretrained(f"{name}.*") or timm.list_pretrained(name)
    if not wanted:
        if not tags:
            raise UnknownWeightsError(
                f"{spec.text} has no pretrained weights in timm", hint="use --weights none, or a path to a state dict"
            )
        return f"{name}.{default_tag(name)}"
    full = wanted if wanted.startswith(name + ".") else f"{name}.{wanted}"
    if full not in tags:
        known = ", ".join(t.split(".", 1)[1] for t in tags[:8] if "." in t) + (
            f" and {len(tags) - 8} more" if len(tags) > 8 else ""
        )
        raise UnknownWeightsError(
            f"{spec.text} has no pretrained tag '{wanted}' (timm has: {known or 'no tags'})",
            hint="use DEFAULT, a listed tag, none, or a path to a state dict",
        )
    return full


def default_tag(name: str) -> str | None:
    """The pretrained tag timm loads for ``name`` alone (its first, not the first in sorted order)."""
    config = timm.models.get_pretrained_cfg(name)
    return getattr(config, "tag", None) if config is not None else None


def _require_timm_files(spec: ModelSpec, full: str, config) -> None:
    """Refuse, naming the file and where to place it, timm weights that are not in the local caches."""
    hub_id = getattr(config, "hf_hub_id", None)
    if hub_id:
        repo, filename = hub_id.rstrip("/"), getattr(config, "hf_hub_filename", None)
        names = [filename] if filename else ["model.safetensors", "open_clip_pytorch_model.bin", "pytorch_model.bin"]
        if not any(hub_cached(repo, n) for n in names):
            raise not_cached(spec, repo, names[0])
        return
    url = getattr(config, "url", None)
    if url:
        cached = hub_checkpoint_path(url)
        if not cached.is_file():
            raise SourceError(
                f"pretrained weights of {spec.text} ({full}) are not cached, and hookcli does not "
                f"download: place {url} at {cached}",
                hint="or use --weights none",
            )
        return
    raise UnknownWeightsError(f"{full} has no pretrained files to load", hint="use --weights none or a file")


def _timm_preprocess(config: dict):
    """timm's evaluation transform (``transforms_imagenet_eval``) as a
    :class:`~hookcli.inputs.preprocess.Preprocess`."""
    notes = []
    height, width = config["input_size"][-2:]
    crop_pct = config.get("crop_pct") or 0.875
    mode = config.get("crop_mode") or "center"
    interpolation = config.get("interpolation", "bilinear")
    if interpolation not in INTERPOLATIONS:
        notes.append(f"timm's '{interpolation}' interpolation is taken as bicubic")
        interpolation = "bicubic"
    if height != width:
        notes.append(f"the model takes {height}x{width} inputs; hookcli crops squares of {height}")
    scale = math.floor(height / crop_pct)
    if mode == "border":
        notes.append("timm's 'border' crop mode (pad to keep the whole image) is taken as 'center'")
    resize = (scale, scale) if mode == "squash" else scale
    return Preprocess(
        resize=resize, crop=height, mean=tuple(config["mean"]), std=tuple(config["std"]), interpolation=interpolation
    ), tuple(notes)


def list_models(pattern: str | None = None) -> list[dict]:
    """Every timm architecture (matching the glob ``pattern``), with its pretrained tags."""

    tags: dict[str, list[str]] = {}
    for full in timm.list_pretrained():
        name, _, tag = full.partition(".")
        tags.setdefault(name, []).append(tag)
    return [
        {
            "model": f"timm:{n}",
            "family": "classification",
            "default": default_tag(n) if n in tags else None,
            "weights": tags.get(n, []),
        }
        for n in timm.list_models(pattern or "")
    ]
