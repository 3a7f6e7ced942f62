"""Build torchvision models of every family (:mod:`hookcli.families`) with the weights a user asks for.

Weights are given as one string:

- ``none`` (any case): random initialisation from ``seed``;
- ``DEFAULT`` (any case) or an enum name such as ``IMAGENET1K_V1`` (also the
  qualified ``VGG16_BN_Weights.IMAGENET1K_V1``): torchvision's pretrained
  weights, read from its cache under ``$TORCH_HOME/hub/checkpoints`` or
  downloaded there. These are always names, even when a file or folder of that
  name is in the current folder: write ``./DEFAULT`` to mean the file;
- a path, that is a string with a path separator or ending in ``.pth``, ``.pt``,
  ``.safetensors``, ``.bin`` or ``.ckpt`` (whether or not it exists), to a state
  dict. Wrappers such as ``{"state_dict": …}`` and ``module.``/``_orig_mod.``
  prefixes are unwrapped; pickles are read with ``weights_only=True`` so no code
  is ever run. Only a regular file is opened; an empty file, a file that holds
  no weights (text, an image, another zip) and tensors whose shapes do not fit
  the model are refused with an error that says which.

Anything else is an unknown weights name, and the error lists the known ones.

Set ``HOOKCLI_OFFLINE=1`` to refuse downloads (the missing-weights error then
says where to put the file).

>>> loaded = load_model("resnet18", "none", seed=0)
>>> loaded.preprocess.crop, loaded.weights, loaded.family
(224, {'source': 'none', 'seed': 0}, 'classification')
"""

from __future__ import annotations

import contextlib
import difflib
import fnmatch
import os
import sys
import warnings
from pathlib import Path

from hookcli.errors import UnknownModelError, UnknownWeightsError, WeightsError, check_choice, first_line
from hookcli.families import FAMILIES, build_options
from hookcli.inputs.preprocess import Preprocess
from hookcli.models import sources
from hookcli.models.loaded import LoadedModel, out_size, prefix_tokens
from hookcli.models.registry import ModelEntry, model_registry
from hookcli.models.specs import LISTED_SOURCES, check_model, check_weights, parse_model
from hookcli.models.weights import (
    check_weights_file,
    file_weights,
    fit_state_dict,
    looks_like_weights_path,
    read_state_dict,
    seeded,
    weights_cache_path,
)

__all__ = ["describe_models", "list_models", "load_model", "model_family", "no_models_note", "resolve_weights"]


def list_models(family: str | None = None) -> list[str]:
    """Names of every model torchvision can build (of one ``family``), sorted (from :mod:`hookcli.models.registry`)."""
    return [name for name, entry in model_registry().items() if family in (None, entry.family)]


def describe_models(
    family: str | None = None, *, pattern: str | None = None, source: str = "torchvision"
) -> list[dict]:
    """Every model hookcli can load (of one ``family``, named like the glob ``pattern``) from ``source`` (one of
    :data:`hookcli.models.specs.LISTED_SOURCES`): ``{"model", "family", "default", "weights"}`` rows.

    >>> [row for row in describe_models("optical_flow")][0]["model"]
    'raft_large'
    >>> [row["model"] for row in describe_models(pattern="resnet1*")]
    ['resnet101', 'resnet152', 'resnet18']
    """

    if family is not None:
        check_choice("family", family, FAMILIES)
    check_choice("source", source, LISTED_SOURCES)
    if source != "torchvision":
        return [row for row in sources.list_source_models(source, pattern) if family in (None, row["family"])]
    return [
        {"model": name, "family": entry.family, "default": entry.default, "weights": list(entry.weights)}
        for name, entry in model_registry().items()
        if family in (None, entry.family) and (pattern is None or fnmatch.fnmatchcase(name, pattern))
    ]


def no_models_note(source: str, pattern: str | None, family: str | None) -> str:
    """Why :func:`describe_models` found nothing, in words (for the local Hugging Face cache, where it is)."""
    wanted = " and ".join(part for part in (pattern and f"'{pattern}'", family and f"family {family}") if part)
    if source == "hf":
        from huggingface_hub import constants

        return f"no model{' matching ' + wanted if wanted else ''} in the Hugging Face cache ({constants.HF_HUB_CACHE})"
    return f"no {source} model matches {wanted}"


def model_family(name: str) -> str:
    """The family of model ``name`` (an unknown name is refused), from the registry cache: no torch needed.

    Models of other sources (:mod:`hookcli.models.sources`) are classification models: they take stacked images.
    """
    spec = _other_source(name)
    return "classification" if spec is not None else _entry(name).family


def _other_source(name: str):
    """The :class:`~hookcli.models.specs.ModelSpec` of a model from outside torchvision (checked), else None."""

    spec = parse_model(name)
    if spec.source == "torchvision":
        return None
    check_model(spec)
    return spec


def resolve_weights(name: str, weights: str) -> str | None:
    """The member of model ``name``'s weights enum that ``weights`` names, None for ``none`` or a path.

    A name is ``DEFAULT`` in any case, a member (``IMAGENET1K_V1``) or a qualified one
    (``ResNet18_Weights.IMAGENET1K_V1``). An unknown model or weights name is refused from the
    registry cache, before torch is imported (see :mod:`hookcli.models.registry`), and so is a weights
    path that is missing, empty or not a regular file.

    >>> resolve_weights("resnet18", "default"), resolve_weights("resnet18", "ResNet18_Weights.IMAGENET1K_V1")
    ('DEFAULT', 'IMAGENET1K_V1')

    Models of other sources have their weights checked as far as can be
    without their package (:func:`hookcli.models.specs.check_weights`), and give None.
    """
    spec = _other_source(name)
    if spec is not None:
        check_weights(spec, weights)
        return None
    entry = _entry(name)
    spec = weights.strip()
    if spec.lower() == "none":
        return None
    if spec.upper() == "DEFAULT":
        return "DEFAULT"
    member = spec.removeprefix(entry.enum + ".")
    if member in entry.weights or member == "DEFAULT":
        return member
    if looks_like_weights_path(spec):
        check_weights_file(Path(spec))  # missing, empty or not a file: said before torch loads, too
        return None
    raise _unknown_weights(name, spec, entry.weights)


