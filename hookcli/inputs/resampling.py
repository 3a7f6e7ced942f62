"""Pillow's resize of 8-bit images, value for value, on uint8 tensors of any device (``--decode device``).

Pillow resizes with a filter in two passes, across and then down (down first for some shapes, which depend on its
version: :func:`_down_first`): each output value is a sum of input values times weights in 22-bit fixed point,
rounded and clipped to 8 bits (its ``Resample.c``); nearest neighbour copies the pixels its own table of positions
names. :func:`resized_window` makes the same sums on the images' device, in 32-bit integers as Pillow does (no
float arithmetic, so no precision setting of the device changes them): each output's inputs are gathered, multiplied
by its weights and added up, for many lines at once. Images decoded to the same pixels therefore resize to the bytes
the CPU path's Pillow gives, on a GPU as on the CPU (checked against Pillow 10.1, 12.1, 12.2 and 13.0).
:func:`resized_windows` resizes images of many sizes together: each keeps its own weights, and the batch is one
set of operations, not one set for each size.

>>> import torch
>>> image = torch.arange(60, dtype=torch.uint8).reshape(1, 6, 10)
>>> resized_window(image, (3, 5), (0, 0, 3, 5), "bilinear").tolist()
[[[8, 10, 12, 14, 15], [26, 28, 30, 32, 33], [44, 46, 48, 50, 51]]]
>>> np.asarray(Image.fromarray(image[0].numpy()).resize((5, 3), Image.Resampling.BILINEAR)).tolist()
[[8, 10, 12, 14, 15], [26, 28, 30, 32, 33], [44, 46, 48, 50, 51]]
"""

from __future__ import annotations

import collections
import functools
import math
import threading
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import PIL
import torch
from PIL import Image

__all__ = ["RESAMPLED", "resized_window", "resized_windows"]

#: The interpolations :func:`resized_window` makes as Pillow does.
RESAMPLED = ("nearest", "bilinear", "bicubic")

_PRECISION = 22  # Pillow's fixed point for 8-bit images: 32 bits less 8 for the value and 2 for overflow
_SUPPORT = {"bilinear": 1.0, "bicubic": 2.0}
_AT_ONCE = 1 << 25  # values gathered, or sums made, at once: a pass's memory is bounded by this, whatever the image
_AT_ONCE_ON_CPU = 1 << 20  # the CPU's caches make smaller slices faster: 2x at 1 << 20 for a photo's passes
_PILLOW = tuple(int(part) for part in PIL.__version__.split(".")[:2])


def resized_window(
    images: torch.Tensor, size: tuple[int, int], window: tuple[int, int, int, int], interpolation: str
) -> torch.Tensor:
    """``images`` (uint8 ``[..., C, H, W]``) resized to ``size`` ``(height, width)`` as Pillow's ``Image.resize``
    resizes, and of that only ``window`` ``(top, left, height, width)``, which lies inside it."""
    return resized_windows([images], [size], [window], interpolation)[0]


