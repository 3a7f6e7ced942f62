"""Many processes on one shard folder: a short-held folder lock, claims on shards, and heartbeats.

Every process writing a shard folder takes the folder's lock
(:data:`LOCK_NAME`, an ``flock``) only for short steps: reading the index
lines others appended, claiming a shard, publishing a finished one. Before
it reads a shard's inputs it claims the shard: ``.claims/<number>`` holds its
owner (host, pid, start time), written beside it and renamed into place, so
that no claim is ever without its owner, not even one a killed process left;
the file's modification time is a heartbeat, renewed by a thread every
:data:`HEARTBEAT` seconds. A claim is taken over when its owner is gone (on
this host, no process has its pid) or its heartbeat is further than
:func:`claim_timeout` (:data:`DEFAULT_CLAIM_TIMEOUT` seconds, or
``$HOOKCLI_CLAIM_TIMEOUT``) from now, in the past or in the future.

The lock file, the claims folder and the claims are only ever opened without
following a symbolic link (claims through a descriptor of their folder), and
anything in their place that hookcli did not make (a link, a FIFO, a folder)
is refused, naming it: hookcli writes, renews and deletes files inside the
output folder only.

Claims only save work: publishing a shard checks the index under the lock,
so a shard computed twice (by a process that was only paused, say) is still
listed once.

>>> import tempfile
>>> from pathlib import Path
>>> folder = Path(tempfile.mkdtemp())
>>> lock = FolderLock(folder, str(folder))
>>> claims, another_process = Claims(folder), Claims(folder)
>>> with lock.held():
...     claims.take(3), another_process.take(3), sorted(claims.mine)
(True, False, [3])
>>> claims.release_all(lock); lock.close()
>>> sorted(p.name for p in (folder / CLAIMS).iterdir())
[]
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import stat
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path

from hookcli.errors import UsageProblem, seconds_from_environment
from hookcli.files import check_folder_output, file_kind, process_stat, reporting_full_disk

__all__ = [
    "CLAIMS",
    "Claims",
    "DEFAULT_CLAIM_TIMEOUT",
    "FolderLock",
    "HEARTBEAT",
    "LOCK_NAME",
    "SHORTEST_CLAIM_TIMEOUT",
    "check_folder_parts",
    "check_folder_target",
    "claim_timeout",
]

#: The lock file of a shard folder, held only for short steps.
LOCK_NAME = ".hookcli.lock"
#: The folder (inside a shard folder) of the claims on unfinished shards.
CLAIMS = ".claims"
#: Seconds between two heartbeats of a claim.
HEARTBEAT = 10.0
#: A claim whose heartbeat is older than this many seconds is taken over.
DEFAULT_CLAIM_TIMEOUT = 120.0
#: The shortest claim timeout accepted: heartbeats come four times a timeout, and a shorter one would spin the
#: heartbeat thread and take claims from live processes that a busy machine kept waiting a moment.
SHORTEST_CLAIM_TIMEOUT = 1.0
#: The longest: a day.
LONGEST_CLAIM_TIMEOUT = 86400.0
#: Seconds waited on the lock before saying so.
_WAIT_NOTE_AFTER = 5.0


def claim_timeout() -> float:
    """Seconds without a heartbeat after which a claim counts as abandoned (``$HOOKCLI_CLAIM_TIMEOUT``): at least
    :data:`SHORTEST_CLAIM_TIMEOUT`, as a shorter one would take claims from live processes (and spin the heartbeat)."""
    return seconds_from_environment(
        "HOOKCLI_CLAIM_TIMEOUT", DEFAULT_CLAIM_TIMEOUT, SHORTEST_CLAIM_TIMEOUT, LONGEST_CLAIM_TIMEOUT
    )


def check_folder_parts(folder: Path) -> None:
    """Refuse, before any work, a lock file, claims folder or claim in ``folder`` that hookcli did not make."""
    _refuse_unless(folder / LOCK_NAME, stat.S_ISREG, _LOCK_FILE)
    if _refuse_unless(folder / CLAIMS, stat.S_ISDIR, _CLAIMS_FOLDER):
        for child in (folder / CLAIMS).iterdir():
            _refuse_unless(child, stat.S_ISREG, _CLAIM_FILE)


_LOCK_FILE, _CLAIMS_FOLDER, _CLAIM_FILE = "a lock file", "the folder of claims", "a claim file"


def _not_made_here(path: Path, expected: str, mode: int) -> UsageProblem:
    """The error for ``path``, found to be something other than ``expected`` (what hookcli makes there)."""
    return UsageProblem(f"'{path}' is {file_kind(mode)}, not {expected} hookcli made", hint="remove it, then run again")


def _refuse_unless(path: Path, is_kind: Callable[[int], bool], expected: str) -> bool:
    """Raise unless ``path`` is missing or ``is_kind`` (a link counts as itself): whether it is there."""
    mode = _mode(path)
    if mode is not None and not is_kind(mode):
        raise _not_made_here(path, expected, mode)
    return mode is not None


def _unopened(path: Path, is_kind: Callable[[int], bool], expected: str, err: OSError) -> UsageProblem:
    """Why opening ``path`` failed with ``err``: something other than ``expected`` is there, or it is not ours to
    open."""
    mode = _mode(path)
    if mode is not None and not is_kind(mode):
        return _not_made_here(path, expected, mode)
    if isinstance(err, FileNotFoundError) and not path.parent.is_dir():
        return UsageProblem(
            f"folder '{path.parent}' went away while this run was writing in it",
            hint="run the same command again (it makes the folder anew), and leave the folder be while it runs",
        )
    return UsageProblem(
        f"cannot open '{path}' ({err.strerror})", hint="check its permissions, or choose another place with -o"
    )


def _mode(path: Path) -> int | None:
    """``path``'s own ``st_mode`` (a link's, not its target's), or None when nothing is there."""
    try:
        return os.lstat(path).st_mode
    except FileNotFoundError:
        return None


