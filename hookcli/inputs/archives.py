"""Images read straight out of ``.tar`` files (the webdataset layout img2dataset writes), without unpacking.

A ``.tar`` given as an input stands for its image members, in the order the
archive holds them; other members (``000.json``, ``000.txt``) are left out. A
row is named ``archive.tar::member.jpg``, and that name, on stdin or in a
file's ``inputs`` metadata, finds the member again. Only plain (uncompressed)
tars are read: each member is one ``seek`` away, which a compressed stream
does not allow.

Member names are strings of the archive, never paths of this machine: a name
is only ever looked up in the archive's own listing, and a row name is the
archive's absolute path, ``::`` and the member's name exactly as the archive
holds it (``..`` and all). What cannot be read safely is a row that fails
with its reason when it is read (so ``--on-error skip`` skips it and names
it): a name that is absolute, has a ``..`` part, a backslash or a NUL, or is
empty; a symbolic link; a sparse member (``tar --sparse``); a member larger
than :data:`MAX_MEMBER_BYTES`. A hard link reads the member it links to. A
name that repeats is a row each time: the first keeps the name, the next
ones are named by occurrence (``000.jpg#2``). Headers larger than
:data:`MAX_HEADER_BYTES` make the archive unreadable.

A path found or given on disk stays a disk path (a :class:`~pathlib.Path`);
only an archive's listing makes members. A row name read back as text (stdin,
metadata) is a member when the archive before ``::`` is a file; one that is
also a file on disk is refused as ambiguous (:func:`find_member`).

The archive's listing is read once per process while the file is unchanged,
and kept compact: one small object per image member.

>>> import io, tarfile, tempfile
>>> folder = tempfile.mkdtemp()
>>> with tarfile.open(f"{folder}/shard.tar", "w") as archive:
...     for name, data in [("000.jpg", b"jpeg bytes"), ("000.json", b"{}")]:
...         info = tarfile.TarInfo(name); info.size = len(data); archive.addfile(info, io.BytesIO(data))
>>> [member.name for member in tar_images(f"{folder}/shard.tar")]
['000.jpg']
>>> member = find_member(f"{folder}/shard.tar::000.jpg")
>>> member.read_bytes(), input_name(member).endswith("shard.tar::000.jpg")
(b'jpeg bytes', True)
"""

from __future__ import annotations

import functools
import io
import os
import tarfile
from collections.abc import Iterable
from pathlib import PurePath
from typing import BinaryIO

from hookcli.errors import ImageError, InputError
from hookcli.files import NotRegularFile, open_regular
from hookcli.inputs.names import is_image_name

__all__ = [
    "MAX_HEADER_BYTES",
    "MAX_MEMBERS",
    "MAX_MEMBER_BYTES",
    "SEPARATOR",
    "TarMember",
    "file_stamp",
    "find_member",
    "input_files",
    "input_key",
    "input_name",
    "is_archive",
    "looks_like_member",
    "tar_images",
]

#: Between an archive's path and a member's name in a row's name.
SEPARATOR = "::"
_SUFFIX = ".tar"
_COMPRESSED = (".tar.gz", ".tgz", ".tar.bz2", ".tar.xz", ".tar.zst")
#: A listing holds at most this many members: a larger tar is split into shards by the tools that write them.
MAX_MEMBERS = 10_000_000
#: The largest member read: an uncompressed image of the most pixels Pillow decodes (twice its
#: ``MAX_IMAGE_PIXELS``, 178,956,970) at 8 bytes a pixel (16-bit RGBA). Larger members are no image hookcli reads.
MAX_MEMBER_BYTES = 2 * 89_478_485 * 8
#: The most header bytes (pax extended headers, GNU long names, sparse maps) read for one member.
MAX_HEADER_BYTES = 1 << 20

#: Why a member cannot be read, by the problem its listing found.
_UNSAFE, _SYMLINK, _SPARSE, _TOO_LARGE, _BROKEN_LINK = "unsafe", "symlink", "sparse", "too large", "broken link"


