"""Files as hookcli reads and writes them: regular files only, outputs written atomically, names checked early.

The foundation every layer shares (inputs read with :func:`open_regular`,
storage writes with :func:`atomic_path`); it imports nothing of hookcli but
its errors.

Files appear complete or not at all: bytes go to a temporary file in the same
folder that is renamed into place, and an existing file is only replaced when
``force`` is set.

>>> import os, tempfile
>>> target = os.path.join(tempfile.mkdtemp(), "out.txt")
>>> with atomic_path(target) as temporary:
...     _ = temporary.write_text("written whole")
>>> open(target).read(), format_bytes(3 * 1024 ** 2)
('written whole', '3.0 MiB')
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import glob
import os
import re
import stat
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

from hookcli.errors import HookcliError, OutputExistsError, UsageProblem

__all__ = [
    "MISSING",
    "NotRegularFile",
    "atomic_path",
    "check_folder_output",
    "check_own_folder",
    "check_writable",
    "file_kind",
    "format_bytes",
    "hold_output",
    "open_regular",
    "process_stat",
    "refuse_existing",
    "refuse_written_output",
    "regular_file_problem",
    "release_output",
    "remove_abandoned",
    "reporting_full_disk",
    "share_output",
    "take_output",
    "temporary_target",
]


class NotRegularFile(OSError):
    """A path names a FIFO, a device, a socket or a folder where a file's bytes were expected."""


def file_kind(mode: int) -> str:
    """What a file of ``st_mode`` ``mode`` is, for messages: ``a FIFO (named pipe)``, ``a folder``, ``a device``…"""
    kinds = {
        stat.S_IFREG: "a regular file",
        stat.S_IFDIR: "a folder",
        stat.S_IFIFO: "a FIFO (named pipe)",
        stat.S_IFCHR: "a device",
        stat.S_IFBLK: "a device",
        stat.S_IFSOCK: "a socket",
        stat.S_IFLNK: "a symbolic link",
    }
    return kinds.get(stat.S_IFMT(mode), "a special file")


def open_regular(path: str | os.PathLike, *, follow_links: bool = True, update: bool = False) -> BinaryIO:
    """Open ``path`` for reading in binary (with ``update``, for reading and writing), refusing anything but a
    regular file.

    The file is opened without blocking and checked before any byte is read,
    so a FIFO (whose ``open`` would wait for a writer forever) or a device is
    refused at once with :class:`NotRegularFile` (so is a symbolic link,
    unless ``follow_links``); a missing path raises ``FileNotFoundError`` as
    ``open`` does.
    """
    flags = (
        (os.O_RDWR if update else os.O_RDONLY) | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow_links else os.O_NOFOLLOW)
    )
    try:
        descriptor = os.open(path, flags)
    except OSError as err:
        if err.errno == errno.ELOOP and not follow_links:
            raise NotRegularFile(f"'{path}' is a symbolic link, not a regular file") from None
        raise
    try:
        mode = os.fstat(descriptor).st_mode
        if not stat.S_ISREG(mode):
            raise NotRegularFile(f"'{path}' is {file_kind(mode)}, not a regular file")
        os.set_blocking(descriptor, True)
        return os.fdopen(descriptor, "r+b" if update else "rb")
    except BaseException:
        os.close(descriptor)
        raise


def check_writable(target: str | os.PathLike, *, force: bool) -> Path:
    """Refuse early, before any work, an output file that could not be written in the end.

    Refused: an existing file (without ``force``) or folder, a broken symbolic
    link, a missing or unwritable folder, and a name too long to carry the
    temporary suffix :func:`atomic_path` adds.
    """
    path = Path(target)
    _check_name_length(path, extra=len(_TEMPORARY_EXTRA))  # first: stat() itself fails on a name too long
    if path.is_dir() and not (force and path.is_symlink()):  # --force replaces a link, whatever it points to
        raise OutputExistsError(f"output '{path}' is a folder", hint="give a file name ending in .safetensors")
    if path.is_symlink() and not path.exists() and not force:
        raise OutputExistsError(
            f"output '{path}' is a broken symbolic link",
            hint="remove it, add --force to replace the link with the file, or choose another name",
        )
    if path.exists() and not force:
        raise OutputExistsError(f"output '{path}' already exists", hint="add --force to overwrite it")
    if not path.parent.is_dir():
        raise UsageProblem(f"folder '{path.parent}' does not exist", hint="create it first")
    if not os.access(path.parent, os.W_OK | os.X_OK):
        raise UsageProblem(
            f"cannot write to folder '{path.parent}'", hint="check its permissions, or choose another place with -o"
        )
    return path