def resized_windows(
    images: Sequence[torch.Tensor],
    sizes: Sequence[tuple[int, int]],
    windows: Sequence[tuple[int, int, int, int]],
    interpolation: str,
) -> torch.Tensor:
    """Each of ``images`` (uint8 ``[..., H, W]``, one leading shape, each of its own size, on one device) resized and
    cut as :func:`resized_window` does with its own ``sizes`` and ``windows`` entries, stacked: ``[len(images), ...,
    height, width]``, the windows all of one height and width. Images of many sizes are resized together, padded
    into batches of like sizes: a few operations for a batch rather than a few for each image (on a GPU, kernel
    launches, which cost more than the sums)."""
    if interpolation not in RESAMPLED:
        raise ValueError(f"interpolation {interpolation!r} is not one of {', '.join(RESAMPLED)}")
    if not images:
        return torch.empty(0, dtype=torch.uint8)
    for size, (top, left, rows, columns) in zip(sizes, windows, strict=True):
        if not (0 <= top and top + rows <= size[0] and 0 <= left and left + columns <= size[1]):
            raise ValueError(f"the window {(top, left, rows, columns)} is not inside the resized size {size}")
    shape, lead = tuple(windows[0][2:]), images[0].shape[:-2]
    if any(tuple(window[2:]) != shape for window in windows) or any(image.shape[:-2] != lead for image in images):
        raise ValueError("the images resized together must share their leading shape and their windows' size")
    made = torch.empty(len(images), *lead, *shape, dtype=torch.uint8, device=images[0].device)
    resized = []
    for k, (image, size, (top, left, rows, columns)) in enumerate(zip(images, sizes, windows)):
        if tuple(image.shape[-2:]) == tuple(size):  # Pillow copies an image already of the size: the window is cut
            made[k] = image[..., top : top + rows, left : left + columns]
        elif interpolation == "nearest":
            down = _nearest_on(str(image.device), image.shape[-2], size[0], top, top + rows)
            across = _nearest_on(str(image.device), image.shape[-1], size[1], left, left + columns)
            made[k] = image.index_select(-2, down).index_select(-1, across)
        else:
            resized.append(k)
    flat = {k: images[k].reshape(-1, *images[k].shape[-2:]) for k in resized}
    for turned, members in _orders(flat, sizes).items():
        for group in _alike([flat[k].shape[-2:] for k in members], [_cost(flat[k], sizes[k], shape, interpolation)
                                                                     for k in members]):  # fmt: skip
            chosen = [members[k] for k in group]
            if turned:  # resized down first: the same passes on the transposed images
                passes = _both_passes(
                    [flat[k].transpose(-1, -2) for k in chosen],
                    [(sizes[k][1], sizes[k][0]) for k in chosen],
                    [(windows[k][1], windows[k][0], shape[1], shape[0]) for k in chosen],
                    interpolation,
                ).transpose(-1, -2)
            else:
                passes = _both_passes([flat[k] for k in chosen], [sizes[k] for k in chosen],
                                      [windows[k] for k in chosen], interpolation)  # fmt: skip
            made[chosen] = passes.reshape(len(chosen), *lead, *shape)
    return made


def _orders(images: dict[int, torch.Tensor], sizes: Sequence[tuple[int, int]]) -> dict[bool, list[int]]:
    """The images' positions by whether Pillow resizes them down first (:func:`_down_first`)."""
    orders: dict[bool, list[int]] = {}
    for k, image in images.items():
        height, width = image.shape[-2:]
        orders.setdefault(sizes[k][1] != width and _down_first(height, width, sizes[k]), []).append(k)
    return orders


def _cost(image: torch.Tensor, size: tuple[int, int], window: Sequence[int], interpolation: str) -> int:
    """The weights of an image's two passes: each output of the ``window`` (rows, columns) has as many as its
    filter's taps, which grow with the reduction."""
    taps = [math.ceil(_SUPPORT[interpolation] * max(side / new, 1.0)) * 2 + 1
            for side, new in zip(image.shape[-2:], size)]  # fmt: skip
    return window[0] * taps[0] + window[1] * taps[1]


#: Weights planned and laid out for one group of images at once: it bounds a group's plans (and the float64 values
#: of their making, about 8 times as many bytes), however many new sizes it holds and however they shrink.
_PLANNED_AT_ONCE = 1 << 21


def _alike(shapes: list, costs: list[int]) -> list[list[int]]:
    """Positions of ``shapes`` ``(height, width)`` in groups padded to their largest height and width together: by
    area, a group growing while its padded area stays within twice its images' own, and its weights (as many for
    each image as the most ``costs`` of one) within :data:`_PLANNED_AT_ONCE`."""
    order = sorted(range(len(shapes)), key=lambda k: (shapes[k][0] * shapes[k][1], tuple(shapes[k])))
    groups: list[list[int]] = []
    tallest = widest = area = most = 0
    for k in order:
        height, width = shapes[k]
        grown = (max(tallest, height), max(widest, width))
        count = len(groups[-1]) + 1 if groups else 1
        if (
            groups
            and count * grown[0] * grown[1] <= 2 * (area + height * width)
            and count * max(most, costs[k]) <= _PLANNED_AT_ONCE
        ):
            groups[-1].append(k)
            (tallest, widest), area, most = grown, area + height * width, max(most, costs[k])
        else:
            groups.append([k])
            tallest, widest, area, most = height, width, height * width, costs[k]
    return groups


