"""Hugging Face transformers vision models (``hf:ORG/NAME`` from the local cache, or
``hf:/path`` written by ``save_pretrained``), with their image processor's preprocessing.

A ``config.json`` is untrusted: its sizes are checked against generous limits
before transformers builds anything, naming the field."""

from __future__ import annotations

import fnmatch
import hashlib
import inspect
import json
import math
import re
from pathlib import Path

import torch
import transformers
from huggingface_hub import constants

from hookcli.errors import UsageProblem, first_line
from hookcli.inputs.preprocess import Preprocess
from hookcli.models.sources.common import (
    assumed_preprocess,
    hub_cached,
    hub_file,
    hub_has_weights,
    load_weights_file,
    loaded_model,
    not_cached,
    quietly,
)
from hookcli.models.specs import MISSING, ModelSpec, SourceError, regular_file_problem
from hookcli.models.state_dicts import seeded
from hookcli.models.weights import file_sha256, looks_like_weights_path
from hookcli.options.run import MAX_SIDE
from hookcli.parsing import parse_triple

__all__ = [
    "list_models",
    "load",
    "nothing_listed",
]


_HF_RESAMPLE = {0: "nearest", 2: "bilinear", 3: "bicubic"}


@quietly
def load(spec: ModelSpec, weights: str, seed: int):
    logs = transformers.utils.logging
    verbosity, bars = logs.get_verbosity(), logs.is_progress_bar_enabled()
    logs.disable_progress_bar()  # its bars and warnings go to stderr, where hookcli's notes go
    logs.set_verbosity_error()
    try:
        return _load_hf_quietly(spec, weights, seed)
    finally:
        logs.set_verbosity(verbosity)
        if bars:
            logs.enable_progress_bar()


def _load_hf_quietly(spec: ModelSpec, weights: str, seed: int):
    source = str(Path(spec.name).expanduser()) if spec.hf_folder else spec.name
    _check_hf_sizes(spec, Path(source) / "config.json" if spec.hf_folder else hub_file(spec.name, "config.json"))
    try:
        config = transformers.AutoConfig.from_pretrained(source, local_files_only=True)
    except Exception as err:
        if spec.hf_folder:
            raise SourceError(
                f"cannot read the config of {spec.text}: {first_line(err)}",
                hint="give a folder written by save_pretrained",
            ) from None
        raise not_cached(spec, spec.name, "config.json") from None
    architectures = getattr(config, "architectures", None)
    architectures = [a for a in architectures if isinstance(a, str)] if isinstance(architectures, list) else []
    classifier = any("ForImageClassification" in a for a in architectures)  # …WithTeacher too
    auto = transformers.AutoModelForImageClassification if classifier else transformers.AutoModel
    if weights.lower() == "default":
        if not spec.hf_folder and not hub_has_weights(spec.name):
            raise not_cached(spec, spec.name, "model.safetensors")
        try:
            module = auto.from_pretrained(source, config=config, local_files_only=True, dtype=torch.float32)
        except Exception as err:
            raise SourceError(
                f"cannot load the weights of {spec.text}: {first_line(err)}",
                hint="replace the files, or use --weights none",
            ) from None
        described = _hf_described(spec)
    else:
        try:
            with seeded(seed):
                module = auto.from_config(config, dtype=torch.float32)
        except Exception as err:
            raise SourceError(
                f"cannot build {spec.text} from its config: {first_line(err)}", hint="check the folder's config.json"
            ) from None
        described = (
            {"source": "none", "seed": seed}
            if not looks_like_weights_path(weights)
            else load_weights_file(spec, module, Path(weights))
        )
    module = _vision_part(spec, module)
    preprocess, assumed_because = _hf_preprocess(spec, source, config)
    labels = getattr(config, "id2label", None)
    labels = labels if isinstance(labels, dict) else {}
    named = (
        classifier
        and labels
        and not all(re.fullmatch(r"LABEL_\d+", str(v)) for v in labels.values())
        and set(labels) == set(range(len(labels)))
    )
    categories = [str(labels[i]) for i in range(len(labels))] if named else None  # the config's, whatever weights
    scores, classes = _hf_scores(config, classifier)
    return loaded_model(
        spec,
        module,
        described,
        preprocess,
        categories=categories,
        classes=classes,
        scores=scores,
        assumed_because=assumed_because,
    )


