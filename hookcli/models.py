"""Build torchvision classification models with the weights a user asks for.

Weights are given as one string:

- ``DEFAULT`` or an enum name such as ``IMAGENET1K_V1`` (also the qualified
  ``VGG16_BN_Weights.IMAGENET1K_V1``): torchvision's pretrained weights, read
  from its cache under ``$TORCH_HOME/hub/checkpoints`` or downloaded there;
- ``none``: random initialisation from ``seed``;
- a path to a ``.pth``/``.pt``/``.safetensors`` state dict. Wrappers such as
  ``{"state_dict": …}`` and ``module.``/``_orig_mod.`` prefixes are unwrapped;
  pickles are read with ``weights_only=True`` so no code is ever run.

Set ``HOOKCLI_OFFLINE=1`` to refuse downloads (the missing-weights error then
says where to put the file).

>>> loaded = load_model("resnet18", "none", seed=0)
>>> loaded.preprocess.crop, loaded.weights
(224, {'source': 'none', 'seed': 0})
"""

from __future__ import annotations

import contextlib
import difflib
import hashlib
import json
import os
import pickle
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from hookcli.errors import UnknownModelError, WeightsError, first_line
from hookcli.preprocess import Preprocess

__all__ = [
    "LoadedModel", "describe_models", "list_models", "load_model", "num_classes", "weights_cache_path", "weights_names",
]

_WEIGHT_FILE_SUFFIXES = (".pth", ".pt", ".safetensors", ".bin", ".ckpt")
_WRAPPER_KEYS = ("state_dict", "model_state_dict", "model", "module", "net", "ema")
_PREFIXES = ("module.", "_orig_mod.", "model.")


@dataclass
class LoadedModel:
    """A model ready to run, with what it needs to be described in metadata.

    ``weights`` is a JSON-able description (source and name, seed or file);
    ``preprocess`` is the default preprocessing for these weights (for random
    or local weights, that of the architecture's default weights).
    """

    name: str
    module: Any
    weights: dict
    preprocess: Preprocess
    categories: list[str] | None

    def weights_json(self) -> str:
        return json.dumps(self.weights)


def list_models() -> list[str]:
    """Names of every classification model torchvision can build, sorted."""
    import torchvision.models

    return sorted(torchvision.models.list_models(module=torchvision.models))


def describe_models() -> list[dict]:
    """Every model hookcli can load: ``{"model", "default", "weights"}`` (the default and every weights name)."""
    import torchvision.models

    return [{"model": name, "default": torchvision.models.get_model_weights(name).DEFAULT.name,
             "weights": weights_names(name)} for name in list_models()]


def weights_names(name: str) -> list[str]:
    """The pretrained weights of model ``name`` by enum member name (without the ``DEFAULT`` alias)."""
    import torchvision.models

    members = torchvision.models.get_model_weights(name).__members__
    return [member for member in members if member != "DEFAULT"]


def check_model_name(name: str) -> str:
    """Return ``name`` if hookcli can build it, else raise with the closest names."""
    names = list_models()
    if name in names:
        return name
    closest = difflib.get_close_matches(name, names, n=3, cutoff=0.0)
    raise UnknownModelError(
        f"unknown model '{name}' (closest: {', '.join(closest)})",
        hint="'hookcli models' lists every model",
    )


def weights_cache_path(weights) -> Path:
    """Where torchvision keeps (or would download) a pretrained weights enum's file."""
    import torch.hub

    filename = os.path.basename(urlparse(weights.url).path)
    return Path(torch.hub.get_dir()) / "checkpoints" / filename


def load_model(name: str, weights: str = "DEFAULT", *, seed: int = 0) -> LoadedModel:
    """Build model ``name`` in eval mode on the CPU with ``weights`` (see the module docs)."""
    import torchvision.models

    check_model_name(name)
    weights_enum = torchvision.models.get_model_weights(name)
    spec = weights.strip()
    if spec.lower() == "none":
        module = _build_seeded(name, seed)
        described = {"source": "none", "seed": seed}
        chosen = weights_enum.DEFAULT
    elif _looks_like_path(spec):
        module, described = _build_from_file(name, Path(spec), seed)
        chosen = weights_enum.DEFAULT
    else:
        chosen = _pick_enum(name, weights_enum, spec)
        module = _build_pretrained(name, chosen)
        described = {"source": "torchvision", "name": f"{type(chosen).__name__}.{chosen.name}"}
    module.eval()
    categories = chosen.meta.get("categories") if described["source"] == "torchvision" else None
    return LoadedModel(
        name=name,
        module=module,
        weights=described,
        preprocess=Preprocess.from_transforms(chosen.transforms()),
        categories=categories,
    )


