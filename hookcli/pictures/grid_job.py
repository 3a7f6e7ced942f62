"""One picture a grid draws (:class:`GridJob`), and where grids go by default."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["DEFAULT_MAPS", "GridJob", "default_grid_folder"]


#: Channels drawn when neither --channels nor --top is given: a wide layer's first 64, with a note on the rest.
DEFAULT_MAPS = 64


def default_grid_folder(source) -> str:
    """Where grid writes when no folder is given: ``<file stem>_grids``, or ``grids`` for stdin and memory."""
    if not isinstance(source, str | os.PathLike) or os.fspath(source) == "-":
        return "grids"
    return f"{Path(source).name.removesuffix('.safetensors') or 'features'}_grids"


@dataclass(frozen=True)
class GridJob:
    """One PNG to draw: tensor ``key``, row ``row`` (input ``name``), written to ``path``.

    ``limit``: how many of the selected maps the picture holds (None: all).
    """

    key: str
    row: int
    name: str
    path: Path
    source_image: str | None = field(default=None, repr=False)
    limit: int | None = None