def check_folder_output(folder: str | os.PathLike) -> Path:
    """Refuse early a folder output that is a file, has too long a name, or cannot be created or written."""
    path = Path(folder)
    for part in path.parts:
        _check_name_length(Path(part))
    if path.exists() and not path.is_dir():
        raise UsageProblem(f"output '{folder}' is a file, not a folder", hint="give a folder name, or remove the file")
    existing = path
    while not existing.exists() and not existing.is_symlink() and existing != existing.parent:
        existing = existing.parent
    if existing.is_symlink() and not existing.exists():
        raise UsageProblem(f"output folder '{existing}' is a broken symbolic link", hint="remove it or fix its target")
    if not existing.is_dir():
        raise UsageProblem(f"cannot make folder '{folder}': '{existing}' is not a folder", hint="choose another place")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UsageProblem(
            f"cannot write to folder '{existing}'", hint="check its permissions, or choose another place with -o"
        )
    return path


def check_own_folder(path: str | os.PathLike, made_for: str) -> Path:
    """Refuse ``path``, where hookcli keeps a folder of its own (``made_for`` says for what), unless it is missing
    or a real folder: a symbolic link there is never followed, with or without --force."""
    path = Path(path)
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return path
    if not stat.S_ISDIR(mode):
        link = "hookcli never writes through a link there: " if stat.S_ISLNK(mode) else ""
        raise UsageProblem(
            f"'{path}' is {file_kind(mode)}, not the folder hookcli keeps {made_for} in",
            hint=f"{link}remove it, then run again",
        )
    return path


#: What a temporary name adds to its target's: ``.`` + name + ``.`` + 8 random characters + ``.part``.
_TEMPORARY_EXTRA = "." + "." + "xxxxxxxx" + ".part"
_TEMPORARY = re.compile(r"\.(.+)\.[^.]+\.part")


def temporary_target(name: str) -> str:
    """The name of the file that the temporary file ``name`` (:func:`atomic_path`'s) is written for; ``name`` itself
    when it is none."""
    found = _TEMPORARY.fullmatch(name)
    return found[1] if found else name


def _check_name_length(path: Path, *, extra: int = 0) -> None:
    try:
        limit = os.pathconf(path.parent if path.parent.is_dir() else ".", "PC_NAME_MAX")
    except (OSError, ValueError):
        limit = 255
    if len(os.fsencode(path.name)) + extra > limit:
        raise UsageProblem(
            f"the name '{path.name[:40]}...' is too long ({len(os.fsencode(path.name))} bytes)",
            hint=f"file names here hold at most {limit - extra} bytes; choose a shorter one",
        )


@contextlib.contextmanager
def atomic_path(
    target: str | os.PathLike,
    *,
    force: bool = False,
    publish: Callable[[], contextlib.AbstractContextManager[bool]] | None = None,
    sweep: bool = True,
) -> Iterator[Path]:
    """Yield a temporary path next to ``target``; on success it becomes ``target``.

    The caller writes into the temporary file itself (opening it by name, never replacing it with another file).
    On any exception (including Ctrl-C, and SIGTERM on the command line) the temporary file is removed and
    ``target`` is untouched. A temporary file of the same target left by a run that was killed outright is
    removed first: each one is locked while in use, so only abandoned ones are. ``publish`` (for one writer among
    several): the rename happens inside ``with publish() as wanted``, and only if ``wanted``. ``sweep=False``
    leaves the abandoned ones to the caller (a shard writer sweeps its folder once, not once a shard).
    """
    path = check_writable(target, force=force)
    if sweep:
        remove_abandoned(path.parent, f".{glob.escape(path.name)}.*.part")
    handle, temporary = _locked_temporary(path)
    try:
        with reporting_full_disk(path):
            yield temporary
            _make_durable(handle)
            with publish() if publish else contextlib.nullcontext(True) as wanted:
                if wanted and force:
                    os.replace(temporary, path)
                elif wanted:
                    _link_without_clobbering(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)
        os.close(handle)