def _down_first(height: int, width: int, size: tuple[int, int]) -> bool:
    """Whether the Pillow installed resizes an image of ``height`` and ``width`` to ``size`` down first: from
    version 13, where the height shrinks by more than twice the pixels the width does; in 12.2, where the image is
    more than 100 times as tall as it is wide and its height shrinks; before, never."""
    if _PILLOW >= (13, 0):
        return size[0] < height and height - size[0] > 2 * (width - size[1])
    return _PILLOW >= (12, 2) and height > width * 100 and size[0] < height


def _both_passes(images: list[torch.Tensor], sizes: list, windows: list, interpolation: str) -> torch.Tensor:
    """Images ``[L, H, W]`` resized across, then down, as Pillow resizes them: uint8 ``[n, L, rows, columns]``.
    Pillow leaves out the pass of a side that keeps its size; that pass here copies each value (a weight of one)."""
    rows, columns = windows[0][2:]
    across = _planned([(image.shape[-1], size[1], window[1], window[1] + columns)
                       for image, size, window in zip(images, sizes, windows)], interpolation)  # fmt: skip
    down = _planned([(image.shape[-2], size[0], window[0], window[0] + rows)
                     for image, size, window in zip(images, sizes, windows)], interpolation)  # fmt: skip
    first, end = down.plan.reads[down.which].T  # the rows each image's outputs read
    count, lines = len(images), images[0].shape[0]
    if len(set(zip(first.tolist(), end.tolist(), (image.shape[-1] for image in images)))) == 1:
        canvas = torch.stack([image[:, first[0] : end[0]] for image in images])
    else:  # padded to the longest span and the widest image: no weight reads the padding
        canvas = images[0].new_zeros(count, lines, int((end - first).max()), max(image.shape[-1] for image in images))
        for k, image in enumerate(images):
            canvas[k, :, : end[k] - first[k], : image.shape[-1]] = image[:, first[k] : end[k]]
    span = canvas.shape[2]
    made = _resampled(canvas.reshape(count, lines * span, canvas.shape[3]), across, np.zeros(count, dtype=np.int64))
    made = made.view(count, lines, span, columns).transpose(-1, -2).reshape(count, lines * columns, span)
    return _resampled(made, down, first).view(count, lines, columns, rows).transpose(-1, -2)


class _Plans(NamedTuple):
    """Passes' sums: output ``o`` of plan ``p`` is the sum over ``t`` of input ``read[p, o, t]`` times
    ``weights[p, o, t]``, Pillow's weights in fixed point (none past an output's own taps); ``reads[p]`` bounds the
    inputs any of its outputs reads."""

    read: np.ndarray  # [plans, outputs, taps] int64
    weights: np.ndarray  # [plans, outputs, taps] int32
    reads: np.ndarray  # [plans, 2] int64: first, end


class _Planned(NamedTuple):
    """The plans of passes, and which of them each image's is."""

    plan: _Plans
    which: np.ndarray  # [images] int64
    key: tuple | None  # the one pass's ``(size, resized, first, end, interpolation)`` where all are one


def _planned(keys: list[tuple], interpolation: str) -> _Planned:
    """The plans of the distinct passes ``(size, resized, first, end)`` of ``keys``, and each key's plan."""
    distinct = list(dict.fromkeys(keys))
    plan = _kept_plans(distinct, interpolation)
    if len(distinct) == 1:
        return _Planned(plan, np.zeros(len(keys), dtype=np.int64), (*distinct[0], interpolation))
    place = {key: k for k, key in enumerate(distinct)}
    which = np.array([place[key] for key in keys], dtype=np.int64)
    return _Planned(plan, which, None)


#: The passes kept planned, by ``(size, resized, first, end, interpolation)``, the least lately used let go past this
#: many bytes: a photo's two passes for resnet50's 232 and 224 are about 25 KB, and a scraped set's sizes repeat.
_KEPT_BYTES = 64 << 20
_kept: collections.OrderedDict = collections.OrderedDict()
_keeping = threading.Lock()
_kept_bytes = 0


