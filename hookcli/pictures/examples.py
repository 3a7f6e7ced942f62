"""A channel's dataset examples drawn from a statistics file: the inputs that drive it hardest, each as the model saw
it with the channel's map over it and the map's largest value ringed, captioned with its rank, value and name.

The maps are the ones the statistics run kept (``top_maps``): nothing is
computed again. A map laid out like the image (``[H, W]`` maps, tokens that
fold to a square) is drawn over the photo (:func:`~hookcli.pictures.render.overlay`,
each map scaled to its own range); one that is not (tokens that do not fold, a
video clip's frames, whose photo is not kept) is drawn alone, as is any map
whose photo cannot be read, and the caption says so. A flat layer's channel
has one value an input and no map: its examples are the photos and their
values.

>>> import numpy as np
>>> laid_out([np.zeros((2, 3, 3), np.uint8), np.zeros((4, 2, 3), np.uint8)], columns=2, padding=1).shape
(6, 9, 3)
"""

from __future__ import annotations

import collections
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from hookcli.console import printable
from hookcli.errors import HookcliError
from hookcli.inputs.preprocess import Preprocess
from hookcli.options.grid import GridOptions
from hookcli.pictures.drawing import Picture
from hookcli.pictures.file_names import capped
from hookcli.pictures.photos import model_photo
from hookcli.pictures.render import (
    MAX_PIXELS,
    PAD_COLOR,
    add_colorbar,
    add_title,
    colorize,
    grid_columns,
    overlay,
    scale_maps,
    stacked,
)
from hookcli.pictures.text import caption_font, fitted, number
from hookcli.storage.stats_file import StatsFile, StatsLayer
from hookcli.storage.stats_format import is_component_key

__all__ = ["EXAMPLE_SIDE", "MAX_EXAMPLES", "ExamplePhotos", "examples_picture", "laid_out", "unit_word"]

#: The longer side of an example's tile in grid's pictures.
EXAMPLE_SIDE = 224
#: The most examples one picture shows (``hookcli stats --top`` keeps at most as many).
MAX_EXAMPLES = 1000
#: Photos kept decoded while pictures are drawn: an input that drives many channels is read once.
_PHOTOS_KEPT = 256
#: The fewest pixels a map drawn alone is high (a row of tokens is one map pixel high).
_STRIP_HEIGHT = 24
#: A captioned picture is at least this wide, so that its colour bar and caption read whole.
_MIN_WIDTH = 384


class ExamplePhotos:
    """The photos of a statistics file's inputs as the model saw them (:func:`~hookcli.pictures.photos.model_photo`),
    at most ``side`` pixels a side; calling it with a row gives ``(pixels, None)`` or ``(None, why there is none)``.
    The most recently used are kept."""

    def __init__(self, stats: StatsFile, side: int) -> None:
        self.inputs, self.side = stats.inputs, side
        self._kept: collections.OrderedDict[int, tuple[np.ndarray | None, str | None]] = collections.OrderedDict()
        self.preprocess: Preprocess | None = None
        self.unusable: str | None = None
        if "frames" in stats.metadata:
            self.unusable = "a video's frames are not kept"
            return
        try:
            self.preprocess = Preprocess.from_metadata(stats.metadata.get("preprocess"))
        except ValueError as err:
            self.unusable = f"its preprocess metadata is unusable: {err}"

    def __call__(self, row: int) -> tuple[np.ndarray | None, str | None]:
        if self.unusable is not None:
            return None, self.unusable
        if row in self._kept:
            self._kept.move_to_end(row)
            return self._kept[row]
        try:
            photo = model_photo(self.inputs[row], self.preprocess, enlarge=False)
            found: tuple[np.ndarray | None, str | None] = (_fitted(photo, self.side), None)
        except HookcliError as err:
            found = (None, err.message)
        self._kept[row] = found
        if len(self._kept) > _PHOTOS_KEPT:
            self._kept.popitem(last=False)
        return found


def _fitted(photo: np.ndarray, side: int) -> np.ndarray:
    """``photo`` resized so that its longer side is ``side`` pixels."""
    height, width = photo.shape[:2]
    scale = side / max(height, width)
    size = (max(1, round(width * scale)), max(1, round(height * scale)))
    resample = Image.Resampling.LANCZOS if scale < 1 else Image.Resampling.BILINEAR
    return np.asarray(Image.fromarray(photo).resize(size, resample))


@dataclass(frozen=True)
class _Example:
    """One example of a channel: its rank (from 1), value, input row and name, its map as drawn (None for a flat
    layer) with the position of its largest value in it, and the frame that position is in (a clip's)."""

    rank: int
    value: float
    row: int
    name: str
    heat: np.ndarray | None
    peak: tuple[int, int] | None
    frame: int | None