def hold_output(target: str | os.PathLike) -> int:
    """Mark output ``target`` as being written by this process until :func:`release_output`: a lock on
    ``.<name>.lock`` beside it. Raise :class:`OutputExistsError` when another process holds it, so that a second
    identical command stops before its work rather than after. A lock file left by a killed process is taken over.
    """
    return _held_or_refused(target, fcntl.LOCK_EX | fcntl.LOCK_NB)


def refuse_written_output(target: str | os.PathLike) -> None:
    """Raise :class:`OutputExistsError`, as :func:`hold_output` would, while another process writes ``target``:
    asked before the heavy imports and the model, so that a second command stops in a moment rather than after
    loading them. Nothing is held afterwards."""
    if not os.path.exists(_lock_file(target)):
        return
    release_output(target, _held_or_refused(target, fcntl.LOCK_SH | fcntl.LOCK_NB))


def _held_or_refused(target: str | os.PathLike, operation: int) -> int:
    try:
        return _output_mark(target, operation)
    except OSError:
        raise OutputExistsError(
            f"another hookcli process is writing '{target}'", hint="wait for it to finish, or write to another file"
        ) from None


def share_output(target: str | os.PathLike, on_wait: Callable[[str], None] | None = None, *, wait: bool = True) -> int:
    """Mark output ``target`` as used by this process beside others of the same run (a shared lock on the file
    :func:`hold_output` locks), until :func:`release_output`; while one of them writes it (:func:`take_output`),
    wait, and after a few seconds let ``on_wait`` hear why once. Without ``wait``, raise
    :class:`OutputExistsError` as :func:`hold_output` does instead.

    Processes that fill one folder of parts share the mark while they use it, so that the one that merges the
    parts into ``target`` removes the folder only once nobody is in it.

    >>> import os, tempfile
    >>> target = os.path.join(tempfile.mkdtemp(), "out.safetensors")
    >>> one, two = share_output(target), share_output(target)  # two processes of one run
    >>> release_output(target, two)
    >>> mine = take_output(target, one)  # nobody else uses it now: this returns at once
    >>> release_output(target, mine)
    >>> os.listdir(os.path.dirname(target))
    []
    """
    if not wait:
        return _held_or_refused(target, fcntl.LOCK_SH | fcntl.LOCK_NB)
    waiting = on_wait and _told(on_wait, f"another hookcli process writing '{target}'")
    return _output_mark(target, fcntl.LOCK_SH, waiting)


def take_output(target: str | os.PathLike, shared: int, on_wait: Callable[[str], None] | None = None) -> int:
    """Turn this process's :func:`share_output` mark ``shared`` on ``target`` into the only one, waiting for the
    other processes to let go of theirs (``on_wait`` as for :func:`share_output`); returns the descriptor to give
    :func:`release_output`. ``shared`` is this call's from then on: let go of when it fails.

    The shared lock is let go of before the wait: a lock turned into another in place may keep the first while
    it waits (``flock`` over NFS), and two processes taking the output at once would wait for each other.
    """
    lock = _lock_file(target)
    waiting = on_wait and _told(on_wait, f"the other hookcli processes of this run to finish with '{target}'")
    descriptor, held = shared, [shared]  # held: what to let go of if this fails
    try:
        fcntl.flock(shared, fcntl.LOCK_UN)
        while True:
            _wait_for_lock(descriptor, fcntl.LOCK_EX, waiting)
            if _still_named(lock, descriptor):
                return descriptor
            held.clear()
            _let_go(descriptor)  # a process that let go last removed the file meanwhile: lock its new one
            descriptor = _output_mark(target, fcntl.LOCK_EX, waiting)
            held.append(descriptor)
    except BaseException:
        for descriptor in held:
            _let_go(descriptor)
        raise


def release_output(target: str | os.PathLike, descriptor: int) -> None:
    """Let go of the mark :func:`hold_output`, :func:`share_output` or :func:`take_output` put on ``target``; the
    lock file goes with the last process that held it."""
    lock = _lock_file(target)
    with contextlib.suppress(OSError):
        fcntl.flock(descriptor, fcntl.LOCK_UN)  # first: each of the last two could otherwise keep the other out
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)  # nobody else holds it: the file can go
        if _still_named(lock, descriptor):
            lock.unlink()
    _let_go(descriptor)


