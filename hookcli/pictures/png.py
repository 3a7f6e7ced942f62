"""Pictures written as PNG files: atomically, with fast compression."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
from PIL import Image

from hookcli.files import atomic_path

__all__ = ["save_png"]


def save_png(pixels: np.ndarray, path: str | os.PathLike, *, force: bool = False) -> None:
    """Write ``uint8 [H, W, 3]`` pixels to ``path`` (its folder made if need be) atomically; an existing file is
    replaced only with ``force``."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path, force=force) as temporary:
        # zlib level 1: a third of the default's time for files about a tenth larger.
        Image.fromarray(pixels).save(temporary, format="PNG", compress_level=1)
