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
command again continues with the next shard. A torn last line is ignored by
readers and cut off before a resumed run appends; a shard file found cut short
on resume is written again. One process writes a folder at a time.

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
import contextlib
import fcntl
import json
import os
import queue
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path

from hookcli import fileformat
from hookcli.errors import (
    FeatureFileError,
    OutputExistsError,
    OutputLockedError,
    UsageProblem,
)
from hookcli.fileformat import INDEX_NAME, SHARD_FILE
from hookcli.store import (
    FeatureFile,
    NotRegularFile,
    check_folder_output,
    open_regular,
    write_safetensors,
)

__all__ = [
    "INDEX_NAME", "LOCK_NAME", "ShardWriter", "ShardedFeatures", "check_folder_target", "finished_shards",
    "check_shard", "open_features", "read_index",
]


def read_index(folder: str | os.PathLike) -> tuple[dict | None, list[dict]]:
    """The run header and the finished shards' lines (ignoring a torn last line), or ``(None, [])``.

    The index is untrusted: a line that is not what hookcli writes raises
    :class:`FeatureFileError` naming it, unless it is the last line (cut short
    by a crash or a full disk), which is left out.
    """
    header, lines, _ = _parse_index(Path(folder) / INDEX_NAME)
    return header, lines


def _parse_index(path: Path) -> tuple[dict | None, list[dict], bool]:
    """``(header, shard lines, whole)``: ``whole`` is False when a torn or garbled last line was left out."""
    try:
        with open_regular(path) as handle:
            raw = handle.read()
    except FileNotFoundError:
        return None, [], True
    except NotRegularFile as err:
        raise FeatureFileError(str(err), hint="an index is a file written by hookcli extract -o DIR/") from None
    lines = raw.split(b"\n")
    entries, whole = [], True
    last = max((n for n, line in enumerate(lines) if line.strip()), default=-1)
    for number, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
            if not entries:
                fileformat.check_index_header(entry)
            else:
                fileformat.check_index_line(entry, len(entries) - 1, entries[0])
        except (ValueError, RecursionError) as err:
            if not entries:
                raise FeatureFileError(f"'{path}' is not a hookcli index",
                                       hint="give a folder written by hookcli extract -o DIR/") from None
            if number == last:
                whole = False  # the last line, cut short or garbled by a crash: its shard is done again
                break
            problem = "is not JSON" if isinstance(err, json.JSONDecodeError) else f"is wrong: {err}"
            raise FeatureFileError(f"index '{path}' is damaged: line {number + 1} {problem}",
                                   hint="run the same extraction again with --force to start over") from None
        entries.append(entry)
    if not entries:
        raise FeatureFileError(f"'{path}' is not a hookcli index", hint="give a folder written by hookcli extract")
    return entries[0], entries[1:], whole


def finished_shards(folder: str | os.PathLike, shards: list[dict], *, verify: bool = False) -> list[dict]:
    """The index lines that count: shards 0, 1, 2, … in order with their files on disk, up to the first gap.

    Lines after a gap (a shard file deleted by hand, say) describe work that
    will be done again, so readers ignore them and a resumed run drops them.
    With ``verify`` (a run about to continue), a shard whose file is cut
    short or does not hold the rows its line lists is a gap too.
    """
    finished = []
    for entry in shards:
        path = Path(folder) / entry["file"]
        if not path.exists() or (verify and not _shard_is_sound(path, entry)):
            break
        finished.append(entry)
    return finished


def check_shard(shard: FeatureFile, entry: Mapping, like: FeatureFile | None = None) -> None:
    """Raise :class:`FeatureFileError` unless ``shard`` holds the rows its index line lists, shaped as ``like``'s."""
    rows = len(entry["inputs"])
    problem = None
    try:
        listed = json.loads(shard.metadata.get("inputs", "[]"))
    except (ValueError, RecursionError):
        listed = None
    if shard.metadata.get("shard") != str(entry["shard"]) or listed != entry["inputs"]:
        problem = f"it is not shard {entry['shard']} of the inputs its index line lists (its own metadata disagrees)"
    for key in shard.keys() if problem is None else ():
        if not shard.shape(key) or shard.shape(key)[0] != rows:
            problem = f"its tensor '{key}' has shape {shard.shape(key)} but the index lists {rows} rows"
            break
    if problem is None and like is not None and rows:
        if _layout(shard) != _layout(like):
            problem = "its tensors differ in keys, dtypes or shapes from the other shards'"
    if problem is not None:
        raise FeatureFileError(f"shard '{shard.name}' does not match its index line: {problem}",
                               hint="run the same extract command again to write it again")


def _layout(features) -> dict:
    """What every shard of a folder shares: each key's dtype and row shape (a ragged key's only its dimensions)."""
    return {k: (features.dtype(k), features.ragged(k),
                len(features.shape(k)) if features.ragged(k) else features.shape(k)[1:]) for k in features.keys()}


