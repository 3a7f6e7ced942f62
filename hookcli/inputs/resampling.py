"""Pillow's resize of 8-bit images, value for value, on uint8 tensors of any device (``--decode device``).

Pillow resizes with a filter in two passes, across and then down (down first for some shapes, which depend on its
version: :func:`_down_first`): each output value is a sum of input values times weights in 22-bit fixed point,
rounded and clipped to 8 bits (its ``Resample.c``); nearest neighbour copies the pixels its own table of positions
names. :func:`resized_window` makes the same sums as matrix products on the images' device, a tile of outputs and
the band of inputs they read at a time. Each weight is cut into pieces of a few bits, so that every product and
every partial sum is an integer below 2**24, which float32 holds exactly whatever precision the device's matrix
products use (TF32 and bfloat16 both keep 8 bits of an input); the pieces' sums are joined in integers as Pillow's
sums are. Images decoded to the same pixels therefore resize to the bytes the CPU path's Pillow gives, on a GPU as
on the CPU (checked against Pillow 10.1, 12.1, 12.2 and 13.0).

>>> import torch
>>> image = torch.arange(60, dtype=torch.uint8).reshape(1, 6, 10)
>>> resized_window(image, (3, 5), (0, 0, 3, 5), "bilinear").tolist()
[[[8, 10, 12, 14, 15], [26, 28, 30, 32, 33], [44, 46, 48, 50, 51]]]
>>> np.asarray(Image.fromarray(image[0].numpy()).resize((5, 3), Image.Resampling.BILINEAR)).tolist()
[[8, 10, 12, 14, 15], [26, 28, 30, 32, 33], [44, 46, 48, 50, 51]]
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import numpy as np
import PIL
import torch
from PIL import Image

__all__ = ["RESAMPLED", "resized_window"]

#: The interpolations :func:`resized_window` makes as Pillow does.
RESAMPLED = ("nearest", "bilinear", "bicubic")

_PRECISION = 22  # Pillow's fixed point for 8-bit images: 32 bits less 8 for the value and 2 for overflow
_SUPPORT = {"bilinear": 1.0, "bicubic": 2.0}
_TILE = 32  # outputs one matrix product makes: it reads about this many times the scale of inputs
_EXACT = 1 << 24  # float32 holds every integer up to this
_AT_ONCE = 1 << 25  # values gathered, or sums made, at once: a pass's memory is bounded by this, whatever the image
_PILLOW = tuple(int(part) for part in PIL.__version__.split(".")[:2])


def resized_window(
    images: torch.Tensor, size: tuple[int, int], window: tuple[int, int, int, int], interpolation: str
) -> torch.Tensor:
    """``images`` (uint8 ``[..., C, H, W]``) resized to ``size`` ``(height, width)`` as Pillow's ``Image.resize``
    resizes, and of that only ``window`` ``(top, left, height, width)``, which lies inside it."""
    (height, width), (top, left, rows, columns) = images.shape[-2:], window
    if not (0 <= top and top + rows <= size[0] and 0 <= left and left + columns <= size[1]):
        raise ValueError(f"the window {window} is not inside the resized size {size}")
    device = str(images.device)
    if interpolation == "nearest":
        down = _nearest_on(device, height, size[0], top, top + rows)
        return images.index_select(-2, down).index_select(-1, _nearest_on(device, width, size[1], left, left + columns))
    if interpolation not in _SUPPORT:
        raise ValueError(f"interpolation {interpolation!r} is not one of {', '.join(RESAMPLED)}")
    if size[1] != width and _down_first(height, width, size):
        turned = (images.transpose(-1, -2), (size[1], size[0]), (left, top, columns, rows))
        return _across_then_down(*turned, interpolation).transpose(-1, -2).contiguous()
    return _across_then_down(images, size, window, interpolation)


def _down_first(height: int, width: int, size: tuple[int, int]) -> bool:
    """Whether the Pillow installed resizes an image of ``height`` and ``width`` to ``size`` down first: from
    version 13, where the height shrinks by more than twice the pixels the width does; in 12.2, where the image is
    more than 100 times as tall as it is wide and its height shrinks; before, never."""
    if _PILLOW >= (13, 0):
        return size[0] < height and height - size[0] > 2 * (width - size[1])
    return _PILLOW >= (12, 2) and height > width * 100 and size[0] < height


def _across_then_down(images: torch.Tensor, size: tuple[int, int], window: tuple, interpolation: str) -> torch.Tensor:
    """:func:`resized_window` by a pass across, then one down; Pillow leaves out the pass of a side that keeps its
    size, and the other pass reads those values as they are."""
    (height, width), (top, left, rows, columns) = images.shape[-2:], window
    down = None if size[0] == height else (height, size[0], top, top + rows, interpolation)
    if down is None:
        images = images[..., top : top + rows, :]
    else:
        first, end = _plan(*down).reads
        images = images[..., first:end, :]  # the rows the outputs read, resized across
    if size[1] == width:
        images = images[..., left : left + columns]
    else:
        images = _resampled(images, (width, size[1], left, left + columns, interpolation))
    if down is None:
        return images
    return _resampled(images.transpose(-1, -2), down, shift=first).transpose(-1, -2).contiguous()


class _Plan(NamedTuple):
    """One pass's sums: output ``o`` of tile ``t`` is the sum over ``b`` of input ``read[t, b]`` times
    ``weights[t, b, o]``, each weight in ``pieces`` of ``bits`` (none, in float64, where ``bits`` is 0);
    ``reads`` bounds the inputs any output reads."""

    read: np.ndarray  # [tiles, band] int64
    weights: np.ndarray  # [tiles, band, pieces * _TILE]
    pieces: int
    bits: int
    outputs: int
    reads: tuple[int, int]


def _resampled(images: torch.Tensor, key: tuple, shift: int = 0) -> torch.Tensor:
    """``images`` (uint8 ``[..., W]``) resampled along the last dimension by the pass :func:`_plan` makes of ``key``,
    its inputs counted from ``shift``: uint8 ``[..., outputs]``."""
    plan = _plan(*key)
    index, weights = _plan_on(str(images.device), key)
    if shift:
        index = index - shift
    lead, tiles = images.shape[:-1], index.shape[0]
    lines = images.reshape(-1, images.shape[-1])
    made = torch.empty(lines.shape[0], tiles * _TILE, dtype=torch.uint8, device=images.device)
    step = max(1, _AT_ONCE // (tiles * max(index.shape[1], plan.pieces * _TILE)))  # inputs read, sums made
    for start in range(0, lines.shape[0], step):
        band = lines[start : start + step][:, index].transpose(0, 1).to(weights.dtype)  # [tiles, lines, band]
        sums = torch.matmul(band, weights).view(tiles, band.shape[1], plan.pieces, _TILE)
        if plan.bits == 0:
            total = sums[:, :, 0].to(torch.int64)
        else:
            total = sums[:, :, -1].to(torch.int32)
            for piece in range(plan.pieces - 2, -1, -1):
                total = torch.bitwise_left_shift(total, plan.bits).add_(sums[:, :, piece].to(torch.int32))
        total = torch.bitwise_right_shift(total.add_(1 << (_PRECISION - 1)), _PRECISION).clamp_(0, 255)
        made[start : start + step] = total.to(torch.uint8).transpose(0, 1).reshape(-1, tiles * _TILE)
    return made[:, : plan.outputs].reshape(*lead, plan.outputs)


#: The passes kept planned: a batch of 256 photos each of its own size makes 512 (a pass is about 150 KB for
#: resnet50's 232 and 224, so about 75 MB kept on the host and as much on the device).
_PLANS_KEPT = 512


@functools.lru_cache(maxsize=_PLANS_KEPT)
def _plan_on(device: str, key: tuple) -> tuple[torch.Tensor, torch.Tensor]:
    """The index and weights of :func:`_plan`'s pass of ``key``, on ``device`` (copied there once)."""
    plan = _plan(*key)
    return torch.from_numpy(plan.read).to(device), torch.from_numpy(plan.weights).to(device)


