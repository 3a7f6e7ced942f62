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
import sys
import warnings
from pathlib import Path

import torch.nn as nn
import torchvision.models

from hookcli.errors import WeightsError, first_line
from hookcli.families import build_options
from hookcli.inputs.preprocess import Preprocess
from hookcli.models import sources
from hookcli.models.catalog import ModelChoice, choose_model
from hookcli.models.loaded import LoadedModel, out_size, prefix_tokens
from hookcli.models.state_dicts import fit_state_dict, read_state_dict, seeded, weights_cache_path
from hookcli.models.weights import downloads_off, file_weights

__all__ = [
    "build_model",
    "load_model",
    "num_classes",
]


def load_model(name: str, weights: str = "DEFAULT", *, seed: int = 0) -> LoadedModel:
    """Build model ``name`` in eval mode on the CPU with ``weights`` (see the module docs).

    ``timm:``, ``hf:``, ``open_clip:`` and factory names are built by :mod:`hookcli.models.sources`.
    """
    return build_model(choose_model(name, weights), seed=seed)  # before torch: what cannot be built is refused


def build_model(choice: ModelChoice, *, seed: int = 0) -> LoadedModel:
    """Build the model ``choice`` names, checked already (:func:`~hookcli.models.catalog.choose_model`): a run's
    request checks it before torch loads, and nothing checks it again."""
    if choice.spec is not None:
        return sources.load(choice.spec, choice.weights, seed=seed)
    name, family = choice.name, choice.family
    weights_enum = torchvision.models.get_model_weights(name)
    named = None if choice.member is None else weights_enum[choice.member]
    if choice.weights.lower() == "none":
        module = _build_seeded(name, seed, **build_options(family, pretrained=False))
        described = {"source": "none", "seed": seed}
    elif named is not None:
        module = _build_pretrained(name, named, build_options(family, pretrained=True))
        described = {"source": "torchvision", "name": f"{type(named).__name__}.{named.name}"}
    else:
        module, described = _build_from_file(name, Path(choice.weights), seed, build_options(family, pretrained=False))
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


def _build_seeded(name: str, seed: int, **kwargs):
    with seeded(seed), warnings.catch_warnings():
        # googlenet and inception_v3 warn that their default init may change; the init used is unchanged.
        warnings.filterwarnings("ignore", message="The default weight initialization", category=FutureWarning)
        # Quantizing a model goes through torch.ao.quantization functions torch has marked as deprecated.
        warnings.filterwarnings("ignore", message="torch.quantize_per_", category=UserWarning)
        warnings.filterwarnings("ignore", message="torch.ao.quantization is deprecated", category=DeprecationWarning)
        return torchvision.models.get_model(name, weights=None, **kwargs)


def _build_pretrained(name: str, weights, options: dict):
    cached = weights_cache_path(weights)
    if not cached.exists() and downloads_off():
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
    classifier = None
    for path, layer in module.named_modules():
        if isinstance(layer, nn.Linear | nn.Conv2d) and out_size(layer) == 1000:
            classifier = path
    if classifier is None or f"{classifier}.weight" not in state:
        return None
    rows = state[f"{classifier}.weight"].shape[0]
    return rows if rows != 1000 else None


def num_classes(module) -> int:
    """How many classes a model tells apart: a classifier's logits (its last Linear or 1×1 Conv2d layer), a
    segmentation model's output channels, a detection model's classes (background included)."""
    head = getattr(module, "head", None)
    classification_head = getattr(head, "classification_head", None)
    for found in (
        getattr(classification_head, "num_classes", None),
        getattr(classification_head, "num_columns", None),
        getattr(
            getattr(getattr(getattr(module, "roi_heads", None), "box_predictor", None), "cls_score", None),
            "out_features",
            None,
        ),
    ):
        if isinstance(found, int):
            return found
    last = [layer for layer in module.modules() if isinstance(layer, nn.Linear | nn.Conv2d)]
    return out_size(last[-1])
