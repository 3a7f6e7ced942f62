"""Pillow's resize on tensors (hookcli.inputs.resampling) against Pillow itself, value for value."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils._python_dispatch import TorchDispatchMode

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
def test_a_lower_float_precision_for_the_run_leaves_the_values_alone(device):
    pixels = _noise(375, 500, seed=4)
    with float32_math("fp32", torch.device(device)):
        exact = _ours(pixels, (232, 309), (4, 42, 224, 224), "bicubic", device)
    with float32_math("tf32", torch.device(device)):  # the sums are integers: no float precision applies
        assert np.array_equal(_ours(pixels, (232, 309), (4, 42, 224, 224), "bicubic", device), exact)
    assert np.array_equal(exact, _pillows(pixels, (232, 309), "bicubic")[4:228, 42:266])


def test_a_large_reduction_sums_thousands_of_taps_exactly():
    pixels = _noise(1, 40_000, seed=1, channels=1)  # 10,000 to one: sums of 20,001 products in 32-bit integers
    assert resampling._plan(40_000, 4, 0, 4, "bilinear").weights.shape == (1, 4, 19_988)  # the last weights round to 0
    assert np.array_equal(_ours(pixels, (1, 4), (0, 0, 1, 4), "bilinear"), _pillows(pixels, (1, 4), "bilinear"))
    wider = _noise(1, 70_000, seed=2, channels=1)
    assert np.array_equal(_ours(wider, (1, 2), (0, 0, 1, 2), "bicubic"), _pillows(wider, (1, 2), "bicubic"))


def test_a_photos_pass_reads_its_window_of_inputs_with_pillows_weights():
    plan = resampling._plan(500, 309, 42, 266, "bilinear")
    assert plan.weights.shape == (1, 224, 4) and plan.reads.tolist() == [[67, 431]]  # of 5 taps, the last unused
    assert plan.weights.dtype == np.int32 and np.abs(plan.weights.sum(axis=2) - (1 << 22)).max() == 1  # one, rounded
    assert plan.read[0, 0, :4].tolist() == [67, 68, 69, 70] and plan.read.max() == 430  # never past the last read


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


def _sized(height: int, width: int, short: int = 16) -> tuple[tuple[int, int], tuple[int, int, int, int]]:
    """A classifier's resize of the shorter side to ``short``, and its centre crop of ``short``."""
    size = (short, round(short * width / height)) if width >= height else (round(short * height / width), short)
    return size, ((size[0] - short) // 2, (size[1] - short) // 2, short, short)


@pytest.mark.parametrize("interpolation", ["bilinear", "bicubic"])
def test_photos_of_many_sizes_resized_together_are_each_resized_alone(interpolation):
    draw = random.Random(7)
    shapes = [(draw.randint(17, 90), draw.randint(17, 90)) for _ in range(24)]
    shapes += [(16, 40), (33, 16), (200, 20), (20, 21), (400, 60)]  # sides that keep their size; down first; far apart
    images = [torch.from_numpy(_noise(h, w, seed=k)).permute(2, 0, 1) for k, (h, w) in enumerate(shapes)]
    placed = [_sized(h, w) for h, w in shapes]
    together = resampling.resized_windows(images, *zip(*placed), interpolation)
    assert together.shape == (len(shapes), 3, 16, 16)
    for k, (pixels, (size, window)) in enumerate(zip(images, placed)):
        alone = _pillows(pixels.permute(1, 2, 0).numpy(), size, interpolation)
        top, left = window[:2]
        assert np.array_equal(together[k].permute(1, 2, 0).numpy(), alone[top : top + 16, left : left + 16]), k


def test_photos_of_like_sizes_are_padded_together_and_far_ones_apart(monkeypatch):
    shapes = [(375, 500), (500, 375), (333, 500), (4000, 3000), (375, 500), (20, 30)]
    assert resampling._alike(shapes, [2_700] * 6) == [[5, 2, 0, 4, 1], [3]]  # by area; padding at most doubles a group
    monkeypatch.setattr(resampling, "_PLANNED_AT_ONCE", 3 * 2_700)
    assert resampling._alike(shapes, [2_700] * 6) == [[5, 2, 0], [4, 1], [3]]  # and the weights of at most 3


def test_lines_squashed_to_a_square_are_planned_a_few_at_a_time():
    line = torch.zeros(3, 1, 60_000, dtype=torch.uint8)  # each output across reads 1,073 inputs
    cost = resampling._cost(line, (224, 224), (224, 224), "bicubic")
    assert cost == 224 * 1_073 + 224 * 5
    groups = resampling._alike([(1, 60_000)] * 20, [cost] * 20)
    assert [len(group) for group in groups] == [8, 8, 4]  # 8 lines' weights, 1.9 million, are within 2**21


def test_an_image_already_of_the_size_is_cut_to_its_window_and_never_planned(monkeypatch):
    monkeypatch.setattr(resampling, "_plans", lambda *_: pytest.fail("planned"))
    pixels = torch.from_numpy(_noise(30, 40, seed=5)).permute(2, 0, 1)
    for interpolation in FILTERS:
        made = resized_window(pixels[None], (30, 40), (2, 3, 20, 25), interpolation)
        assert torch.equal(made[0], pixels[:, 2:22, 3:28])


class _Operations(TorchDispatchMode):
    """Counts the operations that make or write tensors (views left out): on a GPU, about its kernel launches."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += not func.is_view
        return func(*args, **(kwargs or {}))


def test_a_batch_of_many_sizes_costs_a_copy_an_image_beside_one_set_of_operations(monkeypatch):
    monkeypatch.setattr(resampling, "_AT_ONCE_ON_CPU", 1 << 25)  # a GPU's slices: the batch at once

    def operations(count: int) -> int:
        shapes = [(30 + n % 8, 45 + n // 8) for n in range(count)]  # each of its own size, all across first, one group
        images = [torch.zeros(3, h, w, dtype=torch.uint8) for h, w in shapes]
        placed = [_sized(h, w) for h, w in shapes]
        resampling.resized_windows(images, *zip(*placed), "bilinear")  # planned
        with _Operations() as counted:
            resampling.resized_windows(images, *zip(*placed), "bilinear")
        return counted.count

    few, many = operations(4), operations(64)
    assert many - few == 61  # each further image's copy into the padded batch, and one gather of plans some share
    assert few < 40


def test_a_batch_of_photos_each_of_its_own_size_is_planned_once_together(monkeypatch):
    made: list[int] = []
    planning = resampling._plans
    monkeypatch.setattr(
        resampling, "_plans", lambda keys, interpolation: made.append(len(keys)) or planning(keys, interpolation)
    )
    monkeypatch.setattr(resampling, "_kept", resampling.collections.OrderedDict())
    monkeypatch.setattr(resampling, "_kept_bytes", 0)
    sizes = [(20 + n // 16, 40 + n % 16) for n in range(256)]  # 256 sizes, resized and cropped alike
    images = [torch.zeros(1, height, width, dtype=torch.uint8) for height, width in sizes]
    placed = [_sized(h, w) for h, w in sizes]
    resampling.resized_windows(images, *zip(*placed), "bilinear")
    assert made == [230, 16]  # the distinct passes across (230: widths and their resized widths) and down (16)
    resampling.resized_windows(images, *zip(*placed), "bilinear")  # the next batch, of the same sizes
    assert made == [230, 16]


def test_plans_are_kept_up_to_a_number_of_bytes_the_least_lately_used_let_go(monkeypatch):
    monkeypatch.setattr(resampling, "_kept", resampling.collections.OrderedDict())
    monkeypatch.setattr(resampling, "_kept_bytes", 0)
    first = resampling._plan(500, 309, 42, 266, "bilinear")
    assert first.read.nbytes + first.weights.nbytes == 224 * 4 * (8 + 4)  # four taps, the fifth unused
    monkeypatch.setattr(resampling, "_KEPT_BYTES", 2 * 224 * 4 * 12)
    resampling._plan(501, 309, 42, 266, "bilinear")
    resampling._plan(500, 309, 42, 266, "bilinear")  # used lately: kept
    resampling._plan(502, 310, 42, 266, "bilinear")
    assert [key[0] for key in resampling._kept] == [500, 502]
    assert resampling._kept_bytes == 2 * 224 * 4 * 12


@pytest.mark.parametrize("interpolation", list(FILTERS))
def test_an_empty_batch_resizes_to_an_empty_batch(interpolation):
    made = resized_window(torch.zeros(0, 3, 10, 12, dtype=torch.uint8), (8, 9), (1, 1, 5, 5), interpolation)
    assert (made.shape, made.dtype) == ((0, 3, 5, 5), torch.uint8)
