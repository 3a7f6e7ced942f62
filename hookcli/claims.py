"""Many processes on one shard folder: a short-held folder lock, claims on shards, and heartbeats.

Every process writing a shard folder takes the folder's lock
(:data:`LOCK_NAME`, an ``flock``) only for short steps: reading the index
lines others appended, claiming a shard, publishing a finished one. Before
it reads a shard's inputs it claims the shard: ``.claims/<number>`` is
created exclusively and holds its owner (host, pid, start time); the file's
modification time is a heartbeat, renewed by a thread every
:data:`HEARTBEAT` seconds. A claim is taken over when its owner is gone (on
this host, no process has its pid) or its heartbeat is older than
:func:`claim_timeout` (:data:`DEFAULT_CLAIM_TIMEOUT` seconds, or
``$HOOKCLI_CLAIM_TIMEOUT``).

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
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path

from hookcli.errors import UsageProblem

__all__ = ["CLAIMS", "DEFAULT_CLAIM_TIMEOUT", "HEARTBEAT", "LOCK_NAME", "Claims", "FolderLock", "claim_timeout"]

#: The lock file of a shard folder, held only for short steps.
LOCK_NAME = ".hookcli.lock"
#: The folder (inside a shard folder) of the claims on unfinished shards.
CLAIMS = ".claims"
#: Seconds between two heartbeats of a claim.
HEARTBEAT = 10.0
#: A claim whose heartbeat is older than this many seconds is taken over.
DEFAULT_CLAIM_TIMEOUT = 120.0
#: Seconds waited on the lock before saying so.
_WAIT_NOTE_AFTER = 5.0


def claim_timeout() -> float:
    """Seconds without a heartbeat after which a claim counts as abandoned (``$HOOKCLI_CLAIM_TIMEOUT``)."""
    text = os.environ.get("HOOKCLI_CLAIM_TIMEOUT", "").strip()
    if not text:
        return DEFAULT_CLAIM_TIMEOUT
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not seconds > 0 or seconds != seconds or seconds == float("inf"):
        raise UsageProblem(f"HOOKCLI_CLAIM_TIMEOUT must be a number of seconds above 0, not '{text}'",
                           hint=f"unset it for the default of {DEFAULT_CLAIM_TIMEOUT:.0f} s")
    return seconds


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

    def _say_waiting(self) -> None:
        self.on_wait(f"waiting for another hookcli process writing '{self.name}' (it holds {LOCK_NAME} while it "
                     "starts the run or records a shard)")

    def _lock(self) -> int:
        said = False
        while True:
            try:
                descriptor = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o666)
            except OSError:
                raise UsageProblem(f"'{self.path}' is not a lock file hookcli made (it is a folder or a link)",
                                   hint="remove it, then run again") from None
            try:
                fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                # Wait in the kernel's queue (polling would let a busy holder take it again and again).
                timer = threading.Timer(_WAIT_NOTE_AFTER, self._say_waiting) if self.on_wait and not said else None
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
                current = os.stat(self.path).st_ino
            except FileNotFoundError:
                current = None
            if current == os.fstat(descriptor).st_ino:
                return descriptor
            os.close(descriptor)  # the holder deleted the file meanwhile: lock the new one


#: Every lock of this process, so that a forked child drops them (:meth:`FolderLock._forget`).
_LOCKS: weakref.WeakSet = weakref.WeakSet()
os.register_at_fork(after_in_child=lambda: [lock._forget() for lock in list(_LOCKS)])

_RELEASED = "nobody (released meanwhile)"


def _owner() -> dict:
    return {"host": socket.gethostname(), "pid": os.getpid(), "since": round(time.time(), 3)}


class Claims:
    """This process's claims on shards of ``folder``: taken and released under the folder's lock, kept fresh by
    a heartbeat thread."""

    def __init__(self, folder: Path, *, timeout: float | None = None,
                 on_note: Callable[[str], None] | None = None) -> None:
        self.folder = folder / CLAIMS
        self.timeout = claim_timeout() if timeout is None else timeout
        self.on_note = on_note  # hears of each claim taken over
        self.mine: set[int] = set()
        self._beating: threading.Event | None = None
        self._thread: threading.Thread | None = None

    def path(self, number: int) -> Path:
        return self.folder / f"{number:05d}"

    def take(self, number: int) -> bool:
        """Claim shard ``number`` (the caller holds the folder lock): False when a live process holds it."""
        if number in self.mine:
            return True
        self.folder.mkdir(exist_ok=True)
        path = self.path(number)
        for _ in range(2):
            try:
                descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
            except FileExistsError:
                owner = self._abandoned(path)
                if owner is None:
                    return False
                if owner != _RELEASED and self.on_note is not None:
                    self.on_note(f"shard {number} was claimed by {owner}: this process computes it")
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
                continue
            with os.fdopen(descriptor, "w") as handle:
                json.dump(_owner(), handle)
            self.mine.add(number)
            return True
        return False

    def _abandoned(self, path: Path) -> str | None:
        """Who held the claim at ``path``, when it may be taken over (its owner is gone, or silent too long)."""
        try:
            age = time.time() - path.lstat().st_mtime
            with open(path, encoding="utf-8", errors="replace") as handle:
                owner = json.loads(handle.read(4096))
            host, pid = owner["host"], owner["pid"]
            if not isinstance(host, str) or not isinstance(pid, int) or isinstance(pid, bool):
                raise ValueError
        except FileNotFoundError:
            return _RELEASED
        except (OSError, ValueError, KeyError, TypeError, RecursionError):
            return "an unreadable claim" if _age(path) > self.timeout else None
        who = f"process {pid} on {host}"
        if age > self.timeout:
            return f"{who}, silent for {age:.0f} s"
        if host == socket.gethostname() and pid > 0 and not _alive(pid):
            return f"{who}, which has ended"
        return None

    def release(self, number: int) -> None:
        """Drop the claim on ``number`` (the caller holds the folder lock)."""
        if number in self.mine:
            self.mine.discard(number)
            with contextlib.suppress(FileNotFoundError):
                self.path(number).unlink()

    def release_all(self, lock: FolderLock) -> None:
        self.stop()
        if self.mine:
            with lock.held():
                for number in list(self.mine):
                    self.release(number)

    def clear(self) -> None:
        """Remove every claim (a new run starts; the caller holds the folder lock)."""
        if self.folder.is_dir() and not self.folder.is_symlink():
            for child in self.folder.iterdir():
                with contextlib.suppress(FileNotFoundError, IsADirectoryError, PermissionError):
                    child.unlink()
            with contextlib.suppress(OSError):
                self.folder.rmdir()

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
            for number in list(self.mine):
                with contextlib.suppress(OSError):
                    os.utime(self.path(number))


def _age(path: Path) -> float:
    try:
        return time.time() - path.lstat().st_mtime
    except OSError:
        return 0.0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True
