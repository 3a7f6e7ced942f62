"""Turn one image's features into a picture.

Everything here works on numpy arrays and returns ``uint8 [H, W, 3]`` pixels;
colours come from matplotlib's colormaps, sampled once into a 256-entry table.

- :func:`as_maps` reads a per-image tensor as a stack of 2-D maps: ``[C, H, W]``
  channels; ``[T, D]`` ViT tokens folded back to a square (with or without a
  leading class token) or, when T is not square, shown as one ``T×D`` matrix;
  ``[D]`` vectors and ``[C, 1, 1]`` pooled channels as one strip of values (:func:`strip`);
  ``[C, T, H, W]`` video clips as ``[K, T, H, W]`` (one frame, ``T = 1``, as ``[C, H, W]``).
- :func:`scale_maps` maps values to [0, 1] per map or over the whole grid,
  using finite values only: NaN stays NaN (drawn in :data:`NAN_COLOR`), ±inf
  clips to the ends, a constant map is 0 rather than a division by zero.
- :func:`tile_maps` colours and tiles the maps, upscaling small ones
  (nearest neighbour) so every tile is at least ``min_tile`` pixels, with
  each tile's channel number above it; :func:`grid_columns` picks a shape
  without ragged rows where one exists. :func:`tile_frames` tiles clips as
  a table: a row per channel, a column per frame.
- :func:`flow_colours` draws an optical-flow field in the Middlebury colour
  code (hue: direction; white to full colour: length), and
  :func:`add_flow_legend` puts its colour wheel (:func:`flow_wheel`) under it.
- :func:`overlay` blends a heat map over a photo; :func:`add_title` adds a
  caption sized to the picture, :func:`add_colorbar` a colour scale.

>>> import numpy as np
>>> maps, layout = as_maps(np.zeros((197, 768), dtype=np.float32))
>>> maps.shape, layout
((768, 14, 14), 'tokens+cls')
>>> tile_maps(scale_maps(maps[:4], "channel"), columns=2, padding=1, cmap="gray", min_tile=14).shape
(31, 31, 3)
>>> tile_frames(np.zeros((2, 3, 4, 4)), padding=1, cmap="gray", min_tile=4).shape
(11, 16, 3)
"""

from __future__ import annotations

import difflib
import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageDraw

from hookcli.errors import UsageProblem, check_choice
from hookcli.families import is_square
from hookcli.pictures.text import (
    caption_font,
    glyphs,
    label_band,
    label_size,
    shortened,
    stamp,
    text_width,
    tick_step,
    wrapped,
)

__all__ = [
    "add_colorbar",
    "add_title",
    "as_maps",
    "check_cmap",
    "CLIPS",
    "colorize",
    "frame_layout",
    "FrameLayout",
    "grid_columns",
    "map_layout",
    "MAX_PIXELS",
    "MAX_STRIP_VALUES",
    "MAX_TILES",
    "NAN_COLOR",
    "NotDrawable",
    "overlay",
    "PAD_COLOR",
    "RowNotDrawable",
    "scale_maps",
    "stacked",
    "strip",
    "STRIPS",
    "tile_frames",
    "tile_layout",
    "tile_maps",
    "TileLayout",
    "tiles_that_fit",
    "value_range",
]


NAN_COLOR = (255, 0, 255)


PAD_COLOR = 255


#: What one picture may cost: tiles, and pixels (25 megapixels is 75 MB of RGB).
MAX_TILES = 4096


MAX_PIXELS = 25_000_000


class NotDrawable(ValueError):
    """The tensor's per-image shape has no picture hookcli knows how to draw."""


class RowNotDrawable(NotDrawable):
    """One row has no picture (a row of its own shape that holds no values, a photo that cannot be read), though
    the tensor's other rows may have one."""


