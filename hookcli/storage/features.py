"""Read safetensors files back piece by piece, and hold features in memory behind the same interface.

What goes into a file (keys, metadata, the version) is the contract of
:mod:`hookcli.storage.fileformat`; :mod:`hookcli.storage.saving` writes the
bytes.

:class:`FeatureFile` reads any safetensors file with numpy alone (no torch, so
``hookcli info`` and ``grid`` start fast): the header is checked against the
file's size up front, and data is read as exact byte ranges, one row (or a
few channels of one row) at a time, so memory stays near what is drawn.

:class:`Features` holds tensors in memory behind the same reading
interface, and as a read-only mapping: what :func:`hookcli.extract` returns
when asked for no output file.

>>> import os, tempfile, torch
>>> from hookcli.storage.saving import write_safetensors
>>> path = os.path.join(tempfile.mkdtemp(), "out.safetensors")
>>> write_safetensors({"x": torch.arange(6.0).reshape(2, 3)}, {"format": "1"}, path)
>>> with FeatureFile(path) as features:
...     features.shape("x"), features.read("x", 1).tolist()
([2, 3], [3.0, 4.0, 5.0])
"""

from __future__ import annotations

import itertools
import json
import math
import os
import shutil
import struct
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, BinaryIO

import numpy as np

from hookcli.errors import FeatureFileError
from hookcli.files import NotRegularFile, open_regular
from hookcli.storage.fileformat import FLAT_FORMAT_VERSION, ROW_SHAPE, STORED_DTYPES, RunFacts
from hookcli.storage.reader import ReadingMapping
from hookcli.storage.recorded_run import listed_inputs, listed_skipped
from hookcli.storage.row_shapes import checked_row_shapes, companions, short

__all__ = [
    "FeatureFile",
    "Features",
]


#: safetensors dtype name → numpy dtype string; BF16 is read as raw uint16 and widened to float32.
_NUMPY_DTYPES = {
    "F64": "<f8",
    "F32": "<f4",
    "F16": "<f2",
    "BF16": "<u2",
    "I64": "<i8",
    "I32": "<i4",
    "I16": "<i2",
    "I8": "i1",
    "U64": "<u8",
    "U32": "<u4",
    "U16": "<u2",
    "U8": "u1",
    "BOOL": "?",
}
_MAX_HEADER = 100 * 1024 * 1024
#: Dimensions beyond these cannot be real (numpy's own limits are 64 axes and 2^63 elements).
_MAX_DIMS, _MAX_DIM = 32, 2**62
_DAMAGED = "it was not written whole by a safetensors writer; write it again"
#: The longest side an empty row of a flat ragged key may claim (no detections: ``[0, 4]``).
_EMPTY_ROW_SIDE = 1 << 16
#: Rows of a flat ragged key asked for padded may take this many times their values' bytes (and 64 MiB besides).
_PADDING_FACTOR = 64
#: How the images people give by mistake begin: JPEG, PNG, GIF, WebP (RIFF), TIFF, BMP.
_IMAGE_STARTS = (b"\xff\xd8\xff", b"\x89PNG", b"GIF8", b"RIFF", b"II*\x00", b"MM\x00*", b"BM")


