"""Images read straight out of ``.tar`` files (the webdataset layout img2dataset writes), without unpacking.

A ``.tar`` given as an input stands for its image members, in the order the
archive holds them; other members (``000.json``, ``000.txt``) are left out. A
row is named ``archive.tar::member.jpg``, and that name, on stdin or in a
file's ``inputs`` metadata, finds the member again. Only plain (uncompressed)
tars are read: each member is one ``seek`` and one ``read`` away, which a
compressed stream does not allow.

The archive's listing (member names, offsets, sizes) is read once per
process while the file is unchanged.

>>> import io, tarfile, tempfile
>>> folder = tempfile.mkdtemp()
>>> with tarfile.open(f"{folder}/shard.tar", "w") as archive:
...     for name, data in [("000.jpg", b"jpeg bytes"), ("000.json", b"{}")]:
...         info = tarfile.TarInfo(name); info.size = len(data); archive.addfile(info, io.BytesIO(data))
>>> [member.name for member in tar_images(f"{folder}/shard.tar")]
['000.jpg']
>>> member = find_member(f"{folder}/shard.tar::000.jpg")
>>> member.read_bytes(), os.fspath(member).endswith("shard.tar::000.jpg")
(b'jpeg bytes', True)
"""

from __future__ import annotations

import functools
import os
import tarfile
from dataclasses import dataclass
from pathlib import PurePosixPath

from hookcli.errors import ImageError, InputError
from hookcli.store import NotRegularFile, open_regular

__all__ = ["SEPARATOR", "TarMember", "find_member", "is_archive", "tar_images"]

#: Between an archive's path and a member's name in a row's name.
SEPARATOR = "::"
_SUFFIX = ".tar"
_COMPRESSED = (".tar.gz", ".tgz", ".tar.bz2", ".tar.xz", ".tar.zst")
#: A listing holds at most this many members: a larger tar is split into shards by the tools that write them.
MAX_MEMBERS = 10_000_000


@dataclass(frozen=True)
class TarMember:
    """One image inside a tar: where its bytes are (``offset``, ``size``). Its path is ``archive::name``."""

    archive: str
    name: str
    offset: int
    size: int

    def __fspath__(self) -> str:
        return f"{self.archive}{SEPARATOR}{self.name}"

    def __str__(self) -> str:
        return os.fspath(self)

    def read_bytes(self) -> bytes:
        """The member's bytes, read from the archive (which must still hold them where it was listed)."""
        try:
            with open_regular(self.archive) as handle:
                handle.seek(self.offset)
                data = handle.read(self.size)
        except FileNotFoundError:
            raise ImageError(f"archive not found: '{self.archive}'", hint="check the path") from None
        except (NotRegularFile, OSError) as err:
            raise ImageError(f"cannot read '{self}': {err}", hint="the archive may have changed") from None
        if len(data) != self.size:
            raise ImageError(f"'{self}' is cut short: the archive ends {self.size - len(data)} bytes early",
                             hint="the archive may be truncated")
        return data


def is_archive(path: str | os.PathLike) -> bool:
    """Whether an input names a tar file (by its name; compressed tars included, to be refused by name)."""
    return str(path).lower().endswith((_SUFFIX, *_COMPRESSED))


def tar_images(path: str | os.PathLike) -> list[TarMember]:
    """The image members of the tar at ``path``, in archive order; InputError for what cannot be read."""
    return list(_images_by_name(path).values())


def _images_by_name(path: str | os.PathLike) -> dict[str, TarMember]:
    """The archive's image members by name, listed once while the file stays the same (one stat a call)."""
    text = os.path.abspath(os.fspath(path))
    if text.lower().endswith(_COMPRESSED):
        raise InputError(f"'{path}' is a compressed tar, whose members cannot be read one at a time",
                         hint="unpack it to a plain .tar (gzip -d, zstd -d), as webdataset shards are")
    try:
        status = os.stat(text)
    except OSError:
        raise InputError(f"no such file or folder: '{path}'", hint="check the path") from None
    return _images(text, status.st_size, status.st_mtime_ns, status.st_ino)


@functools.lru_cache(maxsize=64)
def _images(path: str, size: int, modified: int, inode: int) -> dict[str, TarMember]:
    """The image members of a tar by name, in archive order (keyed by the file's size, time and inode, so a
    changed file is listed again)."""
    from hookcli.images import _is_image_name

    return {m.name: m for m in _listing(path) if _is_image_name(PurePosixPath(m.name).name)}


def _listing(path: str) -> list[TarMember]:
    """Every regular member of a tar."""
    found = []
    try:
        with open_regular(path) as handle, tarfile.open(fileobj=handle, mode="r:") as archive:
            for info in archive:
                if info.isreg():
                    found.append(TarMember(path, info.name, info.offset_data, info.size))
                    if len(found) > MAX_MEMBERS:
                        raise InputError(f"archive '{path}' holds more than {MAX_MEMBERS:,} files",
                                         hint="split it into shards")
    except NotRegularFile as err:
        raise InputError(str(err), hint="archives are read from regular files") from None
    except (tarfile.TarError, OSError, EOFError) as err:
        raise InputError(f"cannot read archive '{path}': {err}", hint="give a plain .tar file") from None
    return found


def find_member(text) -> TarMember | None:
    """The member a row name ``archive.tar::member`` names; None for a name of another form. InputError when the
    archive cannot be read or lacks the member."""
    if isinstance(text, TarMember):
        return text
    text = os.fspath(text) if isinstance(text, os.PathLike) else str(text)
    cut = text.lower().find(_SUFFIX + SEPARATOR)
    if cut < 0 or cut + len(_SUFFIX + SEPARATOR) == len(text):
        return None
    archive, name = text[:cut + len(_SUFFIX)], text[cut + len(_SUFFIX + SEPARATOR):]
    found = _images_by_name(archive).get(name)
    if found is None:
        raise InputError(f"archive '{archive}' holds no image '{name}'", hint="list it with: tar tf ARCHIVE")
    return found