def _looks_like_path(spec: str) -> bool:
    return spec.lower().endswith(_WEIGHT_FILE_SUFFIXES) or os.sep in spec or Path(spec).exists()


def _pick_enum(name: str, weights_enum, spec: str):
    if spec.upper() == "DEFAULT":
        return weights_enum.DEFAULT
    member = spec.split(".")[-1] if spec.startswith(weights_enum.__name__ + ".") else spec
    if member in weights_enum.__members__:
        return weights_enum[member]
    available = ", ".join(["DEFAULT", *weights_names(name), "none"])
    raise WeightsError(
        f"model '{name}' has no weights '{spec}' (available: {available})",
        hint="or pass a path to a .pth/.safetensors state dict",
    )


def _build_seeded(name: str, seed: int, **kwargs):
    import torch
    import torchvision.models

    with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
        # googlenet and inception_v3 warn that their default init may change; the init used is unchanged.
        warnings.filterwarnings("ignore", message="The default weight initialization", category=FutureWarning)
        torch.manual_seed(seed)
        return torchvision.models.get_model(name, weights=None, **kwargs)


def _build_pretrained(name: str, weights):
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
            return torchvision.models.get_model(name, weights=weights)
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


def _build_from_file(name: str, path: Path, seed: int):
    if not path.is_file():
        raise WeightsError(f"weights file not found: '{path}'", hint="check the path, or use --weights DEFAULT|none")
    state = read_state_dict(path)
    module = _build_seeded(name, seed)
    num_classes = _checkpoint_num_classes(module, state)
    if num_classes is not None:
        module = _build_seeded(name, seed, num_classes=num_classes)
    result = module.load_state_dict(state, strict=False)
    problems = [*(f"missing {k}" for k in result.missing_keys), *(f"unexpected {k}" for k in result.unexpected_keys)]
    if problems:
        shown = ", ".join(problems[:4]) + (f" and {len(problems) - 4} more" if len(problems) > 4 else "")
        raise WeightsError(
            f"weights file '{path}' does not fit model '{name}': {shown}",
            hint="check that it was saved from the same architecture",
        )
    described = {"source": "file", "path": str(path.resolve()), "sha256": _sha256(path)}
    if num_classes is not None:
        described["num_classes"] = num_classes
    return module, described


def read_state_dict(path: Path) -> dict:
    """Read a state dict from a file, unwrapping common checkpoint layouts."""
    import torch

    try:
        if path.suffix.lower() == ".safetensors":
            from safetensors.torch import load_file

            state = load_file(str(path))
        else:
            state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:
        message = first_line(err)
        hint = "save a plain state_dict (torch.save(model.state_dict(), path))"
        if isinstance(err, pickle.UnpicklingError) and "Weights only" in str(err):
            message = "it holds pickled objects other than tensors, which hookcli refuses to unpickle"
        raise WeightsError(f"cannot read weights file '{path}': {message}", hint=hint) from None
    return _unwrap(state, path)


def _unwrap(state: Any, path: Path) -> dict:
    import torch

    while isinstance(state, dict) and not all(isinstance(v, torch.Tensor) for v in state.values()):
        inner = next((state[k] for k in _WRAPPER_KEYS if isinstance(state.get(k), dict)), None)
        if inner is None:
            raise WeightsError(
                f"weights file '{path}' holds no state dict (top-level keys: {', '.join(map(str, list(state)[:6]))})",
                hint="save model.state_dict() or wrap it as {'state_dict': ...}",
            )
        state = inner
    if not isinstance(state, dict) or not state:
        raise WeightsError(f"weights file '{path}' holds no tensors", hint="save model.state_dict()")
    stripped = True
    while stripped:
        stripped = False
        for prefix in _PREFIXES:
            if all(k.startswith(prefix) for k in state):
                state = {k[len(prefix):]: v for k, v in state.items()}
                stripped = True
    return state


def num_classes(module) -> int:
    """How many logits a torchvision classifier gives: the size of its last Linear (or 1×1 Conv2d) layer."""
    import torch.nn as nn

    last = [layer for layer in module.modules() if isinstance(layer, nn.Linear | nn.Conv2d)]
    return _out_size(last[-1])


def _checkpoint_num_classes(module, state: dict) -> int | None:
    """The class count of a fine-tuned checkpoint whose classifier differs from the default 1000."""
    import torch.nn as nn

    classifier = None
    for path, layer in module.named_modules():
        if isinstance(layer, nn.Linear | nn.Conv2d) and _out_size(layer) == 1000:
            classifier = path
    if classifier is None or f"{classifier}.weight" not in state:
        return None
    rows = state[f"{classifier}.weight"].shape[0]
    return rows if rows != 1000 else None


def _out_size(layer) -> int:
    return layer.out_features if hasattr(layer, "out_features") else layer.out_channels


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