def _examples(stats: StatsFile, layer: StatsLayer, channel: int, count: int) -> Iterator[_Example]:
    """The channel's first ``count`` examples, each map read as its example comes (a file may claim maps of
    millions of positions: one is held at a time)."""
    values, rows = (stats.channel(layer.key, field, channel, count) for field in ("top_values", "top_rows"))
    at = stats.channel(layer.key, "top_at", channel, count) if layer.spatial else None
    for rank, (value, row) in enumerate(zip(values.tolist(), rows.tolist())):
        values_map = stats.channel(layer.key, "top_maps", channel, slice(rank, rank + 1))[0]
        heat, peak, frame = _map_at(layer, values_map, None if at is None else at[rank].tolist())
        yield _Example(rank + 1, value, row, Path(stats.inputs[row]).name, heat, peak, frame)


def _map_at(layer: StatsLayer, values: np.ndarray, at: list[int] | None):
    """An example's map as a 2-D picture, where its largest value is in it, and the frame (a clip's: the frame of
    the largest value); ``(None, None, None)`` for a flat layer."""
    if at is None:
        return None, None, None
    if len(layer.spatial) == 3:  # a clip: the frame of its largest value
        return values[at[0]], (at[1], at[2]), at[0]
    if len(layer.spatial) == 1:  # tokens, or a Conv1d's positions
        side = math.isqrt(layer.spatial[0])
        if layer.layout == "tokens" and side * side == layer.spatial[0]:  # folded to a square, as grid folds tokens
            return values.reshape(side, side), divmod(at[0], side), None
        return values.reshape(1, -1), (0, at[0]), None
    return values, (at[0], at[1]), None


def _over_photo(layer: StatsLayer) -> bool:
    """Whether the layer's maps cover the image as it does: maps, and tokens that fold to a square."""
    if len(layer.spatial) == 2:
        return True
    return layer.layout == "tokens" and math.isqrt(layer.spatial[0]) ** 2 == layer.spatial[0]