class TarMember:
    """One image inside a tar: where its bytes are (``offset``, ``size``). Its row name is ``archive::name``.

    ``problem`` says why it cannot be read (None when it can); reading it then
    raises :class:`~hookcli.errors.ImageError` with the reason.
    """

    __slots__ = ("archive", "name", "offset", "size", "problem")

    def __init__(self, archive: str, name: str, offset: int, size: int, problem: str | None = None) -> None:
        self.archive, self.name, self.offset, self.size, self.problem = archive, name, offset, size, problem

    def __fspath__(self) -> str:
        return f"{self.archive}{SEPARATOR}{self.name}"

    def __str__(self) -> str:
        return os.fspath(self)

    def __repr__(self) -> str:
        return f"TarMember({str(self)!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TarMember) and (self.archive, self.name) == (other.archive, other.name)

    def __hash__(self) -> int:
        return hash((self.archive, self.name))

    def __reduce__(self):
        return TarMember, (self.archive, self.name, self.offset, self.size, self.problem)

    def open(self) -> BinaryIO:
        """The member's bytes as a seekable binary stream read from the archive as they are asked for (the member
        is never read whole); ImageError for a member that cannot be read."""
        self._check()
        try:
            handle = open_regular(self.archive)
        except FileNotFoundError:
            raise ImageError(f"archive not found: '{self.archive}'", hint="check the path") from None
        except (NotRegularFile, OSError) as err:
            raise ImageError(f"cannot read '{self}': {err}", hint="the archive may have changed") from None
        if os.fstat(handle.fileno()).st_size < self.offset + self.size:
            handle.close()
            raise ImageError(
                f"'{self}' is cut short: the archive ends before the member's {self.size:,} bytes",
                hint="the archive may be truncated",
            )
        return io.BufferedReader(_Window(handle, self.offset, self.size))

    def read_bytes(self) -> bytes:
        """The member's bytes (at most :data:`MAX_MEMBER_BYTES`)."""
        with self.open() as stream:
            return stream.read()

    def _check(self) -> None:
        if self.problem is None:
            return
        if self.problem == _UNSAFE:
            raise ImageError(
                f"archive member '{self}' has a name hookcli does not read ({_name_fault(self.name)})",
                hint="member names are relative paths without '..'; repack the archive",
            )
        if self.problem.startswith(_SYMLINK):
            raise ImageError(
                f"archive member '{self}' is a symbolic link (to '{self.problem[len(_SYMLINK) + 1 :]}'),"
                " which hookcli does not follow",
                hint="store the image itself in the archive",
            )
        if self.problem == _SPARSE:
            raise ImageError(
                f"archive member '{self}' is stored sparse, which hookcli does not read",
                hint="repack the archive without --sparse",
            )
        if self.problem == _TOO_LARGE:
            raise ImageError(
                f"archive member '{self}' holds {self.size:,} bytes, more than any image hookcli "
                f"decodes ({MAX_MEMBER_BYTES:,})",
                hint="leave it out of the archive",
            )
        raise ImageError(
            f"archive member '{self}' is a hard link to '{self.problem[len(_BROKEN_LINK) + 1 :]}', "
            "which is no member the archive holds before it",
            hint="repack the archive",
        )


class _Window(io.RawIOBase):
    """``size`` bytes of ``handle`` from ``offset`` on, as a file of their own (Pillow seeks and reads in it)."""

    def __init__(self, handle: BinaryIO, offset: int, size: int) -> None:
        self._handle, self._offset, self._size, self._at = handle, offset, size, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        count = max(0, min(len(buffer), self._size - self._at))
        if not count:
            return 0
        self._handle.seek(self._offset + self._at)
        data = self._handle.read(count)
        buffer[: len(data)] = data
        self._at += len(data)
        return len(data)

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._at, io.SEEK_END: self._size}[whence]
        if base + offset < 0:
            raise OSError(f"negative seek position {base + offset}")
        self._at = base + offset
        return self._at

    def tell(self) -> int:
        return self._at

    def close(self) -> None:
        if not self.closed:
            self._handle.close()
        super().close()


def is_archive(path: str | os.PathLike) -> bool:
    """Whether an input names a tar file (by its name; compressed tars included, to be refused by name)."""
    return str(path).lower().endswith((_SUFFIX, *_COMPRESSED))


def input_name(item) -> str:
    """The name a row records for its input: a member's ``archive::name`` as the archive holds the name, any other
    input's absolute path (a member name is never joined to the file system).

    >>> input_name(TarMember("/data/a.tar", "x/../../p.png", 512, 10)), input_name("/data/./b.png")
    ('/data/a.tar::x/../../p.png', '/data/b.png')
    """
    if isinstance(item, TarMember):
        return str(item)
    return os.path.abspath(os.fspath(item))