def map_layout(row_shape: Sequence[int], prefix_tokens: int | None = None) -> tuple[int, int, int, str]:
    """How a per-image tensor of ``row_shape`` is drawn, without its values: ``(maps, height, width, layout)``.

    Layouts: ``channels`` ([C, H, W]), ``tokens`` and ``tokens+cls`` ([T, D]
    folded to a square), ``tokens+prefix`` ([T, D] whose first
    ``prefix_tokens`` tokens, a class token and register tokens as the model
    says, are left out before the rest folds to a square), ``matrix`` ([T, D] drawn as it is), the strips
    ``vector`` ([D]) and ``pooled`` ([C, 1, 1]), whose maps are single values,
    and the :data:`CLIPS` of a video model, ``[C, T, H, W]``: ``frames``, each
    map T frames of ``height × width``, and ``pooled-frames`` ([C, T, 1, 1]),
    a channels × frames table of single values. A clip of one frame is drawn
    as that frame, ``[C, H, W]``. Raises :class:`NotDrawable` for shapes
    without a picture (no axes, more than four, or no values at all).

    >>> map_layout([8, 4, 6, 6]), map_layout([8, 4, 1, 1]), map_layout([8, 1, 6, 6])
    ((8, 6, 6, 'frames'), (8, 1, 1, 'pooled-frames'), (8, 6, 6, 'channels'))
    """
    shape = [int(n) for n in row_shape]
    if math.prod(shape) == 0 and shape:
        raise NotDrawable("it holds no values")
    if len(shape) == 3:
        if shape[1] == shape[2] == 1:
            return shape[0], 1, 1, "pooled"
        return shape[0], shape[1], shape[2], "channels"
    if len(shape) == 2:
        tokens, dim = shape
        # The model's own count of prefix tokens first; without one (or where it does not fit), none or a class token.
        for skip in (*([prefix_tokens] if prefix_tokens is not None else []), 0, 1):
            if is_square(tokens - skip):
                side = math.isqrt(tokens - skip)
                return dim, side, side, {0: "tokens", 1: "tokens+cls"}.get(skip, "tokens+prefix")
        if tokens == 1:
            return dim, 1, 1, "vector"
        return 1, tokens, dim, "matrix"
    if len(shape) == 1:
        return shape[0], 1, 1, "vector"
    if len(shape) == 4:
        channels, frames, height, width = shape
        if frames == 1:
            return map_layout([channels, height, width])
        return channels, height, width, "pooled-frames" if height == width == 1 else "frames"
    raise NotDrawable(f"{len(shape)} dimensions per image")


#: Layouts drawn as one strip of single values rather than tiles.
STRIPS = ("vector", "pooled")


#: Layouts of video clips, drawn by :func:`tile_frames`: their maps are ``[T, H, W]``.
CLIPS = ("frames", "pooled-frames")


def as_maps(array: np.ndarray, prefix_tokens: int | None = None) -> tuple[np.ndarray, str]:
    """One image's tensor as ``(maps [K, H, W], layout)``, float32 (float64 kept); raises :class:`NotDrawable`.

    The maps of :data:`CLIPS` are clips: ``[K, T, H, W]``. ``prefix_tokens``: see :func:`map_layout`.
    """
    array = np.asarray(array)
    array = array.astype(np.float64 if array.dtype == np.float64 else np.float32, copy=False)
    count, height, width, layout = map_layout(array.shape, prefix_tokens)
    if layout in ("tokens", "tokens+cls", "tokens+prefix"):
        skipped = array.shape[0] - height * width
        return np.ascontiguousarray(array[skipped:].T).reshape(count, height, width), layout
    if layout in CLIPS:
        return array, layout
    return array.reshape(count, height, width), layout


