"""Find the input images a command names: files, folders (``recursive=True`` walks sub-folders), tar archives'
members and ``-``, which reads one path per line from a text stream (stdin on the command line), so
``find photos -name '*.jpg' | hookcli extract … -`` works. Order is kept: files in the order given, folder contents
sorted by name.

Nothing is decoded here (:mod:`hookcli.inputs.images` does that), so a command refuses a missing input before
Pillow, numpy or torch load.

>>> photo = __import__("matplotlib.cbook").cbook.get_sample_data("grace_hopper.jpg", asfileobj=False)
>>> [Path(p).name for p in gather_inputs([photo])]
['grace_hopper.jpg']
"""

from __future__ import annotations

import itertools
import os
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from hookcli.console import counted
from hookcli.errors import InputError
from hookcli.files import file_kind
from hookcli.inputs import archives
from hookcli.inputs.names import IMAGE_SUFFIXES, is_image_name, read_lines

__all__ = [
    "FoundInputs",
    "find_inputs",
    "gather_inputs",
]


#: Counting the images a search without ``recursive`` left out stops after this many images or sub-folders.
LEFT_OUT_BOUND = 1000


@dataclass(frozen=True)
class FoundInputs:
    """The image paths, in input order, and the images in sub-folders of folder inputs that were left out.

    A path is a file's :class:`~pathlib.Path`, a tar member
    (:class:`~hookcli.inputs.archives.TarMember`), or for video models a clip
    or a frame pair (:mod:`hookcli.inputs.video`): each names itself through
    :func:`os.fspath`. ``left_out`` images in ``left_out_folders`` sub-folders are what a
    recursive search would add; ``counted_all`` is False when counting them
    stopped at :data:`LEFT_OUT_BOUND` (there are at least that many).
    """

    paths: list[os.PathLike[str]]
    left_out: int = 0
    left_out_folders: int = 0
    counted_all: bool = True

    @property
    def note(self) -> str | None:
        """What to tell the user about the images left out; None when there are none."""
        if not self.left_out:
            return None
        at_least = "" if self.counted_all else "at least "
        verb = "was" if self.left_out == 1 and self.counted_all else "were"
        return (
            f"{at_least}{counted(self.left_out, 'image')} in {at_least}"
            f"{counted(self.left_out_folders, 'sub-folder')} {verb} left out; -r (--recursive) includes them"
        )


def find_inputs(arguments: Sequence[str], *, recursive: bool = False, stdin: TextIO | None = None) -> FoundInputs:
    """Turn command-line inputs into an ordered list of image paths, and count what sub-folders hold.

    ``-`` reads paths, one per line, from ``stdin`` (default ``sys.stdin``);
    blank lines are ignored. Each path read there may itself be a folder.
    Without ``recursive``, images in sub-folders of folder inputs are left
    out, and counted (up to :data:`LEFT_OUT_BOUND`).

    Raises :class:`InputError` for a missing path, a folder with no images or
    when nothing at all is given.
    """
    paths: list[os.PathLike[str]] = []
    folders: list[Path] = []
    for argument in arguments:
        names = read_lines(stdin if stdin is not None else sys.stdin) if argument == "-" else [argument]
        for name in names:
            found, folder = _expand(name, recursive)
            paths.extend(found)
            if folder is not None and not recursive:
                folders.append(folder)
    if not paths and "-" in arguments:
        raise InputError(
            "standard input ('-') held no paths",
            hint="pipe in one path a line (find photos -name '*.jpg' | hookcli …), or pass image files or folders",
        )
    if not paths:
        raise InputError(
            "no input images were given",
            hint="pass image files or folders, or '-' to read paths from stdin",
        )
    return FoundInputs(paths, *_left_out(folders))


def gather_inputs(
    arguments: Sequence[str], *, recursive: bool = False, stdin: TextIO | None = None
) -> list[os.PathLike[str]]:
    """The image paths of :func:`find_inputs`, in input order."""
    return find_inputs(arguments, recursive=recursive, stdin=stdin).paths


def _left_out(folders: Sequence[Path]) -> tuple[int, int, bool]:
    """Images below ``folders`` that a recursive search would add, the sub-folders holding them, and whether the
    count is complete (it stops at :data:`LEFT_OUT_BOUND` images or sub-folders looked into)."""
    images = holding = looked = 0
    for folder in folders:
        for _, names in itertools.islice(_walk(folder), 1, None):  # the folder itself was read
            images, holding, looked = images + len(names), holding + bool(names), looked + 1
            if images >= LEFT_OUT_BOUND or looked >= LEFT_OUT_BOUND:
                return images, holding, False
    return images, holding, True


def _expand(argument: str, recursive: bool) -> tuple[Sequence[os.PathLike[str]], Path | None]:
    """The images ``argument`` names, and the folder it is (None for a file): a ``.tar`` names its image members
    (:mod:`hookcli.inputs.archives`), and ``archive.tar::member`` one of them."""
    if "\0" in argument:  # no path holds one; the system refuses to look
        raise InputError(
            f"input '{argument}' holds a NUL byte, which no path can",
            hint="paths on standard input come one a line (find … -print, not -print0)",
        )
    if not os.path.lexists(argument):  # a path on disk is a disk path, whatever its name
        member = archives.find_member(argument)
        if member is not None:
            return [member], None
    path = Path(argument)
    try:
        path.stat()
    except FileNotFoundError:
        pass
    except OSError as err:
        raise InputError(f"cannot read input '{argument}': {err.strerror}", hint="check the path") from None
    found: Sequence[os.PathLike[str]]
    if path.is_dir():
        found = _images_in(path, recursive)
        if not found:
            has_subfolders = any(child.is_dir() for child in path.iterdir())
            hint = (
                "add --recursive to look in its sub-folders"
                if has_subfolders and not recursive
                else f"image files end in one of {', '.join(sorted(IMAGE_SUFFIXES))}"
            )
            raise InputError(f"no images found in folder '{argument}'", hint=hint)
        return found, path
    if not path.exists():
        raise InputError(f"no such file or folder: '{argument}'", hint="check the path")
    if not path.is_file():
        raise InputError(
            f"input '{argument}' is {file_kind(path.stat().st_mode)}, not an image file",
            hint="images are read from regular files; '-' reads a list of paths from stdin",
        )
    if archives.is_archive(path):
        found = archives.tar_images(path)
        if not found:
            raise InputError(
                f"no images found in archive '{argument}'",
                hint=f"image members end in one of {', '.join(sorted(IMAGE_SUFFIXES))}",
            )
        return found, None
    return [path], None


def _images_in(folder: Path, recursive: bool) -> list[Path]:
    if recursive:
        return [root / name for root, names in _walk(folder) for name in names]
    # Anything but a folder is listed; a FIFO or device among them is refused when read, under --on-error.
    return sorted(p for p in folder.iterdir() if not p.is_dir() and is_image_name(p.name))


def _walk(folder: Path) -> Iterator[tuple[Path, list[str]]]:
    """``(folder, its image names)`` for ``folder`` and every folder below it, in the order a recursive search
    reads them."""
    for root, dirs, files in os.walk(folder):
        dirs.sort()
        yield Path(root), sorted(name for name in files if is_image_name(name))