@functools.lru_cache(maxsize=64)
def _nearest_on(device: str, size: int, resized: int, first: int, end: int) -> torch.Tensor:
    """The inputs Pillow's nearest-neighbour resize of a side of ``size`` to ``resized`` copies to outputs
    ``[first, end)``, on ``device``: read from Pillow itself, which resizes a line of 32-bit pixels that hold their
    own positions."""
    line = Image.new("I", (size, 1))
    line.putdata(range(size))
    picked = np.asarray(line.resize((resized, 1), Image.Resampling.NEAREST), dtype=np.int64)[0, first:end]
    return torch.from_numpy(picked.copy()).to(device)


@functools.lru_cache(maxsize=_PLANS_KEPT)
def _plan(size: int, resized: int, first: int, end: int, interpolation: str) -> _Plan:
    """The pass that resizes a side of ``size`` to ``resized`` and keeps outputs ``[first, end)``: Pillow's weights
    (its ``precompute_coeffs`` and ``normalize_coeffs_8bpc``, in the same double arithmetic), laid out in tiles."""
    scale = size / resized
    filterscale = max(scale, 1.0)
    support, shrink = _SUPPORT[interpolation] * filterscale, 1.0 / filterscale
    taps = math.ceil(support) * 2 + 1
    center = (np.arange(first, end, dtype=np.float64) + 0.5) * scale
    low = np.maximum(np.trunc(center - support + 0.5).astype(np.int64), 0)
    count = np.minimum(np.trunc(center + support + 0.5).astype(np.int64), size) - low
    at = np.arange(taps)
    used = at[None, :] < count[:, None]
    weights = np.where(used, _filter(interpolation, ((at + low[:, None]) - center[:, None] + 0.5) * shrink), 0.0)
    total = np.zeros(len(center))
    for tap in range(taps):  # in Pillow's order, which a float sum depends on
        total = total + weights[:, tap]
    weights = weights / np.where(total == 0.0, 1.0, total)[:, None]
    scaled = weights * (1 << _PRECISION)
    fixed = np.where(scaled < 0, np.trunc(scaled - 0.5), np.trunc(scaled + 0.5)).astype(np.int64)
    return _tiled(fixed, low, count)


