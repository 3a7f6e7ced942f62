"""What a grid is asked to be: the options of ``hookcli grid`` (:class:`GridOptions`) and one picture to draw
(:class:`GridJob`).

>>> GridOptions(channels=parse_channels("0:8")).channels
slice(0, 8, None)
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from hookcli.errors import RANGE_HINT, UsageProblem
from hookcli.grid_options import GRID_OPTIONS
from hookcli.options import check_value, declared, declared_field
from hookcli.parsing import parse_channels

__all__ = [
    "DEFAULT_MAPS",
    "MAPS_CMAP",
    "GridJob",
    "GridOptions",
    "default_grid_folder",
]


#: Channels drawn when neither --channels nor --top is given: a wide layer's first 64, with a note on the rest.
DEFAULT_MAPS = 64

#: Feature maps' colormap when ``--cmap`` is not given.
MAPS_CMAP = "viridis"


def default_grid_folder(source) -> str:
    """Where grid writes when no folder is given: ``<file stem>_grids``, or ``grids`` for stdin and memory."""
    if not isinstance(source, str | os.PathLike) or os.fspath(source) == "-":
        return "grids"
    return f"{Path(source).name.removesuffix('.safetensors') or 'features'}_grids"


@dataclass(frozen=True)
class GridOptions:
    """How to draw: which tensors and images, which channels, and the look of the grid.

    ``keys`` and ``images`` take one value or a list; ``channels`` a slice,
    ``"A:B"`` or one channel. ``plain`` draws just the tiles: no caption,
    channel numbers or colour bar, and no enlargement past ``min_tile``.
    ``frame``: draw only this frame (from 0) of video clips, as ``[C, H, W]``
    maps. ``flow_as_channels``: draw optical-flow fields as their two
    channels rather than in colour. Defaults, bounds and choices are
    :data:`hookcli.grid_options.GRID_OPTIONS`'; values are checked here, with the
    library's errors. ``cmap`` None: each picture's own (:attr:`maps_cmap` for
    feature maps).
    """

    keys: Sequence[str] = declared_field("keys", GRID_OPTIONS)
    images: Sequence[str] = declared_field("images", GRID_OPTIONS)
    channels: slice | None = declared_field("channels", GRID_OPTIONS)
    top: int | None = declared_field("top", GRID_OPTIONS)
    columns: int | None = declared_field("columns", GRID_OPTIONS)
    padding: int = declared_field("padding", GRID_OPTIONS)
    cmap: str | None = declared_field("cmap", GRID_OPTIONS)
    scale: str = declared_field("scale", GRID_OPTIONS)
    min_tile: int = declared_field("min_tile", GRID_OPTIONS)
    title: bool = declared_field("title", GRID_OPTIONS)
    plain: bool = declared_field("plain", GRID_OPTIONS)
    overlay: bool = declared_field("overlay", GRID_OPTIONS)
    alpha: float = declared_field("alpha", GRID_OPTIONS)
    overlay_cmap: str = declared_field("overlay_cmap", GRID_OPTIONS)
    frame: int | None = declared_field("frame", GRID_OPTIONS)
    flow_as_channels: bool = declared_field("flow_as_channels", GRID_OPTIONS)

    def __post_init__(self) -> None:
        for name in ("keys", "images"):
            value = getattr(self, name)
            object.__setattr__(self, name, (value,) if isinstance(value, str | int) else tuple(value))
        object.__setattr__(self, "images", tuple(str(i) for i in self.images))
        try:
            object.__setattr__(self, "channels", parse_channels(self.channels))
        except ValueError as err:
            raise UsageProblem(f"invalid channels: {err}", hint=RANGE_HINT) from None
        for name in ("top", "columns", "padding", "min_tile", "frame", "scale", "alpha"):
            check_value(declared(name, GRID_OPTIONS), getattr(self, name))
        for option in GRID_OPTIONS:  # "no" is true to Python: a flag takes True or False
            if option.kind == "flag" and option.name in self.__dataclass_fields__:
                check_value(option, getattr(self, option.name))

    @property
    def maps_cmap(self) -> str:
        """The colormap of feature maps: ``cmap``, or :data:`MAPS_CMAP`."""
        return MAPS_CMAP if self.cmap is None else self.cmap


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