def _plan(size: int, resized: int, first: int, end: int, interpolation: str) -> _Plans:
    """The pass that resizes a side of ``size`` to ``resized`` and keeps outputs ``[first, end)``."""
    return _kept_plans([(size, resized, first, end)], interpolation)


def _kept_plans(keys: list[tuple], interpolation: str) -> _Plans:
    """The plans of the distinct passes ``keys``, those planned lately as they were kept, the others planned together
    (:func:`_plans`), with as many taps as the most of them have (the others' last taps weighted by zero)."""
    global _kept_bytes
    with _keeping:
        missing = [key for key in keys if (*key, interpolation) not in _kept]
        if missing:
            made = _plans(tuple(missing), interpolation)
            for k, key in enumerate(missing):
                used = np.flatnonzero(made.weights[k].any(axis=0))
                own = int(used[-1]) + 1 if len(used) else 1  # its taps, the group's last zero ones left out
                plan = _Plans(made.read[k : k + 1, :, :own].copy(), made.weights[k : k + 1, :, :own].copy(),
                              made.reads[k : k + 1].copy())  # fmt: skip
                _kept[(*key, interpolation)] = plan
                _kept_bytes += plan.read.nbytes + plan.weights.nbytes
        plans = [_kept[(*key, interpolation)] for key in keys]
        for key in keys:
            _kept.move_to_end((*key, interpolation))
        while _kept_bytes > _KEPT_BYTES:  # this call's own plans too, which it holds until it is done
            _, gone = _kept.popitem(last=False)
            _kept_bytes -= gone.read.nbytes + gone.weights.nbytes
    if len(plans) == 1:
        return plans[0]
    outputs, taps = plans[0].weights.shape[1], max(plan.weights.shape[2] for plan in plans)
    read = np.empty((len(plans), outputs, taps), dtype=np.int64)
    weights = np.zeros((len(plans), outputs, taps), dtype=np.int32)
    for k, plan in enumerate(plans):
        own = plan.weights.shape[2]
        read[k, :, :own], read[k, :, own:], weights[k, :, :own] = plan.read[0], plan.reads[0, 1] - 1, plan.weights[0]
    return _Plans(read, weights, np.concatenate([plan.reads for plan in plans]))