#: The most a transformers config may say of each size, far above any vision model's (or its text tower's): torch
#: would allocate what one more digit asks for until memory runs out, and transformers writes out a label for each
#: of num_labels before anything is built.
_HF_SIZE_LIMITS = {
    "num_hidden_layers": 1024,
    "num_layers": 1024,
    "depths": 1024,
    "hidden_size": 16384,
    "hidden_sizes": 16384,
    "embed_dim": 16384,
    "projection_dim": 16384,
    "intermediate_size": 131072,
    "num_attention_heads": 1024,
    "num_heads": 1024,
    "image_size": MAX_SIDE,
    "patch_size": MAX_SIDE,
    "num_channels": 1024,
    "num_labels": 1_000_000,
    "vocab_size": 1_000_000,
    "max_position_embeddings": 1_000_000,
}


#: The most entries a list of sizes (``depths``: one per stage) may have, and the largest config.json read.
_HF_LIST_LIMIT, _HF_CONFIG_BYTES = 64, 64 << 20


#: The most entries a list of sizes (``depths``: one per stage) may have, and the largest config.json read.
_HF_LIST_LIMIT, _HF_CONFIG_BYTES = 64, 64 << 20


def _check_hf_sizes(spec: ModelSpec, path: Path | None) -> None:
    """Refuse a config.json that asks for a model no machine holds, naming the field, before transformers reads it
    (what it cannot parse, transformers says)."""
    if path is None or regular_file_problem(path) is not None:
        return
    if path.stat().st_size > _HF_CONFIG_BYTES:
        raise UsageProblem(
            f"{spec.text}: its config.json is {path.stat().st_size:,} bytes, more than a model's config "
            f"holds (at most {_HF_CONFIG_BYTES >> 20} MiB)",
            hint="check the model's config.json",
        )
    try:
        settings = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    found = _oversized(settings, "")
    if found is not None:
        said, limit = found
        raise UsageProblem(
            f"{spec.text}: its config.json says {said}, more than hookcli builds (at most {limit:,})",
            hint="check the model's config.json",
        )


def _oversized(settings, where: str) -> tuple[str, int] | None:
    """The first size field (of ``settings`` and the configs nested in it, such as vision_config) above its limit
    in :data:`_HF_SIZE_LIMITS`: ``(its dotted name and value, the limit)``."""
    if not isinstance(settings, dict) or where.count(".") > 3:
        return None
    for key, value in settings.items():
        field = f"{where}{key}"
        if isinstance(value, dict):
            found = _oversized(value, field + ".")
            if found is not None:
                return found
        limit = _HF_SIZE_LIMITS.get(key)
        if limit is None:
            continue
        if isinstance(value, list) and len(value) > _HF_LIST_LIMIT:
            return f"{field} with {len(value):,} entries", _HF_LIST_LIMIT
        for number in value if isinstance(value, list) else [value]:
            if isinstance(number, int | float) and not isinstance(number, bool) and not number <= limit:
                return f"{field} {json.dumps(value)[:60]}", limit  # NaN included: no size
    return None


def _vision_part(spec: ModelSpec, module):
    """A CLIP-like model's vision tower (its forward takes text first); the model itself otherwise."""
    parameters = list(inspect.signature(module.forward).parameters)
    if parameters and parameters[0] == "pixel_values":
        return module
    tower = getattr(module, "vision_model", None)
    if tower is not None:
        return tower
    raise UsageProblem(
        f"{spec.text} does not take images first (its forward takes {parameters[0]})",
        hint="give a vision model (ViT, DINOv2, Swin, ConvNeXt, CLIP…)",
    )


