"""Pillow's resize on tensors (hookcli.inputs.resampling) against Pillow itself, value for value."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from PIL import Image

from hookcli.inputs import resampling
from hookcli.inputs.resampling import resized_window
from hookcli.run.speed import float32_math

FILTERS = {
    "bilinear": Image.Resampling.BILINEAR,
    "bicubic": Image.Resampling.BICUBIC,
    "nearest": Image.Resampling.NEAREST,
}


def _pillows(pixels: np.ndarray, size: tuple[int, int], interpolation: str) -> np.ndarray:
    """Pillow's resize of ``pixels`` (``[H, W, 3]`` or ``[H, W]``) to ``size`` ``(height, width)``."""
    return np.asarray(Image.fromarray(pixels).resize((size[1], size[0]), FILTERS[interpolation]))


#: Where the resize runs: the CPU, and a GPU where there is one (where the exactness argument matters most).
DEVICES = ["cpu", *(["cuda"] if torch.cuda.is_available() else [])]


def _ours(pixels: np.ndarray, size, window, interpolation, device="cpu") -> np.ndarray:
    images = torch.from_numpy(pixels).to(device)
    images = images.permute(2, 0, 1) if images.dim() == 3 else images[None]
    made = resized_window(images[None], size, window, interpolation)[0].cpu()
    return (made.permute(1, 2, 0) if pixels.ndim == 3 else made[0]).numpy()


def _noise(height: int, width: int, seed: int, channels: int = 3) -> np.ndarray:
    shape = (height, width, channels) if channels > 1 else (height, width)
    return np.random.default_rng(seed).integers(0, 256, shape, dtype=np.uint8)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("interpolation", list(FILTERS))
def test_every_value_is_pillows_for_random_sizes_and_windows(interpolation, device):
    draw = random.Random(interpolation)
    for case in range(40):
        height, width = draw.randint(1, 160), draw.randint(1, 160)
        size = (draw.randint(1, 120), draw.randint(1, 120))
        if case % 5 == 0:
            size = (height, size[1])  # one side keeps its size: Pillow leaves out that pass
        top, left = draw.randrange(size[0]), draw.randrange(size[1])
        window = (top, left, draw.randint(1, size[0] - top), draw.randint(1, size[1] - left))
        pixels = _noise(height, width, case)
        expected = _pillows(pixels, size, interpolation)[top : top + window[2], left : left + window[3]]
        found = _ours(pixels, size, window, interpolation, device)
        assert np.array_equal(found, expected), (height, width, size, window)


@pytest.mark.parametrize("interpolation", ["bilinear", "bicubic"])
@pytest.mark.parametrize(
    ("shape", "size"),
    [
        ((375, 500), (232, 309)),  # a photo to a classifier's 232: across first
        ((600, 512), (273, 232)),  # portrait: the height shrinks by more than twice the width's pixels
        ((176, 40), (98, 5)),  # the height shrinks by 78 pixels, the width by 35
        ((233, 10), (211, 31)),  # the width grows
        ((30, 50), (77, 20)),  # the height grows
    ],
)
def test_both_orders_of_the_two_passes_are_pillows(interpolation, shape, size):
    pixels = _noise(*shape, seed=sum(shape))
    assert np.array_equal(_ours(pixels, size, (0, 0, *size), interpolation), _pillows(pixels, size, interpolation))


@pytest.mark.parametrize("device", DEVICES)
def test_matmuls_of_lower_precision_give_the_same_values(device):
    pixels = _noise(375, 500, seed=4)
    with float32_math("fp32", torch.device(device)):
        exact = _ours(pixels, (232, 309), (4, 42, 224, 224), "bicubic", device)
    with float32_math("tf32", torch.device(device)):  # TF32 matmuls: products of 8-bit pieces keep every bit
        assert np.array_equal(_ours(pixels, (232, 309), (4, 42, 224, 224), "bicubic", device), exact)
    assert np.array_equal(exact, _pillows(pixels, (232, 309), "bicubic")[4:228, 42:266])


