"""A shard folder's index (``index.jsonl``): read and checked as untrusted input, line by line, and the shards
it lists checked against their files.

Writers read the index whole (:func:`parse_index`: every line as written); a reader keeps each line without the
names it lists (:class:`IndexReader`, :class:`ShardLine`) and reads them again when they are asked for, so that
a folder of a million inputs opens without holding a million names.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import BinaryIO, NamedTuple

from hookcli.errors import FeatureFileError
from hookcli.files import NotRegularFile, open_regular
from hookcli.storage import fileformat
from hookcli.storage.features import FeatureFile
from hookcli.storage.fileformat import INDEX_NAME
from hookcli.storage.reader import FeatureReader
from hookcli.storage.stats_format import PART_ROWS, STATS_PART

__all__ = [
    "check_shard",
    "file_key",
    "finished_shards",
    "Index",
    "IndexReader",
    "index_state",
    "leading_shards",
    "open_index",
    "parse_index",
    "read_index",
    "shard_layout",
    "shard_of",
    "ShardChecks",
    "ShardLine",
]


def read_index(folder: str | os.PathLike) -> tuple[dict | None, list[dict]]:
    """The run header and the finished shards' lines in shard order (ignoring a torn last line), or ``(None, [])``.

    The index is untrusted: a line that is not what hookcli writes raises
    :class:`FeatureFileError` naming it, unless it is the last line (cut short
    by a crash or a full disk), which is left out. Lines may come in any
    order while processes are still writing the folder.
    """
    index = parse_index(Path(folder) / INDEX_NAME)
    return index.header, index.shards


class Index(NamedTuple):
    """An index as read: ``whole`` is False when a torn or garbled last line was left out; ``end`` is the byte
    offset after the last good line; ``ordered`` says whether the lines came in shard order; ``state`` is the file
    as it was read (:func:`index_state`)."""

    header: dict | None
    shards: list[dict]  # in shard order
    whole: bool = True
    end: int = 0
    ordered: bool = True
    state: tuple[int, int, int] | None = None


class ShardLine(NamedTuple):
    """What an index line says of its shard, without the names it lists: what a reader keeps of each line.

    ``lists`` names the lists of :data:`~hookcli.storage.fileformat.SHARD_LISTS` the line holds (not empty);
    ``names`` is a hash of its inputs (Python's, keyed anew in every process), which the shard's own ``inputs``
    must match.
    """

    shard: int
    file: str
    covered: int  # the run's inputs it covers (its ``count``: its rows and the inputs skipped)
    rows: int  # the inputs it lists, one a row of its shard
    lists: tuple[str, ...]
    names: int | None

    @classmethod
    def of(cls, entry: Mapping) -> ShardLine:
        """The line ``entry``, as :func:`~hookcli.storage.fileformat.check_index_line` passed it."""
        lists = tuple(name for name in fileformat.SHARD_LISTS if entry.get(name))
        return cls(entry["shard"], entry["file"], entry["count"], len(entry["inputs"]), lists, _names(entry["inputs"]))


def _names(inputs: Sequence) -> int | None:
    """The hash :class:`ShardLine` keeps of a list of names (None for a list that holds what has no hash)."""
    try:
        return hash(tuple(inputs))
    except TypeError:
        return None


def _not_an_index(path: Path, writing: bool) -> FeatureFileError:
    hint = (
        "add --force to replace it, or use another folder"
        if writing
        else "give a folder written by hookcli extract -o DIR/"
    )
    return FeatureFileError(f"'{path}' is not a hookcli index", hint=hint)


def parse_index(path: Path, *, writing: bool = False) -> Index:
    """The index at ``path`` (an empty one when there is none), every line checked. ``writing``: the error for a
    file that is no index tells how to replace it, not what to read instead, and a symbolic link is refused (the
    index is appended to, never outside the folder)."""
    try:
        handle = open_index(path, writing=writing)
    except FileNotFoundError:
        return Index(None, [])
    entries: list[dict] = []
    with handle:
        header, whole, end, ordered = _scan(handle, path, writing, lambda entry, *_where: entries.append(entry))
        state = index_state(os.fstat(handle.fileno()))
    return Index(header, sorted(entries, key=lambda entry: entry["shard"]), whole, end, ordered, state)


def index_state(path_or_stat) -> tuple[int, int, int] | None:
    """Which file an index is and how long (None when there is none): it changed when either did (writers only
    append to it, or replace it)."""
    try:
        found = path_or_stat if isinstance(path_or_stat, os.stat_result) else os.lstat(path_or_stat)
    except FileNotFoundError:
        return None
    return (*file_key(found), found.st_size)


def _scan(
    handle: BinaryIO, path: Path, writing: bool, keep: Callable[[dict, int, int], object]
) -> tuple[dict, bool, int, bool]:
    """Read the index open in ``handle`` line by line (one line in memory at a time, so a reader may keep less than
    the lines), check each, and give each shard's line to ``keep`` with its offset and length in bytes: the header,
    whether the index is whole (no torn or garbled last line left out), the offset after the last good line and
    whether the lines came in shard order."""
    header: dict | None = None
    whole, end, highest = True, 0, -1
    ordered = True
    seen: set[int] = set()
    # Lines appended after the size is taken are left for the next reading.
    for number, line, offset, after, ends in _lines(handle, os.fstat(handle.fileno()).st_size):
        last = ends is not None
        try:
            entry = json.loads(line)
            if header is None:
                fileformat.check_index_header(entry)
            else:
                fileformat.check_index_line(entry, header)
                if entry["shard"] in seen:
                    raise ValueError(f"it lists shard {entry['shard']} a second time")
                seen.add(entry["shard"])
            if last and not ends:
                raise ValueError("it was cut short")
        except (ValueError, RecursionError) as err:
            if header is None:
                raise _not_an_index(path, writing) from None
            # A crash leaves a last line without its newline, or bytes that are not JSON; a whole JSON line that is
            # wrong was written so, and is an error wherever it is.
            if last and (not ends or isinstance(err, json.JSONDecodeError | RecursionError)):
                whole = False  # the last line, cut short or garbled by a crash: its shard is done again
                break
            problem = "is not JSON" if isinstance(err, json.JSONDecodeError) else f"is wrong: {err}"
            raise FeatureFileError(
                f"index '{path}' is damaged: line {number + 1} {problem}",
                hint="run the same extraction again with --force to start over",
            ) from None
        if header is None:
            header = entry
        else:
            keep(entry, offset, len(line))
            ordered = ordered and entry["shard"] > highest
            highest = max(highest, entry["shard"])
        end = after
    if header is None:
        raise _not_an_index(path, writing)
    return header, whole, end, ordered


def _lines(handle: BinaryIO, size: int) -> Iterator[tuple[int, bytes, int, int, bool | None]]:
    """The lines holding more than white space in the first ``size`` bytes of ``handle``: each line's number, its
    bytes (without the newline), its offset and the offset after it, and, for the last such line only, whether
    what was read ends with a newline (None for the others)."""
    held: tuple[int, bytes, int, int] | None = None
    number = offset = 0
    line = b""
    while offset < size:
        piece = handle.readline(size - offset)
        if not piece:  # cut shorter since (a writer cuts off a torn last line before it appends)
            break
        line = piece
        if line.strip():
            if held is not None:
                yield (*held, None)
            held = (number, line.removesuffix(b"\n"), offset, offset + len(line))
        offset += len(line)
        number += 1
    if held is not None:
        yield (*held, line.endswith(b"\n"))


class IndexReader:
    """The index at ``path`` as a reader keeps it: its header and, in shard order, a :class:`ShardLine` for each
    line (every line checked as :func:`parse_index` checks it); ``header`` is None when there is no index.

    The file stays open until :meth:`close`, so that a line is read again from where it was, whatever writers do
    to the index meanwhile (they append to it, or replace it with another file).
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lines: list[ShardLine] = []
        self._where: dict[int, tuple[int, int]] = {}  # shard number -> the offset and length of its line
        self._handle: BinaryIO | None = None
        try:
            self._handle = open_index(path, writing=False)
        except FileNotFoundError:
            self.header: dict | None = None
            return
        try:
            self.header = _scan(self._handle, path, False, self._keep)[0]
        except BaseException:
            self.close()
            raise
        self.lines.sort(key=lambda line: line.shard)

    def _keep(self, entry: dict, offset: int, length: int) -> None:
        self.lines.append(ShardLine.of(entry))
        self._where[entry["shard"]] = (offset, length)

    def line(self, listed: ShardLine) -> dict:
        """The whole line of which ``listed`` was kept, read again, checked again and found the same."""
        assert self._handle is not None and self.header is not None, "lines are read from an index that was there"
        offset, length = self._where[listed.shard]
        try:
            entry = json.loads(os.pread(self._handle.fileno(), length, offset))
            fileformat.check_index_line(entry, self.header)
            same = ShardLine.of(entry) == listed
        except (ValueError, RecursionError):
            same = False
        if not same:
            raise FeatureFileError(
                f"index '{self.path}' changed while it was read (the line of shard {listed.shard})",
                hint="open the folder again",
            )
        return entry

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()


def open_index(path: Path, *, writing: bool, update: bool = False):
    """The index file opened (see :func:`~hookcli.files.open_regular`); a writer's is never followed through a link."""
    try:
        return open_regular(path, follow_links=not writing, update=update)
    except NotRegularFile as err:
        hint = "remove it, then run again" if writing else "an index is a file written by hookcli extract -o DIR/"
        raise FeatureFileError(str(err), hint=hint) from None


def finished_shards(folder: str | os.PathLike, lines: list[ShardLine]) -> list[ShardLine]:
    """The lines whose shard files are on disk; the others describe work to do again."""
    return [line for line in lines if (Path(folder) / line.file).exists()]


def leading_shards(lines: list[ShardLine]) -> list[ShardLine]:
    """Shards 0, 1, 2, … of ``lines`` (in shard order) up to the first one missing: what reads as one file."""
    leading: list[ShardLine] = []
    for line in lines:
        if line.shard != len(leading):
            break
        leading.append(line)
    return leading


#: The entries of a shard's metadata that say which run made it: each must be the index header's.
RUN_ENTRIES = ("model", "weights", "capture", "preprocess", "pool", "dtype", "precision")


def check_shard(
    shard: FeatureFile,
    line: ShardLine,
    layout: dict | None = None,
    *,
    parts: bool = False,
    run: Mapping[str, str] | None = None,
) -> None:
    """Raise :class:`FeatureFileError` unless ``shard`` holds the rows its index line lists, laid out as ``layout``
    (the other shards' :func:`shard_layout`) says, and was made by the ``run`` the index header describes (its
    metadata: :data:`RUN_ENTRIES` must be the same). ``parts``: the folder is a gathering run's, whose shards hold
    their accumulators' states and the list of their rows (only that has one a row); the others hold rows."""
    problem = None
    try:
        listed = json.loads(shard.metadata.get("inputs", "[]"))
    except (ValueError, RecursionError):
        listed = None
    if (
        shard.metadata.get("shard") != str(line.shard)
        or not isinstance(listed, list)
        or len(listed) != line.rows
        or _names(listed) != line.names
    ):
        problem = f"it is not shard {line.shard} of the inputs its index line lists (its own metadata disagrees)"
    elif (shard.metadata.get("kind") == STATS_PART) != parts:
        problem = "it is a part of a stats or compare run" if not parts else "it holds rows, not a gathering run's part"
    elif run is not None and (differ := _run_differences(shard.metadata, run, parts=parts)):
        problem = f"it was made by another run than the index's (it differs in: {', '.join(differ)})"
    checked = [] if problem is not None else [PART_ROWS] if parts else shard.keys()
    for key in checked:
        shape = shard.shape(key) if key in shard.keys() else None
        if not shape or shape[0] != line.rows:
            problem = f"its tensor '{key}' has shape {shape or 'missing'} but the index lists {line.rows} rows"
            break
    if problem is None and layout is not None and line.rows:
        if shard_layout(shard) != layout:
            problem = "its tensors differ in keys, dtypes or shapes from the other shards'"
    if problem is not None:
        raise FeatureFileError(
            f"shard '{shard.name}' does not match its index line: {problem}",
            hint="run the same extract command again to write it again",
        )


#: The entries of a run's metadata in which its processes may differ (each its own device and versions).
PER_PROCESS_ENTRIES = ("device", "fused", "memory_format", "versions")


def _run_differences(metadata: Mapping[str, str], run: Mapping[str, str], *, parts: bool = False) -> list[str]:
    """The :data:`RUN_ENTRIES` in which a shard's ``metadata`` and the index's ``run`` differ (JSON compared parsed);
    for a part, every entry of ``run`` but :data:`PER_PROCESS_ENTRIES` (the command's own, ``stats``, ``compare``,
    …, included), its layers by their keys."""
    entries = [entry for entry in run if entry not in PER_PROCESS_ENTRIES] if parts else RUN_ENTRIES
    differ = []
    for entry in entries:
        read = _layer_keys if entry == "layers" else _parsed
        if entry in run and read(metadata.get(entry)) != read(run[entry]):
            differ.append(entry)
    return differ


def _layer_keys(text: str | None):
    """A ``layers`` entry as the key of each layer (what a process learns of them, their calls, left out)."""
    found = _parsed(text)
    if not isinstance(found, dict):
        return found
    return {path: entry.get("key") if isinstance(entry, dict) else entry for path, entry in found.items()}


def _parsed(text: str | None):
    try:
        return None if text is None else json.loads(text)
    except (ValueError, RecursionError):
        return text


def shard_layout(features: FeatureReader) -> dict:
    """What every shard of a folder shares: each key's dtype and row shape (a ragged key's only its dimensions)."""
    layout = {}
    for key in features.keys():
        shape, ragged = features.shape(key), features.ragged(key)
        layout[key] = (features.dtype(key), ragged, len(shape) if ragged else shape[1:])
    return layout


class ShardChecks:
    """Which of the shards an index lists in ``folder`` a run may continue from: whole, and holding the rows their
    lines list. A shard is checked once for its line: again only when its file (or its line) changed since.

    Checking every shard of a large folder takes a while, so a writer checks with the folder's lock let go; what
    it checked is still known when it takes the lock again and finds the index changed meanwhile. ``parts``: as
    for :func:`check_shard`.
    """

    def __init__(self, folder: str | os.PathLike, *, parts: bool = False) -> None:
        self.folder, self.parts = Path(folder), parts
        self._sound: dict[tuple[ShardLine, tuple], bool] = {}  # (line, the file as checked) -> whether it is sound

    def sound(self, entries: Sequence[dict], run: Mapping[str, str] | None = None) -> list[dict]:
        """The index lines of ``entries`` whose shards are sound (see :func:`check_shard`; ``run``: the index
        header's metadata)."""
        return [entry for entry in entries if self._is_sound(entry, run)]

    def _is_sound(self, entry: Mapping, run: Mapping[str, str] | None) -> bool:
        path = self.folder / entry["file"]
        try:
            found = os.lstat(path)
        except FileNotFoundError:
            return False
        known = (ShardLine.of(entry), (*file_key(found), found.st_size, found.st_mtime_ns))
        if known not in self._sound:
            try:
                with FeatureFile(path, follow_links=False) as shard:
                    check_shard(shard, known[0], parts=self.parts, run=run)
            except FeatureFileError:
                self._sound[known] = False
            else:
                self._sound[known] = True
        return self._sound[known]


def file_key(path_or_stat) -> tuple[int, int]:
    """Which file a path names now, itself and not what a link points to (or a stat result describes): an index
    rewritten is another file."""
    found = path_or_stat if isinstance(path_or_stat, os.stat_result) else os.lstat(path_or_stat)
    return found.st_dev, found.st_ino


#: How an index line begins (:func:`~hookcli.storage.fileformat.index_line` puts ``shard`` first).
_LINE_START = re.compile(rb'^\{"shard": (\d+),')


def shard_of(line: bytes, folder: str) -> int:
    found = _LINE_START.match(line)
    if found is None:
        raise FeatureFileError(
            f"the index of '{folder}' holds a line hookcli did not write",
            hint="run the same extraction again with --force to start over",
        )
    return int(found.group(1))