def _checked_entry(key: str, info, what: str, data_start: int, size: int) -> tuple[str, list[int], int]:
    """``(dtype, shape, begin)`` of one header entry, once its claims agree with each other and with the file."""

    def whole(value) -> bool:
        return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= _MAX_DIM

    if not isinstance(info, dict):
        raise FeatureFileError(f"{what} is not a safetensors file", hint=f"the header entry for '{key}' is malformed")
    dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
    if not isinstance(dtype, str) or not isinstance(shape, list) or not isinstance(offsets, list):
        raise FeatureFileError(
            f"{what} is not a safetensors file",
            hint=f"the header entry for '{key}' lacks a dtype, shape or data_offsets",
        )
    if dtype not in _NUMPY_DTYPES:
        raise FeatureFileError(
            f"tensor '{key}' in {what} has unsupported dtype {dtype[:20]}",
            hint=f"hookcli reads {', '.join(_NUMPY_DTYPES)}",
        )
    if (
        len(shape) > _MAX_DIMS
        or not all(whole(n) for n in shape)
        or math.prod(n for n in shape if n) * _itemsize(dtype) > _MAX_DIM
    ):  # numpy could not even shape it
        raise FeatureFileError(
            f"{what} is damaged: tensor '{key}' has an impossible shape {short(shape)}",
            hint=f"dimensions are whole numbers from 0 to 2^62, at most {_MAX_DIMS} of them, "
            "whose non-zero product is under 2^62 bytes",
        )
    if len(offsets) != 2 or not all(whole(n) for n in offsets) or offsets[0] > offsets[1]:
        raise FeatureFileError(
            f"{what} is damaged: tensor '{key}' has impossible data_offsets {short(offsets)}", hint=_DAMAGED
        )
    begin, end = offsets
    claimed = math.prod(shape) * _itemsize(dtype)
    if end - begin != claimed:
        raise FeatureFileError(
            f"{what} is damaged: tensor '{key}' of shape {short(shape)} {dtype} needs {claimed} bytes "
            f"but its data_offsets span {end - begin}",
            hint=_DAMAGED,
        )
    if data_start + end > size:
        raise FeatureFileError(
            f"{what} is truncated: tensor '{key}' ends at byte {data_start + end} but the file has {size}",
            hint="the file was cut short; write it again",
        )
    return dtype, shape, begin


class _RepeatedKey(ValueError):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _without_repeats(pairs: list[tuple[str, object]]) -> dict:
    """A JSON object as a dict, refusing a key given twice (which would leave one of two claims unread)."""
    found = dict(pairs)
    if len(found) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _RepeatedKey(key)
            seen.add(key)
    return found


