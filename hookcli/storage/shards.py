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
:class:`ShardWriter` and :mod:`hookcli.storage.claims`): each computes the shards it
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
import contextlib
import json
import os
import queue
import re
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import NamedTuple

from hookcli.storage import fileformat
from hookcli.storage.claims import LOCK_NAME, Claims, FolderLock, check_folder_parts, claim_timeout
from hookcli.errors import FeatureFileError, OutputExistsError, UsageProblem
from hookcli.storage.fileformat import INDEX_NAME, SHARD_FILE
from hookcli.files import NotRegularFile, check_folder_output, open_regular, remove_abandoned, reporting_full_disk
from hookcli.storage.features import FeatureFile, write_safetensors

__all__ = [
    "INDEX_NAME", "LOCK_NAME", "ShardWriter", "ShardedFeatures", "check_folder_target", "finished_shards",
    "check_shard", "leading_shards", "open_features", "read_index",
]


def read_index(folder: str | os.PathLike) -> tuple[dict | None, list[dict]]:
    """The run header and the finished shards' lines in shard order (ignoring a torn last line), or ``(None, [])``.

    The index is untrusted: a line that is not what hookcli writes raises
    :class:`FeatureFileError` naming it, unless it is the last line (cut short
    by a crash or a full disk), which is left out. Lines may come in any
    order while processes are still writing the folder.
    """
    index = _parse_index(Path(folder) / INDEX_NAME)
    return index.header, index.shards


class _Index(NamedTuple):
    """An index as read: ``whole`` is False when a torn or garbled last line was left out; ``end`` is the byte
    offset after the last good line; ``ordered`` says whether the lines came in shard order."""

    header: dict | None
    shards: list[dict]  # in shard order
    whole: bool = True
    end: int = 0
    ordered: bool = True


def _not_an_index(path: Path, writing: bool) -> FeatureFileError:
    hint = "add --force to replace it, or use another folder" if writing else \
        "give a folder written by hookcli extract -o DIR/"
    return FeatureFileError(f"'{path}' is not a hookcli index", hint=hint)


def _parse_index(path: Path, *, writing: bool = False) -> _Index:
    """The index at ``path`` (an empty one when there is none), every line checked. ``writing``: the error for a
    file that is no index tells how to replace it, not what to read instead, and a symbolic link is refused (the
    index is appended to, never outside the folder)."""
    try:
        with _open_index(path, writing=writing) as handle:
            raw = handle.read()
    except FileNotFoundError:
        return _Index(None, [])
    lines = raw.split(b"\n")
    entries, whole, end, offset = [], True, 0, 0
    last = max((n for n, line in enumerate(lines) if line.strip()), default=-1)
    seen: set[int] = set()
    for number, line in enumerate(lines):
        offset += len(line) + 1
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
            if not entries:
                fileformat.check_index_header(entry)
            else:
                fileformat.check_index_line(entry, entries[0])
                if entry["shard"] in seen:
                    raise ValueError(f"it lists shard {entry['shard']} a second time")
                seen.add(entry["shard"])
            if number == last and not raw.endswith(b"\n"):
                raise ValueError("it was cut short")
        except (ValueError, RecursionError) as err:
            if not entries:
                raise _not_an_index(path, writing) from None
            # A crash leaves a last line without its newline, or bytes that are not JSON; a whole JSON line that is
            # wrong was written so, and is an error wherever it is.
            garbled = not raw.endswith(b"\n") or isinstance(err, json.JSONDecodeError | RecursionError)
            if number == last and garbled:
                whole = False  # the last line, cut short or garbled by a crash: its shard is done again
                break
            problem = "is not JSON" if isinstance(err, json.JSONDecodeError) else f"is wrong: {err}"
            raise FeatureFileError(f"index '{path}' is damaged: line {number + 1} {problem}",
                                   hint="run the same extraction again with --force to start over") from None
        entries.append(entry)
        end = min(offset, len(raw))
    if not entries:
        raise _not_an_index(path, writing)
    numbers = [entry["shard"] for entry in entries[1:]]
    return _Index(entries[0], sorted(entries[1:], key=lambda entry: entry["shard"]), whole, end,
                  numbers == sorted(numbers))


