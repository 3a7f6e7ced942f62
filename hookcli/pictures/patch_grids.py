"""``hookcli grid`` on a patching file: how far each patch moved the target's output toward the source's.

Layers patched whole make one heatmap: a row a layer, a column for the mean over the pairs, then one a pair (the
first ``--top``, :data:`DEFAULT_PAIRS` when not given). Layers patched position by position make a picture each: the
map of the mean effect, then each pair's map (the first ``--top``, :data:`DEFAULT_MAPS`), side by side; a vision
transformer's patch tokens fold to their square (its class and register tokens said in the labels), other sequences
are a strip. ``--top`` takes the first pairs, in file order. Each cell is the effect (0: the patch changed nothing,
1: it moved m as far as the source's), on a diverging colormap centred on 0 (``--cmap`` chooses another): the
heatmap's ends are the largest effect shown, 1 at least; a map's, its own largest effect (``--scale grid``: the
largest of all maps shown), for one position's effect is a small share of its layer's. Undefined effects (a pair
of one class) are hatched.

>>> shown_range(np.array([0.2, np.nan, -1.5]))
1.5
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np

from hookcli.console import printable
from hookcli.errors import UsageProblem
from hookcli.events import Event
from hookcli.options.grid import GridOptions, refuse_given, refuse_scale
from hookcli.pictures.compare_grids import DIVERGING, labelled, matrix_cells
from hookcli.pictures.file_names import file_stem, safe_name
from hookcli.pictures.png import write_pictures
from hookcli.pictures.reading import recorded_prefix_tokens
from hookcli.pictures.render import MAX_PIXELS, PAD_COLOR, add_colorbar, add_title, check_cmap, map_layout
from hookcli.pictures.text import ink, number, text_bitmap
from hookcli.storage.patch_file import PatchFile, read_patch
from hookcli.storage.patch_format import patch_key
from hookcli.storage.reader import FeatureReader

__all__ = ["DEFAULT_MAPS", "DEFAULT_PAIRS", "check_patch_options", "draw_patch_grids", "patch_pictures", "shown_range"]

#: Pairs drawn when ``--top`` is not given: columns of the whole layers' heatmap, and maps beside the mean.
DEFAULT_PAIRS = 32
DEFAULT_MAPS = 8
#: A map's longer side is about this many pixels, in cells of at most :data:`_MAX_CELL`; the heatmap's.
_MAP_SIDE, _SIDE, _MAX_CELL = 160, 640, 48
_GAP, _LABEL_SIZE = 10, 13
#: Options of grid that choose what a features file has and a patching file has not.
_REFUSED = ("keys", "images", "channels", "frame", "overlay")
_SCALE_TEXT = "effect: 0 nothing, 1 as far as the source"


def shown_range(values: np.ndarray, least: float = 1.0) -> float:
    """A colour scale's end: the largest absolute defined value, ``least`` at least (where there is none, or it is
    0: 1)."""
    finite = np.abs(values[np.isfinite(values)])
    largest = float(finite.max()) if finite.size else 0.0
    return max(least, largest) if largest > 0 else 1.0


def draw_patch_grids(
    features: FeatureReader,
    options: GridOptions,
    output: str | os.PathLike | None,
    *,
    force: bool = False,
    progress: Callable[[Event], None] | None = None,
) -> dict[str, np.ndarray] | list[Path]:
    """grid's pictures of a patching file, written under ``output`` (their paths returned) or, with
    ``output=None``, returned by file name as ``uint8 [H, W, 3]`` pixels."""
    patched = read_patch(features)
    check_patch_options(patched, options)
    return write_pictures(
        _picture_names(patched), lambda: patch_pictures(patched, options), output, force=force, progress=progress
    )


def check_patch_options(patched: PatchFile, options: GridOptions) -> None:
    """Refuse the options that choose what a features file has and a patching file has not, and unknown colormaps."""
    what = f"a patching file ('{patched.name}' holds effects of layers and pairs)"
    refuse_given(options, _REFUSED, what, "choose how many pairs with --top, or leave it out")
    if not any(patched.positions.values()):  # --scale chooses how maps of positions are scaled
        refuse_scale(options, f"a patching file of layers patched whole ('{patched.name}')")
    check_cmap(options.cmap or DIVERGING)


def patch_pictures(patched: PatchFile, options: GridOptions) -> list[np.ndarray]:
    """The pictures ``grid`` draws of ``patched``, in the order of :func:`_picture_names`."""
    whole = [key for key in patched.keys if not patched.positions[key]]
    pictures = [_heatmap(patched, whole, options)] if whole else []
    return pictures + [_maps(patched, key, options) for key in patched.keys if patched.positions[key]]


def _picture_names(patched: PatchFile) -> list[str]:
    stem = file_stem(patched.name, "patch")
    whole = any(not patched.positions[key] for key in patched.keys)
    return [f"{stem}.png"] * whole + [f"{stem}__{safe_name(key)}.png" for key in patched.keys if patched.positions[key]]


def _heatmap(patched: PatchFile, keys: list[str], options: GridOptions) -> np.ndarray:
    """Layers patched whole: their mean effect, then each pair's, a row a layer."""
    count = min(patched.pairs, options.top or DEFAULT_PAIRS)
    values = np.stack(
        [np.concatenate([[patched.read(key, "mean_effect")], patched.read(key, "effect")[:count]]) for key in keys]
    )
    limit = shown_range(values)
    cmap = check_cmap(options.cmap or DIVERGING)
    cell = max(1, min(_MAX_CELL, _SIDE // max(values.shape)))
    cells = matrix_cells(values / limit, (-1.0, 1.0), cmap, cell, numbers=False)
    if options.plain:
        return cells
    pixels = labelled(cells, cell, [printable(key) for key in keys], ["mean", *(f"{i}" for i in range(count))])
    if options.title:
        pixels = add_title(pixels, _title(patched, count, "layers patched whole: the mean, then each pair", values))
    return add_colorbar(pixels, cmap, number(-limit), number(limit), _SCALE_TEXT)


def _maps(patched: PatchFile, key: str, options: GridOptions) -> np.ndarray:
    """A layer patched position by position: the mean effect's map, then each pair's; each map on its own colour
    range (``--scale channel``, the default) or all on one (``--scale grid``). A vision transformer's patch tokens
    fold to their square, its class and register tokens said in each map's label."""
    count = min(patched.pairs, options.top or DEFAULT_MAPS)
    prefix = _prefix(patched, patched.positions[key])
    height, width = _flat(np.empty(patched.positions[key]), prefix)[0].shape
    if (count + 1) * height * width > MAX_PIXELS:
        raise UsageProblem(
            f"'{key}' has maps of {height}x{width} positions: {count + 1} of them are larger than a picture may be "
            f"({MAX_PIXELS:,} pixels)",
            hint="draw fewer pairs with --top",
        )
    # The pairs drawn are read a row at a time: a file of many pairs is not read whole.
    rows = [patched.features.read(patch_key(key, "effect"), row) for row in range(count)]
    flat = [_flat(values, prefix) for values in (patched.read(key, "mean_effect"), *rows)]
    maps = [values for values, _ in flat]
    shown = np.concatenate([values.ravel() for values in maps])
    one_range = options.scale == "grid"
    limits = [shown_range(shown, 0.0)] * len(maps) if one_range else [shown_range(values, 0.0) for values in maps]
    cmap = check_cmap(options.cmap or DIVERGING)
    cell = max(1, min(_MAX_CELL, _MAP_SIDE // max(height, width)))
    tiles = [
        matrix_cells(values / limit, (-1.0, 1.0), cmap, cell, numbers=False)
        for values, limit in zip(maps, limits, strict=True)
    ]
    if options.plain:
        return _side_by_side(tiles, [None] * len(tiles))
    names = ["mean", *(f"pair {i}" for i in range(count))]
    labels: list[str | None] = [
        name
        + ("" if one_range else f" ±{number(limit)}")
        + ("" if prefixed is None else f" ({_prefix_text(prefixed)})")
        for name, limit, (_, prefixed) in zip(names, limits, flat, strict=True)
    ]
    pixels = _side_by_side(tiles, labels)
    if options.title:
        pixels = add_title(pixels, _title(patched, count, f"{printable(key)} patched a position at a time", shown))
    if one_range:
        return add_colorbar(pixels, cmap, number(-limits[0]), number(limits[0]), _SCALE_TEXT)
    return add_colorbar(pixels, cmap, "-max", "+max", f"{_SCALE_TEXT}; each map to its own largest (its label)")


def _prefix(patched: PatchFile, positions: tuple[int, ...]) -> int | None:
    """The class and register tokens a sequence of ``positions`` begins with, when the rest folds to a square as
    ``grid`` folds a features file's tokens (:func:`~hookcli.pictures.render.map_layout`); None for a map, or a
    sequence that does not fold."""
    if len(positions) != 1:
        return None
    _, height, width, layout = map_layout([positions[0], 1], recorded_prefix_tokens(patched.features.metadata))
    return positions[0] - height * width if layout.startswith("tokens") else None


def _prefix_text(values: np.ndarray) -> str:
    """The effects of the prefix tokens, as a map's label says them."""
    if values.size == 1:
        return f"class token {number(float(values[0]))}"
    return "prefix tokens " + ", ".join(number(float(value)) for value in values[:4]) + ("…" if values.size > 4 else "")


def _flat(values: np.ndarray, prefix: int | None = None) -> tuple[np.ndarray, np.ndarray | None]:
    """A map as rows and columns, and the prefix tokens' values left out of it (None when there are none): a
    sequence's tokens folded to their square after ``prefix`` tokens, or as one row when they do not fold (a map
    of more axes, its first side by side)."""
    if values.ndim == 1:
        if prefix is None:
            return values[None, :], None
        side = math.isqrt(values.shape[0] - prefix)
        return values[prefix:].reshape(side, side), (values[:prefix] if prefix else None)
    if values.ndim == 3:
        return np.concatenate(list(values), axis=1), None
    return values, None


def _side_by_side(tiles: list[np.ndarray], labels: list[str | None]) -> np.ndarray:
    """The tiles in a row, ``_GAP`` apart, each under its label."""
    marks = [text_bitmap(label, _LABEL_SIZE) if label else None for label in labels]
    header = max((mark.shape[0] for mark in marks if mark is not None), default=0)
    header += 4 if header else 0
    height = header + max(tile.shape[0] for tile in tiles)
    widths = [max(tile.shape[1], 0 if mark is None else mark.shape[1]) for tile, mark in zip(tiles, marks, strict=True)]
    canvas = np.full((height + 2 * _GAP, sum(widths) + _GAP * (len(tiles) + 1), 3), PAD_COLOR, dtype=np.uint8)
    left = _GAP
    for tile, mark, width in zip(tiles, marks, widths, strict=True):
        if mark is not None:
            ink(canvas, mark, _GAP, left)
        canvas[_GAP + header : _GAP + header + tile.shape[0], left : left + tile.shape[1]] = tile
        left += width + _GAP
    return canvas


def _title(patched: PatchFile, shown: int, what: str, values: np.ndarray) -> list[str]:
    pairs = f"{patched.pairs:,} pair{'s' if patched.pairs != 1 else ''}"
    lines = [what, f"{pairs} ({shown:,} shown), measured by m = z[source's class] - z[target's class]"]
    if not np.isfinite(values).any():
        lines.append("every effect shown is undefined: each pair's source and target are of one class, so m is 0")
    return lines