def input_key(item) -> str:
    """What a run's identity keeps of an input: its :func:`input_name`, marked ``file:`` for a disk path that has
    the form of a member's name, so that the file ``a.tar::b.jpg`` and the member ``b.jpg`` of ``a.tar`` are two
    inputs.

    >>> input_key(TarMember("/data/a.tar", "b.jpg", 512, 10)), input_key(PurePath("/data/a.tar::b.jpg"))
    ('/data/a.tar::b.jpg', 'file:/data/a.tar::b.jpg')
    """
    name = input_name(item)
    return name if isinstance(item, TarMember) or not looks_like_member(name) else f"file:{name}"


def input_files(item) -> list[str]:
    """The files on disk a row's input is read from: the file, the archive a member is in, a clip's video (or
    folder of frames), both images of a pair.

    >>> input_files(TarMember("/data/a.tar", "b.jpg", 512, 10))
    ['/data/a.tar']
    """
    if isinstance(item, TarMember):
        return [item.archive]
    second = getattr(item, "second", None)  # a pair of images given as two lists
    firsts = input_files(item.path) if second is not None else [os.path.abspath(os.fspath(item))]
    return firsts + (input_files(second) if second is not None else [])


def file_stamp(path: str) -> list[int] | None:
    """``[size, modification time in ns]`` of the file (or folder) at ``path``, None when it cannot be looked at:
    what tells a file replaced under the same name, cheaply."""
    try:
        found = os.stat(path)
    except (OSError, ValueError):
        return None
    return [found.st_size, found.st_mtime_ns]


def looks_like_member(text: str) -> bool:
    """Whether ``text`` has the form of a member's row name (``….tar::name``), whatever is on disk.

    >>> looks_like_member("/data/a.tar::000.jpg"), looks_like_member("/data/a.tar"), looks_like_member("a.tar::")
    (True, False, False)
    """
    return _split(text) is not None


def _split(text: str) -> tuple[str, str] | None:
    cut = text.lower().find(_SUFFIX + SEPARATOR)
    if cut < 0 or cut + len(_SUFFIX + SEPARATOR) == len(text):
        return None
    return text[: cut + len(_SUFFIX)], text[cut + len(_SUFFIX + SEPARATOR) :]


def tar_images(path: str | os.PathLike) -> list[TarMember]:
    """The image members of the tar at ``path``, in archive order; InputError for what cannot be read."""
    return list(_listing_of(path).members)


def find_member(item) -> TarMember | None:
    """The member a row name ``archive.tar::member`` names; None for a name of another form or a disk path.

    A :class:`~pathlib.PurePath` is a disk path whatever its name. Text of the
    member form is a member when the archive before ``::`` is a file; text
    that is also a file or folder on disk is refused as naming both.
    InputError when the archive cannot be read or lacks the member.
    """
    if isinstance(item, TarMember):
        return item
    if isinstance(item, PurePath) or not isinstance(item, str | os.PathLike):
        return None
    text = os.fspath(item)
    parts = _split(text)
    if parts is None:
        return None
    archive, name = parts
    if not os.path.isfile(archive):
        return None  # a disk path (or nothing) that only looks like a member's name
    if os.path.lexists(text):
        raise InputError(
            f"'{text}' names both a file on disk and a member of the archive '{archive}'",
            hint="rename the file on disk",
        )
    found = _listing_of(archive).find(name)
    if found is None:
        raise InputError(f"archive '{archive}' holds no image '{name}'", hint="list it with: tar tf ARCHIVE")
    return found


class _Listing:
    """An archive's image members in archive order, and a lookup by name made the first time one is asked for."""

    def __init__(self, members: list[TarMember]) -> None:
        self.members = members
        self._by_name: dict[str, TarMember] | None = None

    def find(self, name: str) -> TarMember | None:
        if self._by_name is None:
            self._by_name = {member.name: member for member in self.members}
        return self._by_name.get(name)


def _listing_of(path: str | os.PathLike) -> _Listing:
    """The archive's listing, read once while the file stays the same (one stat a call)."""
    text = os.path.abspath(os.fspath(path))
    if text.lower().endswith(_COMPRESSED):
        raise InputError(
            f"'{path}' is a compressed tar, whose members cannot be read one at a time",
            hint="unpack it to a plain .tar (gzip -d, zstd -d), as webdataset shards are",
        )
    try:
        status = os.stat(text)
    except OSError:
        raise InputError(f"no such file or folder: '{path}'", hint="check the path") from None
    return _listed(text, status.st_size, status.st_mtime_ns, status.st_ino)


@functools.lru_cache(maxsize=64)
def _listed(path: str, size: int, modified: int, inode: int) -> _Listing:
    """Keyed by the file's size, time and inode, so a changed file is listed again."""
    return _Listing(list(_image_members(path)))


class _HeaderTooLarge(Exception):
    pass