def _shard_is_sound(path: Path, entry: Mapping) -> bool:
    try:
        with FeatureFile(path, follow_links=False) as shard:
            check_shard(shard, entry)
    except FeatureFileError:
        return False
    return True


class ShardWriter:
    """Writes shards of a run into ``folder`` on a background thread and keeps the index.

    ``identity`` holds what must be equal to continue an earlier run there
    (model, weights, layers, preprocessing, inputs…). Opening a folder whose
    index describes another run raises :class:`OutputExistsError` naming what
    differs, unless ``force`` (which deletes that run's shards and index);
    so does a folder holding shard files but no index. One writer at a time:
    the folder is locked (``.hookcli.lock``) until :meth:`close`, and a second
    writer is refused with :class:`OutputLockedError`. :attr:`start` is the
    first input still to extract (0 for a new run).
    """

    def __init__(self, folder: str | os.PathLike, identity: Mapping, total: int, *, force: bool = False) -> None:
        check_folder_target(folder)
        self.folder, self._given = Path(folder), str(folder)
        self.identity = dict(identity)
        self.total = total
        self.folder.mkdir(parents=True, exist_ok=True)
        self._lock = _lock_folder(self.folder, self._given)
        try:
            self._open(force)
        except BaseException:
            _unlock_folder(self.folder, self._lock)
            raise
        self._queue: queue.Queue = queue.Queue(maxsize=1)
        self._failure: BaseException | None = None
        self._thread: threading.Thread | None = None

    def _open(self, force: bool) -> None:
        header, shards, whole = _parse_index(self.index_path)
        if header is not None and header["identity"] != self.identity:
            if not force:
                differ = sorted(k for k in {*header["identity"], *self.identity}
                                if header["identity"].get(k) != self.identity.get(k))
                raise OutputExistsError(
                    f"'{self._given}' holds a different run (it differs in: {', '.join(differ)})",
                    hint="run the same command to continue it, add --force to replace it, or use another folder",
                )
            header, shards = None, []
        if header is None:
            self._remove_old_run(force)
        self._clear_partial_files()
        self.header = header
        self.shard_size: int | None = header["shard_size"] if header else None
        self.finished = finished_shards(self.folder, shards, verify=True)
        if header is not None and (len(self.finished) < len(shards) or not whole):
            self._rewrite_index()  # new lines must follow the last good one, never a torn or stale one
        self.start = min(self.total, len(self.finished) * self.shard_size) if self.shard_size else 0

    @property
    def index_path(self) -> Path:
        return self.folder / INDEX_NAME

    def _rewrite_index(self) -> None:
        """Keep only the header and the finished shards' lines, so new lines never follow stale ones."""
        from hookcli.store import atomic_path

        with atomic_path(self.index_path, force=True) as temporary:
            temporary.write_text("".join(json.dumps(line) + "\n" for line in [self.header, *self.finished]))

    def _remove_old_run(self, force: bool) -> None:
        """Delete an earlier run's index and shards (``force``); without it, refuse shard files no index lists."""
        found = sorted(child.name for child in self.folder.iterdir()
                       if child.name == INDEX_NAME or (SHARD_FILE.match(child.name) and not child.name.startswith(".")))
        if found and not force:
            more = f" and {len(found) - 1} more" if len(found) > 1 else ""
            raise OutputExistsError(
                f"'{self._given}' holds {found[0]}{more} but no index of a run",
                hint="move those files away, choose another folder, or add --force to delete them",
            )
        for name in found:
            (self.folder / name).unlink()

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
               skipped: Sequence[dict], details: Mapping[str, Sequence] | None = None) -> None:
        """Queue a finished shard (``details``: its rows' :data:`~hookcli.fileformat.ROW_DETAILS`); blocks while
        the previous one is still being written."""
        self._raise_failure()
        self._queue.put((number, tensors, metadata, list(inputs), list(skipped), details))

    def close(self) -> None:
        """Wait for queued shards to be on disk, unlock the folder; re-raise a writer failure."""
        try:
            if self._thread is not None:
                self._queue.put(None)
                self._thread.join()
                self._thread = None
        finally:
            if self._lock is not None:
                _unlock_folder(self.folder, self._lock)
                self._lock = None
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

    def _write(self, number, tensors, metadata, inputs, skipped, details) -> None:
        line = fileformat.index_line(number, self.shard_size, self.total, inputs, skipped, details)
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
        listed, shards = len(shards), finished_shards(self.folder, shards)
        done = sum(entry["count"] for entry in shards)
        #: What a reader should be told: a folder still (or no longer) missing shards.
        self.reading_notes: tuple[str, ...] = () if done == header["inputs"] else (
            f"'{source}' holds {done} of its {header['inputs']} inputs"
            + (f" (shard {len(shards)} is missing, so the {listed - len(shards) - 1} listed after it are left out)"
               if listed > len(shards) else "")
            + "; run the same extract command again to complete it",)
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
        self._like: FeatureFile | None = None
        self._with_rows = next((n for n, entry in enumerate(shards) if entry["inputs"]), 0)
        first = self._shard(self._with_rows)  # a shard whose inputs all failed may hold no tensors
        self._like = _Shape(first)
        self._keys = first.keys()
        self._info = {k: (first.dtype(k), first.shape(k)[1:]) for k in self._keys}
        self._ragged = {k for k in self._keys if first.ragged(k)}
        self._largest: dict[str, list[int]] = {}
        self.size = sum((self.folder / entry["file"]).stat().st_size for entry in shards)
        self.metadata = fileformat.folder_metadata(header, shards)

    def _shard(self, number: int) -> FeatureFile:
        """Shard ``number``, opened (and checked against its index line and the first shard) on first use."""
        if self._open is None or self._open[0] != number:
            if self._open is not None:
                self._open[1].close()
                self._open = None
            shard = FeatureFile(self.folder / self.shards[number]["file"], follow_links=False)
            try:
                check_shard(shard, self.shards[number], self._like)
            except BaseException:
                shard.close()
                raise
            self._open = (number, shard)
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
        """``[rows, …]``; for a ragged key, the largest row over every shard (their headers are read once)."""
        if key in self._ragged and key not in self._largest:
            sizes = [self._info[key][1]]
            for number, entry in enumerate(self.shards):
                if entry["inputs"]:
                    sizes.append(self._shard(number).shape(key)[1:])
            self._largest[key] = [max(column) for column in zip(*sizes)]
        return [self.rows, *self._largest.get(key, self._info[key][1])]

    def ragged(self, key: str) -> bool:
        return key in self._ragged

    def row_shape(self, key: str, index: int) -> list[int]:
        number, row = self._locate(key, index)
        return self._shard(number).row_shape(key, row)

    def nbytes(self, key: str) -> int:
        per_row = FeatureFile.row_bytes(self.dtype(key), self.shape(key)[1:])
        return per_row * self.rows

    def read(self, key: str, index: int | None = None, part: slice | None = None):
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
        if key in self._ragged:  # shards pad to their own largest row: pad them all to the folder's
            largest = self.shape(key)[1:]
            pieces = [np.pad(p, [(0, 0), *((0, n - m) for n, m in zip(largest, p.shape[1:]))]) for p in pieces]
        return pieces[0] if len(pieces) == 1 else np.concatenate(pieces)


