"""Turn one image's features into a picture.

Everything here works on numpy arrays and returns ``uint8 [H, W, 3]`` pixels;
colours come from matplotlib's colormaps, sampled once into a 256-entry table.

- :func:`as_maps` reads a per-image tensor as a stack of 2-D maps: ``[C, H, W]``
  channels; ``[T, D]`` ViT tokens folded back to a square (with or without a
  leading class token) or, when T is not square, shown as one ``T×D`` matrix;
  ``[D]`` a vector, drawn as one strip.
- :func:`scale_maps` maps values to [0, 1] per map or over the whole grid,
  using finite values only: NaN stays NaN (drawn in :data:`NAN_COLOR`), ±inf
  clips to the ends, a constant map is 0 rather than a division by zero.
- :func:`tile_maps` colours and tiles the maps, upscaling small ones
  (nearest neighbour) so every tile is at least ``min_tile`` pixels.
- :func:`overlay` blends a heat map over a photo; :func:`add_title` adds a caption strip.

>>> import numpy as np
>>> maps, layout = as_maps(np.zeros((197, 768), dtype=np.float32))
>>> maps.shape, layout
((768, 14, 14), 'tokens+cls')
>>> tile_maps(scale_maps(maps[:4], "channel"), columns=2, padding=1, cmap="gray", min_tile=14).shape
(31, 31, 3)
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import numpy as np

from hookcli.errors import UsageProblem

__all__ = [
    "MAX_PIXELS", "MAX_TILES", "NAN_COLOR", "NotDrawable", "add_title", "as_maps", "check_cmap", "map_layout",
    "overlay", "scale_maps", "tile_maps", "tiles_that_fit",
]

NAN_COLOR = (255, 0, 255)
PAD_COLOR = 255
#: What one picture may cost: tiles, and pixels (25 megapixels is 75 MB of RGB).
MAX_TILES = 4096
MAX_PIXELS = 25_000_000


class NotDrawable(ValueError):
    """The tensor's per-image shape has no picture hookcli knows how to draw."""


def map_layout(row_shape: Sequence[int]) -> tuple[int, int, int, str]:
    """How a per-image tensor of ``row_shape`` is drawn, without its values: ``(maps, height, width, layout)``.

    Raises :class:`NotDrawable` for shapes without a picture (no axes, more
    than three, or no values at all).
    """
    shape = [int(n) for n in row_shape]
    if math.prod(shape) == 0 and shape:
        raise NotDrawable("it holds no values")
    if len(shape) == 3:
        return shape[0], shape[1], shape[2], "channels"
    if len(shape) == 2:
        tokens, dim = shape
        side = math.isqrt(tokens)
        if side * side == tokens:
            return dim, side, side, "tokens"
        side = math.isqrt(tokens - 1) if tokens > 1 else 0
        if side and side * side == tokens - 1:
            return dim, side, side, "tokens+cls"
        return 1, tokens, dim, "matrix"
    if len(shape) == 1:
        return 1, 1, shape[0], "vector"
    raise NotDrawable(f"{len(shape)} dimensions per image")


def as_maps(array: np.ndarray) -> tuple[np.ndarray, str]:
    """One image's tensor as ``(maps [K, H, W], layout)``, float32 (float64 kept); raises :class:`NotDrawable`."""
    array = np.asarray(array)
    array = array.astype(np.float64 if array.dtype == np.float64 else np.float32, copy=False)
    count, height, width, layout = map_layout(array.shape)
    if layout == "tokens":
        return np.ascontiguousarray(array.T).reshape(count, height, width), layout
    if layout == "tokens+cls":
        return np.ascontiguousarray(array[1:].T).reshape(count, height, width), layout
    return array.reshape(count, height, width), layout


