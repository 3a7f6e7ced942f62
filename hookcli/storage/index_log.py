"""A shard folder's index as one writing process keeps it: which shards are listed, read again only where other
processes appended to it, and lines appended or the whole index rewritten atomically.

The caller holds the folder's lock (:class:`~hookcli.storage.claims.FolderLock`) around every method but the
constructor.

>>> import json, tempfile
>>> from pathlib import Path
>>> path = Path(tempfile.mkdtemp()) / "index.jsonl"
>>> log = IndexLog(path, "feats/", {"model": "m"})
>>> log.rewrite({"format": "x", "identity": {"model": "m"}}, [])
>>> log.append({"shard": 2}); log.append({"shard": 1})
>>> sorted(log.finished), log.ordered
([1, 2], False)
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from hookcli.errors import FeatureFileError, OutputExistsError
from hookcli.files import atomic_path, reporting_full_disk
from hookcli.storage.fileformat import INDEX_NAME, identity_differences
from hookcli.storage.index import Index, file_key, open_index, parse_index, shard_of

__all__ = ["IndexLog"]


class IndexLog:
    """The shards listed in the index at ``path`` of the run ``identity`` (``given``: the folder as the user named
    it, for messages), as this process last read it.

    ``finished`` holds the listed shards' numbers; ``ordered`` is whether
    the lines follow shard order (the process that lists the last shard
    rewrites them in order when they do not).
    """

    def __init__(self, path: Path, given: str, identity: Mapping) -> None:
        self.path, self._given, self._identity = path, given, identity
        self.finished: set[int] = set()
        self.ordered = True
        self._highest = -1  # the highest shard listed (while lines come in order, the last one)
        self._key: tuple[int, int] | None = None
        self._end = 0

    def adopt(self, index: Index) -> None:
        """Take the lines of ``index``, read whole: what was appended since is read by the next :meth:`refresh`, and
        an index replaced since is read again then."""
        assert index.state is not None, "an index that was read"
        self._take(index.shards, index.ordered)
        self._key, self._end = index.state[:2], index.end

    def rewrite(self, header: Mapping | None, lines: Sequence[Mapping]) -> None:
        """The index as ``header`` and ``lines`` (in shard order), atomically: a reader sees the old one or this."""
        with atomic_path(self.path, force=True) as temporary:
            temporary.write_text("".join(json.dumps(line) + "\n" for line in [header, *lines]))
        found = os.lstat(self.path)
        self._take(lines, True)
        self._key, self._end = file_key(found), found.st_size

    def rewrite_in_order(self, header: Mapping | None) -> None:
        """The index's lines again, in shard order."""
        self.rewrite(header, parse_index(self.path, writing=True).shards)

    def refresh(self) -> None:
        """Learn which shards other processes listed since the last look: what they appended, or the whole index
        when it was replaced."""
        try:
            found = os.lstat(self.path)  # a link put in its place is another file: it is read, and refused
        except FileNotFoundError:
            raise FeatureFileError(
                f"'{self._given}' lost its {INDEX_NAME} while this run was writing it",
                hint="run the same command again to continue",
            ) from None
        key = file_key(found)
        if key != self._key or found.st_size < self._end:
            header, shards, _, end, ordered, _ = parse_index(self.path, writing=True)
            if header is None or identity_differences(header["identity"], self._identity):
                raise OutputExistsError(
                    f"'{self._given}' was given to a different run while this one was writing it",
                    hint="write this run to another folder",
                )
            self._take(shards, ordered)
            self._key, self._end = key, end
            return
        if found.st_size == self._end:
            return
        with open_index(self.path, writing=True) as index:
            index.seek(self._end)
            raw = index.read(found.st_size - self._end)
        complete = raw[: raw.rfind(b"\n") + 1]
        for line in complete.split(b"\n"):
            if line.strip():
                self._listed(shard_of(line, self._given))
        self._end += len(complete)

    def append(self, line: Mapping) -> None:
        """Add ``line`` (shard ``line["shard"]``) after the last whole line (the caller has just refreshed)."""
        with reporting_full_disk(self.path), open_index(self.path, writing=True, update=True) as index:
            index.truncate(self._end)  # a line cut short by a killed process is not followed
            index.seek(self._end)
            index.write(json.dumps(line).encode() + b"\n")
            index.flush()
            os.fsync(index.fileno())
            self._end = index.tell()
        self._key = file_key(self.path)
        self._listed(int(line["shard"]))

    def _take(self, shards: Sequence[Mapping], ordered: bool) -> None:
        self.finished = {int(entry["shard"]) for entry in shards}
        self._highest = max(self.finished, default=-1)
        self.ordered = ordered

    def _listed(self, number: int) -> None:
        """Shard ``number``'s line follows the others in the index."""
        self.ordered = self.ordered and number > self._highest
        self._highest = max(self._highest, number)
        self.finished.add(number)