def examples_picture(
    stats: StatsFile,
    layer: StatsLayer,
    channel: int,
    options: GridOptions,
    photos: ExamplePhotos,
    *,
    title: bool = True,
) -> Picture:
    """Channel ``channel`` of ``layer``: a tile for each of its examples (see the module), ``options.columns`` a row
    (default: about 3:2), with a colour bar and, with ``title``, a caption naming the layer, the channel and how the
    examples were chosen (``options.plain``: the tiles alone). The notes say which photos could not be read."""
    count = min(layer.examples, MAX_EXAMPLES)
    examples = _examples(stats, layer, channel, count)
    side = min(photos.side, max(32, math.isqrt(MAX_PIXELS // max(1, 2 * count))))
    over_photo = _over_photo(layer)
    tiles, notes = [], []
    for example in examples:
        photo, problem = photos(example.row) if over_photo or example.heat is None else (None, None)
        tile = _tile(example, photo, side, options)
        if problem is not None and photos.unusable is None:
            notes.append(f"the photo of input {example.row} ({example.name}) cannot be read: {problem}")
        if not options.plain:
            missing = "map alone: photo unreadable" if example.heat is not None else "photo unreadable"
            tile = _captioned(tile, example, missing if problem is not None else None, side)
        tiles.append(tile)
    if not tiles:
        tiles = [np.full((side // 4, side, 3), PAD_COLOR, dtype=np.uint8)]
    columns = options.columns or grid_columns(len(tiles), *tiles[0].shape[:2])
    pixels = laid_out(tiles, columns=columns, padding=options.padding)
    if options.plain:
        return Picture(pixels, tuple(notes))
    if pixels.shape[1] < _MIN_WIDTH:  # room for the colour bar's words and the caption
        pixels = np.pad(pixels, ((0, 0), (0, _MIN_WIDTH - pixels.shape[1]), (0, 0)), constant_values=PAD_COLOR)
    if layer.spatial:
        pixels = add_colorbar(pixels, options.overlay_cmap, "low", "high", "each map to its own range")
    if title:
        pixels = add_title(pixels, _title_parts(stats, layer, channel, count, over_photo and photos.unusable is None))
    return Picture(pixels, tuple(notes))


def unit_word(key: str) -> str:
    """What pictures and pages call a unit of layer ``key``: a channel, or a principal component (the layers
    ``stats --components`` adds)."""
    return "component" if is_component_key(key) else "channel"


def _title_parts(stats: StatsFile, layer: StatsLayer, channel: int, count: int, over_photo: bool) -> list[str]:
    mean, high = (float(stats.channel(layer.key, field, channel)) for field in ("mean", "max"))
    kept = f"top {count} of {len(stats.inputs):,} inputs by {printable(str(stats.options['top_by']))}"
    if count < layer.examples:
        kept += f" (the first {count} of {layer.examples} kept)"
    unit = unit_word(layer.key)
    parts = [printable(capped(layer.key, 200)), f"{unit} {channel}", f"mean {number(mean)}, max {number(high)}", kept]
    if not layer.spatial:
        parts.append("one value an input")
    elif over_photo:
        parts.append(f"the {unit}'s map over the photo the model saw, its largest value ringed")
    else:
        parts.append(f"the {unit}'s map, its largest value ringed")
    return parts


def _tile(example: _Example, photo: np.ndarray | None, side: int, options: GridOptions) -> np.ndarray:
    """The example's picture: its map over its photo, the map alone, or the photo alone (a flat layer's); a blank
    tile for a flat layer's example without its photo."""
    if example.heat is None:
        return photo if photo is not None else np.full((side, side, 3), 235, dtype=np.uint8)
    if photo is not None:
        drawn = overlay(photo, example.heat, cmap=options.overlay_cmap, alpha=options.alpha)
    else:
        heat = example.heat
        if max(heat.shape) > side:  # more cells than the tile has pixels: each pixel the mean of its cells
            scale = side / max(heat.shape)
            size = (max(1, round(heat.shape[1] * scale)), max(1, round(heat.shape[0] * scale)))
            heat = np.asarray(
                Image.fromarray(heat.astype(np.float32, copy=False), mode="F").resize(size, Image.Resampling.BOX)
            )
        height, width = heat.shape
        factor = max(1, side // max(height, width))
        drawn = colorize(scale_maps(heat[None], "channel")[0], options.overlay_cmap)
        drawn = drawn.repeat(factor, axis=0).repeat(factor, axis=1)
        if drawn.shape[0] < _STRIP_HEIGHT:
            drawn = drawn.repeat(math.ceil(_STRIP_HEIGHT / drawn.shape[0]), axis=0)
    return _ringed(drawn, example.peak, example.heat.shape) if example.peak is not None else drawn


def _ringed(pixels: np.ndarray, peak: tuple[int, int], shape: tuple[int, ...]) -> np.ndarray:
    """A ring, white inside black, around the centre of map cell ``peak`` (of a map of ``shape``) on ``pixels``."""
    image = Image.fromarray(np.ascontiguousarray(pixels))
    draw = ImageDraw.Draw(image)
    y = (peak[0] + 0.5) * image.height / shape[0]
    x = (peak[1] + 0.5) * image.width / shape[1]
    radius = max(4.0, min(image.width, image.height) / 18, 0.5 * image.width / shape[1])
    for grow, colour, width in ((1, (0, 0, 0), 4), (0, (255, 255, 255), 2)):
        r = radius + grow
        draw.ellipse((x - r, y - r, x + r, y + r), outline=colour, width=width)
    return np.asarray(image)


def _captioned(tile: np.ndarray, example: _Example, problem: str | None, side: int) -> np.ndarray:
    """``tile`` above its caption: rank and value (and frame), the input's name, and what is missing."""
    width = max(tile.shape[1], side)
    font = caption_font(width)
    first = f"#{example.rank}  {number(example.value)}" + (
        f"  frame {example.frame}" if example.frame is not None else ""
    )
    lines = [first, fitted(printable(example.name), font, width - 8)]
    if problem:
        lines.append(fitted(problem, font, width - 8))
    line_h = font.getbbox("Ag")[3] + 3
    band = Image.new("RGB", (width, line_h * len(lines) + 4), (255, 255, 255))
    draw = ImageDraw.Draw(band)
    for place, line in enumerate(lines):
        colour = (160, 0, 0) if problem and place == len(lines) - 1 else (0, 0, 0)
        draw.text((2, 2 + place * line_h), line, fill=colour, font=font)
    return stacked(tile, np.asarray(band))


def laid_out(tiles: list[np.ndarray], *, columns: int, padding: int) -> np.ndarray:
    """Pictures of any sizes in rows of ``columns``, each in a cell as large as the largest, ``padding`` pixels
    apart and around."""
    cell_h = max(tile.shape[0] for tile in tiles)
    cell_w = max(tile.shape[1] for tile in tiles)
    columns = max(1, min(columns, len(tiles)))
    rows = math.ceil(len(tiles) / columns)
    canvas = np.full(
        (rows * (cell_h + padding) + padding, columns * (cell_w + padding) + padding, 3), PAD_COLOR, dtype=np.uint8
    )
    for place, tile in enumerate(tiles):
        row, column = divmod(place, columns)
        top, left = padding + row * (cell_h + padding), padding + column * (cell_w + padding)
        canvas[top : top + tile.shape[0], left : left + tile.shape[1]] = tile
    return canvas
