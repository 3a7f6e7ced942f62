"""Writing tensors as a safetensors file: atomically to a path, or to a binary stream (``-o -``).

The one place hookcli serialises torch tensors; the readers
(:mod:`hookcli.storage.features`) need numpy only.

>>> import io, torch
>>> stream = io.BytesIO()
>>> write_safetensors({"x": torch.zeros(2)}, {"format": "example"}, stream)
>>> stream.getvalue()[8:9]
b'{'
"""

from __future__ import annotations

import contextlib
import json
import os
import struct
import sys
from collections.abc import Callable, Mapping
from typing import Any, BinaryIO

import torch

from hookcli.errors import CaptureError
from hookcli.files import atomic_path
from hookcli.storage.fileformat import STORED_DTYPES

__all__ = [
    "write_safetensors",
]


def write_safetensors(
    tensors: Mapping[str, Any],
    metadata: Mapping[str, str],
    destination: str | os.PathLike | BinaryIO,
    *,
    force: bool = False,
    publish: Callable[[], contextlib.AbstractContextManager[bool]] | None = None,
    sweep: bool = True,
) -> None:
    """Write ``tensors`` and ``metadata`` as a safetensors file to a path (atomically; ``publish`` as
    :func:`atomic_path`'s, as is ``sweep``) or to a binary stream.

    The header, then each tensor's bytes in turn, go straight into the
    temporary file :func:`atomic_path` holds locked (or into the stream): no
    copy of the whole file is made in memory, and no other file is made
    beside it, so a temporary file left unlocked is one a killed process
    abandoned.
    """
    if isinstance(destination, str | os.PathLike):
        with (
            atomic_path(destination, force=force, publish=publish, sweep=sweep) as temporary,
            open(temporary, "r+b") as handle,
        ):
            _serialise(tensors, metadata, handle)
        return
    _serialise(tensors, metadata, destination)
    destination.flush()


def _serialise(tensors: Mapping[str, Any], metadata: Mapping[str, str], handle: BinaryIO) -> None:
    """The safetensors layout: the header's length (8 bytes, little-endian), the JSON header (padded with spaces
    to a multiple of 8 bytes), then the tensors' bytes one after the other, widest items first (so each tensor
    starts aligned to its item size, as safetensors' own writer lays them out), then by key."""
    assert sys.byteorder == "little", "safetensors stores little-endian values, as this machine holds them"
    order = sorted(tensors, key=lambda key: (-tensors[key].element_size(), key))
    entries: dict[str, Any] = {"__metadata__": dict(metadata)} if metadata else {}
    offset = 0
    for key in order:
        tensor = tensors[key]
        dtype = str(tensor.dtype).removeprefix("torch.")
        if dtype not in STORED_DTYPES:
            raise CaptureError(
                f"'{key}' holds {dtype} values, which hookcli does not store",
                hint="store a layer whose output is of a float, integer or boolean type",
            )
        size = tensor.numel() * tensor.element_size()
        entries[key] = {
            "dtype": STORED_DTYPES[dtype],
            "shape": list(tensor.shape),
            "data_offsets": [offset, offset + size],
        }
        offset += size
    header = json.dumps(entries, separators=(",", ":")).encode()
    header += b" " * (-len(header) % 8)
    handle.write(struct.pack("<Q", len(header)))
    handle.write(header)
    for key in order:
        tensor = tensors[key].detach().to("cpu").contiguous()
        if tensor.numel():
            handle.write(memoryview(tensor.reshape(-1).view(torch.uint8).numpy()))
