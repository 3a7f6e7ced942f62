"""What a layer's units are: its channels, and the positions each channel has a value at.

A layer's output row (one input's tensor) is read as ``C`` channels over ``P``
positions, as the pictures read it (:func:`hookcli.pictures.render.map_layout`):

- ``[C, H, W]`` maps (``[H, W, C]`` where a model of square inputs lays its output out channels-last), and video
  clips ``[C, T, H, W]``: ``C`` channels over the spatial (and time) positions;
- ``[T, D]`` tokens: ``D`` channels over the tokens, the model's prefix tokens (a class token, registers) left out
  as the pictures leave them out;
- ``[D]`` vectors (an embedding, pooled features, logits): ``D`` channels with one value each, and no position;
- an attention module's weights (``KEY@attention``, any shape): each value a unit of its own, with no position.
  A row of weights sums to 1 over its keys, so a mean over them says nothing of the row: nothing is pooled away.

>>> layout = UnitLayout.of((197, 768), prefix_tokens=1)
>>> layout.channels, layout.spatial, layout.kind, layout.skip
(768, (196,), 'tokens', 1)
>>> UnitBatch(torch.ones(2, 197, 768), torch.tensor([4, 5]), layout).maps.shape
torch.Size([2, 768, 196])
>>> UnitLayout.of((7, 7, 96), channels_last=True).spatial, UnitLayout.of((512,)).spatial
((7, 7), ())
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import cached_property
from typing import Literal

import numpy as np
import torch

from hookcli.errors import CaptureError

__all__ = [
    "UnitBatch",
    "UnitLayout",
    "is_gradient",
    "known_units",
    "layer_widths",
    "numpy_sorts",
    "sort_rows",
    "width_axis",
    "width_of",
]


@dataclass(frozen=True)
class UnitLayout:
    """How one row of ``row_shape`` holds ``channels`` channels over positions of shape ``spatial``.

    ``kind``: ``maps`` (channels first), ``channels_last``, ``tokens`` (the
    first ``skip`` tokens left out) or ``flat``.
    """

    row_shape: tuple[int, ...]
    channels: int
    spatial: tuple[int, ...]
    kind: str
    skip: int = 0

    @property
    def positions(self) -> int:
        """Values a channel has in one row."""
        return math.prod(self.spatial)

    @classmethod
    def of(
        cls,
        row_shape,
        *,
        prefix_tokens: int | None = None,
        channels_last: bool = False,
        key: str = "the layer",
        width: int | None = None,
    ) -> UnitLayout:
        """The layout of rows of ``row_shape``. ``channels_last``: the model's inputs are square, so a
        ``[H, W, C]`` row (equal first two axes, a different last) is channels-last. ``width``: how many channels
        the module says its output has (:func:`known_units`), which decides where the shape alone cannot: a
        Conv1d's ``[C, L]`` is C channels over L positions, not tokens, and a ``[C, H, W]`` map whose C equals its H
        stays channels-first. Raises :class:`~hookcli.errors.CaptureError` for rows with no channels to speak of."""
        shape = tuple(int(n) for n in row_shape)
        if not shape or len(shape) > 4 or 0 in shape:
            raise CaptureError(
                f"'{key}' has rows of shape {list(shape)}: statistics need channels (a vector [D], tokens [T, D], "
                "maps [C, H, W] or clips [C, T, H, W]) with at least one value each",
                hint="choose another layer (hookcli layers lists their shapes)",
            )
        if len(shape) == 1 or key.endswith("@attention"):
            return cls(shape, math.prod(shape), (), "flat")
        said = width_axis(shape, width)
        if said == 0:
            return cls(shape, shape[0], shape[1:], "maps")
        if said == -1 and len(shape) == 3:
            return cls(shape, shape[2], shape[:2], "channels_last")
        if len(shape) == 2:
            tokens, dim = shape
            if prefix_tokens is not None and 0 <= prefix_tokens < tokens:  # the model's own count, grid square or not
                skip = prefix_tokens
            else:  # a model that does not say: a class token where the rest, and not the whole, fold to a square
                skip = 1 if tokens > 1 and not _square(tokens) and _square(tokens - 1) else 0
            return cls(shape, dim, (tokens - skip,), "tokens", skip)
        if len(shape) == 3 and channels_last and shape[0] == shape[1] != shape[2]:
            return cls(shape, shape[2], shape[:2], "channels_last")
        return cls(shape, shape[0], shape[1:], "maps")

    def units(self, rows: torch.Tensor) -> torch.Tensor:
        """A batch of rows ``[n, *row_shape]`` as ``[n, C, P]``, in float32 (float64 kept)."""
        if tuple(rows.shape[1:]) != self.row_shape:
            raise CaptureError(
                f"a row of shape {list(rows.shape[1:])} came after rows of shape {list(self.row_shape)}",
                hint="statistics take layers whose rows share one shape: give the model one input size (--crop)",
            )
        dtype = torch.float64 if rows.dtype == torch.float64 else torch.float32
        rows = rows.to(dtype)
        count = rows.shape[0]
        if self.kind == "flat":
            return rows.reshape(count, self.channels, 1)
        if self.kind == "tokens":
            return rows[:, self.skip :].transpose(1, 2)
        if self.kind == "channels_last":
            return rows.reshape(count, self.positions, self.channels).transpose(1, 2)
        return rows.reshape(count, self.channels, self.positions)


def width_axis(row_shape, width: int | None) -> int | None:
    """Where a row of ``row_shape`` holds its channels by the ``width`` its module says (:func:`known_units`):
    0 (first: a Conv1d's ``[C, L]``, a map ``[C, H, W]``), -1 (last: tokens ``[T, D]``, a map ``[H, W, C]``), or
    None where the width does not tell (not known, or the first and last axes both that long).

    >>> width_axis((16, 64), 16), width_axis((7, 7, 96), 96), width_axis((8, 8), 8), width_axis((8, 8), None)
    (0, -1, None, None)
    """
    if width is None or len(row_shape) not in (2, 3) or row_shape[0] == row_shape[-1]:
        return None
    return 0 if row_shape[0] == width else -1 if row_shape[-1] == width else None


def known_units(module) -> int | None:
    """How many channels a module's output has, where its weights say it (a convolution's ``out_channels``, a
    norm's ``num_features``, a linear layer's ``out_features``…); None where only running it tells.

    >>> nn = torch.nn
    >>> known_units(nn.Conv1d(8, 6, 1)), known_units(nn.LayerNorm(6)), known_units(nn.LayerNorm([8, 4]))
    (6, 6, None)
    """
    for attribute in ("out_channels", "out_features", "num_features", "embedding_dim", "num_channels"):
        value = getattr(module, attribute, None)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    shape = getattr(module, "normalized_shape", None)  # a LayerNorm over [C, H, W] says nothing of C alone
    return int(shape[0]) if isinstance(shape, tuple) and len(shape) == 1 else None


def layer_widths(model, layers: Mapping[str, str]) -> dict[str, int | None]:
    """The channels of each captured layer's output, by the key of its output (``layers``: module path → key;
    its input's and attention's keys are others), where its module says them (:func:`known_units`)."""
    modules = dict(model.named_modules())
    return {key: known_units(modules[path]) for path, key in layers.items() if path in modules}


#: What follows a layer's key in the keys of values of its output's shape: a call (``K:1``), a gradient (``K@grad``,
#: ``K@grad#0``).
_OF_THE_OUTPUT = re.compile(r"(?::\d+)?(?:@grad(?:#\d+)?)?$")
_GRADIENT = re.compile(r"@grad(?:#\d+)?$")


def is_gradient(key: str) -> bool:
    """Whether stored ``key`` holds a gradient (``K@grad``, ``K@grad#0``), not a layer's values.

    >>> is_gradient("mix:1@grad#0"), is_gradient("mix"), is_gradient("grad")
    (True, False, False)
    """
    return _GRADIENT.search(key) is not None


def width_of(widths: Mapping[str, int | None], key: str) -> int | None:
    """The channels of stored ``key`` by ``widths`` (each layer's, by the key of its output): its own, or its
    layer's where it holds values of that output's shape (a call, a gradient); None where neither says.

    >>> width_of({"mix": 6}, "mix"), width_of({"mix": 6}, "mix:1@grad#0"), width_of({"mix": 6}, "mix@input")
    (6, 6, None)
    """
    if key in widths:
        return widths[key]
    layer = _OF_THE_OUTPUT.sub("", key, count=1)
    return widths.get(layer) if layer != key else None


def _square(number: int) -> bool:
    return math.isqrt(number) ** 2 == number


class UnitBatch:
    """One batch of a layer's rows as its units see it, each view made once for every accumulator that asks.

    ``maps``: ``[n, C, P]``; ``values``: ``[C, n·P]``, every value of each
    channel (``ordered``: sorted); ``pooled``: ``[n, C]`` float64,
    each row's mean over its positions (``spread``: the sum of its squared
    deviations from that mean); ``rows``: int64 ``[n]``, the inputs the rows
    came from.
    """

    def __init__(self, rows: torch.Tensor, inputs: torch.Tensor, layout: UnitLayout) -> None:
        self.layout = layout
        self.maps = layout.units(rows)
        self.rows = inputs.to(torch.int64)

    @cached_property
    def values(self) -> torch.Tensor:
        return self.maps.transpose(0, 1).reshape(self.layout.channels, -1)

    @cached_property
    def pooled(self) -> torch.Tensor:
        return self._row_moments[0]

    @cached_property
    def spread(self) -> torch.Tensor:
        return self._row_moments[1]

    @cached_property
    def _row_moments(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Each row's mean over its positions and the sum of squares of its deviations from it, float64 ``[n, C]``
        each: two passes over one float64 copy of the maps."""
        wide = self.maps.to(torch.float64, copy=True)
        means = wide.mean(dim=2)
        # The norm's reduction is several times faster than squaring and summing here.
        return means, torch.linalg.vector_norm(wide.sub_(means[..., None]), dim=2).square()

    @cached_property
    def ordered(self) -> torch.Tensor:
        """``values`` with each channel's values sorted, float32, where the values are (:func:`sort_rows`)."""
        # A copy of its own (sorted in place), laid out channel by channel: torch's blocked copy transposes the
        # channels-last layouts several times faster than numpy's.
        return sort_rows(self.values.to(torch.float32).clone(memory_format=torch.contiguous_format))


def sort_rows(rows: torch.Tensor, *, stable: bool = False) -> torch.Tensor:
    """``rows`` (a 2-D tensor) with each row sorted (``stable``: equal values keep their order, and runs already
    sorted cost near one pass): on the CPU in place, by numpy's sort (vectorised where the processor allows,
    several times faster than torch's there) on blocks of rows on as many threads as torch's; on a GPU by
    torch's. Either sorts NaN last; the two may order an equal ``-0.0`` and ``0.0`` differently unless stable."""
    if rows.device.type != "cpu" or not numpy_sorts():
        return torch.sort(rows, dim=1, stable=stable).values
    array = rows.numpy()
    kind: Literal["stable", "quicksort"] = "stable" if stable else "quicksort"
    blocks = np.array_split(array, min(torch.get_num_threads(), max(1, len(array) // 64)))
    if len(blocks) > 1:
        list(_sorting_threads().map(functools.partial(np.ndarray.sort, axis=1, kind=kind), blocks))
    else:
        array.sort(axis=1, kind=kind)
    return rows


def numpy_sorts() -> bool:
    """Whether CPU tensors are sorted by numpy (the tests turn it off to check torch's path against it)."""
    return True


@functools.cache
def _sorting_threads() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max(1, torch.get_num_threads()), thread_name_prefix="hookcli-sort")
