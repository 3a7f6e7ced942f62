"""Pictures written as PNG files: atomically, with fast compression."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import numpy as np
from PIL import Image

from hookcli.events import Advanced, Event, Started, Wrote
from hookcli.files import atomic_path, check_folder_output, refuse_existing

__all__ = ["save_png", "write_pictures"]


def save_png(pixels: np.ndarray, path: str | os.PathLike, *, force: bool = False) -> None:
    """Write ``uint8 [H, W, 3]`` pixels to ``path`` (its folder made if need be) atomically; an existing file is
    replaced only with ``force``."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path, force=force) as temporary:
        # zlib level 1: a third of the default's time for files about a tenth larger.
        Image.fromarray(pixels).save(temporary, format="PNG", compress_level=1)


def write_pictures(
    names: Sequence[str],
    pictures: Callable[[], Iterable[np.ndarray]],
    output: str | os.PathLike | None,
    *,
    force: bool = False,
    progress: Callable[[Event], None] | None = None,
) -> dict[str, np.ndarray] | list[Path]:
    """The pictures a file makes, named ``names`` and drawn in that order by ``pictures()``: written as PNGs under
    the folder ``output`` (refused before any is drawn when one exists, unless ``force``) and their paths returned,
    or with ``output=None`` returned by name as ``uint8 [H, W, 3]`` pixels; ``progress`` hears each one."""
    emit = progress or (lambda event: None)
    folder = None if output is None else check_folder_output(output)
    if folder is not None:
        refuse_existing([folder / name for name in names], force=force)
    emit(Started(total=len(names)))
    found: dict[str, np.ndarray] = {}
    written: list[Path] = []
    for name, pixels in zip(names, pictures(), strict=True):
        if folder is None:
            found[name] = pixels
        else:
            save_png(pixels, folder / name, force=force)
            written.append(folder / name)
            emit(Wrote(folder / name))
        emit(Advanced(1))
    return found if folder is None else written
