"""Weights files: reading a state dict without running code, fitting it to a model, and where pretrained files live.

Shared by every model source (:mod:`hookcli.models.loading` for torchvision,
:mod:`hookcli.models.sources` for the others). A file is opened only when it
is a regular file; pickles are read with ``weights_only=True``; wrappers such
as ``{"state_dict": …}`` and ``module.``/``_orig_mod.`` prefixes are
unwrapped; a tensor whose shape or dtype does not fit the model is refused,
named.

>>> looks_like_weights_path("IMAGENET1K_V1"), looks_like_weights_path("./best.pth")
(False, True)
"""

from __future__ import annotations

import codecs
import contextlib
import hashlib
import os
import pickle
import stat
import zipfile
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from hookcli.errors import WeightsError, first_line
from hookcli.files import file_kind

__all__ = [
    "archive_kind",
    "check_weights_file",
    "file_sha256",
    "file_weights",
    "fit_state_dict",
    "hub_checkpoint_path",
    "looks_like_weights_path",
    "read_state_dict",
    "seeded",
    "weights_cache_path",
]


_WEIGHT_FILE_SUFFIXES = (".pth", ".pt", ".safetensors", ".bin", ".ckpt")


_WRAPPER_KEYS = ("state_dict", "model_state_dict", "model", "module", "net", "ema")


_PREFIXES = ("module.", "_orig_mod.", "model.")


_WEIGHTS_FILE_HINT = (
    "give a complete file written by torch.save(model.state_dict(), path) or safetensors.torch.save_file"
)


def looks_like_weights_path(spec: str) -> bool:
    """Whether a ``--weights`` value that is not a weights name is a path: it has a separator or a weights suffix.

    Decided by the spelling alone, so that a file named like weights in the
    current folder cannot shadow them.
    """
    return "/" in spec or os.sep in spec or spec.lower().endswith(_WEIGHT_FILE_SUFFIXES)


def weights_cache_path(weights) -> Path:
    """Where torchvision keeps (or would download) a pretrained weights enum's file."""
    return hub_checkpoint_path(weights.url)


def hub_checkpoint_path(url: str) -> Path:
    """Where torch.hub keeps the file downloaded from ``url``: ``$TORCH_HOME/hub/checkpoints/<its name>``."""
    import torch.hub

    return Path(torch.hub.get_dir()) / "checkpoints" / os.path.basename(urlparse(url).path)


@contextlib.contextmanager
def seeded(seed: int):
    """Random initialisation inside the block draws from ``seed``; the global generator is left as it was."""
    import torch

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


def file_sha256(path: Path) -> str:
    """The SHA-256 of a file's bytes, read a MiB at a time."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def file_weights(path: Path) -> dict:
    """The metadata's description of weights read from the file at ``path``."""
    return {"source": "file", "path": str(path.resolve()), "sha256": file_sha256(path)}


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
    import torch

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
    import torch

    try:
        if path.suffix.lower() == ".safetensors":
            from safetensors.torch import load_file

            state = load_file(str(path))
        else:
            state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:
        raise _unreadable(path, err) from None
    return _unwrap(state, path)


def check_weights_file(path: Path) -> None:
    """Refuse a weights path that is missing, not a regular file, or empty, before anything opens it."""
    try:
        status = path.stat()
    except OSError:
        raise WeightsError(
            f"weights file not found: '{path}'", hint="check the path, or use --weights DEFAULT|none"
        ) from None
    if not stat.S_ISREG(status.st_mode):
        raise WeightsError(
            f"weights path '{path}' is not a regular file but {file_kind(status.st_mode)}",
            hint="give the path of the .pth/.pt/.safetensors file itself",
        )
    if status.st_size == 0:
        raise WeightsError(f"weights file '{path}' is empty", hint=_WEIGHTS_FILE_HINT)


def _unreadable(path: Path, err: Exception) -> WeightsError:
    # Told from the first bytes before reading torch's error: its weights-only unpickler fails on any non-pickle.
    from hookcli.models.weights import archive_kind

    kind = archive_kind(path)
    archive = {"torchscript": "a TorchScript", "export": "a torch.export"}.get(kind) if kind is not None else None
    if archive is not None:
        return WeightsError(
            f"weights file '{path}' is {archive} archive, not a state dict",
            hint="save model.state_dict() of the model it came from",
        )
    with open(path, "rb") as handle:
        kind = _kind_of_non_weights(path, handle.read(512))
    if kind is not None:
        return WeightsError(f"weights file '{path}' is {kind}", hint=_WEIGHTS_FILE_HINT)
    if isinstance(err, pickle.UnpicklingError) and "Weights only" in str(err):
        return WeightsError(
            f"cannot read weights file '{path}': it holds pickled objects other than tensors, which hookcli refuses "
            "to unpickle",
            hint="save a plain state_dict (torch.save(model.state_dict(), path))",
        )
    return WeightsError(f"cannot read weights file '{path}': {first_line(err)}", hint=_WEIGHTS_FILE_HINT)


def _kind_of_non_weights(path: Path, head: bytes) -> str | None:
    """What a file that failed to load is, from its first bytes; None when it looks like weights (damaged inside)."""
    if head.startswith(b"\x89PNG\r\n\x1a\n"):
        return "a PNG image"
    if head.startswith(b"\xff\xd8\xff"):
        return "a JPEG image"
    if head[:4] in (b"PK\x03\x04", b"PK\x05\x06"):
        # torch.save writes a zip whose first entry is <name>/data.pkl; its name starts at byte 30 of the zip.
        first_entry = head[30 : 30 + int.from_bytes(head[26:28], "little")]
        if not first_entry.endswith(b"/data.pkl"):
            return "a zip archive but not a PyTorch checkpoint"
        return None if zipfile.is_zipfile(path) else "a truncated PyTorch checkpoint (its end is missing)"
    if _is_text(head):
        return "text"
    if head.startswith(b"\x80") or head[8:9] == b"{":  # a pickle (torch's legacy format) or a safetensors header
        return None
    return "not a PyTorch (.pth/.pt) or safetensors weights file"


def _is_text(head: bytes) -> bool:
    try:
        # The incremental decoder accepts a character cut in two at the end of head.
        text = codecs.getincrementaldecoder("utf-8")().decode(head)
    except UnicodeDecodeError:
        return False
    return all(char.isprintable() or char in "\t\n\r\f" for char in text)


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
                state = {k[len(prefix) :]: v for k, v in state.items()}
                stripped = True
    return state


def archive_kind(path: Path) -> str | None:
    """What a file given as a model or weights is, by the layout of its zip: ``torchscript``, ``export``,
    ``weights``, or None (not a zip we know, or not a regular file)."""
    try:
        if not path.is_file():
            return None
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
    except (OSError, zipfile.BadZipFile):
        return None
    parts = {name.split("/", 1)[1] if "/" in name else name for name in names}
    if any(p.startswith("code/") for p in parts) or "constants.pkl" in parts:
        return "torchscript"
    if any(p.startswith(("models/", "serialized_exported_program", "archive_format")) for p in parts) or any(
        "exported_program" in name for name in names
    ):
        return "export"
    if "data.pkl" in parts:
        return "weights"
    return None