class FolderLock:
    """An exclusive ``flock`` on ``folder``'s lock file that threads of one process share (re-entrant).

    Another process holding it makes :meth:`held` wait; after a few seconds
    ``on_wait`` hears why once. The lock file may be deleted by its holder
    (:meth:`remove`): a lock taken on a deleted file is taken again on the
    new one.
    """

    def __init__(self, folder: Path, name: str, on_wait: Callable[[str], None] | None = None) -> None:
        self.path, self.name, self.on_wait = folder / LOCK_NAME, name, on_wait
        self._threads = threading.RLock()
        self._depth = 0
        self._descriptor: int | None = None
        _LOCKS.add(self)

    def _forget(self) -> None:
        """In a child forked while this process held the lock (a decode worker): drop the child's copy of the
        lock file, through which the lock would stay held after this process dies while the child lives on."""
        if self._descriptor is not None:
            os.close(self._descriptor)  # the child's own descriptor only: the lock stays this process's
        self._threads, self._depth, self._descriptor = threading.RLock(), 0, None

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        self.acquire()
        try:
            yield
        finally:
            self.release()

    def acquire(self) -> None:
        self._threads.acquire()
        try:
            if self._depth == 0:
                self._descriptor = self._lock()
        except BaseException:
            self._threads.release()
            raise
        self._depth += 1

    def release(self) -> None:
        self._depth -= 1
        if self._depth == 0 and self._descriptor is not None:
            # Unlock before closing: a process forked while the lock was held (a decode worker) shares this open
            # file, and closing only our descriptor would leave the flock held through its copy.
            fcntl.flock(self._descriptor, fcntl.LOCK_UN)
            os.close(self._descriptor)
            self._descriptor = None
        self._threads.release()

    @property
    def holding(self) -> bool:
        return self._depth > 0

    def remove(self) -> None:
        """Delete the lock file (while holding it): a finished folder keeps no trace of its writers."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)

    def close(self) -> None:
        while self._depth:
            self.release()

    def _waiting_note(self) -> str:
        return (
            f"waiting for another hookcli process writing '{self.name}' (it holds {LOCK_NAME} while it "
            "starts the run or records a shard)"
        )

    def _lock(self) -> int:
        said = False
        while True:
            descriptor = self._open()
            try:
                fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                # Wait in the kernel's queue (polling would let a busy holder take it again and again).
                timer = (
                    threading.Timer(_WAIT_NOTE_AFTER, self.on_wait, args=(self._waiting_note(),))
                    if self.on_wait and not said
                    else None
                )
                if timer is not None:
                    said = True
                    timer.daemon = True
                    timer.start()
                try:
                    fcntl.flock(descriptor, fcntl.LOCK_EX)
                except BaseException:
                    os.close(descriptor)
                    raise
                finally:
                    if timer is not None:
                        timer.cancel()
            except BaseException:
                os.close(descriptor)
                raise
            try:
                current = os.lstat(self.path).st_ino
            except FileNotFoundError:
                current = None
            if current == os.fstat(descriptor).st_ino:
                return descriptor
            os.close(descriptor)  # the holder deleted the file meanwhile: lock the new one

    def _open(self) -> int:
        """The lock file, created if missing; a link, a FIFO or a folder in its place is refused, never followed
        nor waited on."""
        try:
            descriptor = os.open(
                self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK, 0o666
            )
        except OSError as err:
            raise _unopened(self.path, stat.S_ISREG, _LOCK_FILE, err) from None
        mode = os.fstat(descriptor).st_mode
        if not stat.S_ISREG(mode):
            os.close(descriptor)
            raise _not_made_here(self.path, _LOCK_FILE, mode)
        return descriptor


#: Every lock of this process, so that a forked child drops them (:meth:`FolderLock._forget`).
_LOCKS: weakref.WeakSet = weakref.WeakSet()
os.register_at_fork(after_in_child=lambda: [lock._forget() for lock in list(_LOCKS)])

_RELEASED = "nobody (released meanwhile)"


def _owner() -> dict:
    return {"host": socket.gethostname(), "pid": os.getpid(), "since": round(time.time(), 3)}


class Claims:
    """This process's claims on shards of ``folder``: taken and released under the folder's lock, kept fresh by
    a heartbeat thread."""

    def __init__(
        self, folder: Path, *, timeout: float | None = None, on_note: Callable[[str], None] | None = None
    ) -> None:
        self.folder = folder / CLAIMS
        self.timeout = claim_timeout() if timeout is None else timeout
        self.on_note = on_note  # hears of each claim taken over
        self.mine: set[int] = set()
        self._beating = threading.Event()  # a fresh one for each heartbeat thread
        self._thread: threading.Thread | None = None

    def path(self, number: int) -> Path:
        return self.folder / _claim_name(number)

    @contextlib.contextmanager
    def _opened(self, *, create: bool = False) -> Iterator[int | None]:
        """A descriptor of the claims folder (None when there is none and ``create`` is not set), through which
        every claim is made, renewed and deleted: a link in the folder's place would lead them out of the output
        folder, so it is refused, as is a file."""
        if create:
            with contextlib.suppress(FileExistsError):
                os.mkdir(self.folder)  # never follows a link: one in the way is refused below
        try:
            descriptor = os.open(
                self.folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
            )
        except FileNotFoundError:
            descriptor = None
        except OSError as err:
            raise _unopened(self.folder, stat.S_ISDIR, _CLAIMS_FOLDER, err) from None
        try:
            yield descriptor
        finally:
            if descriptor is not None:
                os.close(descriptor)

    def take(self, number: int) -> bool:
        """Claim shard ``number`` (the caller holds the folder lock): False when a live process holds it."""
        if number in self.mine:
            return True
        name = _claim_name(number)
        with self._opened(create=True) as folder:
            assert folder is not None, "made by _opened, under the folder lock"
            owner = self._abandoned(name, folder)
            if owner is None:
                return False
            if owner != _RELEASED and self.on_note is not None:
                self.on_note(f"shard {number} was claimed by {owner}: this process computes it")
            self._write_claim(number, folder)
        self.mine.add(number)
        return True

    def _write_claim(self, number: int, folder: int) -> None:
        """Make the claim on ``number`` in ``folder`` (the caller holds the folder lock), its owner this process, in
        one step: written beside it, then renamed into place (over an abandoned claim). A claim created empty and
        written after is left empty by a process killed in between, and a claim naming no owner holds its shard until
        it times out: the processes still running would end with that shard undone."""
        name = _claim_name(number)
        beside = f".{name}.new"
        with contextlib.suppress(OSError):  # left by a process killed as it claimed (a link goes, not its target)
            os.unlink(beside, dir_fd=folder)
        try:
            descriptor = os.open(
                beside, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666, dir_fd=folder
            )
        except OSError as err:
            raise _unopened(self.folder / beside, stat.S_ISREG, _CLAIM_FILE, err) from None
        with reporting_full_disk(self.path(number)):
            with os.fdopen(descriptor, "w") as handle:
                json.dump(_owner(), handle)
            os.replace(beside, name, src_dir_fd=folder, dst_dir_fd=folder)

    def _abandoned(self, name: str, folder: int) -> str | None:
        """Who held the claim ``name`` in ``folder``, when it may be taken over (its owner is gone, or its heartbeat
        is too far from now); anything there but a regular file is refused."""
        try:
            found, owner = _read_claim(name, folder)
        except FileNotFoundError:
            return _RELEASED
        if not stat.S_ISREG(found.st_mode):
            raise _not_made_here(self.folder / name, _CLAIM_FILE, found.st_mode)
        stale = self._stale(found.st_mtime)
        if owner is None:
            return "an unreadable claim" if stale else None
        who = f"process {owner['pid']} on {owner['host']}"
        if stale:
            return f"{who}, {stale}"
        if owner["host"] != socket.gethostname() or owner["pid"] <= 0:
            return None
        if not _alive(owner["pid"]):
            return f"{who}, which has ended"
        # A process id is reused (a container restarted keeps its host name and starts its processes at the same
        # ids): a process started after the claim was made, this one included, is not its maker.
        started, since = _started(owner["pid"]), owner.get("since")
        if started is not None and isinstance(since, int | float) and started > since + _START_SLACK:
            return f"{who}, which has ended (its id is now another process's)"
        return None

    def _stale(self, heartbeat: float) -> str:
        """Why a heartbeat at ``heartbeat`` (a modification time) no longer keeps its claim, or "" while it does.

        A heartbeat further in the future than the timeout is none: a clock set wrong (or a file touched so) would
        otherwise hold the shard forever, as the owner's next heartbeat never dates it earlier.
        """
        age = time.time() - heartbeat
        if age > self.timeout:
            return f"silent for {age:.0f} s"
        if -age > self.timeout:
            return f"whose heartbeat is dated {-age:.0f} s in the future"
        return ""

    def release(self, number: int) -> None:
        """Drop the claim on ``number`` (the caller holds the folder lock)."""
        if number in self.mine:
            self.mine.discard(number)
            with self._opened() as folder, contextlib.suppress(FileNotFoundError):
                if folder is not None:
                    os.unlink(_claim_name(number), dir_fd=folder)

    def release_all(self, lock: FolderLock) -> None:
        self.stop()
        if self.mine:
            with lock.held():
                for number in list(self.mine):
                    self.release(number)

    def clear(self) -> None:
        """Remove every claim (a new run starts; the caller holds the folder lock)."""
        with self._opened() as folder:
            if folder is None:
                return
            for name in os.listdir(folder):
                with contextlib.suppress(FileNotFoundError, IsADirectoryError, PermissionError):
                    os.unlink(name, dir_fd=folder)  # a link goes, never what it points to
        with contextlib.suppress(OSError):
            os.rmdir(self.folder)  # fails on a link put in its place meanwhile, as it should

    def start(self) -> None:
        """Renew this process's claims every :data:`HEARTBEAT` seconds until :meth:`stop`."""
        if self._thread is not None:
            return
        self._beating = threading.Event()
        self._thread = threading.Thread(target=self._beat, args=(self._beating,), name="hookcli-claims", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._thread is not None:
            self._beating.set()
            self._thread.join()
            self._thread = None

    def _beat(self, stopped: threading.Event) -> None:
        interval = min(HEARTBEAT, self.timeout / 4)
        while not stopped.wait(interval):
            # A claims folder that became something else is refused where claims are taken; a heartbeat only skips.
            with contextlib.suppress(OSError, UsageProblem), self._opened() as folder:
                for number in list(self.mine) if folder is not None else ():
                    with contextlib.suppress(OSError):
                        os.utime(_claim_name(number), dir_fd=folder, follow_symlinks=False)


def _claim_name(number: int) -> str:
    return f"{number:05d}"


def _read_claim(name: str, folder: int) -> tuple[os.stat_result, dict | None]:
    """The claim ``name`` in ``folder``: its status (a link's own) and its owner (None when unreadable).

    Opened without blocking: a FIFO's open would wait for a writer forever, and the folder lock is held meanwhile.
    """
    try:
        descriptor = os.open(name, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=folder)
    except OSError:  # a link, or a claim this user may not read (a missing one raises FileNotFoundError here too)
        return os.stat(name, dir_fd=folder, follow_symlinks=False), None
    try:
        found = os.fstat(descriptor)
        if not stat.S_ISREG(found.st_mode):
            return found, None
        try:
            owner = json.loads(os.read(descriptor, 4096).decode("utf-8", errors="replace"))
            host, pid = owner["host"], owner["pid"]
            if not isinstance(host, str) or not isinstance(pid, int) or isinstance(pid, bool):
                raise ValueError
        except (OSError, ValueError, KeyError, TypeError, RecursionError):
            return found, None
        return found, owner
    finally:
        os.close(descriptor)


#: Seconds a process's start time, counted from the boot time in clock ticks, may read later than it was: the boot
#: time is whole seconds, and moves with the wall clock (a clock set forward by NTP).
_START_SLACK = 30.0


def _started(pid: int) -> float | None:
    """When process ``pid`` started (seconds since the epoch), where the system says (Linux's /proc); else None."""
    fields = process_stat(pid)
    if not fields or len(fields) < 20 or not fields[19].isdigit():
        return None
    try:
        with open("/proc/stat", "rb") as system:
            boot = next(int(line.split()[1]) for line in system if line.startswith(b"btime "))
    except (OSError, ValueError, IndexError, StopIteration):
        return None
    return boot + int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22 of the line: the start, in ticks


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True


def check_folder_target(folder: str | os.PathLike) -> None:
    """Refuse a shard folder output that could not be written (called before any work, and again on open)."""
    if Path(folder).exists() and not Path(folder).is_dir():
        raise UsageProblem(f"output '{folder}' is a file, not a folder", hint="drop the trailing / to write one file")
    check_folder_output(folder)
    claim_timeout()  # $HOOKCLI_CLAIM_TIMEOUT is checked before any work
    check_folder_parts(Path(folder))