def test_a_large_reduction_cuts_the_weights_finer_and_stays_exact():
    pixels = _noise(1, 40_000, seed=1, channels=1)  # 10,000 to one: sums of 20,001 products, so pieces of 2 bits
    plan = resampling._plan(40_000, 4, 0, 4, "bilinear")
    assert (plan.bits, plan.pieces) == (2, 5)
    assert np.array_equal(_ours(pixels, (1, 4), (0, 0, 1, 4), "bilinear"), _pillows(pixels, (1, 4), "bilinear"))
    wider = _noise(1, 70_000, seed=2, channels=1)  # no piece small enough: float64 sums
    assert resampling._plan(70_000, 2, 0, 2, "bilinear").bits == 0
    assert np.array_equal(_ours(wider, (1, 2), (0, 0, 1, 2), "bilinear"), _pillows(wider, (1, 2), "bilinear"))


def test_a_photos_weights_are_cut_in_three_pieces_of_eight_bits():
    plan = resampling._plan(500, 309, 42, 266, "bilinear")
    assert (plan.bits, plan.pieces, plan.outputs, plan.reads) == (8, 3, 224, (67, 431))
    assert plan.read.shape == (7, 54) and plan.weights.shape == (7, 54, 96)  # 32 outputs read 54 inputs


def test_a_batch_is_resized_in_bounded_slices_to_the_same_values(monkeypatch):
    pixels = _noise(61, 97, seed=3)
    whole = _ours(pixels, (40, 64), (4, 5, 30, 50), "bicubic")
    monkeypatch.setattr(resampling, "_AT_ONCE", 1)  # one line of the image at a time
    assert np.array_equal(_ours(pixels, (40, 64), (4, 5, 30, 50), "bicubic"), whole)


def test_a_window_outside_the_resized_image_or_an_unknown_filter_is_refused():
    images = torch.zeros(1, 3, 10, 10, dtype=torch.uint8)
    with pytest.raises(ValueError, match=r"^the window \(0, 4, 5, 5\) is not inside the resized size \(8, 8\)$"):
        resized_window(images, (8, 8), (0, 4, 5, 5), "bilinear")
    with pytest.raises(ValueError, match=r"^interpolation 'lanczos' is not one of nearest, bilinear, bicubic$"):
        resized_window(images, (8, 8), (0, 0, 8, 8), "lanczos")


@pytest.mark.parametrize(
    ("version", "expected"),
    [((13, 0), [True, False, True, False]), ((12, 2), [False, False, False, True]), ((12, 1), [False] * 4)],
)
def test_the_pass_order_follows_the_pillow_installed(monkeypatch, version, expected):
    monkeypatch.setattr(resampling, "_PILLOW", version)
    shapes = [
        (176, 40, (98, 5)),  # the height shrinks by 78 pixels, more than twice the width's 35
        (375, 500, (232, 309)),  # a landscape photo
        (233, 10, (211, 31)),  # the height shrinks and the width grows
        (701, 7, (700, 3)),  # over 100 times as tall as wide, its height shrinking by a pixel
    ]
    assert [resampling._down_first(height, width, size) for height, width, size in shapes] == expected


def test_a_batch_of_photos_each_of_its_own_size_is_planned_once():
    sizes = [(20 + n // 16, 40 + n % 16) for n in range(256)]  # 256 sizes, resized and cropped alike
    resampling._plan.cache_clear()
    planned = []
    for _ in range(2):  # a batch, then the next one of the same sizes
        for height, width in sizes:
            resized = (16, round(16 * width / height))
            window = (0, (resized[1] - 16) // 2, 16, 16)
            resized_window(torch.zeros(1, height, width, dtype=torch.uint8), resized, window, "bilinear")
        planned.append(resampling._plan.cache_info().misses)
    assert planned[0] == planned[1] > 200  # every pass planned in the first batch, and kept for the next