class _Shape:
    """The keys, dtypes and shapes of a shard, kept after it is closed (what the others must match)."""

    def __init__(self, shard: FeatureFile) -> None:
        self._info = {k: (shard.dtype(k), shard.shape(k), shard.ragged(k)) for k in shard.keys()}

    def keys(self) -> list[str]:
        return list(self._info)

    def ragged(self, key: str) -> bool:
        return self._info[key][2]

    def dtype(self, key: str) -> str:
        return self._info[key][0]

    def shape(self, key: str) -> list[int]:
        return self._info[key][1]


def open_features(source: str | os.PathLike):
    """A :class:`~hookcli.store.FeatureFile` for a file or ``-``, a :class:`ShardedFeatures` for a shard folder."""
    path = Path(source)
    if str(source) != "-" and (path.is_dir() or path.name == INDEX_NAME):
        return ShardedFeatures(path)
    return FeatureFile(source)


def check_folder_target(folder: str | os.PathLike) -> None:
    """Refuse a shard folder output that could not be written (called before any work, and again on open)."""
    if Path(folder).exists() and not Path(folder).is_dir():
        raise UsageProblem(f"output '{folder}' is a file, not a folder", hint="drop the trailing / to write one file")
    check_folder_output(folder)
    lock = Path(folder) / LOCK_NAME
    if lock.is_symlink() or (lock.exists() and not lock.is_file()):
        raise UsageProblem(f"'{lock}' is not a lock file hookcli made (it is a folder or a link)",
                           hint="remove it, then run again")


#: The lock file that keeps a second writer out of a shard folder.
LOCK_NAME = ".hookcli.lock"


def _lock_folder(folder: Path, name: str) -> int:
    """Hold an exclusive lock on ``folder``'s lock file (released when the descriptor closes, or the process ends).

    The holder deletes the file when done (:func:`_unlock_folder`), so a lock
    taken on a file that was meanwhile deleted is taken again on the new one.
    """
    path = folder / LOCK_NAME
    while True:
        try:
            descriptor = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o666)
        except OSError:
            raise UsageProblem(f"'{path}' is not a lock file hookcli made (it is a folder or a link)",
                               hint="remove it, then run again") from None
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(descriptor)
            raise OutputLockedError(f"another hookcli process is writing to '{name}'",
                                    hint="wait for it to finish (then run the same command to continue), "
                                         "or write to another folder") from None
        try:
            current = os.stat(path).st_ino
        except FileNotFoundError:
            current = None
        if current == os.fstat(descriptor).st_ino:
            return descriptor
        os.close(descriptor)


def _unlock_folder(folder: Path, descriptor: int) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(folder / LOCK_NAME)
    os.close(descriptor)
