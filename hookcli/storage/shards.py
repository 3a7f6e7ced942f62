"""Stream features into a folder of shards with an index; resume an interrupted run.

A folder output holds:

- ``features-00000.safetensors``, ``features-00001.safetensors``, …: shard *k*
  covers inputs ``[k·S, (k+1)·S)`` (S = the shard size in rows) and is a
  complete hookcli file on its own: same keys, same metadata, its own
  ``inputs`` (and ``skipped``);
- ``index.jsonl``: line 1 describes the run (its metadata, what must match to
  resume, the shard size, the number of inputs); then one line per finished
  shard: ``{"shard", "file", "first", "count", "inputs", "skipped"}``, which
  maps every input to its shard and row.

A shard is written to a temporary name and renamed, and only then is its line
appended to the index (and flushed to disk). After a crash, even ``kill -9``,
the index lists exactly the shards that are complete; running the same
command again computes the others. A torn last line is ignored by readers and
cut off before the next line is appended; a shard file found cut short on
resume is written again.

Any number of processes may run the same command on one folder at once (see
:class:`~hookcli.storage.shard_writer.ShardWriter` and :mod:`hookcli.storage.claims`): each computes the shards it
claims, and every shard is listed once. While they work, the index lists
shards in the order they finished; the process that lists the last one puts
the lines in shard order, so a finished folder is the same whoever wrote it.

>>> import tempfile, hookcli
>>> photo = __import__("matplotlib.cbook").cbook.get_sample_data("grace_hopper.jpg", asfileobj=False)
>>> folder = tempfile.mkdtemp() + "/feats/"
>>> _ = hookcli.extract("resnet18", "layer3", [photo] * 3, output=folder, shard_size=2, weights="none",
...                     resize=64, crop=64)
>>> with open_features(folder) as features:
...     features.shape("layer3"), features.read("layer3", 2).shape, len(features.shards)
([3, 256, 4, 4], (256, 4, 4), 2)
"""

from __future__ import annotations

import bisect
import itertools
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from hookcli.errors import FeatureFileError
from hookcli.storage import fileformat
from hookcli.storage.compare_format import COMPARE_KIND
from hookcli.storage.features import FeatureFile
from hookcli.storage.fileformat import INDEX_NAME
from hookcli.storage.index import (
    IndexReader,
    ShardLine,
    check_shard,
    file_key,
    finished_shards,
    leading_shards,
    shard_layout,
)
from hookcli.storage.reader import FeatureReader, ReadingMapping
from hookcli.storage.stats_format import STATS_KIND, STATS_PART

__all__ = [
    "ShardedFeatures",
    "open_features",
]


def _after(count: int) -> str:
    return "the one listed after it is" if count == 1 else f"the {count} listed after it are"


