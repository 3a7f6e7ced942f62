"""Where a run's rows go: one implementation per kind of output of one interface
(:class:`~hookcli.storage.rows_writer.RowsWriter`).

A writer is told the run (its :class:`~hookcli.storage.fileformat.RunRecord` and
inputs), then:

- ``begin(batch_size)`` returns the batches to compute, in order (an
  iterable of lists of input indices), or None when nothing is left;
  ``done`` then says how many inputs an earlier run (or other processes, for
  a shard folder) did, and ``kept`` where their work is when that is not the
  output itself (None: it is);
- ``add(batch)`` takes each :class:`~hookcli.run.settings.Batch` in that order;
- ``finish()`` completes the output and returns what the run returns (the
  features in memory, or the path written); ``written`` then lists the paths
  to report, in order; ``complete`` says whether the output then held every
  input (a shard folder others still write may not), ``finisher`` whether this
  process completed it;
- ``abort()`` gives up after a failure, leaving nothing half-written.

Implementations: :class:`MemoryWriter` (``output=None``), :class:`FileWriter`
(one ``.safetensors`` file, written atomically), :class:`StdoutWriter` (``-``),
:class:`FolderWriter` (shards and an index, resumable, see
:mod:`hookcli.storage.shards`); :class:`hookcli.pictures.cams.CamOverlays` draws
each CAM over the image the model saw and hands the rows on to one of them.

Rows are gathered by one :class:`RowBuffer`: tensors allocated once, for a
whole file or for one shard.

>>> buffer = RowBuffer(capacity=3)
>>> buffer.add({"x": __import__("torch").ones(2, 4)}, slice(0, 2), ["/photos/a.jpg", "/photos/b.jpg"])
>>> buffer.tensors()["x"].shape, buffer.inputs
(torch.Size([2, 4]), ['/photos/a.jpg', '/photos/b.jpg'])
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, BinaryIO, Protocol, TypeAlias

import torch

from hookcli.errors import MemoryLimitError, UsageProblem
from hookcli.files import check_writable, format_bytes, hold_output, release_output
from hookcli.inputs.archives import file_stamp, input_files, input_name
from hookcli.storage import fileformat
from hookcli.storage.features import Features
from hookcli.storage.fileformat import ROW_SHAPE, RunFacts, RunRecord
from hookcli.storage.saving import write_safetensors
from hookcli.storage.shard_writer import ShardWriter

__all__ = [
    "FileWriter",
    "FolderWriter",
    "MemoryWriter",
    "RowBuffer",
    "StdoutWriter",
    "auto_shard_size",
    "row_bytes",
]

#: Shard size chosen when none is given (:func:`auto_shard_size`): at most about this many bytes of features per
#: shard, and this many rows; at least this many shards for a run of that many batches.
AUTO_SHARD_BYTES = 128 * 1024 * 1024
MAX_AUTO_SHARD_ROWS = 10_000
MIN_AUTO_SHARDS = 8

_Rows: TypeAlias = Mapping[str, torch.Tensor | list[torch.Tensor]]  # by key: batch-first tensors, or ragged rows


class _Batch(Protocol):
    """What a writer reads of a :class:`~hookcli.run.settings.Batch` (the run layer is above storage)."""

    @property
    def indices(self) -> Sequence[int]: ...

    @property
    def features(self) -> _Rows: ...

    @property
    def failures(self) -> Sequence[tuple[int, str]]: ...

    @property
    def targets(self) -> Sequence[Any] | None: ...

    @property
    def facts(self) -> RunFacts | None: ...


def row_bytes(features: _Rows) -> int:
    """Bytes one row of these batch-first tensors (or lists of ragged rows) takes (0 for none)."""
    return sum(value[0].numel() * value[0].element_size() for value in features.values())


class RowBuffer:
    """Rows of a file (or of one shard) in tensors allocated once for ``capacity`` rows, with their inputs.

    A feature given as a list of row tensors (ragged rows, each of its own
    shape) is held as the rows themselves, and :meth:`tensors` gives it
    without padding (one 1-D tensor of the rows' values, one after the other)
    or padded with zeros to the largest row, with its ``<key>@shape``
    companion (:data:`~hookcli.storage.fileformat.ROW_SHAPE`) either way.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._tensors: dict[str, torch.Tensor] = {}
        self._ragged: dict[str, list[torch.Tensor]] = {}  # key -> its rows, each as computed
        self._order: list[str] = []  # the keys as they first came
        self.inputs: list[str] = []
        # hookcli.storage.fileformat.ROW_DETAILS of rows cut from videos, or pairs
        self.details: dict[str, list[list[int] | str]] = {}
        self.skipped: list[dict[str, str]] = []
        self.targets: list[Any] = []  # each row's, as the run describes them

    def add(
        self,
        features: _Rows,
        rows: slice,
        inputs: Sequence[str | os.PathLike[str]],
        targets: Sequence[Any] | None = None,
    ) -> None:
        """Append ``rows`` of batch-first ``features``, the inputs they came from and (gradient runs) their targets."""
        start = len(self.inputs)
        for key, value in features.items():
            if key not in self._order:
                self._order.append(key)
            if isinstance(value, list) != (key in self._ragged) and (key in self._tensors or key in self._ragged):
                form = "rows of their own shapes" if isinstance(value, list) else "one tensor"
                raise ValueError(f"'{key}' came as {form} after coming the other way: a run gives each key one form")
            if isinstance(value, list):
                self._ragged.setdefault(key, []).extend(value[rows])
                continue
            if key not in self._tensors:
                self._tensors[key] = torch.empty((self.capacity, *value.shape[1:]), dtype=value.dtype)
            part = value[rows]
            self._tensors[key][start : start + len(part)] = part
        self.inputs.extend(input_name(p) for p in inputs)
        for item in inputs:
            if hasattr(item, "frames"):
                self.details.setdefault("frames", []).append(list(item.frames))
            if hasattr(item, "second"):
                self.details.setdefault("second_inputs", []).append(input_name(item.second))
        self.targets.extend(targets or ())

    def skip(self, path: str | os.PathLike[str], error: str) -> None:
        self.skipped.append({"input": input_name(path), "error": error})

    def tensors(self, *, flat: bool = True) -> dict[str, torch.Tensor]:
        """The rows added so far, by key; a ragged key's ``@shape`` companion right after it. ``flat``: a ragged
        key's rows one after the other in one 1-D tensor (what files store); else padded to the largest row."""
        found: dict[str, torch.Tensor] = {}
        for key in self._order:
            if key in self._tensors:
                found[key] = self._tensors[key][: len(self.inputs)]
                continue
            rows = self._ragged[key][: len(self.inputs)]
            found[key] = _flattened(rows) if flat else _padded(rows)
            found[key + ROW_SHAPE] = torch.tensor([list(row.shape) for row in rows], dtype=torch.int64).reshape(
                len(rows), rows[0].dim() if rows else 0
            )
        return found


def _flattened(rows: Sequence[torch.Tensor]) -> torch.Tensor:
    return torch.cat([row.reshape(-1) for row in rows]) if rows else torch.zeros(0)


def _padded(rows: Sequence[torch.Tensor]) -> torch.Tensor:
    largest = [max(sizes) for sizes in zip(*(row.shape for row in rows))]
    held = torch.zeros((len(rows), *largest), dtype=rows[0].dtype)
    for number, row in enumerate(rows):
        within: tuple[int | slice, ...] = (number, *(slice(0, n) for n in row.shape))
        held[within] = row
    return held


class _WholeWriter:
    """Every row in memory, then one delivery: the base of the single-output writers."""

    def __init__(self, record: RunRecord, paths: Sequence[str | os.PathLike[str]]) -> None:
        self.record, self.paths = record, paths
        self.rows: RowBuffer | None = None
        self.facts: RunFacts | None = None
        self.skipped: list[dict[str, str]] = []
        self.written: list[str | Path] = []

    flat = True  # ragged keys are stored without padding (format 3); results in memory hold them padded
    done = 0  # inputs an earlier run did
    kept = None  # where their work is: the output itself
    complete = True  # the output holds every input once finish() returns
    finisher = True  # this process completed the output (and so draws its pictures)

    def begin(self, batch_size: int) -> Iterator[list[int]]:
        return (list(range(i, min(i + batch_size, len(self.paths)))) for i in range(0, len(self.paths), batch_size))

    @property
    def inputs_done(self) -> int:
        return 0 if self.rows is None else len(self.rows.inputs)

    @property
    def has_rows(self) -> bool:
        return self.rows is not None and bool(self.rows.inputs)

    def add(self, batch: _Batch) -> None:
        if batch.indices:
            if self.rows is None:
                _check_fits_in_memory(batch.features, len(self.paths))
                self.rows = RowBuffer(len(self.paths))
            self.rows.add(batch.features, slice(None), [self.paths[i] for i in batch.indices], batch.targets)
            self.facts = batch.facts
        self.skipped.extend({"input": input_name(self.paths[i]), "error": e} for i, e in batch.failures)

    def finish(self) -> Features | Path:
        assert self.rows is not None and self.facts is not None, "finished after rows were added (has_rows)"
        tensors = self.rows.tensors(flat=self.flat)
        run = fileformat.run_metadata(self.record, self.facts, keys=list(tensors), flat=self.flat)
        metadata = fileformat.file_metadata(
            run, inputs=self.rows.inputs, skipped=self.skipped, targets=self.rows.targets, details=self.rows.details
        )
        return self._deliver(tensors, metadata)

    def _deliver(self, tensors: Mapping[str, torch.Tensor], metadata: Mapping[str, str]) -> Features | Path:
        raise NotImplementedError

    def abort(self) -> None:
        self.rows = None


class MemoryWriter(_WholeWriter):
    """Returns the rows as :class:`~hookcli.storage.features.Features`: nothing is written."""

    flat = False

    def _deliver(self, tensors: Mapping[str, torch.Tensor], metadata: Mapping[str, str]) -> Features:
        return Features(tensors, metadata, facts=self.facts)


class FileWriter(_WholeWriter):
    """One safetensors file, written atomically; an existing file is replaced only with ``force``."""

    def __init__(
        self,
        record: RunRecord,
        paths: Sequence[str | os.PathLike[str]],
        path: str | os.PathLike[str],
        *,
        force: bool = False,
    ) -> None:
        super().__init__(record, paths)
        self.path, self.force = os.fspath(path), force
        self._held: int | None = None

    def begin(self, batch_size: int) -> Iterator[list[int]]:
        """Mark the output as this process's (:func:`~hookcli.files.hold_output`) before any work: a second run
        writing the same file stops at once."""
        check_writable(self.path, force=self.force)  # first: its errors say what is wrong with the name
        self._held = hold_output(self.path)
        check_writable(self.path, force=self.force)  # again, held: a run that finished meanwhile wrote it
        return super().begin(batch_size)

    def _deliver(self, tensors: Mapping[str, torch.Tensor], metadata: Mapping[str, str]) -> Path:
        try:
            write_safetensors(tensors, metadata, self.path, force=self.force)
        finally:
            self._release()
        self.written = [self.path]  # reported as given: ./out.safetensors stays so
        return Path(self.path)

    def abort(self) -> None:
        super().abort()
        self._release()

    def _release(self) -> None:
        if self._held is not None:
            release_output(self.path, self._held)
            self._held = None


class StdoutWriter(_WholeWriter):
    """The file's bytes on a binary stream (stdout by default); returns the features too, to draw them."""

    def __init__(
        self, record: RunRecord, paths: Sequence[str | os.PathLike[str]], stream: BinaryIO | None = None
    ) -> None:
        super().__init__(record, paths)
        if stream is None and not hasattr(sys.stdout, "buffer"):  # a notebook's or a test runner's stdout: text
            raise UsageProblem(
                "output '-' writes the file's bytes to stdout, and this stdout takes text alone",
                hint="give a binary stream as the output (io.BytesIO(), a file opened 'wb') or a path",
            )
        self.stream = stream

    def _deliver(self, tensors: Mapping[str, torch.Tensor], metadata: Mapping[str, str]) -> Features:
        write_safetensors(tensors, metadata, self.stream or sys.stdout.buffer)
        if metadata["format"] == fileformat.FLAT_FORMAT_VERSION:  # drawn from the rows held padded, as in memory
            assert self.rows is not None, "finish() delivers rows"
            tensors = self.rows.tensors(flat=False)
            metadata = {**metadata, "format": fileformat.RAGGED_FORMAT_VERSION}
        return Features(tensors, metadata, name="stdout", facts=self.facts)


def _check_fits_in_memory(features: _Rows, rows: int) -> None:
    """Refuse, before allocating, a single-file result larger than half of this machine's memory."""
    size = row_bytes(features)
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return
    if size * rows > memory // 2:
        raise MemoryLimitError(
            f"{rows} images x {format_bytes(size)} of features = {format_bytes(size * rows)}, more than "
            f"half of this machine's {format_bytes(memory)}, and one output file is built in memory",
            hint="write shards with -o DIR/ (memory stays flat), or use --pool / --dtype to store less",
        )


class FolderWriter:
    """Shards of ``shard_size`` rows and an index in ``folder``, continuing an earlier run of the same command and
    sharing the work with other processes running it (see :class:`~hookcli.storage.shard_writer.ShardWriter`).

    Shard *k* holds inputs ``[k·S, (k+1)·S)``; a shard is handed to a
    background thread once all its inputs are placed. ``part`` ``(index,
    count)`` says which block of shards this process takes first. Returns (and
    lists in ``written``) the index's path; ``complete`` says whether the
    folder was complete when this process finished.
    """

    def __init__(
        self,
        record: RunRecord,
        paths: Sequence[str | os.PathLike[str]],
        folder: str | os.PathLike[str],
        *,
        shard_size: int | None = None,
        force: bool = False,
        part: tuple[int, int] = (0, 1),
        on_note: Callable[[str], None] | None = None,
    ) -> None:
        self.record, self.paths, self.folder = record, paths, folder
        self.shard_size, self.force, self.part, self.on_note = shard_size, force, part, on_note
        self._writer: ShardWriter | None = None
        self.run_metadata: dict[str, str] | None = None
        self.open: dict[int, RowBuffer] = {}
        # failures seen before the first readable image fixes the shard size
        self.held: list[tuple[int, int | str, _Batch]] = []
        self.written: list[str | Path] = []
        self.done = 0
        self.kept = None  # the inputs done are in the folder: the output
        self.complete = False
        self.finisher = False  # this process found the folder complete, or listed its last shard

    @property
    def writer(self) -> ShardWriter:
        """The folder's writer, from :meth:`begin` on."""
        assert self._writer is not None, "begin() opens the folder first"
        return self._writer

    @property
    def inputs_done(self) -> int:
        """Inputs in the shards listed when this process finished."""
        return self.writer.inputs_done

    def begin(self, batch_size: int) -> Iterator[list[int]] | None:
        self.batch_size = batch_size
        self._writer = ShardWriter(
            self.folder,
            fileformat.identity(self.record),
            len(self.paths),
            force=self.force,
            part=self.part,
            on_note=self.on_note,
        )
        self.done = self.writer.done
        if self.writer.header is not None:  # continuing: the shard size is known, shards may be finished at once
            self.writer.start_writing()
            if self.writer.complete:
                # Complete before this process began: the command run again finishes it; a late process of many
                # (--part, a launcher's) leaves the pictures to the one that completed it.
                self.finisher = self.part[1] == 1
                return None
        return self.writer.order(batch_size, self.shard_size)

    @property
    def has_rows(self) -> bool:
        return self.writer.shard_size is not None

    def add(self, batch: _Batch) -> None:
        if self.run_metadata is None and batch.indices:
            assert batch.facts is not None, "a batch with rows has facts"
            keys = [
                name
                for key, value in batch.features.items()
                for name in ((key, key + ROW_SHAPE) if isinstance(value, list) else (key,))
            ]
            self.run_metadata = fileformat.run_metadata(self.record, batch.facts, keys=keys, flat=True)
            if self.writer.header is None:
                size = self.shard_size or auto_shard_size(row_bytes(batch.features), self.batch_size, len(self.paths))
                self.writer.start_writing(fileformat.index_header(self.record, self.run_metadata, size))
        events: list[tuple[int, int | str]] = [(index, row) for row, index in enumerate(batch.indices)]
        events += [(index, error) for index, error in batch.failures]
        if self.writer.shard_size is None:
            self.held.extend((index, item, batch) for index, item in events)
            return
        # Within a shard rows come in input order; a batch may end one shard and begin another.
        for index, item, source in sorted(self.held + [(i, e, batch) for i, e in events], key=lambda e: e[0]):
            self._place(index, item, source)
        self.held = []

    def _place(self, index: int, item: int | str, batch: _Batch) -> None:
        """Put one row (``item``: its row in ``batch``) or failure (``item``: the error) into its shard."""
        number = self.writer.shard_of(index)
        first, end = self.writer.shard_range(number)
        rows = self.open.setdefault(number, RowBuffer(end - first))
        if isinstance(item, int):
            rows.add(
                batch.features,
                slice(item, item + 1),
                [self.paths[index]],
                batch.targets[item : item + 1] if batch.targets else None,
            )
        else:
            rows.skip(self.paths[index], item)
        if len(rows.inputs) + len(rows.skipped) == end - first:
            # A continued run whose first inputs are all unreadable has learnt nothing yet: the first run's metadata.
            header = self.writer.header
            assert header is not None, "written or read before any row is placed"
            run = self.run_metadata or header["metadata"]
            metadata = fileformat.shard_metadata(
                run, number, inputs=rows.inputs, skipped=rows.skipped, targets=rows.targets, details=rows.details
            )
            files = dict.fromkeys(path for row in self.paths[first:end] for path in input_files(row))  # a tar: once
            stamps = {path: file_stamp(path) for path in files}
            self.writer.submit(number, rows.tensors(), metadata, rows.inputs, rows.skipped, rows.details, stamps)
            del self.open[number]

    def finish(self) -> Path:
        self.writer.close()
        self.complete = self.writer.complete
        self.finisher = self.finisher or self.writer.finisher
        self.written = [self.writer.index_path]
        return self.writer.index_path

    def abort(self) -> None:
        if self._writer is not None:
            with contextlib.suppress(Exception):  # the failure that stopped the run is the one to report
                self._writer.close()


def auto_shard_size(row_size: int, batch_size: int, inputs: int) -> int:
    """The shard size chosen when none is given: enough rows for :data:`MIN_AUTO_SHARDS` shards, so that a run
    killed part-way keeps most of its work, but never more than :data:`AUTO_SHARD_BYTES` of rows (or
    :data:`MAX_AUTO_SHARD_ROWS`), nor less than a batch; a whole number of batches when a batch fits, so that no
    batch is cut in two by a shard's end.

    >>> auto_shard_size(50_000, 16, 200), auto_shard_size(50_000, 16, 10**6), auto_shard_size(50_000, 16, 20)
    (32, 2672, 16)
    """
    by_bytes = max(1, min(MAX_AUTO_SHARD_ROWS, AUTO_SHARD_BYTES // max(1, row_size)))
    by_count = -(-inputs // MIN_AUTO_SHARDS)
    rows = min(by_bytes, max(by_count, batch_size))
    if rows < batch_size:
        return rows
    whole = -(-rows // batch_size) * batch_size  # rounded up to whole batches, within the bytes' bound
    return whole if whole <= by_bytes else by_bytes - by_bytes % batch_size