def _hf_scores(config, classifier: bool) -> tuple[str, int | None]:
    """Which output field grad and cam take scores from, and how many there are: a classifier's logits, else the
    pooled output backbones return (ViT, DINOv2, CLIP's vision tower, ConvNeXt, Swin)."""
    if classifier:
        return "logits", int(config.num_labels)
    config = getattr(config, "vision_config", None) or config
    size = getattr(config, "hidden_size", None) or (getattr(config, "hidden_sizes", None) or [None])[-1]
    return "pooler_output", size


def _hf_described(spec: ModelSpec) -> dict:
    if spec.hf_folder:
        folder = Path(spec.name).expanduser().resolve()
        files = sorted(p for p in folder.iterdir() if p.suffix in (".safetensors", ".bin") and p.is_file())
        digest = hashlib.sha256()
        for path in files:
            digest.update(f"{path.name}:{file_sha256(path)}\n".encode())
        return {"source": "folder", "path": str(folder), "sha256": digest.hexdigest()}
    found = hub_file(spec.name, "config.json")  # …/snapshots/<revision>/config.json
    return {"source": "hf", "repo": spec.name, "revision": found.parent.name if found is not None else None}


def _hf_preprocess(spec: ModelSpec, source: str, config):
    """``(preprocessing, why it is assumed)``: the image processor's settings as a
    :class:`~hookcli.inputs.preprocess.Preprocess` and None, or ImageNet's preprocessing at the model ``config``'s image
    size and why, when there are no settings to use."""
    # transformers writes an image processor's settings alone, or (a processor of several parts) under its key.
    for name, part in (("preprocessor_config.json", None), ("processor_config.json", "image_processor")):
        try:
            text = _folder_or_hub_text(spec, source, name)
            if text is None:
                continue
            settings = json.loads(text)
            if part is not None:
                settings = settings.get(part) if isinstance(settings, dict) else None
                if settings is None:
                    continue  # a processor of text alone
            return _processor_steps(settings), None
        except Exception as err:  # an untrusted file: any content at all
            reason = f"its {name} cannot be used ({first_line(err)[:200]})"
            break
    else:
        reason = "it has no preprocessor_config.json"
    return assumed_preprocess(spec, reason, _image_size(config))


def _folder_or_hub_text(spec: ModelSpec, source: str, name: str) -> str | None:
    """The text of file ``name`` of the model's folder or cached repository, None when it has none; ValueError
    or OSError when it is there but cannot be read as text."""
    path = Path(source) / name if spec.hf_folder else hub_file(spec.name, name)
    what = MISSING if path is None else regular_file_problem(path)
    if path is None or what == MISSING:
        return None
    if what is not None:
        raise ValueError(f"it {what}")
    return path.read_text(encoding="utf-8")


def _image_size(config) -> int | None:
    """The side of the square images a transformers config (or its vision part) says the model takes, if it says
    one (the config is the folder's, so untrusted)."""
    size = getattr(getattr(config, "vision_config", None) or config, "image_size", None)
    if isinstance(size, list) and len(size) == 2 and size[0] == size[1]:
        size = size[0]
    return size if isinstance(size, int) and not isinstance(size, bool) and 1 <= size <= 8192 else None


