"""Writing a shard folder: :class:`ShardWriter` claims shards no other process holds, writes each one
atomically in a thread of its own while the next batches compute, and lists it in the index under the
folder's lock; a run continues an earlier one of the same command.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

from hookcli.errors import FeatureFileError, OutputExistsError
from hookcli.files import check_own_folder, remove_abandoned, temporary_target
from hookcli.inputs.archives import file_stamp
from hookcli.storage import fileformat
from hookcli.storage.background import Background
from hookcli.storage.claims import CLAIMS, LOCK_NAME, Claims, FolderLock, check_folder_target
from hookcli.storage.fileformat import INDEX_NAME, SHARD_FILE
from hookcli.storage.index import Index, ShardChecks, index_state, parse_index
from hookcli.storage.index_log import IndexLog
from hookcli.storage.saving import write_safetensors

__all__ = ["ShardWriter", "batches_in"]


#: What a gathering run's folder of parts holds, for messages.
_PARTS = "a file's parts"


class ShardWriter:
    """Writes a run's shards into ``folder`` on a background thread and keeps its index, shared with other processes.

    ``identity`` holds what must match to share or continue a run there (model, weights, layers, preprocessing,
    inputs…). A folder whose index describes another run raises :class:`OutputExistsError` naming what differs, as
    does one with shards but no index, unless ``force`` (which deletes that run's shards and index). The first process
    founds the run and holds the :class:`~hookcli.storage.claims.FolderLock` until :meth:`start_writing` records the
    header; the others wait, then read the shard size from it. :meth:`order` hands out the inputs of the shards this
    process claims (:class:`~hookcli.storage.claims.Claims`), the block ``part`` ``(index, count)`` first, then any
    shard nobody holds. ``parts``: the shards are a gathering run's parts (:func:`~hookcli.storage.index.check_shard`).
    """

    def __init__(
        self,
        folder: str | os.PathLike,
        identity: Mapping,
        total: int,
        *,
        force: bool = False,
        part: tuple[int, int] = (0, 1),
        on_note: Callable[[str], None] | None = None,
        parts: bool = False,
    ) -> None:
        if parts:
            check_own_folder(folder, _PARTS)
        check_folder_target(folder)
        self.folder, self._given = Path(folder), str(folder)
        self.identity, self.parts = dict(identity), parts
        self.total = total
        self.part = part
        self._made = not os.path.lexists(self.folder)  # an empty folder of this run's making goes if it fails
        self.folder.mkdir(parents=True, exist_ok=True)
        if parts:
            check_own_folder(folder, _PARTS)  # a link put there meanwhile: the lock, claims and shards go in no link
            _refuse_others(self.folder, self._given)
        self.lock = FolderLock(self.folder, self._given, on_wait=on_note)
        self.claims = Claims(self.folder, on_note=on_note)
        self.index = IndexLog(self.folder / INDEX_NAME, self._given, self.identity)
        self.done = 0  # inputs in shards finished before this process began
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
        self._writing: Background | None = None  # the thread that writes shards while the next batches compute

    def _open(self, force: bool) -> None:
        checks = ShardChecks(self.folder, parts=self.parts)
        while True:
            index = self._read(force)
            self.header = index.header
            self.shard_size: int | None = index.header["shard_size"] if index.header else None
            if index.header is None or self._continue(index, checks, force):
                return

    def _read(self, force: bool) -> Index:
        """The index as it is now (the caller holds the lock): none when an earlier run was cleared away (``force``)
        or there was none."""
        try:
            index = parse_index(self.index_path, writing=True)
        except FeatureFileError:
            if not force or (self.index_path.is_dir() and not self.index_path.is_symlink()):
                raise
            index = Index(None, [])  # --force: a damaged index goes, with the shards it listed
        header = index.header
        sides = ("the folder's", "this command's")
        differ = fileformat.identity_differences(header["identity"], self.identity, sides) if header else []
        if differ:
            if not force:
                what = "the parts of a different run" if self.parts else "a different run"
                other = "another file" if self.parts else "another folder"
                raise OutputExistsError(
                    f"'{self._given}' holds {what} (it differs in: {', '.join(differ)})",
                    hint=f"run the same command to continue it, add --force to replace it, or use {other}",
                )
            index = Index(None, [])
        if index.header is None:
            self._remove_old_run(force)
            self.claims.clear()
        # Left by killed processes: shards are written in place, so an unlocked one is abandoned.
        remove_abandoned(self.folder, ".features-*.safetensors.*.part")
        return index

    def _continue(self, index: Index, checks: ShardChecks, force: bool) -> bool:
        """Continue the run from the shards ``index`` lists that are sound and were computed from the inputs as
        they are. Their files are checked with the lock let go (many processes joining a large folder would wait on
        each other's checks); the lock is taken again to rewrite the index when some shard must be computed again or
        a torn line cut off. False when the index changed meanwhile, so that the rewrite would lose another
        process's work: the caller reads it again (and only shards not checked yet are checked)."""
        self.lock.release()
        run = index.header["metadata"] if index.header else None
        finished = _unchanged(checks.sound(index.shards, run), self._given, force)
        self.lock.acquire()
        if len(finished) == len(index.shards) and index.whole:
            self.index.adopt(index)
        elif index_state(self.index_path) == index.state:
            self.index.rewrite(index.header, finished)  # new lines must follow good ones, never a torn or stale one
        else:
            return False
        self.done = sum(entry["count"] for entry in finished)
        return True

    @property
    def index_path(self) -> Path:
        return self.folder / INDEX_NAME

    @property
    def shards(self) -> int:
        """How many shards the run has (once the shard size is known)."""
        return fileformat.shard_count({"inputs": self.total, "shard_size": self.shard_size})

    @property
    def _size(self) -> int:
        """The shard size, where the caller knows it is known (a shard is listed, or the header written)."""
        assert self.shard_size is not None, "the shard size is known once the run's header is"
        return self.shard_size

    @property
    def inputs_done(self) -> int:
        """Inputs in the shards listed (as this process last read the index)."""
        return sum(min(self._size, self.total - number * self._size) for number in self.index.finished)

    @property
    def complete(self) -> bool:
        """Every shard of the run is listed (as this process last read the index)."""
        return self.shard_size is not None and len(self.index.finished) == self.shards

    def _remove_old_run(self, force: bool) -> None:
        """Delete an earlier run's index and shards (``force``); without it, refuse shard files no index lists."""
        found = sorted(
            child.name
            for child in self.folder.iterdir()
            if child.name == INDEX_NAME or (SHARD_FILE.match(child.name) and not child.name.startswith("."))
        )
        if found and not force:
            more = f" and {len(found) - 1} more" if len(found) > 1 else ""
            raise OutputExistsError(
                f"'{self._given}' holds {found[0]}{more} but no index of a run",
                hint="move those files away, choose another folder, or add --force to delete them",
            )
        for name in found:
            (self.folder / name).unlink()

    def start_writing(self, header: Mapping | None = None) -> None:
        """Record the run in a new index (``header``, see :func:`~hookcli.storage.fileformat.index_header`; none when
        continuing) and start the writer thread. A founder claims the shards it has handed out inputs of, then
        lets the other processes in."""
        if self.header is None:
            assert header is not None, "a run without an index (a founder's) gives its header"
            self.header = dict(header)
            self.shard_size = self.header["shard_size"]
            self.index.rewrite(self.header, [])
            for number in range(self._reached // self._size + 1 if self._reached >= 0 else 0):
                self.claims.take(number)
                self._started.add(number)
            self.lock.release()
        self.claims.start()
        self._writing = Background(lambda shard: self._write(*shard), name="hookcli-shard-writer")

    def shard_of(self, index: int) -> int:
        """The shard input ``index`` falls in (once the shard size is known)."""
        return index // self._size

    def shard_range(self, number: int) -> tuple[int, int]:
        """Inputs ``[first, end)`` covered by shard ``number``."""
        first = number * self._size
        return first, min(first + self._size, self.total)

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
            yield from batches_in(index, self.shard_range((index - 1) // self.shard_size)[1], batch_size)
        while (number := self._next_shard()) is not None:
            yield from batches_in(*self.shard_range(number), batch_size)

    def _next_shard(self) -> int | None:
        """Claim the next shard to compute: this part's block first, then the shards after it, then those before;
        once through, any shard whose claim was given up or abandoned."""
        count = self.shards
        low, high = self.part[0] * count // self.part[1], (self.part[0] + 1) * count // self.part[1]

        def shard_at(position: int) -> int:
            return (low + position) % count if high > low else position

        with self.lock.held():
            self.index.refresh()
            for start in (self._cursor, 0):
                for position in range(start, count):
                    number = shard_at(position)
                    if number in self.index.finished or number in self._started:
                        continue
                    if self.claims.take(number):
                        self._started.add(number)
                        self._cursor = position + 1
                        return number
                self._cursor = count
        return None

    def submit(
        self,
        number: int,
        tensors: Mapping,
        metadata: Mapping[str, str],
        inputs: Sequence[str],
        skipped: Sequence[dict],
        details: Mapping[str, Sequence] | None = None,
        stamps: Mapping[str, list[int] | None] | None = None,
    ) -> None:
        """Queue a finished shard (``details``: its rows' :data:`~hookcli.storage.fileformat.ROW_DETAILS`;
        ``stamps``: each file its inputs were read from, with its size and time); blocks while the previous one is
        still being written."""
        assert self._writing is not None, "start_writing comes first"
        self._writing.submit((number, tensors, metadata, list(inputs), list(skipped), details, stamps))

    def close(self) -> None:
        """Wait for queued shards to be on disk, give up unfinished claims; re-raise a writer failure. The
        process that leaves the folder complete removes the lock and the claims folder."""
        writing, self._writing = self._writing, None
        failed = False
        try:
            if writing is not None:
                writing.close()  # raises what failed
        except BaseException:
            failed = True
            raise
        finally:
            self.claims.release_all(self.lock)
            if not failed and self.shard_size is not None:
                with self.lock.held():
                    self.index.refresh()
                    if self.complete:
                        self.claims.clear()
                        self.lock.remove()
            self._leave()

    def _leave(self) -> None:
        """Let go of the lock; a founder that wrote no header leaves no lock file behind, nor the folder when it made
        it and nothing else is in it."""
        if self.header is None and self.lock.holding:
            self.lock.remove()
        self.lock.close()
        if self.header is None and self._made:
            with contextlib.suppress(OSError):
                os.rmdir(self.folder)  # only an empty folder goes

    def _write(self, number, tensors, metadata, inputs, skipped, details, stamps) -> None:
        line = fileformat.index_line(number, self._size, self.total, inputs, skipped, details, stamps)
        write_safetensors(
            tensors,
            metadata,
            self.folder / line["file"],
            force=True,
            publish=lambda: self._publishing(number, line),
            sweep=False,  # swept once, when the folder opened: a glob a shard would cost O(shards²) over a run
        )

    @contextlib.contextmanager
    def _publishing(self, number: int, line: Mapping) -> Iterator[bool]:
        """Under the lock: rename shard ``number`` into place and list it, unless another process listed it."""
        with self.lock.held():
            self.index.refresh()
            if number in self.index.finished:
                self.claims.release(number)
                yield False
                return
            yield True
            self.index.append(line)
            self.claims.release(number)
            if self.complete:
                self.finisher = True
                if not self.index.ordered:  # the last shard: the lines go in shard order
                    self.index.rewrite_in_order(self.header)


#: What systems put in any folder (macOS's Finder, NFS's files deleted while open, FUSE's, Windows'): never the
#: user's work, removed with the folder.
_SYSTEM_FILES = (".DS_Store", "._", ".nfs", ".fuse_hidden", "Thumbs.db", "desktop.ini")


def _refuse_others(folder: Path, given: str) -> None:
    """Refuse a folder of parts that holds what hookcli puts in none (the user's files): it is removed whole once
    the parts merge."""
    ours = (INDEX_NAME, LOCK_NAME, CLAIMS)
    other = next(
        (
            name
            for name in sorted(os.listdir(folder))  # a file being written (its temporary name) counts as that file
            if temporary_target(name) not in ours
            and not SHARD_FILE.match(temporary_target(name))
            and not name.startswith(_SYSTEM_FILES)
        ),
        None,
    )
    if other is not None:
        raise OutputExistsError(
            f"'{given}' holds '{other}', which hookcli never puts there: it keeps a file's parts in that folder and "
            "removes it whole when the file is written",
            hint="move what it holds elsewhere, or give another -o",
        )


def batches_in(first: int, end: int, size: int) -> Iterator[list[int]]:
    """Inputs ``[first, end)`` cut where a multiple of ``size`` begins: the batches of a shard, the same whoever
    computes it."""
    while first < end:
        stop = min((first // size + 1) * size, end)
        yield list(range(first, stop))
        first = stop


def _unchanged(shards: list[dict], folder: str, force: bool) -> list[dict]:
    """The shards whose inputs are as they were when they were computed (the files' sizes and modification times
    are those their index lines keep). A changed one is refused, naming the file: a replaced input would leave rows
    of the old one beside rows of the new. With ``force`` its shards are left out, to be computed again."""
    kept = []
    for entry in shards:
        changed = next(
            (
                path
                for path, stamp in entry.get("stamps", {}).items()
                if stamp is not None and file_stamp(path) != stamp
            ),
            None,
        )
        if changed is None:
            kept.append(entry)
        elif not force:
            raise OutputExistsError(
                f"input '{changed}' changed after shard {entry['shard']} of '{folder}' was computed from it (its "
                "size or modification time differ)",
                hint="put the original back to continue, or add --force to compute its shards again",
            )
    return kept