class FeatureFile(ReadingMapping):
    """A safetensors file (or ``-``: stdin, spooled to a temporary file) opened for reading.

    Raises :class:`FeatureFileError` for an empty, truncated or non-safetensors
    file, or one that is not a regular file (with ``follow_links=False``, a
    symbolic link too: shards are read so). Use as a context manager, or call
    :meth:`close`. A read-only mapping too (:class:`~hookcli.storage.reader.ReadingMapping`):
    ``file["layer3"]`` reads that tensor whole.
    """

    def __init__(self, source: str | os.PathLike, *, follow_links: bool = True) -> None:
        self.name = "stdin" if str(source) == "-" else str(source)
        self._handle: BinaryIO
        self.metadata: dict[str, str]
        if str(source) == "-":
            self._handle = tempfile.TemporaryFile()
            shutil.copyfileobj(sys.stdin.buffer, self._handle, 1 << 20)
            self._handle.flush()
        else:
            try:
                self._handle = open_regular(source, follow_links=follow_links)
            except FileNotFoundError:
                raise FeatureFileError(f"no such file: '{source}'", hint="check the path") from None
            except NotRegularFile as err:
                raise FeatureFileError(str(err), hint="give a .safetensors file") from None
        try:
            self.size = os.fstat(self._handle.fileno()).st_size
            self._data_start, self.metadata, self._entries = self._read_header()
            #: Ragged keys stored without padding (format 3): key -> (row shapes, offsets in values, largest row).
            self._flat: dict[str, tuple[np.ndarray, np.ndarray, list[int]]] | None = (
                {} if self.metadata.get("format") == FLAT_FORMAT_VERSION else None
            )
            self._row_shapes = companions(
                self._entries,
                lambda key: self._entries[key][:2],
                f"'{self.name}' is damaged",
                flat=self._flat is not None,
            )
            self._shape_tables: dict = {}
        except BaseException:
            self._handle.close()
            raise

    def _read_header(self) -> tuple[int, dict[str, str], dict[str, tuple[str, list[int], int]]]:
        what = f"'{self.name}'"
        if self.size == 0:
            raise FeatureFileError(f"{what} is empty", hint="it holds no safetensors data")
        not_ours = f"{what} is not a safetensors file"
        if self.size < 8:
            raise FeatureFileError(not_ours, hint="it is too short to hold a header")
        first = os.pread(self._handle.fileno(), 8, 0)
        (length,) = struct.unpack("<Q", first)
        if length > _MAX_HEADER or 8 + length > self.size:
            if first.startswith(_IMAGE_STARTS):
                raise FeatureFileError(
                    f"{what} is an image, not a safetensors file",
                    hint="hookcli extract makes features of it; grid, report and info read what extract writes",
                )
            raise FeatureFileError(not_ours, hint="its first 8 bytes do not give a header length that fits the file")
        try:
            header = json.loads(os.pread(self._handle.fileno(), length, 8), object_pairs_hook=_without_repeats)
        except _RepeatedKey as repeated:
            raise FeatureFileError(not_ours, hint=f"its header names '{repeated.key}' twice") from None
        except (UnicodeDecodeError, ValueError, RecursionError):
            raise FeatureFileError(not_ours, hint="its header is not JSON") from None
        if not isinstance(header, dict):
            raise FeatureFileError(not_ours, hint="its header is not a JSON object")
        metadata = header.pop("__metadata__", None) or {}
        if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
            raise FeatureFileError(not_ours, hint="its __metadata__ is not a map of strings")
        data_start = 8 + length
        entries = {key: _checked_entry(key, info, what, data_start, self.size) for key, info in header.items()}
        spans = sorted(
            (begin, begin + self.row_bytes(dtype, shape), key) for key, (dtype, shape, begin) in entries.items()
        )
        for (_, end, first), (begin, _, second) in zip(spans, spans[1:]):
            if begin < end:
                raise FeatureFileError(
                    f"{what} is damaged: the data of tensors '{first}' and '{second}' overlap", hint=_DAMAGED
                )
        return data_start, metadata, {key: entries[key] for key in _key_order(entries, metadata)}

    def __enter__(self) -> FeatureFile:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        self._handle.close()

    def keys(self) -> list[str]:  # type: ignore[override]  # a list, as every reader's
        """The stored tensors' keys, without the ``@shape`` companions of ragged ones (see :meth:`row_shape`)."""
        return [key for key in self._entries if key not in self._row_shapes.values()]

    def ragged(self, key: str) -> bool:
        """Whether the rows of ``key`` have shapes of their own (stored padded, with a ``@shape`` companion)."""
        return key in self._row_shapes

    def row_shape(self, key: str, index: int) -> list[int]:
        """Row ``index``'s own shape: from the ``@shape`` companion when ``key`` is ragged, else the stored one."""
        if key not in self._row_shapes:
            return self.shape(key)[1:]
        if self._flat is not None:
            return self._flat_rows(key)[0][index].tolist()
        if key not in self._shape_tables:  # read and checked once: readers ask for every row's, some many times
            self._shape_tables[key] = checked_row_shapes(self, key, self._raw_read(self._row_shapes[key]))
        return self._shape_tables[key][index].tolist()

    def _flat_rows(self, key: str) -> tuple[np.ndarray, np.ndarray, list[int]]:
        """A flat ragged key's row shapes, where each row's values begin (and the end), and its largest row; read
        and checked once: the shapes must account for every stored value."""
        if key not in self._flat:  # type: ignore[operator]
            table = np.asarray(self._raw_read(self._row_shapes[key]), dtype=np.int64)
            stored = self._entries[key][1][0]
            # A dimension beyond the stored values (or, for an empty row, beyond _EMPTY_ROW_SIDE) is damage: it would
            # ask for a padded tensor of any size. Sizes are then summed as whole numbers, which no shape overflows.
            empty = (table == 0).any(axis=1)
            bound = np.where(empty, max(stored, _EMPTY_ROW_SIDE), max(stored, 1))
            wrong = np.flatnonzero(((table < 0) | (table > bound[:, None])).any(axis=1))
            if wrong.size:
                row = int(wrong[0])
                raise FeatureFileError(
                    f"'{self.name}' is damaged: row {row} of '{key}' claims shape {table[row].tolist()}, and "
                    f"'{key}' holds {stored} values",
                    hint=_DAMAGED,
                )
            offsets = np.array([0, *itertools.accumulate(math.prod(row) for row in table.tolist())], dtype=object)
            if offsets[-1] != stored:
                raise FeatureFileError(
                    f"'{self.name}' is damaged: the row shapes in '{key}{ROW_SHAPE}' account for {offsets[-1]} "
                    f"values, and '{key}' holds {stored}",
                    hint=_DAMAGED,
                )
            offsets = offsets.astype(np.int64)
            largest = table.max(axis=0).tolist() if len(table) else [0] * table.shape[1]
            self._flat[key] = (table, offsets, largest)  # type: ignore[index]
        return self._flat[key]  # type: ignore[index]

    def dtype(self, key: str) -> str:
        return self._entries[key][0]

    def shape(self, key: str) -> list[int]:
        """``[rows, …]``; a ragged key's padded to its largest row (stored without padding in format 3)."""
        if self._flat is not None and key in self._row_shapes:
            table, _, largest = self._flat_rows(key)
            return [len(table), *largest]
        return list(self._entries[key][1])

    def nbytes(self, key: str) -> int:
        dtype, shape, _ = self._entries[key]
        return self.row_bytes(dtype, shape)

    @staticmethod
    def row_bytes(dtype: str, shape: Sequence[int]) -> int:
        """Bytes of a tensor of safetensors ``dtype`` and ``shape`` (pass a row's shape for a row)."""
        return math.prod(shape) * _itemsize(dtype)

    def read(self, key: str, index: int | None = None, part: slice | None = None) -> np.ndarray:
        """Tensor ``key`` as a numpy array: all of it, row ``index``, or a slice ``part`` of that row's first axis.

        Only the bytes asked for are read. F64 comes back as float64, other
        floating types as float32 (BF16 and F16 widened), integers and
        booleans as stored. A row of a ragged key comes back in its own shape
        (the whole tensor, and :meth:`read_rows`, padded with zeros).
        """
        if self._flat is not None and key in self._row_shapes:
            return self._flat_read(key, index, part)
        if index is not None and key in self._row_shapes:
            return _own_part(self._raw_read(key, index), self.row_shape(key, index), part)
        return self._raw_read(key, index, part)

    def _flat_read(self, key: str, index: int | None, part: slice | None) -> np.ndarray:
        table, offsets, _ = self._flat_rows(key)
        if index is None:
            return self.read_rows(key, 0, len(table))
        if not -len(table) <= index < len(table):
            raise IndexError(f"row {index} out of range for '{key}' with {len(table)} rows")
        index %= len(table)
        dtype, _, begin = self._entries[key]
        row = self._read_at(dtype, begin + int(offsets[index]) * _itemsize(dtype), table[index].tolist())
        return _widened(row[part] if part is not None else row, dtype)

    def _raw_read(self, key: str, index: int | None = None, part: slice | None = None) -> np.ndarray:
        dtype, shape, begin = self._entries[key]
        itemsize = _itemsize(dtype)
        start, shape = begin, list(shape)
        if index is not None:
            rows = shape[0] if shape else 0
            if not -rows <= index < rows:
                raise IndexError(f"row {index} out of range for '{key}' with {rows} rows")
            shape = shape[1:]
            start += (index % rows) * math.prod(shape) * itemsize
            if part is not None and shape:
                # Read the rows from the lowest chosen to the highest; a step (backwards too) is taken from them.
                chosen = range(*part.indices(shape[0]))
                low = min(chosen[0], chosen[-1]) if chosen else 0
                start += low * math.prod(shape[1:]) * itemsize
                shape = [abs(chosen[-1] - chosen[0]) + 1 if chosen else 0, *shape[1:]]
                part = slice(None, None, chosen.step) if chosen and chosen.step != 1 else None
        array = self._read_at(dtype, start, shape)
        return _widened(array[part] if part is not None else array, dtype)

    def read_rows(self, key: str, start: int, stop: int) -> np.ndarray:
        """Rows ``start:stop`` of tensor ``key`` (clipped as a slice is), in one read, converted as :meth:`read`."""
        if self._flat is not None and key in self._row_shapes:
            return self._flat_rows_padded(key, start, stop)
        dtype, shape, begin = self._entries[key]
        first, last, _ = slice(start, stop).indices(shape[0])
        row = [*shape[1:]]
        offset = begin + first * math.prod(row) * _itemsize(dtype)
        return _widened(self._read_at(dtype, offset, [max(last - first, 0), *row]), dtype)

    def _flat_rows_padded(self, key: str, start: int, stop: int) -> np.ndarray:
        """Rows ``start:stop`` of a flat ragged key in one read, padded with zeros to the key's largest row."""
        table, offsets, largest = self._flat_rows(key)
        dtype, _, begin = self._entries[key]
        first, last, _ = slice(start, stop).indices(len(table))
        last = max(last, first)
        values = self._read_at(
            dtype, begin + int(offsets[first]) * _itemsize(dtype), [int(offsets[last] - offsets[first])]
        )
        padded_bytes = (last - first) * math.prod(largest) * values.itemsize
        if padded_bytes > _PADDING_FACTOR * values.nbytes + (64 << 20):
            raise FeatureFileError(
                f"rows {first} to {last - 1} of '{key}' in '{self.name}' padded to {largest} would take "
                f"{padded_bytes:,} bytes for {values.nbytes:,} of values",
                hint="read the rows one at a time, each in its own shape (reader.row(key, i))",
            )
        padded = np.zeros((last - first, *largest), dtype=values.dtype)
        for number in range(first, last):
            shape = table[number].tolist()
            piece = values[offsets[number] - offsets[first] : offsets[number + 1] - offsets[first]]
            within: tuple[int | slice, ...] = (number - first, *(slice(0, n) for n in shape))
            padded[within] = piece.reshape(shape)
        return _widened(padded, dtype)

    def _read_at(self, dtype: str, offset: int, shape: list[int]) -> np.ndarray:
        count = math.prod(shape)
        buffer = bytearray(count * _itemsize(dtype))  # read into memory of our own: the array is writable
        view, done = memoryview(buffer), 0
        while done < len(buffer):
            got = os.preadv(self._handle.fileno(), [view[done:]], self._data_start + offset + done)
            if got == 0:
                raise FeatureFileError(f"'{self.name}' was cut short while it was read", hint=_DAMAGED)
            done += got
        return np.frombuffer(buffer, dtype=_NUMPY_DTYPES[dtype], count=count).reshape(shape)


