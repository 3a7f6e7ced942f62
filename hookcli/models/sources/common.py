"""What the model sources share: the hub kept offline and libraries quiet while a model loads, the
:class:`~hookcli.models.loaded.LoadedModel` every source returns, weights files loaded into a model, ImageNet's
preprocessing assumed for a model that gives none, and the local Hugging Face cache.

>>> from hookcli.models.specs import parse_model
>>> recorded_name(parse_model("timm:resnet50"))
'timm:resnet50'
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import functools
import logging
import os
import sys
import warnings
from collections.abc import Callable
from pathlib import Path

try:  # installed with timm, transformers and open_clip; a factory's model needs none
    from huggingface_hub import constants as hub_constants
    from huggingface_hub import try_to_load_from_cache
except ImportError:  # pragma: no cover - depends on the extras installed
    hub_constants = try_to_load_from_cache = None  # type: ignore[assignment]

from hookcli.errors import HookcliError, UnknownModelError
from hookcli.inputs.preprocess import Preprocess
from hookcli.models.loaded import LoadedModel, has_class_token, prefix_tokens
from hookcli.models.specs import ModelSpec, SourceError
from hookcli.models.state_dicts import fit_state_dict, read_state_dict
from hookcli.models.weights import file_weights

__all__ = [
    "assumed_preprocess",
    "given_preprocess",
    "hub_cached",
    "hub_file",
    "hub_has_weights",
    "load_weights_file",
    "loaded_model",
    "not_cached",
    "offline_hub",
    "quiet_libraries",
    "quietly",
    "recorded_name",
    "unknown_model",
]


@contextlib.contextmanager
def offline_hub():
    """The Hugging Face hub offline for the block, whatever the environment says: timm and OpenCLIP read pretrained
    files through it, and would otherwise ask the Hub for a newer revision."""
    if hub_constants is None:  # a factory's model needs no hub
        yield
        return
    constants = hub_constants
    before, environment = constants.HF_HUB_OFFLINE, os.environ.get("HF_HUB_OFFLINE")
    constants.HF_HUB_OFFLINE = True
    os.environ["HF_HUB_OFFLINE"] = "1"
    try:
        yield
    finally:
        constants.HF_HUB_OFFLINE = before
        if environment is None:
            os.environ.pop("HF_HUB_OFFLINE", None)
        else:
            os.environ["HF_HUB_OFFLINE"] = environment


@contextlib.contextmanager
def quiet_libraries():
    """Libraries announce downloads, progress and random init on stdout and through logging; stdout carries data."""
    logger = logging.getLogger()
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stdout(sys.stderr), warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            yield
    finally:
        logger.setLevel(level)


def quietly(load: Callable[..., LoadedModel]) -> Callable[..., LoadedModel]:
    """A source's ``load`` run with :func:`quiet_libraries` and :func:`offline_hub`."""

    @functools.wraps(load)
    def quiet_load(*args, **kwargs) -> LoadedModel:
        with quiet_libraries(), offline_hub():
            return load(*args, **kwargs)

    return quiet_load


def loaded_model(spec: ModelSpec, module, described: dict, preprocess, **fields):
    module.eval()
    fields.setdefault("categories", None)
    return LoadedModel(
        name=recorded_name(spec),
        module=module,
        weights=described,
        preprocess=preprocess,
        family="classification",
        source=spec.source,
        prefix_tokens=prefix_tokens(module),
        class_token=has_class_token(module),
        **fields,
    )


def load_weights_file(spec: ModelSpec, module, path: Path, part: str = "") -> dict:
    """Load a state-dict file into ``module`` (shapes checked first); its description for the metadata.

    ``part``: a prefix (``visual.``) whose entries are the module's, when the file holds a whole model of which
    ``module`` is one tower.
    """
    state = read_state_dict(path)
    if part and any(key.startswith(part) for key in state):
        state = {key[len(part) :]: value for key, value in state.items() if key.startswith(part)}
    fit_state_dict(module, state, path, spec.text)
    return file_weights(path)


def assumed_preprocess(spec: ModelSpec, why: str, side: int | None = None):
    """ImageNet's preprocessing, for a model that gives none: resize 256 and crop 224, or in that proportion for a
    model made for ``side`` pixels; and why it is assumed (said with the parts a run uses,
    :meth:`~hookcli.models.loaded.LoadedModel.notes_for`)."""
    crop = side or 224
    return Preprocess(resize=int(crop * 256 / 224), crop=crop), f"{spec.text}: {why}"  # mean and std: ImageNet's


