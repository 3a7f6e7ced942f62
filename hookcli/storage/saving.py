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
import os
from collections.abc import Callable, Mapping
from typing import Any, BinaryIO

import safetensors.torch

from hookcli.files import SETTLE_IN_PLACE, atomic_path

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
    in_place: bool = False,
) -> None:
    """Write ``tensors`` and ``metadata`` to a path (atomically; ``publish`` as :func:`atomic_path`'s) or to a
    binary stream.

    ``in_place``: serialise in memory and write the bytes into the temporary file :func:`atomic_path` holds
    locked, instead of letting safetensors replace it with a file of its own; the temporary file is then never
    unlocked while in use, so one left unlocked is abandoned at once (shards, of a bounded size, are written so).
    """
    tensors = {key: value.contiguous() for key, value in tensors.items()}
    metadata = dict(metadata)
    if isinstance(destination, str | os.PathLike):
        settle = SETTLE_IN_PLACE if in_place else None
        with atomic_path(destination, force=force, publish=publish, settle=settle) as temporary:
            if in_place:
                temporary.write_bytes(safetensors.torch.save(tensors, metadata=metadata))
            else:
                safetensors.torch.save_file(tensors, str(temporary), metadata=metadata)
        return
    destination.write(safetensors.torch.save(tensors, metadata=metadata))
    destination.flush()