def _filter(interpolation: str, x: np.ndarray) -> np.ndarray:
    """Pillow's filters: the triangle, and the cubic of a = -0.5."""
    x = np.abs(x)
    if interpolation == "bilinear":
        return np.where(x < 1.0, 1.0 - x, 0.0)
    near = (1.5 * x - 2.5) * x * x + 1
    far = (((x - 5) * x + 8) * x - 4) * -0.5
    return np.where(x < 1.0, near, np.where(x < 2.0, far, 0.0))


def _tiled(fixed: np.ndarray, low: np.ndarray, count: np.ndarray) -> _Plan:
    """Weights ``fixed`` ``[outputs, taps]`` of ``count`` inputs from ``low`` on, as tiles of :data:`_TILE` outputs
    that each read one band of inputs, every weight cut into pieces whose sums float32 holds exactly."""
    outputs, taps = fixed.shape
    bits = 8  # an input of 8 bits times a piece of 8 is exact in bfloat16 products too
    signed = bool((fixed < 0).any())  # a negative weight's top piece may reach -2**bits
    while bits and 255 * ((1 << bits) - (0 if signed else 1)) * taps >= _EXACT:
        bits -= 1
    largest, pieces = int(np.abs(fixed).max(initial=0)), 1
    while bits and largest >> (bits * (pieces - 1)) > (1 << bits) - 1:
        pieces += 1
    tile, column = np.arange(outputs) // _TILE, np.arange(outputs) % _TILE
    first, end = int(low.min()), int((low + count).max())
    band = int((low + count - low[tile * _TILE]).max(initial=1))
    starts = np.minimum(low[::_TILE], end - band)  # a band never reads past the last input any output reads
    laid = np.zeros((len(starts), band, pieces * _TILE), dtype=np.float32 if bits else np.float64)
    output, tap = np.nonzero(np.arange(taps)[None, :] < count[:, None])  # every weight used, each in a place its own
    at, weight = low[output] + tap - starts[tile[output]], fixed[output, tap]
    for piece in range(pieces):
        part = weight
        if bits:  # the lower pieces unsigned, the top one with the sign
            part = weight >> (bits * piece) if piece == pieces - 1 else (weight >> (bits * piece)) & ((1 << bits) - 1)
        laid[tile[output], at, piece * _TILE + column[output]] = part
    index = starts[:, None] + np.arange(band)
    return _Plan(index, laid, pieces, bits, outputs, (first, end))