def _open_index(path: Path, *, writing: bool, update: bool = False):
    """The index file opened (see :func:`~hookcli.files.open_regular`); a writer's is never followed through a link."""
    try:
        return open_regular(path, follow_links=not writing, update=update)
    except NotRegularFile as err:
        hint = "remove it, then run again" if writing else "an index is a file written by hookcli extract -o DIR/"
        raise FeatureFileError(str(err), hint=hint) from None


def finished_shards(folder: str | os.PathLike, shards: list[dict], *, verify: bool = False) -> list[dict]:
    """The index lines whose shard files are on disk (with ``verify``, a run about to continue: whole, and holding
    the rows their lines list); the others describe work to do again."""
    return [entry for entry in shards
            if (Path(folder) / entry["file"]).exists()
            and (not verify or _shard_is_sound(Path(folder) / entry["file"], entry))]


def leading_shards(shards: list[dict]) -> list[dict]:
    """Shards 0, 1, 2, … of ``shards`` (in shard order) up to the first one missing: what reads as one file."""
    leading = []
    for entry in shards:
        if entry["shard"] != len(leading):
            break
        leading.append(entry)
    return leading


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
    """Writes shards of a run into ``folder`` on a background thread and keeps the index, beside any number of
    other processes running the same command there.

    ``identity`` holds what must be equal to share (or continue) a run in the
    folder (model, weights, layers, preprocessing, inputs…). Opening a folder
    whose index describes another run raises :class:`OutputExistsError` naming
    what differs, unless ``force`` (which deletes that run's shards and index);
    so does a folder holding shard files but no index.

    The first process to find no index founds the run: it holds the folder
    lock (:class:`~hookcli.storage.claims.FolderLock`) until :meth:`start_writing`
    records the header, so the others wait and then read the shard size from
    it. :meth:`order` hands out the inputs of the shards this process claims
    (:class:`~hookcli.storage.claims.Claims`); a finished shard is renamed into place
    and its line appended under the lock, unless another process listed that
    shard first. The process that lists the last shard puts the lines in shard
    order. ``part`` ``(index, count)`` says which block of shards to take
    first; then any shard nobody holds.
    """

    def __init__(self, folder: str | os.PathLike, identity: Mapping, total: int, *, force: bool = False,
                 part: tuple[int, int] = (0, 1), on_note: Callable[[str], None] | None = None) -> None:
        check_folder_target(folder)
        self.folder, self._given = Path(folder), str(folder)
        self.identity = dict(identity)
        self.total = total
        self.part = part
        self.folder.mkdir(parents=True, exist_ok=True)
        self.lock = FolderLock(self.folder, self._given, on_wait=on_note)
        self.claims = Claims(self.folder, on_note=on_note)
        self.finished: set[int] = set()
        self.done = 0  # inputs in shards finished before this process began
        self._index_key: tuple[int, int] | None = None
        self._index_end = 0
        self._highest = -1  # the highest shard listed (while lines come in order, the last one)
        self._reached = -1  # the last input handed out before the shard size was known (founding)
        self._started: set[int] = set()
        self._cursor = 0
        self.finisher = False  # this process listed the run's last shard
        self.header: dict | None = None
        self.lock.acquire()
        try:
            self._open(force)
        except BaseException:
            self._leave()
            raise
        if self.header is not None:
            self.lock.release()  # a founder keeps the lock until its header is written
        self._queue: queue.Queue = queue.Queue(maxsize=1)
        self._failure: BaseException | None = None
        self._thread: threading.Thread | None = None

    def _open(self, force: bool) -> None:
        try:
            index = _parse_index(self.index_path, writing=True)
        except FeatureFileError:
            if not force or (self.index_path.is_dir() and not self.index_path.is_symlink()):
                raise
            index = _Index(None, [])  # --force: a damaged index goes, with the shards it listed
        header, shards, whole, end, self._ordered = index
        if header is not None and header["identity"] != self.identity:
            if not force:
                differ = fileformat.identity_differences(header["identity"], self.identity)
                raise OutputExistsError(
                    f"'{self._given}' holds a different run (it differs in: {', '.join(differ)})",
                    hint="run the same command to continue it, add --force to replace it, or use another folder",
                )
            header, shards = None, []
        if header is None:
            self._remove_old_run(force)
            self.claims.clear()
        remove_abandoned(self.folder, ".features-*.safetensors.*.part")  # left by killed processes
        self.header = header
        self.shard_size: int | None = header["shard_size"] if header else None
        if header is not None:
            finished = finished_shards(self.folder, shards, verify=True)
            if len(finished) < len(shards) or not whole:
                self._rewrite_index(finished)  # new lines must follow good ones, never a torn or stale one
            else:
                self._index_key, self._index_end = _file_key(self.index_path), end
            self.finished = {entry["shard"] for entry in finished}
            self._highest = max(self.finished, default=-1)
            self.done = sum(entry["count"] for entry in finished)

    @property
    def index_path(self) -> Path:
        return self.folder / INDEX_NAME

    @property
    def shards(self) -> int:
        """How many shards the run has (once the shard size is known)."""
        return fileformat.shard_count({"inputs": self.total, "shard_size": self.shard_size})

    @property
    def inputs_done(self) -> int:
        """Inputs in the shards listed (as this process last read the index)."""
        return sum(min(self.shard_size, self.total - number * self.shard_size) for number in self.finished)

    @property
    def complete(self) -> bool:
        """Every shard of the run is listed (as this process last read the index)."""
        return self.shard_size is not None and len(self.finished) == self.shards

    def _rewrite_index(self, lines: Sequence[Mapping]) -> None:
        """The header and ``lines`` (in shard order), atomically: a reader sees the old index or this one."""
        from hookcli.files import atomic_path

        with atomic_path(self.index_path, force=True) as temporary:
            temporary.write_text("".join(json.dumps(line) + "\n" for line in [self.header, *lines]))
        found = os.lstat(self.index_path)
        self._index_key, self._index_end, self._ordered = _file_key(found), found.st_size, True

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

    def _refresh(self) -> None:
        """Learn which shards other processes listed since the last look (the caller holds the lock)."""
        try:
            found = os.lstat(self.index_path)  # a link put in its place is another file: it is read, and refused
        except FileNotFoundError:
            raise FeatureFileError(f"'{self._given}' lost its {INDEX_NAME} while this run was writing it",
                                   hint="run the same command again to continue") from None
        key = _file_key(found)
        if key != self._index_key or found.st_size < self._index_end:
            header, shards, _, end, self._ordered = _parse_index(self.index_path, writing=True)
            if header is None or header["identity"] != self.identity:
                raise OutputExistsError(f"'{self._given}' was given to a different run while this one was writing it",
                                        hint="write this run to another folder")
            self.finished = {entry["shard"] for entry in shards}
            self._highest = max(self.finished, default=-1)
            self._index_key, self._index_end = key, end
            return
        if found.st_size == self._index_end:
            return
        with _open_index(self.index_path, writing=True) as index:
            index.seek(self._index_end)
            raw = index.read(found.st_size - self._index_end)
        complete = raw[:raw.rfind(b"\n") + 1]
        for line in complete.split(b"\n"):
            if line.strip():
                self._listed(_shard_of(line, self._given))
        self._index_end += len(complete)

    def _append(self, line: Mapping) -> None:
        """Add ``line`` after the last whole line (the caller holds the lock and has just refreshed)."""
        with reporting_full_disk(self.index_path), _open_index(self.index_path, writing=True, update=True) as index:
            index.truncate(self._index_end)  # a line cut short by a killed process is not followed
            index.seek(self._index_end)
            index.write(json.dumps(line).encode() + b"\n")
            index.flush()
            os.fsync(index.fileno())
            self._index_end = index.tell()
        self._index_key = _file_key(self.index_path)

    def start_writing(self, header: Mapping | None = None) -> None:
        """Record the run in a new index (``header``, see :func:`~hookcli.storage.fileformat.index_header`; none when
        continuing) and start the writer thread. A founder claims the shards it has handed out inputs of, then
        lets the other processes in."""
        if self.header is None:
            self.header = dict(header)
            self.shard_size = self.header["shard_size"]
            self._rewrite_index([])
            for number in range(self._reached // self.shard_size + 1 if self._reached >= 0 else 0):
                self.claims.take(number)
                self._started.add(number)
            self.lock.release()
        self.claims.start()
        self._thread = threading.Thread(target=self._write_loop, name="hookcli-shard-writer", daemon=True)
        self._thread.start()

    def shard_range(self, number: int) -> tuple[int, int]:
        """Inputs ``[first, end)`` covered by shard ``number``."""
        first = number * self.shard_size
        return first, min(first + self.shard_size, self.total)

    def order(self, batch_size: int, planned_size: int | None = None) -> Iterator[list[int]]:
        """Batches of the inputs this process computes, shard after shard; each shard is claimed as its first batch
        is handed out. A founder hands out batches from input 0 until the shard size (``planned_size`` when the
        user gave one) is in the header.

        A batch is the inputs ``[k·B, (k+1)·B)`` (``B`` = ``batch_size``) that fall in one shard, whoever
        computes it, so every row is computed beside the same others as in any other run of the command.
        """
        index = 0
        while self.shard_size is None:
            if index >= self.total:
                return
            end = (index // batch_size + 1) * batch_size
            if planned_size:
                end = min(end, (index // planned_size + 1) * planned_size)
            batch = list(range(index, min(end, self.total)))
            self._reached = batch[-1]
            yield batch
            index = batch[-1] + 1
        if index and index < self.shard_range((index - 1) // self.shard_size)[1]:
            yield from _batches(index, self.shard_range((index - 1) // self.shard_size)[1], batch_size)
        while (number := self._next_shard()) is not None:
            yield from _batches(*self.shard_range(number), batch_size)

    def _next_shard(self) -> int | None:
        """Claim the next shard to compute: this part's block first, then the shards after it, then those before;
        once through, any shard whose claim was given up or abandoned."""
        count = self.shards
        low, high = self.part[0] * count // self.part[1], (self.part[0] + 1) * count // self.part[1]

        def shard_at(position: int) -> int:
            return (low + position) % count if high > low else position

        with self.lock.held():
            self._refresh()
            for start in (self._cursor, 0):
                for position in range(start, count):
                    number = shard_at(position)
                    if number in self.finished or number in self._started:
                        continue
                    if self.claims.take(number):
                        self._started.add(number)
                        self._cursor = position + 1
                        return number
                self._cursor = count
        return None

    def submit(self, number: int, tensors: Mapping, metadata: Mapping[str, str], inputs: Sequence[str],
               skipped: Sequence[dict], details: Mapping[str, Sequence] | None = None) -> None:
        """Queue a finished shard (``details``: its rows' :data:`~hookcli.storage.fileformat.ROW_DETAILS`); blocks while
        the previous one is still being written."""
        self._raise_failure()
        self._queue.put((number, tensors, metadata, list(inputs), list(skipped), details))

    def close(self) -> None:
        """Wait for queued shards to be on disk, give up unfinished claims; re-raise a writer failure. The
        process that leaves the folder complete removes the lock and the claims folder."""
        try:
            if self._thread is not None:
                self._queue.put(None)
                self._thread.join()
                self._thread = None
        finally:
            self.claims.release_all(self.lock)
            if self._failure is None and self.shard_size is not None:
                with self.lock.held():
                    self._refresh()
                    if self.complete:
                        self.claims.clear()
                        self.lock.remove()
            self._leave()
        self._raise_failure()

    def _leave(self) -> None:
        """Let go of the lock; a founder that wrote no header leaves no lock file behind."""
        if self.header is None and self.lock.holding:
            self.lock.remove()
        self.lock.close()

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
        write_safetensors(tensors, metadata, self.folder / line["file"], force=True,
                          publish=lambda: self._publishing(number, line))

    @contextlib.contextmanager
    def _publishing(self, number: int, line: Mapping) -> Iterator[bool]:
        """Under the lock: rename shard ``number`` into place and list it, unless another process listed it."""
        with self.lock.held():
            self._refresh()
            if number in self.finished:
                self.claims.release(number)
                yield False
                return
            yield True
            self._append(line)
            self._listed(number)
            self.claims.release(number)
            if self.complete:
                self.finisher = True
                if not self._ordered:  # the last shard: the lines go in shard order
                    self._rewrite_index(_parse_index(self.index_path, writing=True).shards)

    def _listed(self, number: int) -> None:
        """Shard ``number``'s line follows the others in the index."""
        self._ordered = self._ordered and number > self._highest
        self._highest = max(self._highest, number)
        self.finished.add(number)


def _file_key(path_or_stat) -> tuple[int, int]:
    """Which file a path names now, itself and not what a link points to (or a stat result describes): an index
    rewritten is another file."""
    found = path_or_stat if isinstance(path_or_stat, os.stat_result) else os.lstat(path_or_stat)
    return found.st_dev, found.st_ino


def _batches(first: int, end: int, size: int) -> Iterator[list[int]]:
    """Inputs ``[first, end)`` cut where a multiple of ``size`` begins."""
    while first < end:
        stop = min((first // size + 1) * size, end)
        yield list(range(first, stop))
        first = stop


#: How an index line begins (:func:`~hookcli.storage.fileformat.index_line` puts ``shard`` first).
_LINE_START = re.compile(rb'^\{"shard": (\d+),')


def _shard_of(line: bytes, folder: str) -> int:
    found = _LINE_START.match(line)
    if found is None:
        raise FeatureFileError(f"the index of '{folder}' holds a line hookcli did not write",
                               hint="run the same extraction again with --force to start over")
    return int(found.group(1))


class ShardedFeatures:
    """A shard folder (or its ``index.jsonl``) read as one file: rows run on across shards.

    Offers :class:`~hookcli.storage.features.FeatureFile`'s reading interface, so
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
        present = finished_shards(self.folder, shards)
        shards = leading_shards(present)
        done = sum(entry["count"] for entry in shards)
        #: What a reader should be told: a folder still (or no longer) missing shards.
        self.reading_notes: tuple[str, ...] = () if done == header["inputs"] else (
            f"'{source}' holds {done} of its {header['inputs']} inputs"
            + (f" (shard {len(shards)} is missing, so the {len(present) - len(shards)} listed after it are left out)"
               if len(present) > len(shards) else "")
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
    """A :class:`~hookcli.storage.features.FeatureFile` for a file or ``-``, a :class:`ShardedFeatures` for a shard folder."""
    path = Path(source)
    if str(source) != "-" and (path.is_dir() or path.name == INDEX_NAME):
        return ShardedFeatures(path)
    return FeatureFile(source)


def check_folder_target(folder: str | os.PathLike) -> None:
    """Refuse a shard folder output that could not be written (called before any work, and again on open)."""
    if Path(folder).exists() and not Path(folder).is_dir():
        raise UsageProblem(f"output '{folder}' is a file, not a folder", hint="drop the trailing / to write one file")
    check_folder_output(folder)
    claim_timeout()  # $HOOKCLI_CLAIM_TIMEOUT is checked before any work
    check_folder_parts(Path(folder))