def given_preprocess(whose: str, given, refusal: type[HookcliError] = SourceError) -> Preprocess:
    """The preprocessing ``whose`` (``the factory nets.py:make``) gives: a
    :class:`~hookcli.inputs.preprocess.Preprocess`, a dict of its fields, or a torchvision weights' ``transforms()``;
    one that is not usable is a ``refusal``."""
    if isinstance(given, Preprocess):
        return given
    try:
        if isinstance(given, dict):
            fields = dict(given)
            known = [field.name for field in dataclasses.fields(Preprocess)]
            unknown = [str(name) for name in fields if name not in known]
            if unknown:
                raise ValueError(f"{unknown[0]} is none of its fields ({', '.join(known)})")
            if "resize" not in fields:
                raise ValueError("resize must be given (and crop, with one side)")
            for name in ("mean", "std"):
                if fields.get(name) is not None:
                    fields[name] = tuple(float(v) for v in fields[name])
            return Preprocess(**{"crop": None, **fields})
        if hasattr(given, "resize_size") and hasattr(given, "crop_size"):
            return Preprocess.from_transforms(given)
    except (TypeError, ValueError) as err:
        raise refusal(
            f"the preprocessing {whose} gives is not usable: {err}",
            hint="give a hookcli.Preprocess or a dict of resize, crop, mean, std",
        ) from None
    raise refusal(
        f"{whose} gives a {type(given).__name__} as preprocessing",
        hint="give a hookcli.Preprocess, a dict of resize, crop, mean, std, or a torchvision weights' transforms()",
    )


def hub_cached(repo: str, filename: str) -> bool:
    return hub_file(repo, filename) is not None


def hub_file(repo: str, filename: str) -> Path | None:
    assert try_to_load_from_cache is not None, "the sources that read the hub install huggingface_hub"
    found = try_to_load_from_cache(repo, filename)
    return Path(found) if isinstance(found, str) else None


def hub_has_weights(repo: str) -> bool:
    return any(
        hub_cached(repo, n)
        for n in (
            "model.safetensors",
            "model.safetensors.index.json",
            "pytorch_model.bin",
            "pytorch_model.bin.index.json",
        )
    )


def not_cached(spec: ModelSpec, repo: str, filename: str) -> SourceError:
    assert hub_constants is not None, "the sources that read the hub install huggingface_hub"
    folder = Path(hub_constants.HF_HUB_CACHE) / f"models--{repo.replace('/', '--')}"
    otherwise = (
        "or give hf:/path/to/a/folder written by save_pretrained" if spec.source == "hf" else "or use --weights none"
    )
    if spec.source == "hf" and Path(spec.name).is_dir():
        otherwise = f"or, for the folder '{spec.name}' here, write hf:./{spec.name}"
    return SourceError(
        f"{spec.text} is not in the local Hugging Face cache, and hookcli does not download: {filename} of "
        f"{repo} belongs under {folder}/snapshots/<revision>/",
        hint=f"run 'hf download {repo}' where there is network and copy {folder} here (or set HF_HUB_CACHE), "
        f"{otherwise}",
    )


def recorded_name(spec: ModelSpec) -> str:
    """The model's name as files record it: paths (a folder, a config, a factory's file) made absolute, so that the
    name means the same from any folder."""
    if spec.source == "factory":
        module, function = spec.name.rsplit(":", 1)
        return f"{Path(module).expanduser().resolve()}:{function}" if module.endswith(".py") else spec.name
    if spec.hf_folder or spec.source == "open_clip" and spec.name.endswith(".json"):
        return f"{spec.source}:{Path(spec.name).expanduser().resolve()}"
    return spec.text


def unknown_model(spec: ModelSpec, known: list[str], command: str) -> UnknownModelError:
    closest = difflib.get_close_matches(spec.name, known, n=3, cutoff=0.5)
    shown = f" (closest: {', '.join(closest)})" if closest else ""
    return UnknownModelError(f"unknown {spec.source} model '{spec.name}'{shown}", hint=f"'{command}' lists them")
