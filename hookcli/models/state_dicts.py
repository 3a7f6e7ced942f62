"""State dicts: reading one from a weights file without running code, fitting it to a model, seeded
initialisation, and where torch.hub keeps pretrained files.

The torch half of :mod:`hookcli.models.weights` (which checks a weights path
before anything loads). Pickles are read with ``weights_only=True``; wrappers
such as ``{"state_dict": …}`` and ``module.``/``_orig_mod.`` prefixes are
unwrapped; a tensor whose shape or dtype does not fit the model is refused,
named.

>>> import torch
>>> with seeded(0):
...     first = torch.rand(2)
>>> with seeded(0):
...     bool((first == torch.rand(2)).all())
True
"""

from __future__ import annotations

import contextlib
import os
import pickle
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import torch
import torch.hub
from safetensors.torch import load_file

from hookcli.errors import WeightsError, first_line
from hookcli.models.weights import WEIGHTS_FILE_HINT, archive_kind, check_weights_file, kind_of_non_weights

__all__ = [
    "fit_state_dict",
    "hub_checkpoint_path",
    "read_state_dict",
    "seeded",
    "weights_cache_path",
]

_WRAPPER_KEYS = ("state_dict", "model_state_dict", "model", "module", "net", "ema")


_PREFIXES = ("module.", "_orig_mod.", "model.")


def weights_cache_path(weights) -> Path:
    """Where torchvision keeps (or would download) a pretrained weights enum's file."""
    return hub_checkpoint_path(weights.url)


def hub_checkpoint_path(url: str) -> Path:
    """Where torch.hub keeps the file downloaded from ``url``: ``$TORCH_HOME/hub/checkpoints/<its name>``."""
    return Path(torch.hub.get_dir()) / "checkpoints" / os.path.basename(urlparse(url).path)


@contextlib.contextmanager
def seeded(seed: int):
    """Random initialisation inside the block draws from ``seed``; the global generator is left as it was."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


def fit_state_dict(module, state: dict, path: Path, name: str) -> None:
    """Load ``state`` (read from ``path``) into ``module``, refusing, with the first misfit named, one that does not
    fit it exactly."""
    # load_state_dict reports wrong shapes as one RuntimeError whose first line names nothing; check them first.
    expected = module.state_dict()
    misfits = [key for key, tensor in expected.items() if key in state and state[key].shape != tensor.shape]
    if misfits:
        key, more = misfits[0], (f" (and {len(misfits) - 1} more)" if len(misfits) > 1 else "")
        raise _does_not_fit(
            path,
            name,
            f"{key} is {list(state[key].shape)} in the file but {list(expected[key].shape)} in the model{more}",
        )
    for key, tensor in expected.items():
        if key in state and not _casts_faithfully(state[key].dtype, tensor.dtype):
            stored, wanted = (str(t.dtype).removeprefix("torch.") for t in (state[key], tensor))
            raise WeightsError(
                f"weights file '{path}' holds {key} as {stored} and the model takes {wanted}: hookcli "
                f"does not cast {stored} into {wanted}",
                hint="save the model's float weights (dequantized ones, for a quantized model)",
            )
    result = module.load_state_dict(state, strict=False)
    problems = [*(f"missing {k}" for k in result.missing_keys), *(f"unexpected {k}" for k in result.unexpected_keys)]
    if problems:
        raise _does_not_fit(
            path, name, ", ".join(problems[:4]) + (f" and {len(problems) - 4} more" if len(problems) > 4 else "")
        )


def _casts_faithfully(stored, wanted) -> bool:
    """Whether a tensor stored as dtype ``stored`` holds the same numbers once loaded into a ``wanted`` one: a float
    into a float (half and bfloat16 files are common), an integer into an integer (counters). Not quantized integers
    or float8 into floats (scaled: the stored numbers are not the weights), nor booleans or complex numbers."""
    return stored == wanted or _number_kind(stored) is not None and _number_kind(stored) == _number_kind(wanted)


def _number_kind(dtype) -> str | None:
    """``float`` (16 bits or more), ``integer`` (a plain one, not quantized), or None for a dtype that only loads into
    itself."""
    if dtype.is_floating_point and dtype.itemsize >= 2:
        return "float"
    return "integer" if dtype in (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64) else None


def _does_not_fit(path: Path, name: str, detail: str) -> WeightsError:
    return WeightsError(
        f"weights file '{path}' does not fit model '{name}': {detail}",
        hint="check that it was saved from the same architecture",
    )


def read_state_dict(path: Path) -> dict:
    """Read a state dict from a file, unwrapping common checkpoint layouts.

    Only a regular file is opened (opening a named pipe would wait for a writer forever). When the file does not
    load, its first bytes tell a file of another kind (text, an image, a zip) from a damaged weights file.
    """
    check_weights_file(path)
    safetensors = path.suffix.lower() == ".safetensors"
    archive = None if safetensors else _ARCHIVES.get(archive_kind(path) or "")
    if archive is not None:  # refused unread: torch.load hands a TorchScript archive to torch.jit.load
        raise WeightsError(
            f"weights file '{path}' is {archive} archive, not a state dict",
            hint="save model.state_dict() of the model it came from",
        )
    try:
        state = load_file(str(path)) if safetensors else torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:
        raise _unreadable(path, err) from None
    return _unwrap(state, path)


#: Archives of models, not of weights, by :func:`~hookcli.models.weights.archive_kind`.
_ARCHIVES = {"torchscript": "a TorchScript", "export": "a torch.export"}


def _unreadable(path: Path, err: Exception) -> WeightsError:
    # Told from the first bytes before reading torch's error: its weights-only unpickler fails on any non-pickle.
    with open(path, "rb") as handle:
        kind = kind_of_non_weights(path, handle.read(512))
    if kind is not None:
        return WeightsError(f"weights file '{path}' is {kind}", hint=WEIGHTS_FILE_HINT)
    if isinstance(err, pickle.UnpicklingError) and "Weights only" in str(err):
        return WeightsError(
            f"cannot read weights file '{path}': it holds pickled objects other than tensors, which hookcli refuses "
            "to unpickle",
            hint="save a plain state_dict (torch.save(model.state_dict(), path))",
        )
    return WeightsError(f"cannot read weights file '{path}': {first_line(err)}", hint=WEIGHTS_FILE_HINT)


def _unwrap(state: Any, path: Path) -> dict:
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
                state = {k[len(prefix) :]: v for k, v in state.items()}
                stripped = True
    return state