def _processor_steps(config: dict):
    """Resize (shortest edge, or to an exact height and width), centre crop, rescale, normalise; ValueError naming
    the field that cannot be used (the file is untrusted: any value at all)."""
    if not isinstance(config, dict):
        raise ValueError("it is not a JSON object")
    size = config.get("size") or {}
    if isinstance(size, int | float) and not isinstance(size, bool):
        size = {"shortest_edge": size}
    if not isinstance(size, dict):
        raise ValueError(f"its size {size!r} is not a number or an object")
    crop = config.get("crop_size") if config.get("do_center_crop") else None
    if isinstance(crop, dict):
        if crop.get("height") != crop.get("width"):
            raise ValueError(f"its crop_size {crop} is not square")
        crop = _pixels(crop.get("height"), "crop_size.height")
    elif crop is not None:
        crop = _pixels(crop, "crop_size")
    resize: int | tuple[int, int] | None = None
    if config.get("do_resize", True):
        if "shortest_edge" in size:
            resize = _pixels(size["shortest_edge"], "size.shortest_edge")
            crop_pct = config.get("crop_pct")
            if crop_pct is not None and (
                isinstance(crop_pct, bool) or not isinstance(crop_pct, int | float) or not 0 < crop_pct <= 1
            ):  # NaN fails it too
                raise ValueError(f"its crop_pct {crop_pct!r} is not a fraction above 0 and at most 1")
            if crop_pct is not None and resize < 384:  # ConvNeXt: resize larger, then crop
                crop, resize = resize, _pixels(int(resize / crop_pct), "size.shortest_edge divided by crop_pct")
            elif crop_pct is not None:  # ConvNeXt from 384 pixels on: squashed, not cropped
                crop, resize = None, (resize, resize)
        elif "height" in size and "width" in size:
            resize = (_pixels(size["height"], "size.height"), _pixels(size["width"], "size.width"))
        else:
            raise ValueError(f"its size {size} is neither a shortest edge nor a height and width")
    if resize is None or isinstance(resize, int) and crop is None:
        raise ValueError("it does not resize to a fixed size")
    if config.get("do_rescale", True):
        factor = config.get("rescale_factor", 1 / 255)
        if isinstance(factor, bool) or not isinstance(factor, int | float) or not abs(factor - 1 / 255) <= 1e-9:
            raise ValueError(f"its rescale_factor {factor!r} is not 1/255")
    normalise = config.get("do_normalize", True)
    mean = _normalisation(config, "image_mean") if normalise else None
    std = _normalisation(config, "image_std") if normalise else None
    resample = config.get("resample", 2)
    if resample not in _HF_RESAMPLE:
        raise ValueError(f"its resample {resample!r} is none of nearest (0), bilinear (2) and bicubic (3)")
    interpolation = _HF_RESAMPLE[resample]
    return Preprocess(resize=resize, crop=crop, mean=mean, std=std, interpolation=interpolation)


def _pixels(value, field: str) -> int:
    """A processor file's side ``value`` as a whole number of pixels; ValueError naming ``field`` if it is not one."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not 1 <= value <= MAX_SIDE
        or value != int(value)
    ):  # NaN and infinities fail the range
        raise ValueError(f"its {field} {value!r} is not a whole number of pixels from 1 to {MAX_SIDE}")
    return int(value)


def _normalisation(config: dict, field: str) -> tuple[float, float, float]:
    """A processor file's ``image_mean`` or ``image_std``: one or three finite numbers (a std's above 0)."""
    if field not in config:
        raise ValueError(f"it has no {field}")
    value = config[field]
    try:
        numbers = parse_triple(value)
    except ValueError:
        raise ValueError(f"its {field} {value!r} is not one or three numbers") from None
    if not all(math.isfinite(v) and (v > 0 or field == "image_mean") for v in numbers):
        raise ValueError(
            f"its {field} {value!r} is not " + ("finite numbers" if field == "image_mean" else "finite numbers above 0")
        )
    return numbers


def list_models(pattern: str | None = None) -> list[dict]:
    """The transformers models in the local Hugging Face cache (matching the glob ``pattern``)."""

    cache = Path(constants.HF_HUB_CACHE)
    rows = []
    for folder in sorted(cache.glob("models--*")) if cache.is_dir() else []:
        repo = folder.name[len("models--") :].replace("--", "/")
        if pattern and not fnmatch.fnmatchcase(repo, pattern):
            continue
        if hub_cached(repo, "config.json"):
            rows.append(
                {
                    "model": f"hf:{repo}",
                    "family": "classification",
                    "default": "DEFAULT",
                    "weights": ["DEFAULT"] if hub_has_weights(repo) else [],
                }
            )
    return rows


def nothing_listed(wanted: str) -> str:
    """Why :func:`list_models` found no model that is ``wanted`` (may be empty), in words: where the cache is."""
    return f"no model{' matching ' + wanted if wanted else ''} in the Hugging Face cache ({constants.HF_HUB_CACHE})"
