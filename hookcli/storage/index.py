"""A shard folder's index (``index.jsonl``): read and checked as untrusted input, line by line, and the shards
it lists checked against their files.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import NamedTuple

from hookcli.errors import FeatureFileError
from hookcli.files import NotRegularFile, open_regular
from hookcli.storage import fileformat
from hookcli.storage.features import FeatureFile
from hookcli.storage.fileformat import INDEX_NAME
from hookcli.storage.reader import FeatureReader

__all__ = [
    "check_shard",
    "file_key",
    "finished_shards",
    "Index",
    "leading_shards",
    "open_index",
    "parse_index",
    "read_index",
    "shard_layout",
    "shard_of",
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
    offset after the last good line; ``ordered`` says whether the lines came in shard order."""

    header: dict | None
    shards: list[dict]  # in shard order
    whole: bool = True
    end: int = 0
    ordered: bool = True


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
        with open_index(path, writing=writing) as handle:
            raw = handle.read()
    except FileNotFoundError:
        return Index(None, [])
    lines = raw.split(b"\n")
    entries: list[dict] = []
    whole, end, offset = True, 0, 0
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
            raise FeatureFileError(
                f"index '{path}' is damaged: line {number + 1} {problem}",
                hint="run the same extraction again with --force to start over",
            ) from None
        entries.append(entry)
        end = min(offset, len(raw))
    if not entries:
        raise _not_an_index(path, writing)
    numbers = [entry["shard"] for entry in entries[1:]]
    return Index(
        entries[0], sorted(entries[1:], key=lambda entry: entry["shard"]), whole, end, numbers == sorted(numbers)
    )


def open_index(path: Path, *, writing: bool, update: bool = False):
    """The index file opened (see :func:`~hookcli.files.open_regular`); a writer's is never followed through a link."""
    try:
        return open_regular(path, follow_links=not writing, update=update)
    except NotRegularFile as err:
        hint = "remove it, then run again" if writing else "an index is a file written by hookcli extract -o DIR/"
        raise FeatureFileError(str(err), hint=hint) from None


def finished_shards(folder: str | os.PathLike, shards: list[dict], *, verify: bool = False) -> list[dict]:
    """The index lines whose shard files are on disk (with ``verify``, a run about to continue: whole, and holding
    the rows their lines list); the others describe work to do again."""
    return [
        entry
        for entry in shards
        if (Path(folder) / entry["file"]).exists()
        and (not verify or _shard_is_sound(Path(folder) / entry["file"], entry))
    ]


def leading_shards(shards: list[dict]) -> list[dict]:
    """Shards 0, 1, 2, … of ``shards`` (in shard order) up to the first one missing: what reads as one file."""
    leading: list[dict] = []
    for entry in shards:
        if entry["shard"] != len(leading):
            break
        leading.append(entry)
    return leading


def check_shard(shard: FeatureFile, entry: Mapping, layout: dict | None = None) -> None:
    """Raise :class:`FeatureFileError` unless ``shard`` holds the rows its index line lists, laid out as ``layout``
    (the other shards' :func:`shard_layout`) says."""
    rows = len(entry["inputs"])
    problem = None
    try:
        listed = json.loads(shard.metadata.get("inputs", "[]"))
    except (ValueError, RecursionError):
        listed = None
    if shard.metadata.get("shard") != str(entry["shard"]) or listed != entry["inputs"]:
        problem = f"it is not shard {entry['shard']} of the inputs its index line lists (its own metadata disagrees)"
    for key in shard.keys() if problem is None else ():
        shape = shard.shape(key)
        if not shape or shape[0] != rows:
            problem = f"its tensor '{key}' has shape {shape} but the index lists {rows} rows"
            break
    if problem is None and layout is not None and rows:
        if shard_layout(shard) != layout:
            problem = "its tensors differ in keys, dtypes or shapes from the other shards'"
    if problem is not None:
        raise FeatureFileError(
            f"shard '{shard.name}' does not match its index line: {problem}",
            hint="run the same extract command again to write it again",
        )


def shard_layout(features: FeatureReader) -> dict:
    """What every shard of a folder shares: each key's dtype and row shape (a ragged key's only its dimensions)."""
    layout = {}
    for key in features.keys():
        shape, ragged = features.shape(key), features.ragged(key)
        layout[key] = (features.dtype(key), ragged, len(shape) if ragged else shape[1:])
    return layout


def _shard_is_sound(path: Path, entry: Mapping) -> bool:
    try:
        with FeatureFile(path, follow_links=False) as shard:
            check_shard(shard, entry)
    except FeatureFileError:
        return False
    return True


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
