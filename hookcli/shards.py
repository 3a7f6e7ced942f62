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
command again continues with the next shard. A torn last line is ignored.

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
import json
import os
import queue
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path

from hookcli import fileformat
from hookcli.errors import FeatureFileError, OutputExistsError, UsageProblem
from hookcli.fileformat import INDEX_NAME, INDEX_VERSION, SHARD_FILE
from hookcli.store import FeatureFile, write_safetensors

__all__ = [
    "INDEX_NAME", "ShardWriter", "ShardedFeatures", "check_folder_target", "finished_shards", "open_features",
    "read_index",
]


def read_index(folder: str | os.PathLike) -> tuple[dict | None, list[dict]]:
    """The run header and the finished shards' lines (ignoring a torn last line), or ``(None, [])``."""
    path = Path(folder) / INDEX_NAME
    if not path.exists():
        return None, []
    lines = path.read_bytes().split(b"\n")
    entries = []
    for number, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            entries.append(json.loads(line))
        except ValueError:
            if number >= len(lines) - 2:  # the last line, cut short by a crash
                break
            raise FeatureFileError(f"index '{path}' is damaged at line {number + 1}",
                                   hint="run the extraction again with --force") from None
    if not entries or entries[0].get("hookcli_index") != INDEX_VERSION:
        raise FeatureFileError(f"'{path}' is not a hookcli index", hint="give a folder written by hookcli extract")
    return entries[0], entries[1:]


def finished_shards(folder: str | os.PathLike, shards: list[dict]) -> list[dict]:
    """The index lines that count: shards 0, 1, 2, … in order with their files on disk, up to the first gap.

    Lines after a gap (a shard file deleted by hand, say) describe work that
    will be done again, so readers ignore them and a resumed run drops them.
    """
    finished = []
    for expected, entry in enumerate(shards):
        if entry.get("shard") != expected or not (Path(folder) / entry["file"]).exists():
            break
        finished.append(entry)
    return finished


class ShardWriter:
    """Writes shards of a run into ``folder`` on a background thread and keeps the index.

    ``identity`` holds what must be equal to continue an earlier run there
    (model, weights, layers, preprocessing, inputs…). Opening a folder whose
    index describes another run raises :class:`OutputExistsError` naming what
    differs, unless ``force`` (which deletes that run's shards and index).
    :attr:`start` is the first input still to extract (0 for a new run).
    """

    def __init__(self, folder: str | os.PathLike, identity: Mapping, total: int, *, force: bool = False) -> None:
        check_folder_target(folder)
        self.folder = Path(folder)
        self.identity = dict(identity)
        self.total = total
        self.folder.mkdir(parents=True, exist_ok=True)
        header, shards = read_index(self.folder)
        if header is not None and header["identity"] != self.identity:
            if not force:
                differ = sorted(k for k in {*header["identity"], *self.identity}
                                if header["identity"].get(k) != self.identity.get(k))
                raise OutputExistsError(
                    f"'{folder}' holds a different run (it differs in: {', '.join(differ)})",
                    hint="run the same command to continue it, add --force to replace it, or use another folder",
                )
            header, shards = None, []
        if header is None:
            self._remove_old_run()
        self._clear_partial_files()
        self.header = header
        self.shard_size: int | None = header["shard_size"] if header else None
        self.finished = finished_shards(self.folder, shards)
        if header is not None and len(self.finished) < len(shards):
            self._rewrite_index()
        self.start = min(total, len(self.finished) * self.shard_size) if self.shard_size else 0
        self._queue: queue.Queue = queue.Queue(maxsize=1)
        self._failure: BaseException | None = None
        self._thread: threading.Thread | None = None

    @property
    def index_path(self) -> Path:
        return self.folder / INDEX_NAME

    def _rewrite_index(self) -> None:
        """Keep only the header and the finished shards' lines, so new lines never follow stale ones."""
        from hookcli.store import atomic_path

        with atomic_path(self.index_path, force=True) as temporary:
            temporary.write_text("".join(json.dumps(line) + "\n" for line in [self.header, *self.finished]))

    def _remove_old_run(self) -> None:
        for child in self.folder.iterdir():
            if child.name == INDEX_NAME or SHARD_FILE.match(child.name):
                child.unlink()

    def _clear_partial_files(self) -> None:
        for child in self.folder.iterdir():
            if child.name.startswith(".") and SHARD_FILE.match(child.name):
                child.unlink()  # a temporary file left by a killed run

    def start_writing(self, header: Mapping | None = None) -> None:
        """Record the run in a new index (``header``, see :func:`~hookcli.fileformat.index_header`; none when
        continuing) and start the writer thread."""
        if self.header is None:
            self.header = dict(header)
            self.shard_size = self.header["shard_size"]
            self._rewrite_index()
        self._thread = threading.Thread(target=self._write_loop, name="hookcli-shard-writer", daemon=True)
        self._thread.start()

    def shard_range(self, number: int) -> tuple[int, int]:
        """Inputs ``[first, end)`` covered by shard ``number``."""
        first = number * self.shard_size
        return first, min(first + self.shard_size, self.total)

    def submit(self, number: int, tensors: Mapping, metadata: Mapping[str, str], inputs: Sequence[str],
               skipped: Sequence[dict]) -> None:
        """Queue a finished shard; blocks while the previous one is still being written."""
        self._raise_failure()
        self._queue.put((number, tensors, metadata, list(inputs), list(skipped)))

    def close(self) -> None:
        """Wait for queued shards to be on disk; re-raise a writer failure."""
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()
            self._thread = None
        self._raise_failure()

    def _raise_failure(self) -> None:
        if self._failure is not None:
            failure, self._failure = self._failure, None
            raise failure

    def _write_loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            if self._failure is not None:
                continue  # drain: one failure stops the writing
            try:
                self._write(*item)
            except BaseException as err:  # handed to the main thread
                self._failure = err

    def _write(self, number, tensors, metadata, inputs, skipped) -> None:
        line = fileformat.index_line(number, self.shard_size, self.total, inputs, skipped)
        write_safetensors(tensors, metadata, self.folder / line["file"], force=True)
        with open(self.index_path, "a", encoding="utf-8") as index:
            index.write(json.dumps(line) + "\n")
            index.flush()
            os.fsync(index.fileno())


