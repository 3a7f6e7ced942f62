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

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, Protocol, Self, runtime_checkable

from hookcli.storage.recorded_run import listed_inputs, listed_skipped

if TYPE_CHECKING:
    import numpy as np

__all__ = ["CheckedFile", "FeatureReader", "ReadingMapping"]


@runtime_checkable
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


class ReadingMapping(Mapping[str, Any]):
    """A reader as a read-only mapping: ``reader[key]`` reads tensor ``key`` whole when asked (a numpy array;
    ``key + "@shape"`` gives a ragged key's row shapes), iteration gives :meth:`~FeatureReader.keys`, and
    :attr:`inputs`, :attr:`skipped` and :meth:`row` read the rest. The readers of files and folders share it, so
    that ``open_features(path)["layer3"]`` works as the in-memory result's ``features["layer3"]`` does.
    """

    metadata: Mapping[str, str]
    name: str

    def keys(self) -> list[str]:  # type: ignore[override]  # a list, as every reader's (Mapping's is a view)
        raise NotImplementedError

    def read(self, key: str, index: int | None = None, part: slice | None = None) -> np.ndarray:
        raise NotImplementedError

    def __getitem__(self, key: str) -> np.ndarray:
        return self.read(key)

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys())

    def __len__(self) -> int:
        return len(self.keys())

    def __contains__(self, key: object) -> bool:
        return key in self.keys()

    def __bool__(self) -> bool:
        return True  # an open reader is something, whatever it holds

    __hash__ = object.__hash__

    def __eq__(self, other: object) -> bool:
        return self is other  # not by value: comparing would read every tensor

    def row(self, key: str, index: int) -> np.ndarray:
        """Row ``index`` of ``key`` in its own shape (a ragged key's without its padding)."""
        return self.read(key, index)

    @property
    def inputs(self) -> list[str]:
        """The input each row came from, in row order (from the ``inputs`` metadata)."""
        return listed_inputs(self.metadata, self.name)

    @property
    def skipped(self) -> list[dict[str, Any]]:
        """Inputs left out by ``on_error="skip"``: ``{"input", "error"}`` each."""
        return listed_skipped(self.metadata, self.name)


class CheckedFile:
    """A file of a kind of its own read back and checked (a statistics file, a comparison file): the reader it is
    read with (``features``), and its ``name`` and ``metadata``."""

    features: FeatureReader

    @property
    def name(self) -> str:
        return self.features.name

    @property
    def metadata(self) -> Mapping[str, str]:
        return self.features.metadata
