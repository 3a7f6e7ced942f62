"""The options of ``grid`` and ``report``, each declared once as a typed field of :class:`GridOptions`: the Click
options (:func:`hookcli.cli.declared.grid_drawing_options`) and the checks are made from its fields.

>>> declared("padding", GRID_OPTIONS).high, declared("keys", GRID_OPTIONS).flags
(64, ('--key', '-k'))
>>> GridOptions(channels="0:8").channels
slice(0, 8, None)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from hookcli.errors import RANGE_HINT, UsageProblem
from hookcli.options.declaring import Option, check_flags, check_value, declarations, declared, option
from hookcli.options.run import SCALES
from hookcli.parsing import parse_channels

__all__ = ["GRID_OPTIONS", "MAPS_CMAP", "GridOptions", "drawing_options", "refuse_given", "refuse_scale"]

#: Feature maps' colormap when ``--cmap`` is not given.
MAPS_CMAP = "viridis"


@dataclass(frozen=True)
class GridOptions:
    """How to draw: which tensors and images, which channels, and the look of the grid.

    ``keys`` and ``images`` take one value or a list; ``channels`` a slice,
    ``"A:B"`` or one channel. ``plain`` draws just the tiles: no caption,
    channel numbers or colour bar, and no enlargement past ``min_tile``.
    ``frame``: draw only this frame (from 0) of video clips, as ``[C, H, W]``
    maps. ``flow_as_channels``: draw optical-flow fields as their two
    channels rather than in colour. ``cmap`` None: each picture's own
    (:attr:`maps_cmap` for feature maps).
    """

    keys: Sequence[str] = option(
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
    )
    images: Sequence[str] = option(
        ("--image", "-i"),
        "Images (rows) to draw: row index, range A:B of indices, or input file name. Repeat. [all]",
        ("grid",),
        default=(),
        metavar="INDEX|NAME|A:B",
        multiple=True,
    )
    channels: slice | None = option(
        ("--channels",),
        "Channel range, e.g. 0:64 (':' for all), or one channel K. [all; the first 64 of wider layers]",
        ("grid",),
        kind="parsed",
        metavar="A:B|K",
        parser=parse_channels,
        multiple=True,
    )
    top: int | None = option(
        ("--top",),
        "Only the K channels with the highest mean activation (an ablation file: the K units of largest effect).",
        ("grid",),
        kind="int",
        low=1,
    )
    columns: int | None = option(
        ("--columns",),
        "Tiles per row [fewest blank places, about 3:2].",
        ("grid",),
        kind="int",
        low=1,
    )
    padding: int = option(
        ("--padding",),
        "Pixels between tiles.",
        ("grid",),
        kind="int",
        default=2,
        low=0,
        high=64,
        show_default=True,
    )
    cmap: str | None = option(
        ("--cmap",),
        "Any matplotlib colormap (gray, magma…)  [default: viridis; the diverging RdBu_r for an RSA matrix]",
        ("grid",),
    )
    scale: str = option(
        ("--scale",),
        "Normalise each channel alone, or the whole grid with one range.",
        ("grid",),
        kind="choice",
        choices=SCALES,
        default="channel",
        show_default=True,
    )
    min_tile: int = option(
        ("--min-tile",),
        "Enlarge small maps (nearest neighbour) to at least this many pixels.",
        ("grid",),
        kind="int",
        default=32,
        low=1,
        high=1024,
        show_default=True,
    )
    title: bool = option(
        ("--title/--no-title",),
        "Caption strip with key, input and shape.",
        ("grid",),
        kind="flag",
        default=True,
        show_default=True,
    )
    plain: bool = option(
        ("--plain",),
        "Just the tiles: no caption, channel numbers or colour bar, and no enlargement "
        "past --min-tile (for pictures to process further).",
        ("grid",),
        kind="flag",
        default=False,
    )
    overlay: bool = option(
        ("--overlay",),
        "Blend the mean activation (or --channels K) over the input image instead of tiling.",
        ("grid",),
        kind="flag",
        default=False,
    )
    alpha: float = option(
        ("--alpha",),
        "Overlay opacity.",
        ("grid",),
        kind="float",
        default=0.5,
        low=0,
        high=1,
        show_default=True,
    )
    overlay_cmap: str = option(
        ("--overlay-cmap",),
        "Colormap of the overlay heat map (lightness should rise with value).",
        ("grid",),
        default="inferno",
        show_default=True,
    )
    frame: int | None = option(
        ("--frame",),
        "Only frame T (from 0) of video clips, drawn as channel maps. [all: a column per frame]",
        ("grid",),
        kind="int",
        low=0,
        metavar="T",
    )
    flow_as_channels: bool = option(
        ("--flow-as-channels",),
        "Draw optical-flow fields as their dx and dy maps, not in colour.",
        ("grid",),
        kind="flag",
        default=False,
    )
    examples: str | None = option(
        ("--examples",),
        "An ablation file's report: a stats file of the same layer, whose dataset examples each unit's row shows.",
        ("report",),
        metavar="STATS",
    )

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
        check_flags(self, GRID_OPTIONS)

    @property
    def maps_cmap(self) -> str:
        """The colormap of feature maps: ``cmap``, or :data:`MAPS_CMAP`."""
        return MAPS_CMAP if self.cmap is None else self.cmap


#: Every option of ``grid`` and ``report``, in declaration order.
GRID_OPTIONS: tuple[Option, ...] = declarations(GridOptions)


def drawing_options(command: str) -> tuple[Option, ...]:
    """The options ``command`` (``grid`` or ``report``, which takes grid's too) takes of :data:`GRID_OPTIONS`."""
    return tuple(option for option in GRID_OPTIONS if command in option.commands or "grid" in option.commands)


def refuse_scale(options: GridOptions, what: str) -> None:
    """Refuse ``--scale`` away from its default for ``what``, a file whose picture has no maps to scale."""
    if options.scale != declared("scale", GRID_OPTIONS).default:
        raise UsageProblem(
            f"--scale does not apply to {what}: its picture has one colour scale", hint="leave --scale out"
        )


def refuse_given(options: GridOptions, names: Sequence[str], what: str, hint: str) -> None:
    """Refuse any of the options ``names`` that ``options`` sets (a value, a flag, a list), by its flag: it does not
    apply to ``what`` (``a comparison file ('c.safetensors' holds one matrix of similarities)``)."""
    for name in names:
        given = getattr(options, name)
        if given is not None and given is not False and given != ():
            raise UsageProblem(f"{declared(name, GRID_OPTIONS).flags[0]} does not apply to {what}", hint=hint)