class ShardedFeatures:
    """A shard folder (or its ``index.jsonl``) read as one file: rows run on across shards.

    Offers :class:`~hookcli.store.FeatureFile`'s reading interface, so
    ``grid`` and ``info`` treat both alike. ``metadata["inputs"]`` lists the
    rows' inputs over all shards.
    """

    def __init__(self, source: str | os.PathLike) -> None:
        path = Path(source)
        self.folder = path.parent if path.name == INDEX_NAME else path
        self.name = str(source)
        header, shards = read_index(self.folder)
        if header is None:
            raise FeatureFileError(f"no {INDEX_NAME} in folder '{source}'",
                                   hint="give a folder written by hookcli extract -o DIR/")
        shards = finished_shards(self.folder, shards)
        if not shards:
            raise FeatureFileError(f"'{source}' holds no finished shard yet",
                                   hint="run the extraction (again) to write some")
        self.header, self.shards = header, shards
        self._starts, rows = [], 0
        for entry in shards:
            self._starts.append(rows)
            rows += len(entry["inputs"])
        self.rows = rows
        self._open: tuple[int, FeatureFile] | None = None
        self._with_rows = next((n for n, entry in enumerate(shards) if entry["inputs"]), 0)
        first = self._shard(self._with_rows)  # a shard whose inputs all failed may hold no tensors
        self._keys = first.keys()
        self._info = {k: (first.dtype(k), first.shape(k)[1:]) for k in self._keys}
        self.size = sum((self.folder / entry["file"]).stat().st_size for entry in shards)
        self.metadata = fileformat.folder_metadata(header, shards)

    def _shard(self, number: int) -> FeatureFile:
        if self._open is None or self._open[0] != number:
            if self._open is not None:
                self._open[1].close()
            self._open = (number, FeatureFile(self.folder / self.shards[number]["file"]))
        return self._open[1]

    def __enter__(self) -> ShardedFeatures:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def close(self) -> None:
        if self._open is not None:
            self._open[1].close()
            self._open = None

    def keys(self) -> list[str]:
        return list(self._keys)

    def dtype(self, key: str) -> str:
        return self._info[key][0]

    def shape(self, key: str) -> list[int]:
        return [self.rows, *self._info[key][1]]

    def nbytes(self, key: str) -> int:
        per_row = FeatureFile.row_bytes(*self._info[key])
        return per_row * self.rows

    def read(self, key: str, index: int | None = None, part: slice | None = None):
        if index is None:
            return self.read_rows(key, 0, self.rows)
        if not -self.rows <= index < self.rows:
            raise IndexError(f"row {index} out of range for '{key}' with {self.rows} rows")
        index %= self.rows
        number = bisect.bisect_right(self._starts, index) - 1
        return self._shard(number).read(key, index - self._starts[number], part)

    def read_rows(self, key: str, start: int, stop: int):
        """Rows ``start:stop`` across shards (clipped as a slice is): one read per shard they fall in."""
        import numpy as np

        start, stop, _ = slice(start, stop).indices(self.rows)
        pieces = []
        for number, entry in enumerate(self.shards):
            first = self._starts[number]
            low, high = max(start, first), min(stop, first + len(entry["inputs"]))
            if low < high:
                pieces.append(self._shard(number).read_rows(key, low - first, high - first))
        if not pieces:
            return self._shard(self._with_rows).read_rows(key, 0, 0)
        return pieces[0] if len(pieces) == 1 else np.concatenate(pieces)


def open_features(source: str | os.PathLike):
    """A :class:`~hookcli.store.FeatureFile` for a file or ``-``, a :class:`ShardedFeatures` for a shard folder."""
    path = Path(source)
    if str(source) != "-" and (path.is_dir() or path.name == INDEX_NAME):
        return ShardedFeatures(path)
    return FeatureFile(source)


def check_folder_target(folder: str | os.PathLike) -> None:
    """Refuse a folder output whose path is an existing file (called before any work, and again on open)."""
    if Path(folder).exists() and not Path(folder).is_dir():
        raise UsageProblem(f"output '{folder}' is a file, not a folder", hint="drop the trailing / to write one file")
