"""Write captured tensors to safetensors files, atomically.

The file format is a contract documented in the README: one tensor per key,
batch-first, plus string metadata (JSON for structured values) whose
``format`` field carries the version, :data:`FORMAT_VERSION`.

Files appear complete or not at all: bytes go to a temporary file in the same
folder that is renamed into place, and an existing file is only replaced when
``force`` is set.

>>> import torch
>>> write_safetensors({"x": torch.zeros(2, 3)}, {"format": FORMAT_VERSION}, "out.safetensors")  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import BinaryIO

from hookcli.errors import OutputExistsError, UsageProblem

__all__ = ["FORMAT_VERSION", "atomic_path", "check_writable", "write_safetensors"]

FORMAT_VERSION = "1"


def check_writable(target: str | os.PathLike, *, force: bool) -> Path:
    """Refuse early, before any work, if ``target`` exists (without ``force``) or its folder is missing."""
    path = Path(target)
    if path.is_dir():
        raise OutputExistsError(f"output '{path}' is a folder", hint="give a file name ending in .safetensors")
    if path.exists() and not force:
        raise OutputExistsError(f"output '{path}' already exists", hint="add --force to overwrite it")
    if not path.parent.is_dir():
        raise UsageProblem(f"folder '{path.parent}' does not exist", hint="create it first")
    return path


@contextlib.contextmanager
def atomic_path(target: str | os.PathLike, *, force: bool = False) -> Iterator[Path]:
    """Yield a temporary path next to ``target``; on success it becomes ``target``.

    On any exception (including Ctrl-C) the temporary file is removed and
    ``target`` is untouched.
    """
    path = check_writable(target, force=force)
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".part", dir=path.parent)
    os.close(handle)
    temporary = Path(temporary)
    try:
        yield temporary
        _make_durable(temporary)
        if force:
            os.replace(temporary, path)
        else:
            _link_without_clobbering(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)


def _make_durable(path: Path) -> None:
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, 0o666 & ~umask)  # mkstemp creates 0600; the result should look like any other file
    with open(path, "rb+") as handle:
        os.fsync(handle.fileno())


def _link_without_clobbering(source: Path, target: Path) -> None:
    try:
        os.link(source, target)  # fails if target appeared meanwhile, unlike rename
    except FileExistsError:
        raise OutputExistsError(f"output '{target}' already exists", hint="add --force to overwrite it") from None
    except OSError:  # file systems without hard links
        if target.exists():
            raise OutputExistsError(f"output '{target}' already exists", hint="add --force to overwrite it") from None
        os.replace(source, target)


def write_safetensors(
    tensors: Mapping, metadata: Mapping[str, str], destination: str | os.PathLike | BinaryIO, *, force: bool = False
) -> None:
    """Write ``tensors`` and ``metadata`` to a path (atomically) or to a binary stream."""
    from safetensors.torch import save, save_file

    tensors = {key: value.contiguous() for key, value in tensors.items()}
    metadata = dict(metadata)
    if hasattr(destination, "write"):
        destination.write(save(tensors, metadata=metadata))
        destination.flush()
        return
    with atomic_path(destination, force=force) as temporary:
        save_file(tensors, str(temporary), metadata=metadata)


def stdout_binary() -> BinaryIO:
    """stdout as a byte stream, refusing a terminal (binary output would garble it)."""
    if sys.stdout.isatty():
        raise UsageProblem("refusing to write binary safetensors data to a terminal", hint="redirect or pipe '-o -'")
    return sys.stdout.buffer