def _lock_file(target: str | os.PathLike) -> Path:
    path = Path(target)
    return path.parent / f".{path.name}.lock"


def _let_go(descriptor: int) -> None:
    """Unlock and close: decode workers forked meanwhile share the open file, and closing only this descriptor
    would leave the lock held through theirs."""
    with contextlib.suppress(OSError):
        fcntl.flock(descriptor, fcntl.LOCK_UN)
    _MARKS.discard(descriptor)
    os.close(descriptor)


#: The descriptors of the output marks this process holds, which a forked child closes (its copies only).
_MARKS: set[int] = set()


def _forget_marks() -> None:
    for descriptor in _MARKS:
        with contextlib.suppress(OSError):
            os.close(descriptor)
    _MARKS.clear()


os.register_at_fork(after_in_child=_forget_marks)


#: Seconds a wait for an output mark lasts before the one waiting hears why.
_WAIT_NOTE_AFTER = 5.0


def _output_mark(target: str | os.PathLike, operation: int, on_wait: Callable[[], None] | None = None) -> int:
    """A descriptor of ``target``'s lock file, locked with ``operation`` (``LOCK_NB``: BlockingIOError when
    another process holds it; else ``on_wait`` is called once a wait has lasted a few seconds)."""
    lock = _lock_file(target)
    while True:
        try:  # as anyone may write the folder: whoever shares the output opens the file
            descriptor = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
        except OSError as err:
            if err.errno in (errno.ENOENT, errno.EACCES, errno.EPERM, errno.EROFS):  # the folder takes no new file
                raise UsageProblem(
                    f"cannot write to folder '{Path(lock).parent}' ({err.strerror})",
                    hint="choose another place with -o",
                ) from None
            raise UsageProblem(  # something is in the lock file's place (a folder, a link)
                f"cannot mark '{target}' as being written: '{lock}' {err.strerror}",
                hint="remove it, or write elsewhere",
            ) from None
        try:
            _wait_for_lock(descriptor, operation, on_wait)
        except BaseException:
            os.close(descriptor)
            raise
        if _still_named(lock, descriptor):
            _MARKS.add(descriptor)
            return descriptor
        os.close(descriptor)  # the lock file a finishing process removed between our open and our lock


def _wait_for_lock(descriptor: int, operation: int, on_wait: Callable[[], None] | None) -> None:
    """``flock(descriptor, operation)``; ``on_wait`` is called once a wait has lasted a few seconds."""
    if operation & fcntl.LOCK_NB or on_wait is None:
        fcntl.flock(descriptor, operation)
        return
    try:
        fcntl.flock(descriptor, operation | fcntl.LOCK_NB)
        return
    except BlockingIOError:
        pass
    timer = threading.Timer(_WAIT_NOTE_AFTER, on_wait)
    timer.daemon = True
    timer.start()
    try:
        fcntl.flock(descriptor, operation)  # in the kernel's queue
    finally:
        timer.cancel()


def _told(on_wait: Callable[[str], None], what: str) -> Callable[[], None]:
    """What to call when a wait lasts: ``on_wait`` hears what the process waits for, once."""
    said: list[bool] = []

    def tell() -> None:
        if not said:
            said.append(True)
            on_wait(f"waiting for {what}")

    return tell


def _still_named(lock: Path, descriptor: int) -> bool:
    """Whether ``lock`` still names the file ``descriptor`` is open on."""
    try:
        return os.stat(lock, follow_symlinks=False).st_ino == os.fstat(descriptor).st_ino
    except FileNotFoundError:
        return False


def _locked_temporary(path: Path) -> tuple[int, Path]:
    """A new temporary file beside ``path``, locked (marked in use; released when its descriptor closes).

    Between being made and being locked a file is unlocked for a moment, and another process sweeping abandoned
    files (:func:`remove_abandoned`) may lock it and remove it then: one locked by the sweeper, or whose name no
    longer leads to the locked file, is made again.
    """
    while True:
        with reporting_full_disk(path):
            handle, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".part", dir=path.parent)
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(handle)  # the sweeper holds it, and removes it
            continue
        try:
            if os.stat(name, follow_symlinks=False).st_ino == os.fstat(handle).st_ino:
                return handle, Path(name)
        except FileNotFoundError:
            pass
        os.close(handle)