def _entry(name: str) -> ModelEntry:
    """Model ``name``'s registry entry; an unknown name is refused with the closest ones."""
    registry = model_registry()
    if name in registry:
        return registry[name]
    closest = difflib.get_close_matches(name, list(registry), n=3, cutoff=0.0)
    raise UnknownModelError(
        f"unknown model '{name}' (closest: {', '.join(closest)})",
        hint="'hookcli models' lists every model",
    )


def load_model(name: str, weights: str = "DEFAULT", *, seed: int = 0) -> LoadedModel:
    """Build model ``name`` in eval mode on the CPU with ``weights`` (see the module docs).

    ``timm:``, ``hf:``, ``open_clip:`` and factory names are built by :mod:`hookcli.models.sources`.
    """
    spec = _other_source(name)
    if spec is not None:
        return sources.load(spec, weights, seed=seed)
    member = resolve_weights(name, weights)  # before torch: a name that cannot be built is refused at once
    import torchvision.models

    weights_enum = torchvision.models.get_model_weights(name)
    family = model_family(name)
    spec = weights.strip()
    named = None if member is None else weights_enum[member]
    if spec.lower() == "none":
        module = _build_seeded(name, seed, **build_options(family, pretrained=False))
        described = {"source": "none", "seed": seed}
    elif named is not None:
        module = _build_pretrained(name, named, build_options(family, pretrained=True))
        described = {"source": "torchvision", "name": f"{type(named).__name__}.{named.name}"}
    else:
        module, described = _build_from_file(name, Path(spec), seed, build_options(family, pretrained=False))
    module.eval()
    return LoadedModel(
        name=name,
        module=module,
        weights=described,
        preprocess=Preprocess.from_transforms((weights_enum.DEFAULT if named is None else named).transforms()),
        categories=None if named is None else named.meta.get("categories"),
        family=family,
        prefix_tokens=prefix_tokens(module),
    )


def _unknown_weights(name: str, spec: str, known: tuple[str, ...]) -> UnknownWeightsError:
    available = ", ".join(["DEFAULT", *known, "none"])
    hint = (
        f"to load the file '{spec}' in the current folder, write it as ./{spec}"
        if os.path.isfile(spec)
        else "or pass a path to a .pth/.safetensors state dict"
    )
    return UnknownWeightsError(f"model '{name}' has no weights '{spec}' (available: {available})", hint=hint)


def _build_seeded(name: str, seed: int, **kwargs):
    import torchvision.models

    with seeded(seed), warnings.catch_warnings():
        # googlenet and inception_v3 warn that their default init may change; the init used is unchanged.
        warnings.filterwarnings("ignore", message="The default weight initialization", category=FutureWarning)
        # Quantizing a model goes through torch.ao.quantization functions torch has marked as deprecated.
        warnings.filterwarnings("ignore", message="torch.quantize_per_", category=UserWarning)
        warnings.filterwarnings("ignore", message="torch.ao.quantization is deprecated", category=DeprecationWarning)
        return torchvision.models.get_model(name, weights=None, **kwargs)


def _build_pretrained(name: str, weights, options: dict):
    import torchvision.models

    cached = weights_cache_path(weights)
    if not cached.exists() and os.environ.get("HOOKCLI_OFFLINE", "") not in ("", "0"):
        raise WeightsError(
            f"pretrained weights {type(weights).__name__}.{weights.name} are not cached and "
            f"downloads are off (HOOKCLI_OFFLINE); place {weights.url} at {cached}",
            hint="or use --weights none for random weights",
        )
    try:
        # torch.hub announces a download on stdout, which carries only data here (-o - writes the file there).
        with contextlib.redirect_stdout(sys.stderr):
            return torchvision.models.get_model(name, weights=weights, **options)
    except Exception as err:  # download and unpickling failures come in many types
        if cached.exists():
            raise WeightsError(
                f"cached weights file {cached} cannot be loaded ({first_line(err)})",
                hint="delete it so it is downloaded again, or replace it with a good copy",
            ) from None
        raise WeightsError(
            f"cannot download pretrained weights {type(weights).__name__}.{weights.name} "
            f"({first_line(err)}); place {weights.url} at {cached}",
            hint="or use --weights none for random weights",
        ) from None


def _build_from_file(name: str, path: Path, seed: int, options: dict):
    state = read_state_dict(path)
    module = _build_seeded(name, seed, **options)
    num_classes = _checkpoint_num_classes(module, state)
    if num_classes is not None:
        module = _build_seeded(name, seed, num_classes=num_classes, **options)
    fit_state_dict(module, state, path, name)
    described = file_weights(path)
    if num_classes is not None:
        described["num_classes"] = num_classes
    return module, described


def _checkpoint_num_classes(module, state: dict) -> int | None:
    """The class count of a fine-tuned checkpoint whose classifier differs from the default 1000."""
    import torch.nn as nn

    classifier = None
    for path, layer in module.named_modules():
        if isinstance(layer, nn.Linear | nn.Conv2d) and out_size(layer) == 1000:
            classifier = path
    if classifier is None or f"{classifier}.weight" not in state:
        return None
    rows = state[f"{classifier}.weight"].shape[0]
    return rows if rows != 1000 else None
