"""What names an input: the suffixes of image files, and the lines of a list of paths (stdin).

The lowest module of :mod:`hookcli.inputs`: folders, archives and frame
folders all pick images by these names.

>>> is_image_name("cat.JPG"), is_image_name(".hidden.png"), is_image_name("notes.txt")
(True, False, False)
>>> list(read_lines(["a.jpg\\n", "\\n", "b c.png\\r\\n"]))
['a.jpg', 'b c.png']
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

__all__ = ["IMAGE_SUFFIXES", "is_image_name", "read_lines"]

#: Suffixes picked up when a folder is given; files named explicitly are always tried.
IMAGE_SUFFIXES = frozenset(
    {".jpg", ".jpeg", ".png", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm", ".pgm", ".pbm", ".jfif"}
)


def read_lines(stream: Iterable[str]) -> Iterable[str]:
    """The non-blank lines of ``stream``, their line ends cut (one path each)."""
    for line in stream:
        line = line.rstrip("\r\n")
        if line.strip():
            yield line


def is_image_name(name: str) -> bool:
    """Whether a file name is an image's by its suffix (hidden files are not)."""
    return not name.startswith(".") and Path(name).suffix.lower() in IMAGE_SUFFIXES