class ShardedFeatures(ReadingMapping):
    """A shard folder (or its ``index.jsonl``) read as one file: rows run on across shards.

    Offers the reading interface of every reader (:class:`~hookcli.storage.reader.FeatureReader`), so
    ``grid`` and ``info`` treat a folder and a file alike. ``metadata["inputs"]`` and
    :attr:`inputs` list the rows' inputs over all shards, read from the index
    when asked for: a folder of a million inputs opens without holding their
    names. The index stays open until :meth:`close`.
    """

    def __init__(self, source: str | os.PathLike) -> None:
        path = Path(source)
        self.folder = path.parent if path.name == INDEX_NAME else path
        self.name = str(source)
        self._open: tuple[int, FeatureFile] | None = None
        self._index = IndexReader(self.folder / INDEX_NAME)
        try:
            self._read_index(source)
        except BaseException:
            self.close()
            raise

    def _read_index(self, source: str | os.PathLike) -> None:
        header = self._index.header
        if header is None:
            held = min(self.folder.glob("*.safetensors"), default=None)  # a cam folder's cams.safetensors, say
            hint = f"it holds '{held}': give that file" if held else "give a folder written by hookcli extract -o DIR/"
            raise FeatureFileError(f"no {INDEX_NAME} in folder '{source}'", hint=hint)
        gathered = next((kind for kind in (STATS_KIND, COMPARE_KIND) if kind in header["identity"]), None)
        if gathered is not None:  # its shards hold what each gathered, not rows
            raise FeatureFileError(
                f"'{source}' holds the parts of a {gathered} run, which merge into one file when it completes",
                hint=f"run the same {gathered} command again to complete it, and read the file it writes",
            )
        present = finished_shards(self.folder, self._index.lines)
        shards = leading_shards(present)
        done = sum(line.covered for line in shards)
        #: A folder still (or no longer) missing shards: how many of its inputs it holds, and why, in words; None
        #: when it is complete.
        self.shortfall: str | None = None
        if done != header["inputs"]:
            self.shortfall = f"'{source}' holds {done} of its {header['inputs']} inputs" + (
                f" (shard {len(shards)} is missing, so {_after(len(present) - len(shards))} left out)"
                if len(present) > len(shards)
                else ""
            )
        #: What a reader should be told.
        self.reading_notes: tuple[str, ...] = (
            () if self.shortfall is None else (f"{self.shortfall}; run the same extract command again to complete it",)
        )
        if not shards:
            raise FeatureFileError(
                f"'{source}' holds no finished shard yet", hint="run the extraction (again) to write some"
            )
        #: What the index says of each shard read (its names are read from the index when asked for).
        self.shards: list[ShardLine] = shards
        self.header = header
        self._starts = list(itertools.accumulate((line.rows for line in shards), initial=0))
        self.rows = self._starts.pop()
        self._checked: dict[int, tuple] = {}  # shard number -> the file checked (its identity and size)
        self._layout: dict | None = None  # what every shard must match: the first one's, once it is checked
        self._with_rows = next((n for n, line in enumerate(shards) if line.rows), 0)
        first = self._shard(self._with_rows)  # a shard whose inputs all failed may hold no tensors
        self._layout = shard_layout(first)
        self._keys = first.keys()
        self._info = {k: (first.dtype(k), first.shape(k)[1:]) for k in self._keys}
        self._ragged = {k for k in self._keys if first.ragged(k)}
        self._largest: dict[str, list[int]] = {key: list(self._info[key][1]) for key in self._ragged}
        self.size = 0
        self._check_every_shard()
        self.metadata = fileformat.folder_metadata(
            header,
            self._lines,
            shards=len(shards),
            done=done,
            listed={name for line in shards for name in line.lists},
        )

    def _lines(self) -> Iterator[dict]:
        """The index lines of the shards read, whole, in shard order: read again from the index, one at a time."""
        return (self._index.line(line) for line in self.shards)

    def _check_every_shard(self) -> None:
        """Open each shard once, now, and check its header against its index line and the first shard's layout: a
        damaged folder is refused before anything is drawn or written from it. The largest row of each ragged key
        is read on the way."""
        self._stored = dict.fromkeys(self._keys, 0)
        self._targets: list[str | None] = []
        for number, line in enumerate(self.shards):
            shard = self._shard(number)
            self.size += shard.size
            self._targets.append(shard.metadata.get("targets"))
            if line.rows:
                for key in self._ragged:
                    self._largest[key] = [max(a, b) for a, b in zip(self._largest[key], shard.shape(key)[1:])]
                for key in self._keys:
                    self._stored[key] += shard.nbytes(key)

    def _shard(self, number: int) -> FeatureFile:
        """Shard ``number``, opened (and checked against its index line and the first shard) on first use."""
        if self._open is None or self._open[0] != number:
            if self._open is not None:
                self._open[1].close()
                self._open = None
            path = self.folder / self.shards[number].file
            shard = FeatureFile(path, follow_links=False)
            try:
                fileformat.check_format(shard.metadata, str(path))  # a later hookcli's shard, its index older
                found = (file_key(path), shard.size)
                if self._checked.get(number) != found:  # checked once, unless the file changed since
                    check_shard(shard, self.shards[number], self._layout, run=self.header["metadata"])
                    self._checked[number] = found
            except BaseException:
                shard.close()
                raise
            self._open = (number, shard)
        return self._open[1]

    def __enter__(self) -> ShardedFeatures:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        if self._open is not None:
            self._open[1].close()
            self._open = None
        self._index.close()

    def shard_targets(self, number: int) -> str | None:
        """Shard ``number``'s ``targets`` metadata (grad and cam: each row's targets, JSON), as read when the folder
        opened: the shards are not opened again for it."""
        return self._targets[number]

    @property
    def inputs(self) -> list[str]:
        """The input each row came from, in row order, read from the index (no JSON made)."""
        return [path for entry in self._lines() for path in entry["inputs"]]

    def keys(self) -> list[str]:  # type: ignore[override]  # a list, as every reader's
        return list(self._keys)

    def dtype(self, key: str) -> str:
        return self._info[key][0]

    def shape(self, key: str) -> list[int]:
        """``[rows, …]``; for a ragged key, the largest row over every shard (read when the folder opened)."""
        return [self.rows, *self._largest.get(key, self._info[key][1])]

    def ragged(self, key: str) -> bool:
        return key in self._ragged

    def row_shape(self, key: str, index: int) -> list[int]:
        number, row = self._locate(key, index)
        return self._shard(number).row_shape(key, row)

    def nbytes(self, key: str) -> int:
        """The bytes ``key`` takes in the shards, as stored (a ragged key's without padding in format 3)."""
        return self._stored[key]

    def read(self, key: str, index: int | None = None, part: slice | None = None) -> np.ndarray:
        if index is None:
            return self.read_rows(key, 0, self.rows)
        number, row = self._locate(key, index)
        return self._shard(number).read(key, row, part)

    def _locate(self, key: str, index: int) -> tuple[int, int]:
        if not -self.rows <= index < self.rows:
            raise IndexError(f"row {index} out of range for '{key}' with {self.rows} rows")
        index %= self.rows
        number = bisect.bisect_right(self._starts, index) - 1
        return number, index - self._starts[number]

    def read_rows(self, key: str, start: int, stop: int) -> np.ndarray:
        """Rows ``start:stop`` across shards (clipped as a slice is): one read per shard they fall in."""
        start, stop, _ = slice(start, stop).indices(self.rows)
        pieces = []
        for number, line in enumerate(self.shards):
            first = self._starts[number]
            low, high = max(start, first), min(stop, first + line.rows)
            if low < high:
                pieces.append(self._shard(number).read_rows(key, low - first, high - first))
        if not pieces:
            return self._shard(self._with_rows).read_rows(key, 0, 0)
        if key in self._ragged:  # shards pad to their own largest row: pad them all to the folder's
            largest = self.shape(key)[1:]
            pieces = [np.pad(p, [(0, 0), *((0, n - m) for n, m in zip(largest, p.shape[1:]))]) for p in pieces]
        return pieces[0] if len(pieces) == 1 else np.concatenate(pieces)


def open_features(source: str | os.PathLike) -> FeatureReader:
    """A :class:`~hookcli.storage.features.FeatureFile` for a file or ``-``, a :class:`ShardedFeatures` for a shard
    folder: either reads as :class:`~hookcli.storage.reader.FeatureReader` says."""
    path = Path(source)
    opened: FeatureReader
    if str(source) != "-" and (path.is_dir() or path.name == INDEX_NAME):
        opened = ShardedFeatures(path)
    else:
        opened = FeatureFile(source)
    try:
        fileformat.check_format(opened.metadata, str(source))
    except FeatureFileError:
        opened.close()
        raise
    if opened.metadata.get("kind") == STATS_PART:  # its tensors are accumulators' states, not rows
        opened.close()
        raise FeatureFileError(
            f"'{source}' is a part of a stats or compare run, which merge into one file when it completes",
            hint="run the same command again to complete it, and read the file it writes",
        )
    return opened
