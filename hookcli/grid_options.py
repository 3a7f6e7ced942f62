"""The options of ``grid`` and ``report``, declared once as :data:`hookcli.options.RUN_OPTIONS` declares a run's:
the Click options (:func:`hookcli.cli.declared.grid_drawing_options`), :class:`hookcli.pictures.options.GridOptions`
and its checks are made from :data:`GRID_OPTIONS`.

>>> from hookcli.options import declared
>>> declared("padding", GRID_OPTIONS).high, declared("keys", GRID_OPTIONS).flags
(64, ('--key', '-k'))
"""

from __future__ import annotations

from hookcli.options import SCALES, Option
from hookcli.parsing import parse_channels

__all__ = ["GRID_OPTIONS"]

GRID_OPTIONS: tuple[Option, ...] = (
    Option(
        "keys",
        ("--key", "-k"),
        "Tensors to draw (globs as for --layer). Repeat.",
        ("grid", "stats", "compare"),
        default=(),
        metavar="GLOB",
        multiple=True,
        help_in=(
            ("stats", "Saved features: the tensors to describe (globs) [every one whose rows share a shape]."),
            ("compare", "Saved features: the tensors of the first side (globs) [every one whose rows share a shape]."),
        ),
    ),
    Option(
        "images",
        ("--image", "-i"),
        "Images (rows) to draw: row index, range A:B of indices, or input file name. Repeat. [all]",
        ("grid",),
        default=(),
        metavar="INDEX|NAME|A:B",
        multiple=True,
    ),
    Option(
        "channels",
        ("--channels",),
        "Channel range, e.g. 0:64 (':' for all), or one channel K. [all; the first 64 of wider layers]",
        ("grid",),
        kind="parsed",
        metavar="A:B|K",
        parser=parse_channels,
        multiple=True,  # given twice, refused (one range is drawn), rather than the first left out without a word
    ),
    Option("top", ("--top",), "Only the K channels with the highest mean activation.", ("grid",), kind="int", low=1),
    Option("columns", ("--columns",), "Tiles per row [fewest blank places, about 3:2].", ("grid",), kind="int", low=1),
    Option(
        "padding",
        ("--padding",),
        "Pixels between tiles.",
        ("grid",),
        kind="int",
        default=2,
        low=0,
        high=64,
        show_default=True,
    ),
    Option(
        "cmap",
        ("--cmap",),
        "Any matplotlib colormap (gray, magma…)  [default: viridis; the diverging RdBu_r for an RSA matrix]",
        ("grid",),
    ),
    Option(
        "scale",
        ("--scale",),
        "Normalise each channel alone, or the whole grid with one range.",
        ("grid",),
        kind="choice",
        choices=SCALES,
        default="channel",
        show_default=True,
    ),
    Option(
        "min_tile",
        ("--min-tile",),
        "Enlarge small maps (nearest neighbour) to at least this many pixels.",
        ("grid",),
        kind="int",
        default=32,
        low=1,
        high=1024,
        show_default=True,
    ),
    Option(
        "title",
        ("--title/--no-title",),
        "Caption strip with key, input and shape.",
        ("grid",),
        kind="flag",
        default=True,
        show_default=True,
    ),
    Option(
        "plain",
        ("--plain",),
        "Just the tiles: no caption, channel numbers or colour bar, and no enlargement "
        "past --min-tile (for pictures to process further).",
        ("grid",),
        kind="flag",
        default=False,
    ),
    Option(
        "overlay",
        ("--overlay",),
        "Blend the mean activation (or --channels K) over the input image instead of tiling.",
        ("grid",),
        kind="flag",
        default=False,
    ),
    Option(
        "alpha",
        ("--alpha",),
        "Overlay opacity.",
        ("grid",),
        kind="float",
        default=0.5,
        low=0,
        high=1,
        show_default=True,
    ),
    Option(
        "overlay_cmap",
        ("--overlay-cmap",),
        "Colormap of the overlay heat map (lightness should rise with value).",
        ("grid",),
        default="inferno",
        show_default=True,
    ),
    Option(
        "frame",
        ("--frame",),
        "Only frame T (from 0) of video clips, drawn as channel maps. [all: a column per frame]",
        ("grid",),
        kind="int",
        low=0,
        metavar="T",
    ),
    Option(
        "flow_as_channels",
        ("--flow-as-channels",),
        "Draw optical-flow fields as their dx and dy maps, not in colour.",
        ("grid",),
        kind="flag",
        default=False,
    ),
)
