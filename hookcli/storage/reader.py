"""What every feature reader offers: :class:`FeatureReader`.

A safetensors file (:class:`~hookcli.storage.features.FeatureFile`), tensors
in memory (:class:`~hookcli.storage.features.Features`) and a shard folder
(:class:`~hookcli.storage.shards.ShardedFeatures`, what
:func:`~hookcli.storage.shards.open_features` opens for a folder) are read
alike: ``grid``, ``report`` and ``info`` take any of them.

>>> import numpy as np
>>> from hookcli.storage.features import Features
>>> def rows(features: FeatureReader, key: str) -> int:
...     return features.shape(key)[0]
>>> rows(Features({"x": np.zeros((2, 3), dtype="float32")}, {}), "x")
2
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol, Self

if TYPE_CHECKING:
    import numpy as np

__all__ = ["FeatureReader"]


class FeatureReader(Protocol):
    """Tensors read by key, whole or a row at a time, as numpy arrays, and the metadata stored with them.

    A ragged key's rows have shapes of their own: they are stored padded to
    the largest, with a ``@shape`` companion key that :meth:`keys` leaves out.
    Use as a context manager, or call :meth:`close`.
    """

    @property
    def name(self) -> str:
        """Where the tensors come from: a path, ``stdin`` or ``memory``."""
        ...

    @property
    def size(self) -> int:
        """The bytes the tensors take (a file's or a folder's shards' size on disk)."""
        ...

    @property
    def metadata(self) -> Mapping[str, str]:
        """The stored metadata: strings, structured values as JSON (:mod:`hookcli.storage.fileformat`)."""
        ...

    def keys(self) -> list[str]:
        """The tensors' keys, without the ``@shape`` companions of ragged ones."""
        ...

    def ragged(self, key: str) -> bool:
        """Whether the rows of ``key`` have shapes of their own."""
        ...

    def row_shape(self, key: str, index: int) -> list[int]:
        """Row ``index``'s own shape (a ragged key's from its ``@shape`` companion)."""
        ...

    def dtype(self, key: str) -> str:
        """The safetensors dtype name of ``key`` (``F32``, ``BF16``, ``I64``…)."""
        ...

    def shape(self, key: str) -> list[int]:
        """The shape of ``key``, rows first (a ragged key's padded to its largest row)."""
        ...

    def nbytes(self, key: str) -> int:
        """The bytes ``key`` takes, as stored."""
        ...

    def read(self, key: str, index: int | None = None, part: slice | None = None) -> np.ndarray:
        """Tensor ``key``: all of it, row ``index`` (in its own shape), or a slice ``part`` of that row's first
        axis. Floating types other than float64 come back as float32."""
        ...

    def read_rows(self, key: str, start: int, stop: int) -> np.ndarray:
        """Rows ``start:stop`` of ``key`` (clipped as a slice is; a ragged key's padded), converted as :meth:`read`."""
        ...

    def close(self) -> None:
        """Release what reading holds (an open file); nothing for tensors in memory."""
        ...

    def __enter__(self) -> Self: ...

    def __exit__(self, *exc_info: object) -> None: ...