def _own_part(row, shape: Sequence[int], part: slice | None):
    """A padded row cut to its own ``shape``, then to ``part`` of its first axis."""
    row = row[tuple(slice(0, n) for n in shape)]
    return row[part] if part is not None else row


class Features(Mapping[str, Any]):
    """Tensors in memory: a read-only mapping key → tensor, and :class:`FeatureFile`'s reading interface.

    Values may be torch tensors or numpy arrays. ``metadata`` is the file's
    metadata (strings); :attr:`inputs` and :attr:`skipped` read it. ``facts``
    (:class:`~hookcli.storage.fileformat.RunFacts`) and ``notes`` say what the run
    that made them learnt, when a run did.
    """

    def __init__(
        self,
        tensors: Mapping[str, Any],
        metadata: Mapping[str, str],
        *,
        name: str = "memory",
        facts: RunFacts | None = None,
        notes: Sequence[str] = (),
    ) -> None:
        self.name, self.metadata, self.facts, self.notes = name, dict(metadata), facts, tuple(notes)
        self._tensors = {key: tensors[key] for key in _key_order(tensors, self.metadata)}
        self.size = sum(self.nbytes(key) for key in self._tensors)
        self._row_shapes = companions(
            self._tensors, lambda key: (self.dtype(key), self.shape(key)), f"'{name}' is damaged"
        )
        self._keys = [key for key in self._tensors if key not in self._row_shapes.values()]
        self._shape_tables: dict = {}

    def __getitem__(self, key: str) -> Any:
        return self._tensors[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._keys)

    def keys(self) -> list[str]:  # type: ignore[override]  # a list, as every reader's (Mapping's is a view)
        """The tensors' keys, without the ``@shape`` companions of ragged ones (``features[key + "@shape"]`` works)."""
        return list(self._keys)

    def ragged(self, key: str) -> bool:
        """Whether the rows of ``key`` have shapes of their own (held padded, with a ``@shape`` companion)."""
        return key in self._row_shapes

    def row_shape(self, key: str, index: int) -> list[int]:
        """Row ``index``'s own shape (see :meth:`FeatureFile.row_shape`)."""
        if key not in self._row_shapes:
            return self.shape(key)[1:]
        if key not in self._shape_tables:
            self._shape_tables[key] = checked_row_shapes(self, key, _as_numpy(self._tensors[self._row_shapes[key]]))
        return self._shape_tables[key][index].tolist()

    def row(self, key: str, index: int) -> Any:
        """Row ``index`` of ``key`` as the tensor it is, cut to its own shape when ``key`` is ragged."""
        value = self._tensors[key][index]
        return value[tuple(slice(0, n) for n in self.row_shape(key, index))] if key in self._row_shapes else value

    def __repr__(self) -> str:
        shapes = ", ".join(f"{key}: {self.shape(key)}" for key in self._tensors)
        return f"<Features {self.name}: {shapes}>"

    @property
    def inputs(self) -> list[str]:
        """The input each row came from, in row order (from the ``inputs`` metadata)."""
        return listed_inputs(self.metadata, self.name)

    @property
    def skipped(self) -> list[dict]:
        """Inputs left out by ``on_error="skip"``: ``{"input", "error"}`` each."""
        return listed_skipped(self.metadata, self.name)

    def __enter__(self) -> Features:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Nothing to release: the tensors stay readable."""

    def dtype(self, key: str) -> str:
        name = str(self._tensors[key].dtype).removeprefix("torch.")
        return STORED_DTYPES.get(name, name)

    def shape(self, key: str) -> list[int]:
        return list(self._tensors[key].shape)

    def nbytes(self, key: str) -> int:
        value = self._tensors[key]
        return value.nbytes if hasattr(value, "nbytes") else value.numel() * value.element_size()

    def read(self, key: str, index: int | None = None, part: slice | None = None) -> np.ndarray:
        value = self._tensors[key]
        if index is not None:  # sliced as an array: a tensor takes no negative step
            return _own_part(_as_numpy(value[index]), self.row_shape(key, index), part)
        return _as_numpy(value)

    def read_rows(self, key: str, start: int, stop: int) -> np.ndarray:
        return _as_numpy(self._tensors[key][start:stop])


def _as_numpy(value: Any) -> np.ndarray:
    """A tensor or array as :meth:`FeatureFile.read` returns it: float64 kept, other floating types as float32."""
    if hasattr(value, "detach"):  # a torch tensor (so torch is loaded already)
        value = value.detach().cpu()
        wide = value.is_floating_point() and str(value.dtype) != "torch.float64"
        value = (value.float() if wide else value).numpy()
    array = np.asarray(value)
    return array.astype("float32") if array.dtype.kind == "f" and array.dtype != np.float64 else array


def _widened(array: np.ndarray, dtype: str) -> np.ndarray:
    """BF16 and F16 widened to float32; F64 (whose range float32 lacks), F32, integers and booleans as stored."""
    if dtype == "BF16":
        return (array.astype(np.uint32) << 16).view(np.float32)
    if dtype == "F16":
        return array.astype(np.float32)
    return array


def _key_order(keys, metadata: Mapping[str, str]) -> list[str]:
    """hookcli's layer order when the metadata gives it, then any other keys by name."""
    try:
        listed = [k for layer in json.loads(metadata.get("layers", "{}")).values() for k in layer["keys"]]
    except (ValueError, TypeError, KeyError, AttributeError, RecursionError):
        listed = []
    first = [k for k in listed if k in keys]
    return first + sorted(set(keys) - set(first))


def _itemsize(dtype: str) -> int:
    return 1 if dtype in ("I8", "U8", "BOOL") else int(_NUMPY_DTYPES[dtype][-1])