def tiles_that_fit(height: int, width: int, *, padding: int) -> int:
    """How many ``height × width`` maps one picture may hold: at most :data:`MAX_TILES`, within :data:`MAX_PIXELS`."""
    return min(MAX_TILES, MAX_PIXELS // ((height + padding) * (width + padding)))


def scale_maps(maps: np.ndarray, scale: str = "channel") -> np.ndarray:
    """Values to [0, 1]: ``"channel"`` scales each map alone, ``"grid"`` uses one range for all maps."""
    if scale not in ("channel", "grid"):
        raise UsageProblem(f"scale must be 'channel' or 'grid', not '{scale}'")
    maps = maps.astype(np.float64 if maps.dtype == np.float64 else np.float32, copy=True)
    finite = np.isfinite(maps)
    filled_low = np.where(finite, maps, np.inf)
    filled_high = np.where(finite, maps, -np.inf)
    axes = (1, 2) if scale == "channel" else None
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
    from matplotlib import colormaps

    if name not in colormaps:
        import difflib

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


def tile_maps(
    scaled: np.ndarray, *, columns: int | None = None, padding: int = 2, cmap: str = "viridis", min_tile: int = 32,
    stretch_rows_only: bool = False,
) -> np.ndarray:
    """Colour ``[K, H, W]`` maps scaled to [0, 1] and tile them ``columns`` wide (default: about square).

    Tiles smaller than ``min_tile`` are enlarged by a whole factor, nearest
    neighbour, keeping their aspect ratio; ``stretch_rows_only`` enlarges only
    the height (for one-row vector strips). The enlargement stops short of
    :data:`MAX_PIXELS`; more tiles than fit unenlarged raise :class:`NotDrawable`.
    """
    count, height, width = scaled.shape
    columns = max(1, min(columns or math.ceil(math.sqrt(count)), count))
    rows = math.ceil(count / columns)
    if stretch_rows_only:
        fy, fx = max(1, math.ceil(min_tile / height)), 1
    else:
        fy = fx = max(1, math.ceil(min_tile / max(height, width)))

    def pixels(fy: int, fx: int) -> int:
        return (rows * (height * fy + padding) + padding) * (columns * (width * fx + padding) + padding)

    if pixels(1, 1) > MAX_PIXELS:
        raise NotDrawable(f"{count} maps of {height}x{width} need more than {MAX_PIXELS:,} pixels")
    while pixels(fy, fx) > MAX_PIXELS:
        fy, fx = max(1, fy - 1), max(1, fx - 1)
    rgb = colorize(scaled, cmap)
    if fy > 1 or fx > 1:
        rgb = rgb.repeat(fy, axis=1).repeat(fx, axis=2)
    tile_h, tile_w = height * fy, width * fx
    blank = np.full((rows * columns - count, tile_h, tile_w, 3), PAD_COLOR, dtype=np.uint8)
    tiles = np.concatenate([rgb, blank]) if len(blank) else rgb
    tiles = np.pad(tiles, ((0, 0), (0, padding), (0, padding), (0, 0)), constant_values=PAD_COLOR)
    grid = tiles.reshape(rows, columns, tile_h + padding, tile_w + padding, 3).swapaxes(1, 2)
    grid = grid.reshape(rows * (tile_h + padding), columns * (tile_w + padding), 3)
    return np.pad(grid, ((padding, 0), (padding, 0), (0, 0)), constant_values=PAD_COLOR)


def overlay(photo: np.ndarray, heat: np.ndarray, *, cmap: str = "inferno", alpha: float = 0.5) -> np.ndarray:
    """Blend a 2-D ``heat`` map, scaled to [0, 1] and upsampled bilinearly, over a ``uint8 [H, W, 3]`` photo."""
    from PIL import Image

    scaled = scale_maps(np.asarray(heat, dtype=np.float32)[None], "channel")[0]
    height, width = photo.shape[:2]
    upsampled = np.asarray(Image.fromarray(np.nan_to_num(scaled).astype(np.float32), mode="F").resize((width, height), Image.BILINEAR))
    colours = colorize(np.clip(upsampled, 0.0, 1.0), cmap).astype(np.float32)
    return np.round((1.0 - alpha) * photo.astype(np.float32) + alpha * colours).astype(np.uint8)


def add_title(pixels: np.ndarray, parts: Sequence[str]) -> np.ndarray:
    """Put a white caption strip above the picture: ``parts`` joined by `` · ``, wrapped to its width."""
    from PIL import Image, ImageDraw, ImageFont

    font = ImageFont.load_default(size=13)
    width = pixels.shape[1]
    lines: list[str] = []
    for part in parts:
        joined = f"{lines[-1]} · {part}" if lines else part
        if lines and font.getlength(joined) + 8 <= width:
            lines[-1] = joined
        else:
            lines.append(part)
    line_h = font.getbbox("Ag")[3] + 4
    width = max(width, *(int(font.getlength(line)) + 8 for line in lines))
    strip_h = line_h * len(lines) + 6
    canvas = Image.new("RGB", (width, pixels.shape[0] + strip_h), (255, 255, 255))
    canvas.paste(Image.fromarray(pixels), (0, strip_h))
    draw = ImageDraw.Draw(canvas)
    for i, line in enumerate(lines):
        draw.text((4, 4 + i * line_h), line, fill=(0, 0, 0), font=font)
    return np.asarray(canvas)