@contextlib.contextmanager
def reporting_full_disk(path: str | os.PathLike) -> Iterator[None]:
    """Turn a write to ``path`` failing for want of space into one line naming where.

    A full disk shows as ``OSError`` ENOSPC, or as safetensors' own error,
    whose text ends in the system's ``(os error 28)``.
    """
    try:
        yield
    except Exception as err:
        if getattr(err, "errno", None) != errno.ENOSPC and f"os error {errno.ENOSPC})" not in str(err):
            raise
        raise HookcliError(
            f"no space left on the device holding '{path}'", hint="free some space there, or write to another place"
        ) from None


def remove_abandoned(folder: Path, pattern: str) -> None:
    """Remove the temporary files in ``folder`` matching the glob ``pattern`` that no running process holds (one
    :func:`atomic_path` made is locked from its making until it is renamed or removed)."""
    for candidate in folder.glob(pattern):
        try:
            descriptor = os.open(candidate, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            found = os.fstat(descriptor)
            if stat.S_ISREG(found.st_mode):
                fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
                candidate.unlink(missing_ok=True)
        except OSError:
            pass  # in use by another process, or gone already
        finally:
            os.close(descriptor)


def refuse_existing(paths, *, force: bool) -> None:
    """Raise naming the first of ``paths`` that exists (and how many more), unless ``force``."""
    if force:
        return
    first, count = None, 0
    for p in paths:
        if Path(p).exists():
            first, count = first or Path(p), count + 1
    if count:
        more = f" and {count - 1} more" if count > 1 else ""
        raise OutputExistsError(
            f"'{first}'{more} already exist{'s' if not more else ''}",
            hint="add --force to overwrite, or choose another folder with -o",
        )


def _make_durable(descriptor: int) -> None:
    umask = os.umask(0)
    os.umask(umask)
    # mkstemp creates 0600; the result should look like any other file. Through the descriptor: the name could be
    # a link by now.
    os.fchmod(descriptor, 0o666 & ~umask)
    os.fsync(descriptor)


def _link_without_clobbering(source: Path, target: Path) -> None:
    try:
        os.link(source, target)  # fails if target appeared meanwhile, unlike rename
    except FileExistsError:
        raise OutputExistsError(f"output '{target}' already exists", hint="add --force to overwrite it") from None
    except OSError:  # file systems without hard links
        if target.exists():
            raise OutputExistsError(f"output '{target}' already exists", hint="add --force to overwrite it") from None
        os.replace(source, target)


def format_bytes(count: float) -> str:
    """``512 B``, ``3.1 MiB``, ``2.0 GiB``: sizes for people."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if count < 1024 or unit == "TiB":
            break
        count /= 1024
    else:
        unit = "TiB"
    return f"{int(count)} B" if unit == "B" else f"{count:.1f} {unit}"


#: What :func:`regular_file_problem` says of a path that does not exist.
MISSING = "not found"


def regular_file_problem(path: Path) -> str | None:
    """None for a regular file (links followed); else why ``path`` cannot be read as one, said after its name:
    :data:`MISSING`, ``is a symbolic link loop``, ``is a FIFO (named pipe), not a regular file``… (reading a FIFO
    would wait forever for a writer)."""
    try:
        mode = path.stat().st_mode
    except OSError as err:
        if err.errno == errno.ELOOP:
            return "is a symbolic link loop"
        return MISSING if err.errno in (errno.ENOENT, errno.ENOTDIR) else f"cannot be looked at ({err.strerror})"
    return None if stat.S_ISREG(mode) else f"is {file_kind(mode)}, not a regular file"


def process_stat(pid: int) -> list[bytes] | None:
    """The fields of Linux's ``/proc/PID/stat`` after the process's name (which may hold spaces), the state (the
    line's third field) first; None where the system has no such file for ``pid``."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat_file:
            return stat_file.read().rpartition(b")")[2].split()
    except OSError:
        return None