class _Guarded:
    """The archive file as ``tarfile`` reads it while listing: a read of more than :data:`MAX_HEADER_BYTES` since
    the last :meth:`allow` (one member's headers) stops the listing before the bytes are read."""

    def __init__(self, handle: BinaryIO) -> None:
        self._handle, self._read = handle, 0

    def allow(self) -> None:
        self._read = 0

    def read(self, size: int = -1) -> bytes:
        self._read += size if size >= 0 else MAX_HEADER_BYTES + 1
        if self._read > MAX_HEADER_BYTES:
            raise _HeaderTooLarge(self._handle.tell())
        return self._handle.read(size)

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        return self._handle.seek(offset, whence)

    def tell(self) -> int:
        return self._handle.tell()


def _image_members(path: str) -> Iterable[TarMember]:
    """Every image member of a tar, in archive order, each marked with what keeps it from being read."""
    seen: dict[str, TarMember] = {}  # every regular member's name (the last of a name), for hard links
    occurrences: dict[str, int] = {}  # how often each image name came
    listed = 0
    try:
        with open_regular(path) as handle:
            guarded = _Guarded(handle)
            # typeshed's file protocol for tarfile asks for write() and close() too, which reading never calls.
            with tarfile.open(fileobj=guarded, mode="r:") as archive:  # type: ignore[call-overload]
                while True:
                    guarded.allow()
                    info = archive.next()
                    if info is None:
                        break
                    archive.members.clear()  # tarfile keeps every header it read: the listing keeps its own
                    member = _member(path, info, seen)
                    if member is None or not is_image_name(member.name.rpartition("/")[2]):
                        continue
                    listed += 1
                    if listed > MAX_MEMBERS:
                        raise InputError(
                            f"archive '{path}' holds more than {MAX_MEMBERS:,} images", hint="split it into shards"
                        )
                    count = occurrences.get(member.name, 0) + 1
                    occurrences[member.name] = count
                    if count > 1:  # no image's name ends in '#2': a row named so is never another member's
                        member.name = f"{member.name}#{count}"
                    yield member
    except NotRegularFile as err:
        raise InputError(str(err), hint="archives are read from regular files") from None
    except _HeaderTooLarge as err:
        raise InputError(
            f"archive '{path}' has a member header near byte {err.args[0]:,} larger than {MAX_HEADER_BYTES:,} bytes",
            hint="it is damaged or not a tar of images",
        ) from None
    except RecursionError:
        raise InputError(
            f"cannot read archive '{path}': a chain of headers too long", hint="it is damaged or not a tar of images"
        ) from None
    except (tarfile.TarError, OSError, EOFError, ValueError) as err:
        cut = isinstance(err, EOFError) or "unexpected end of data" in str(err)  # a tar, but not all of one
        hint = (
            "it ends inside a member: it was cut short, so copy or write it again" if cut else "give a plain .tar file"
        )
        raise InputError(f"cannot read archive '{path}': {err}", hint=hint) from None


def _member(path: str, info: tarfile.TarInfo, seen: dict[str, TarMember]) -> TarMember | None:
    """The member ``info`` describes (a hard link reads its target's bytes), or None for folders and devices."""
    if info.isreg():
        problem = (
            _UNSAFE
            if _name_fault(info.name)
            else _SPARSE
            if info.issparse()
            else _TOO_LARGE
            if info.size > MAX_MEMBER_BYTES
            else None
        )
        member = TarMember(path, info.name, info.offset_data, info.size, problem)
        seen[info.name] = member
        return member
    if info.islnk():
        target = seen.get(info.linkname)
        if _name_fault(info.name):
            return TarMember(path, info.name, 0, 0, _UNSAFE)
        if target is None or target.problem == _UNSAFE:
            return TarMember(path, info.name, 0, 0, f"{_BROKEN_LINK} {info.linkname}")
        member = TarMember(path, info.name, target.offset, target.size, target.problem)
        seen[info.name] = member
        return member
    if info.issym():
        return TarMember(path, info.name, 0, 0, _UNSAFE if _name_fault(info.name) else f"{_SYMLINK} {info.linkname}")
    return None


def _name_fault(name: str) -> str | None:
    """What makes a member name unsafe to read by (absolute, ``..``, backslash, NUL, empty), or None."""
    if not name:
        return "empty"
    if "\0" in name:
        return "a NUL character"
    if "\\" in name:
        return "a backslash"
    if name.startswith("/"):
        return "absolute"
    if ".." in name.split("/"):
        return "a '..' part"
    return None
