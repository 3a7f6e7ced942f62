"""Write captured tensors to safetensors files, atomically, and read them back piece by piece.

What goes into a file (keys, metadata, the version) is the contract of
:mod:`hookcli.fileformat`; this module moves bytes.

Files appear complete or not at all: bytes go to a temporary file in the same
folder that is renamed into place, and an existing file is only replaced when
``force`` is set.

:class:`FeatureFile` reads any safetensors file with numpy alone (no torch, so
``hookcli info`` and ``grid`` start fast): the header is checked against the
file's size up front, and data is read as exact byte ranges, one row (or a
few channels of one row) at a time, so memory stays near what is drawn.

:class:`Features` holds tensors in memory behind the same reading
interface, and as a read-only mapping: what :func:`hookcli.extract` returns
when asked for no output file.

>>> import os, tempfile, torch
>>> path = os.path.join(tempfile.mkdtemp(), "out.safetensors")
>>> write_safetensors({"x": torch.arange(6.0).reshape(2, 3)}, {"format": "1"}, path)
>>> with FeatureFile(path) as features:
...     features.shape("x"), features.read("x", 1).tolist()
([2, 3], [3.0, 4.0, 5.0])
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import struct
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import BinaryIO

from hookcli.errors import FeatureFileError, OutputExistsError, UsageProblem

__all__ = [
    "FeatureFile", "Features", "atomic_path", "check_writable", "format_bytes", "refuse_existing",
    "write_safetensors",
]


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


def refuse_existing(paths, *, force: bool) -> None:
    """Raise naming the first of ``paths`` that exists (and how many more), unless ``force``."""
    existing = [Path(p) for p in paths if Path(p).exists()]
    if existing and not force:
        more = f" and {len(existing) - 1} more" if len(existing) > 1 else ""
        raise OutputExistsError(f"'{existing[0]}'{more} already exist{'s' if not more else ''}",
                                hint="add --force to overwrite, or choose another folder with -o")


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


#: safetensors dtype name → numpy dtype string; BF16 is read as raw uint16 and widened to float32.
_NUMPY_DTYPES = {
    "F64": "<f8", "F32": "<f4", "F16": "<f2", "BF16": "<u2",
    "I64": "<i8", "I32": "<i4", "I16": "<i2", "I8": "i1",
    "U64": "<u8", "U32": "<u4", "U16": "<u2", "U8": "u1", "BOOL": "?",
}
_MAX_HEADER = 100 * 1024 * 1024


class FeatureFile:
    """A safetensors file (or ``-``: stdin, spooled to a temporary file) opened for reading.

    Raises :class:`FeatureFileError` for an empty, truncated or non-safetensors
    file. Use as a context manager, or call :meth:`close`.
    """

    def __init__(self, source: str | os.PathLike) -> None:
        self.name = "stdin" if str(source) == "-" else str(source)
        if str(source) == "-":
            self._handle = tempfile.TemporaryFile()
            shutil.copyfileobj(sys.stdin.buffer, self._handle, 1 << 20)
            self._handle.flush()
        else:
            try:
                self._handle = open(source, "rb")
            except FileNotFoundError:
                raise FeatureFileError(f"no such file: '{source}'", hint="check the path") from None
            except IsADirectoryError:
                raise FeatureFileError(f"'{source}' is a folder", hint="give a .safetensors file") from None
        try:
            self.size = os.fstat(self._handle.fileno()).st_size
            self._data_start, self.metadata, self._entries = self._read_header()
        except BaseException:
            self._handle.close()
            raise

    def _read_header(self):
        what = f"'{self.name}'"
        if self.size == 0:
            raise FeatureFileError(f"{what} is empty", hint="it holds no safetensors data")
        not_ours = f"{what} is not a safetensors file"
        if self.size < 8:
            raise FeatureFileError(not_ours, hint="it is too short to hold a header")
        (length,) = struct.unpack("<Q", os.pread(self._handle.fileno(), 8, 0))
        if length > _MAX_HEADER or 8 + length > self.size:
            raise FeatureFileError(not_ours, hint="its first 8 bytes do not give a header length that fits the file")
        try:
            header = json.loads(os.pread(self._handle.fileno(), length, 8))
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise FeatureFileError(not_ours, hint="its header is not JSON") from None
        if not isinstance(header, dict):
            raise FeatureFileError(not_ours, hint="its header is not a JSON object")
        metadata = header.pop("__metadata__", None) or {}
        data_start = 8 + length
        available = self.size - data_start
        entries = {}
        for key, info in header.items():
            try:
                dtype, shape, (begin, end) = info["dtype"], [int(n) for n in info["shape"]], info["data_offsets"]
            except (KeyError, TypeError, ValueError):
                raise FeatureFileError(not_ours, hint=f"the header entry for '{key}' is malformed") from None
            if dtype not in _NUMPY_DTYPES:
                raise FeatureFileError(f"tensor '{key}' in {what} has unsupported dtype {dtype}")
            if end > available:
                raise FeatureFileError(
                    f"{what} is truncated: tensor '{key}' ends at byte {data_start + end} but the file has {self.size}",
                    hint="the file was cut short; write it again",
                )
            entries[key] = (dtype, shape, begin)
        return data_start, metadata, {key: entries[key] for key in _key_order(entries, metadata)}

    def __enter__(self) -> FeatureFile:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def close(self) -> None:
        self._handle.close()

    def keys(self) -> list[str]:
        return list(self._entries)

    def dtype(self, key: str) -> str:
        return self._entries[key][0]

    def shape(self, key: str) -> list[int]:
        return list(self._entries[key][1])

    def nbytes(self, key: str) -> int:
        dtype, shape, _ = self._entries[key]
        return self.row_bytes(dtype, shape)

    @staticmethod
    def row_bytes(dtype: str, shape: Sequence[int]) -> int:
        """Bytes of a tensor of safetensors ``dtype`` and ``shape`` (pass a row's shape for a row)."""
        return math.prod(shape) * _itemsize(dtype)

    def read(self, key: str, index: int | None = None, part: slice | None = None):
        """Tensor ``key`` as a numpy array: all of it, row ``index``, or a slice ``part`` of that row's first axis.

        Only the bytes asked for are read. Floating types come back as float32
        (BF16 and F16 widened), integers and booleans as stored.
        """
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
                first, stop, step = part.indices(shape[0])
                stop = max(stop, first)
                start += first * math.prod(shape[1:]) * itemsize
                shape = [stop - first, *shape[1:]]
                part = slice(None, None, step) if step != 1 else None
        array = self._read_at(dtype, start, shape)
        return _widened(array[part] if part is not None else array, dtype)

    def read_rows(self, key: str, start: int, stop: int):
        """Rows ``start:stop`` of tensor ``key`` (clipped as a slice is), in one read, converted as :meth:`read`."""
        dtype, shape, begin = self._entries[key]
        first, last, _ = slice(start, stop).indices(shape[0])
        row = [*shape[1:]]
        offset = begin + first * math.prod(row) * _itemsize(dtype)
        return _widened(self._read_at(dtype, offset, [max(last - first, 0), *row]), dtype)

    def _read_at(self, dtype: str, offset: int, shape: list[int]):
        import numpy as np

        count = math.prod(shape)
        raw = os.pread(self._handle.fileno(), count * _itemsize(dtype), self._data_start + offset)
        return np.frombuffer(raw, dtype=_NUMPY_DTYPES[dtype], count=count).reshape(shape)


class Features(Mapping):
    """Tensors in memory: a read-only mapping key → tensor, and :class:`FeatureFile`'s reading interface.

    Values may be torch tensors or numpy arrays. ``metadata`` is the file's
    metadata (strings); :attr:`inputs` and :attr:`skipped` read it. ``facts``
    (:class:`~hookcli.fileformat.RunFacts`) and ``notes`` say what the run
    that made them learnt, when a run did.
    """

    _NAMES = {"float32": "F32", "float16": "F16", "float64": "F64", "bfloat16": "BF16", "int64": "I64",
              "int32": "I32", "int16": "I16", "int8": "I8", "uint8": "U8", "bool": "BOOL"}

    def __init__(self, tensors: Mapping, metadata: Mapping[str, str], *, name: str = "memory", facts=None,
                 notes: Sequence[str] = ()) -> None:
        self.name, self.metadata, self.facts, self.notes = name, dict(metadata), facts, tuple(notes)
        self._tensors = {key: tensors[key] for key in _key_order(tensors, self.metadata)}
        self.size = sum(self.nbytes(key) for key in self._tensors)

    def __getitem__(self, key: str):
        return self._tensors[key]

    def __iter__(self):
        return iter(self._tensors)

    def __len__(self) -> int:
        return len(self._tensors)

    def __repr__(self) -> str:
        shapes = ", ".join(f"{key}: {self.shape(key)}" for key in self._tensors)
        return f"<Features {self.name}: {shapes}>"

    @property
    def inputs(self) -> list[str]:
        """The input each row came from, in row order (from the ``inputs`` metadata)."""
        return json.loads(self.metadata.get("inputs", "[]"))

    @property
    def skipped(self) -> list[dict]:
        """Inputs left out by ``on_error="skip"``: ``{"input", "error"}`` each."""
        return json.loads(self.metadata.get("skipped", "[]"))

    def __enter__(self) -> Features:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def close(self) -> None:
        """Nothing to release: the tensors stay readable."""

    def dtype(self, key: str) -> str:
        name = str(self._tensors[key].dtype).removeprefix("torch.")
        return self._NAMES.get(name, name)

    def shape(self, key: str) -> list[int]:
        return list(self._tensors[key].shape)

    def nbytes(self, key: str) -> int:
        value = self._tensors[key]
        return value.nbytes if hasattr(value, "nbytes") else value.numel() * value.element_size()

    def read(self, key: str, index: int | None = None, part: slice | None = None):
        value = self._tensors[key]
        if index is not None:
            value = value[index]
            if part is not None:
                value = value[part]
        return _as_numpy(value)

    def read_rows(self, key: str, start: int, stop: int):
        return _as_numpy(self._tensors[key][start:stop])


def _as_numpy(value):
    """A tensor or array as :meth:`FeatureFile.read` returns it: floating types as float32, others as stored."""
    import numpy as np

    if hasattr(value, "detach"):  # a torch tensor
        value = value.detach().cpu()
        value = (value.float() if value.is_floating_point() else value).numpy()
    array = np.asarray(value)
    return array.astype("float32") if array.dtype.kind == "f" else array


def _widened(array, dtype: str):
    """Floating types as float32 (BF16 and F16 widened); integers and booleans as stored."""
    import numpy as np

    if dtype == "BF16":
        return (array.astype(np.uint32) << 16).view(np.float32)
    if dtype in ("F16", "F64"):
        return array.astype(np.float32)
    return array


def format_bytes(count: float) -> str:
    """``512 B``, ``3.1 MiB``, ``2.0 GiB``: sizes for people."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if count < 1024 or unit == "TiB":
            break
        count /= 1024
    else:
        unit = "TiB"
    return f"{int(count)} B" if unit == "B" else f"{count:.1f} {unit}"


def _key_order(keys, metadata: Mapping[str, str]) -> list[str]:
    """hookcli's layer order when the metadata gives it, then any other keys by name."""
    try:
        listed = [k for layer in json.loads(metadata.get("layers", "{}")).values() for k in layer["keys"]]
    except (ValueError, TypeError, KeyError, AttributeError):
        listed = []
    first = [k for k in listed if k in keys]
    return first + sorted(set(keys) - set(first))


def _itemsize(dtype: str) -> int:
    return 1 if dtype in ("I8", "U8", "BOOL") else int(_NUMPY_DTYPES[dtype][-1])