def tiles_that_fit(height: int, width: int, *, padding: int, layout: str = "channels") -> int:
    """How many ``height × width`` maps one picture may hold: at most :data:`MAX_TILES` within
    :data:`MAX_PIXELS`, or :data:`MAX_STRIP_VALUES` values for a strip layout."""
    if layout in STRIPS:
        return MAX_STRIP_VALUES
    return min(MAX_TILES, MAX_PIXELS // ((height + padding) * (width + padding)))


def value_range(maps: np.ndarray) -> tuple[float, float] | None:
    """The lowest and highest finite values, or None when there is none."""
    finite = maps[np.isfinite(maps)]
    return (float(finite.min()), float(finite.max())) if finite.size else None


def scale_maps(maps: np.ndarray, scale: str = "channel") -> np.ndarray:
    """Values to [0, 1]: ``"channel"`` scales each map alone, ``"grid"`` uses one range for all maps.

    ``maps`` are ``[K, H, W]``, or ``[K, T, H, W]`` clips, each scaled over all its frames.
    """
    check_choice("scale", scale, ("channel", "grid"))
    maps = maps.astype(np.float64 if maps.dtype == np.float64 else np.float32, copy=True)
    finite = np.isfinite(maps)
    filled_low = np.where(finite, maps, np.inf)
    filled_high = np.where(finite, maps, -np.inf)
    axes = tuple(range(1, maps.ndim)) if scale == "channel" else None
    low = filled_low.min(axis=axes, keepdims=True)
    high = filled_high.max(axis=axes, keepdims=True)
    empty = ~np.isfinite(low)  # maps with no finite value at all
    low, high = np.where(empty, 0.0, low), np.where(empty, 1.0, high)
    span = high - low
    with np.errstate(invalid="ignore", over="ignore"):
        scaled = np.where(span > 0, (maps - low) / np.where(span > 0, span, 1.0), 0.0)
    scaled = np.where(np.isposinf(maps), 1.0, np.where(np.isneginf(maps), 0.0, scaled))
    return np.clip(scaled, 0.0, 1.0, out=scaled, where=~np.isnan(scaled))


def check_cmap(name: str) -> str:
    """Return ``name`` if matplotlib knows the colormap, else raise naming the closest ones."""
    _lut(name)
    return name


@functools.lru_cache(maxsize=16)
def _lut(name: str) -> np.ndarray:
    # matplotlib (about 0.15 s) loads when a picture is first coloured: extract, grad and cam runs import the
    # pictures but draw only with --grid or cam's overlays.
    from matplotlib import colormaps

    if name not in colormaps:
        closest = difflib.get_close_matches(name, list(colormaps), n=3, cutoff=0.0)
        raise UsageProblem(
            f"unknown colormap '{name}' (closest: {', '.join(closest)})",
            hint="any matplotlib colormap works, e.g. viridis, gray, magma, jet",
        )
    table = colormaps[name](np.linspace(0.0, 1.0, 256))[:, :3]
    return np.round(table * 255).astype(np.uint8)


def colorize(values: np.ndarray, cmap: str) -> np.ndarray:
    """[0, 1] values (NaN allowed) → uint8 RGB with one more trailing axis."""
    nan = np.isnan(values)
    index = np.round(np.where(nan, 0.0, values) * 255).astype(np.uint8)
    rgb = _lut(cmap)[index]
    rgb[nan] = NAN_COLOR
    return rgb


@functools.lru_cache(maxsize=256)
def grid_columns(count: int, tile_height: int, tile_width: int) -> int:
    """Tiles per row for ``count`` tiles: the fewest blank places whose picture is about as wide as tall or wider.

    Shapes from a little taller than wide (3:4) to three times as wide as tall
    are considered; among them the fewest blanks win, then the one closest to
    3:2. 128 tiles give 16 × 8 rather than 12 × 11 with four blanks.
    """
    best: tuple[tuple[bool, int, float], int] = ((True, count + 1, math.inf), 1)  # any real key is smaller
    for columns in range(1, count + 1):
        rows = math.ceil(count / columns)
        if columns > 1 and math.ceil(count / (columns - 1)) == rows:
            continue  # the same rows with fewer columns leave fewer blanks
        aspect = (columns * tile_width) / (rows * tile_height)
        key = (not 0.75 <= aspect <= 3.0, rows * columns - count, abs(math.log(aspect / 1.5)))
        if key < best[0]:
            best = (key, columns)
    return best[1]


@dataclass(frozen=True)
class TileLayout:
    """How :func:`tile_maps` lays tiles out: ``columns`` × ``rows``, each map enlarged ``factor`` times, with a
    label band ``band`` pixels high (0: no labels, or they do not fit)."""

    columns: int
    rows: int
    factor: int
    band: int


def tile_layout(
    count: int,
    height: int,
    width: int,
    *,
    columns: int | None = None,
    padding: int = 2,
    min_tile: int = 32,
    labels: Sequence[int] | None = None,
    min_width: int = 0,
) -> TileLayout:
    """Pick the layout of :func:`tile_maps` (same arguments); raises :class:`NotDrawable` past :data:`MAX_PIXELS`."""
    factor = max(1, math.ceil(min_tile / max(height, width)))
    columns = max(1, min(columns or grid_columns(count, height * factor, width * factor), count))
    rows = math.ceil(count / columns)
    if min_width:
        factor = max(factor, math.ceil((min_width / columns - padding) / width))

    def band(f: int) -> int:
        return label_band(labels, width * f) if labels is not None else 0

    def pixels(f: int) -> int:
        return (rows * (height * f + band(f) + padding) + padding) * (columns * (width * f + padding) + padding)

    if pixels(1) > MAX_PIXELS:
        raise NotDrawable(f"{count} maps of {height}x{width} need more than {MAX_PIXELS:,} pixels")
    while factor > 1 and pixels(factor) > MAX_PIXELS:
        factor -= 1
    return TileLayout(columns, rows, factor, band(factor))


def tile_maps(
    scaled: np.ndarray,
    *,
    columns: int | None = None,
    padding: int = 2,
    cmap: str = "viridis",
    min_tile: int = 32,
    labels: Sequence[int] | None = None,
    min_width: int = 0,
    layout: TileLayout | None = None,
) -> np.ndarray:
    """Colour ``[K, H, W]`` maps scaled to [0, 1] and tile them ``columns`` wide (default: :func:`grid_columns`).

    Tiles smaller than ``min_tile`` are enlarged by a whole factor, nearest
    neighbour, keeping their aspect ratio, and further while the picture is
    narrower than ``min_width``. ``labels`` (one number per map) are written
    in a band above each tile when they fit its width. The enlargement stops
    short of :data:`MAX_PIXELS`; more tiles than fit unenlarged raise :class:`NotDrawable`. ``layout``: what
    :func:`tile_layout` gave for the same arguments, when the caller has it already.
    """
    count, height, width = scaled.shape
    layout = layout or tile_layout(
        count, height, width, columns=columns, padding=padding, min_tile=min_tile, labels=labels, min_width=min_width
    )
    columns, rows, factor, band = layout.columns, layout.rows, layout.factor, layout.band
    rgb = colorize(scaled, cmap)
    if factor > 1:
        rgb = rgb.repeat(factor, axis=1).repeat(factor, axis=2)
    tile_h, tile_w = height * factor + band, width * factor
    if band:
        size = label_size(tile_w)
        heads = np.full((count, band, tile_w, 3), PAD_COLOR, dtype=np.uint8)
        for head, label in zip(heads, labels or ()):  # a band is made for labels only
            stamp(head, str(label), size, 1, 1)
        rgb = np.concatenate([heads, rgb], axis=1)
    blank = np.full((rows * columns - count, tile_h, tile_w, 3), PAD_COLOR, dtype=np.uint8)
    tiles = np.concatenate([rgb, blank]) if len(blank) else rgb
    tiles = np.pad(tiles, ((0, 0), (0, padding), (0, padding), (0, 0)), constant_values=PAD_COLOR)
    grid = tiles.reshape(rows, columns, tile_h + padding, tile_w + padding, 3).swapaxes(1, 2)
    grid = grid.reshape(rows * (tile_h + padding), columns * (tile_w + padding), 3)
    return np.pad(grid, ((padding, 0), (padding, 0), (0, 0)), constant_values=PAD_COLOR)


@dataclass(frozen=True)
class FrameLayout:
    """How :func:`tile_frames` lays clips out: each frame enlarged ``factor`` times, a ``header`` band of frame
    numbers over the columns and a ``margin`` of channel numbers left of the rows (0: none, or they do not fit)."""

    factor: int
    header: int
    margin: int


def frame_layout(
    count: int,
    frames: int,
    height: int,
    width: int,
    *,
    padding: int = 2,
    min_tile: int = 32,
    labels: Sequence[int] | None = None,
    min_width: int = 0,
) -> FrameLayout:
    """Pick the layout of :func:`tile_frames` (same arguments); raises :class:`NotDrawable` past :data:`MAX_PIXELS`."""
    factor = math.ceil(min_tile / max(height, width))
    if min_width:
        # Enlarged until min_width wide or twice that tall: a table of many channels is not made taller still.
        by_width = math.ceil(((min_width - padding) / frames - padding) / width)
        by_height = math.ceil(((2 * min_width - padding) / count - padding) / height)
        factor = max(factor, min(by_width, by_height))
    factor = tile_layout(
        count * frames, height, width, columns=frames, padding=padding, min_tile=factor * max(height, width)
    ).factor
    if not labels:
        return FrameLayout(factor, 0, 0)
    size = label_size(width * factor)
    glyph_h = glyphs(size)[1]
    header = glyph_h + 2 if text_width(str(frames - 1), size) + 2 <= width * factor else 0
    longest = max((str(n) for n in labels), key=len)
    margin = text_width(longest, size) + 4 if glyph_h + 1 <= height * factor + padding else 0
    return FrameLayout(factor, header, margin)


def tile_frames(
    scaled: np.ndarray,
    *,
    padding: int = 2,
    cmap: str = "viridis",
    min_tile: int = 32,
    labels: Sequence[int] | None = None,
    min_width: int = 0,
    layout: FrameLayout | None = None,
) -> np.ndarray:
    """Colour ``[K, T, H, W]`` clips scaled to [0, 1] as a table: a row of T tiles per clip, a column per frame.

    Frames are enlarged as :func:`tile_maps` enlarges tiles (to ``min_tile``),
    and further while the picture is narrower than ``min_width`` and shorter
    than twice that. ``labels`` (one number per clip, its channel) are written
    left of each row and the frame numbers 0 to T-1 above the columns, each
    when it fits (None: neither). ``layout``: what :func:`frame_layout` gave
    for the same arguments, when the caller has it already. Without labels
    the picture is :func:`tile_maps` of the ``K·T`` frames, T a row.
    """
    count, frames, height, width = scaled.shape
    layout = layout or frame_layout(
        count, frames, height, width, padding=padding, min_tile=min_tile, labels=labels, min_width=min_width
    )
    grid = tile_maps(
        scaled.reshape(count * frames, height, width),
        padding=padding,
        cmap=cmap,
        layout=TileLayout(frames, count, layout.factor, 0),
    )
    if not layout.header and not layout.margin:
        return grid
    canvas = np.full((layout.header + grid.shape[0], layout.margin + grid.shape[1], 3), PAD_COLOR, dtype=np.uint8)
    canvas[layout.header :, layout.margin :] = grid
    size = label_size(width * layout.factor)
    step_y, step_x = height * layout.factor + padding, width * layout.factor + padding
    for frame in range(frames if layout.header else 0):
        stamp(canvas, str(frame), size, 1, layout.margin + padding + frame * step_x + 1)
    for row, label in enumerate(labels if labels and layout.margin else ()):
        stamp(canvas, str(label), size, layout.header + padding + row * step_y + 1, 2)
    return canvas


def strip(scaled: np.ndarray, labels: Sequence[int] | None, *, cmap: str = "viridis", width: int = 768) -> np.ndarray:
    """Colour single values scaled to [0, 1] as one strip of cells (lines of at most 1,024 cells for long vectors).

    Each cell is at least one pixel wide and the strip about ``width`` pixels; ``labels`` (each cell's index) are
    written under every cell when they fit, else under evenly spaced cells, with a tick at each (None: no labels).
    """
    values = np.asarray(scaled).reshape(-1)
    count = len(values)
    per_line = min(count, _STRIP_LINE)
    lines = math.ceil(count / per_line)
    cell = max(1, width // per_line)
    size = 11
    names = [str(n) for n in labels] if labels else []
    label_w = text_width(max(names, key=len), size) if names else 0
    every = 1 if cell >= label_w + 4 else tick_step(math.ceil((label_w + 8) / cell))
    line_h = 28 if lines == 1 else 14
    row_h = line_h + (4 + glyphs(size)[1] + 4 if labels else 2)
    canvas = np.full(
        (lines * row_h + 2, per_line * cell + 2 + (label_w + 2 if labels else 0), 3), PAD_COLOR, dtype=np.uint8
    )
    rgb = colorize(values, cmap)
    for line in range(lines):
        part = rgb[line * per_line : (line + 1) * per_line]
        top = line * row_h + 1
        canvas[top : top + line_h, 1 : 1 + len(part) * cell] = part.repeat(cell, axis=0)[None]
        for i in range(0, len(part) if names else 0, every):
            x = 1 + i * cell
            canvas[top + line_h : top + line_h + 3, x] = 0
            stamp(canvas, names[line * per_line + i], size, top + line_h + 3, x)
    return canvas


_STRIP_LINE = 1024


#: A strip holds at most this many values (256 lines of 1,024).
MAX_STRIP_VALUES = 256 * _STRIP_LINE


def overlay(photo: np.ndarray, heat: np.ndarray, *, cmap: str = "inferno", alpha: float = 0.5) -> np.ndarray:
    """Blend a 2-D ``heat`` map, scaled to [0, 1] and upsampled bilinearly, over a ``uint8 [H, W, 3]`` photo.

    A map without any spread (all zero, say) has nothing to show: the photo
    comes back as it is.
    """
    heat = np.asarray(heat, dtype=np.float32)
    span = value_range(heat)
    if span is None or span[0] == span[1]:
        return np.array(photo, dtype=np.uint8)
    scaled = scale_maps(heat[None], "channel")[0]
    height, width = photo.shape[:2]
    heat_image = Image.fromarray(np.nan_to_num(scaled).astype(np.float32), mode="F")
    upsampled = np.asarray(heat_image.resize((width, height), Image.Resampling.BILINEAR))
    colours = colorize(np.clip(upsampled, 0.0, 1.0), cmap).astype(np.float32)
    return np.round((1.0 - alpha) * photo.astype(np.float32) + alpha * colours).astype(np.uint8)


def add_title(pixels: np.ndarray, parts: Sequence[str]) -> np.ndarray:
    """Put a white caption strip above the picture: ``parts`` joined by `` · ``, wrapped to its width.

    The type grows with the picture (12 to 28 pixels), so it reads the same
    when the picture is shown to fit a screen.
    """
    width = pixels.shape[1]
    font = caption_font(width)
    lines = wrapped(font, parts, width, " · ")
    line_h = font.getbbox("Ag")[3] + 4
    width = max(width, *(int(font.getlength(line)) + 8 for line in lines))
    strip = Image.new("RGB", (width, line_h * len(lines) + 6), (255, 255, 255))
    draw = ImageDraw.Draw(strip)
    for i, line in enumerate(lines):
        draw.text((4, 4 + i * line_h), line, fill=(0, 0, 0), font=font)
    return stacked(np.asarray(strip), pixels)


#: The most characters either end of a colour bar shows (a number, or a word).
_MOST_END = 24


def add_colorbar(pixels: np.ndarray, cmap: str, low: str, high: str, text: str = "") -> np.ndarray:
    """Put a colour bar under the picture: ``low`` at its left end, ``high`` at its right, ``text`` after it, or
    under it, wrapped, when it does not fit beside it (a narrow picture: a video clip of two frames)."""
    width = pixels.shape[1]
    font = caption_font(width)
    low, high, text = shortened(low, _MOST_END), shortened(high, _MOST_END), shortened(text)
    line_h = font.getbbox("Ag")[3]
    bar_w = max(64, min(256, width // 3))
    left = 6 + round(font.getlength(low)) + 6
    right = left + bar_w + 6 + round(font.getlength(high))
    strip_w = max(width, right + 6)
    beside = not text or right + 12 + font.getlength(text) + 4 <= strip_w
    lines = [] if beside else wrapped(font, text.split(), strip_w - 4, " ")  # 6 pixels either side
    strip_w = max([strip_w, *(round(font.getlength(line)) + 12 for line in lines)])
    strip = Image.new("RGB", (strip_w, line_h + 12 + len(lines) * (line_h + 4)), (255, 255, 255))
    bar = colorize(np.linspace(0.0, 1.0, bar_w)[None].repeat(line_h, axis=0), cmap)
    strip.paste(Image.fromarray(bar), (left, 6))
    draw = ImageDraw.Draw(strip)
    draw.text((6, 6), low, fill=(0, 0, 0), font=font)
    draw.text((left + bar_w + 6, 6), high, fill=(0, 0, 0), font=font)
    if beside and text:
        draw.text((right + 12, 6), text, fill=(60, 60, 60), font=font)
    for number, line in enumerate(lines):
        draw.text((6, 6 + (number + 1) * (line_h + 4)), line, fill=(60, 60, 60), font=font)
    return stacked(pixels, np.asarray(strip))


def stacked(upper: np.ndarray, lower: np.ndarray) -> np.ndarray:
    """Two pictures one above the other, the narrower padded white on its right."""
    width = max(upper.shape[1], lower.shape[1])
    out = np.full((upper.shape[0] + lower.shape[0], width, 3), 255, dtype=np.uint8)
    out[: upper.shape[0], : upper.shape[1]] = upper
    out[upper.shape[0] :, : lower.shape[1]] = lower
    return out
