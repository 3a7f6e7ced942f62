"""Weights files checked before anything loads: is a ``--weights`` value a path, is the file there, regular, not empty,
and what kind of archive it is (torch reads it in :mod:`hookcli.models.state_dicts`).

Shared by every model source. Nothing here imports torch, so a missing or
empty weights file is refused before torch loads. A file is opened only when
it is a regular file.

>>> looks_like_weights_path("IMAGENET1K_V1"), looks_like_weights_path("./best.pth")
(False, True)
"""

from __future__ import annotations

import codecs
import hashlib
import os
import stat
import zipfile
from pathlib import Path

from hookcli.errors import WeightsError
from hookcli.files import file_kind


def downloads_off() -> bool:
    """Whether ``HOOKCLI_OFFLINE`` turns downloads off (set, and not ``0``, ``false``, ``no`` or ``off``)."""
    return os.environ.get("HOOKCLI_OFFLINE", "").strip().lower() not in ("", "0", "false", "no", "off")


__all__ = [
    "archive_kind",
    "check_weights_file",
    "downloads_off",
    "file_sha256",
    "file_weights",
    "looks_like_weights_path",
]


_WEIGHT_FILE_SUFFIXES = (".pth", ".pt", ".safetensors", ".bin", ".ckpt")


WEIGHTS_FILE_HINT = (
    "give a complete file written by torch.save(model.state_dict(), path) or safetensors.torch.save_file"
)


def looks_like_weights_path(spec: str) -> bool:
    """Whether a ```--weights``` value that is not a weights name is a path: it has a separator or a weights suffix.

    Decided by the spelling alone, so that a file named like weights in the
    current folder cannot shadow them.
    """
    return "/" in spec or os.sep in spec or spec.lower().endswith(_WEIGHT_FILE_SUFFIXES)


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
        raise WeightsError(f"weights file '{path}' is empty", hint=WEIGHTS_FILE_HINT)


def kind_of_non_weights(path: Path, head: bytes) -> str | None:
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