def _resampled(lines: torch.Tensor, planned: _Planned, shift: np.ndarray) -> torch.Tensor:
    """Lines ``[n, M, N]`` uint8, those of image ``k`` resampled along their last dimension by its plan, its inputs
    counted from ``shift[k]``: uint8 ``[n, M, outputs]``. The sums are Pillow's: 32-bit integers, rounded from its
    fixed point and clipped."""
    (plan, which, key), (count, length), device = planned, lines.shape[:2], lines.device
    outputs, taps = plan.weights.shape[1:]
    if key is not None and len(set(shift.tolist())) == 1:  # one plan: the images' lines are one batch
        index, weights = _plan_on(str(device), key)
        index, weights = (index - int(shift[0]))[None], weights[None]
        lines, count, length = lines.reshape(1, -1, lines.shape[-1]), 1, count * length
    else:
        index = torch.from_numpy((plan.read[which] - shift[:, None, None]).reshape(count, -1)).to(device)
        weights = torch.from_numpy(plan.weights).to(device)
        if not np.array_equal(which, np.arange(len(plan.read))):  # some images share a plan
            weights = weights[torch.from_numpy(which).to(device)]
    made = torch.empty(count, length, outputs, dtype=torch.uint8, device=device)
    budget = _AT_ONCE if device.type != "cpu" else min(_AT_ONCE, _AT_ONCE_ON_CPU)
    step = max(1, budget // (outputs * taps))  # lines whose values are gathered at once
    images_step, lines_step = (max(1, step // max(length, 1)), max(length, 1)) if step >= length else (1, step)
    for image in range(0, count, images_step):
        picked = slice(image, image + images_step)
        for start in range(0, length, lines_step):
            part = lines[picked, start : start + lines_step]
            taken = part.gather(2, index[picked, None].expand(-1, part.shape[1], -1)).view(
                *part.shape[:2], outputs, taps
            )
            sums = taken.to(torch.int32).mul_(weights[picked, None]).sum(-1, dtype=torch.int32)
            sums = torch.bitwise_right_shift(sums.add_(1 << (_PRECISION - 1)), _PRECISION).clamp_(0, 255)
            made[picked, start : start + lines_step] = sums
    return made.view(len(which), -1, outputs)


@functools.lru_cache(maxsize=64)
def _plan_on(device: str, key: tuple) -> tuple[torch.Tensor, torch.Tensor]:
    """The index and weights of :func:`_plan`'s pass of ``key``, on ``device`` (copied there once)."""
    plan = _plan(*key)
    return torch.from_numpy(plan.read[0].reshape(-1)).to(device), torch.from_numpy(plan.weights[0]).to(device)


@functools.lru_cache(maxsize=64)
def _nearest_on(device: str, size: int, resized: int, first: int, end: int) -> torch.Tensor:
    """The inputs Pillow's nearest-neighbour resize of a side of ``size`` to ``resized`` copies to outputs
    ``[first, end)``, on ``device``: read from Pillow itself, which resizes a line of 32-bit pixels that hold their
    own positions."""
    line = Image.new("I", (size, 1))
    line.putdata(range(size))
    picked = np.asarray(line.resize((resized, 1), Image.Resampling.NEAREST), dtype=np.int64)[0, first:end]
    return torch.from_numpy(picked.copy()).to(device)


def _plans(keys: tuple, interpolation: str) -> _Plans:
    """The passes ``keys``, each ``(size, resized, first, end)``: resize a side of ``size`` to ``resized`` and keep
    outputs ``[first, end)``, as many of them in each. Pillow's weights (its ``precompute_coeffs`` and
    ``normalize_coeffs_8bpc``, in the same double arithmetic), laid out in tiles; a side that keeps its size has
    weights of one."""
    size, resized, first, end = (np.array(column, dtype=np.int64)[:, None] for column in zip(*keys))
    positions = first + np.arange(int(end[0, 0] - first[0, 0]))  # [keys, outputs]
    scale = size / resized
    filterscale = np.maximum(scale, 1.0)
    support, shrink = _SUPPORT[interpolation] * filterscale, 1.0 / filterscale
    taps = int(np.ceil(support).max()) * 2 + 1
    center = (positions + 0.5) * scale
    low = np.maximum(np.trunc(center - support + 0.5).astype(np.int64), 0)
    count = np.minimum(np.trunc(center + support + 0.5).astype(np.int64), size) - low
    at = np.arange(taps)
    used = at < count[..., None]
    weights = np.where(
        used, _filter(interpolation, ((at + low[..., None]) - center[..., None] + 0.5) * shrink[..., None]), 0.0
    )
    total = np.zeros(center.shape)
    for tap in range(taps):  # in Pillow's order, which a float sum depends on
        total = total + weights[..., tap]
    weights = weights / np.where(total == 0.0, 1.0, total)[..., None]
    scaled = weights * (1 << _PRECISION)
    fixed = np.where(scaled < 0, np.trunc(scaled - 0.5), np.trunc(scaled + 0.5)).astype(np.int64)
    kept = size[:, 0] == resized[:, 0]  # Pillow leaves these out: each output is its input
    fixed[kept], low[kept], count[kept] = 0, positions[kept], 1
    fixed[kept, :, 0] = 1 << _PRECISION
    end = (low + count).max(axis=1)
    read = np.minimum(low[..., None] + at, (end - 1)[:, None, None])  # past an output's taps: weighted by zero
    weights = np.where(at < count[..., None], fixed, 0).astype(np.int32)
    return _Plans(read, weights, np.stack([low.min(axis=1), end], axis=1))


def _filter(interpolation: str, x: np.ndarray) -> np.ndarray:
    """Pillow's filters: the triangle, and the cubic of a = -0.5."""
    x = np.abs(x)
    if interpolation == "bilinear":
        return np.where(x < 1.0, 1.0 - x, 0.0)
    near = (1.5 * x - 2.5) * x * x + 1
    far = (((x - 5) * x + 8) * x - 4) * -0.5
    return np.where(x < 1.0, near, np.where(x < 2.0, far, 0.0))
