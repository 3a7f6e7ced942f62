"""Quantiles of each channel's values from a sketch of bounded size: a KLL sketch (Karnin, Lang and Liberty, 2016)
kept for all channels at once.

The sketch holds levels of values; a value at level ``h`` stands for ``2**h``
of the values seen. When a level outgrows its capacity (``k`` at the top,
two thirds of that one level down, and so on, never under 2) it is sorted and
every other value, from a random first one, moves up a level (an odd one out
stays). Every channel sees as many values as the others, so all channels
compact together: one level is one ``[C, n]`` array, each channel drawing its
own first value. A batch comes in sorted (:attr:`UnitBatch.ordered
<hookcli.statistics.units.UnitBatch.ordered>`, shared with the moments), and
is compacted as it comes. A channel's quantile at level ``q`` is its smallest
value whose weight, with the weight of all smaller values, reaches ``q`` times
the count. Until a channel has seen more values than the lowest capacity, the
answer is exact.

Rank error: with ``k`` = :data:`DEFAULT_K` (4,096) the value returned for
level ``q`` has a rank within 0.1% of the count of ``q × count`` (in tests of
up to millions of values, including sorted and constant channels, heavy ties,
all zeros and outliers, the largest error seen was about 0.05%). A value
held in the sketch stands for values that had the same rank, so ties and
outliers cost nothing. The sketch holds at most about ``3k`` values a channel,
whatever the count. Random choices are drawn from ``seed`` and a count of
compactions, so a sketch given the same values in the same batches, and
merged in the same order, is the same sketch.

>>> from hookcli.statistics.units import UnitBatch, UnitLayout
>>> sketch = QuantileSketch(1, k=64)
>>> values = torch.arange(1000.0).reshape(1, 1, 1, 1000)  # one row: one channel, 1,000 positions
>>> sketch.update(UnitBatch(values, torch.tensor([0]), UnitLayout.of((1, 1, 1000))))
>>> quantiles = sketch.quantiles([0.5, 0.99])
>>> [abs(q - exact) <= 0.1 * 1000 for q, exact in zip(quantiles[0].tolist(), [499, 989])], sketch.size < 1000
([True, True], True)
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import torch

from hookcli.statistics.base import stored
from hookcli.statistics.units import UnitBatch, sort_rows

__all__ = ["DEFAULT_K", "QuantileSketch"]

#: The top level's capacity: the sketch's size and accuracy (rank error about ``2 / k`` at worst in tests).
DEFAULT_K = 4096
#: Each level's capacity against the one above.
_SHRINK = 2 / 3


class QuantileSketch:
    """A KLL sketch of each of ``channels`` channels (see the module's description)."""

    def __init__(self, channels: int, *, k: int = DEFAULT_K, seed: int = 0, device=None) -> None:
        self.channels, self.k, self.seed = channels, k, seed
        self.count = 0
        self.compactions = 0
        self.levels: list[torch.Tensor] = [torch.empty((channels, 0), dtype=torch.float32, device=device)]

    @property
    def size(self) -> int:
        """Values held for each channel."""
        return sum(level.shape[1] for level in self.levels)

    def update(self, batch: UnitBatch) -> None:
        ordered = batch.ordered
        self.count += ordered.shape[1]
        if ordered.shape[1] > self._capacity(0):  # compacted as it comes: sorted once, for the moments too
            self._compact(0, ordered)
        else:
            self.levels[0] = torch.cat([self.levels[0], ordered], dim=1)
        self._compress()

    def merge(self, other: QuantileSketch) -> None:
        if other.k != self.k:
            raise ValueError(f"a sketch of k={other.k} cannot merge into one of k={self.k}")
        device = self.levels[0].device
        for height, level in enumerate(other.levels):
            if height == len(self.levels):
                self.levels.append(level.to(device, copy=True))
            else:
                self.levels[height] = torch.cat([self.levels[height], level.to(device)], dim=1)
        self.count += other.count
        self._compress()

    def _capacity(self, height: int) -> int:
        return max(2, math.ceil(self.k * _SHRINK ** (len(self.levels) - 1 - height)))

    def _compress(self) -> None:
        height = 0
        while height < len(self.levels):
            level = self.levels[height]
            if level.shape[1] > self._capacity(height):
                self.levels[height] = level[:, :0]
                # A level is runs already sorted (each compaction's).
                self._compact(height, sort_rows(level, stable=True))
            height += 1

    def _compact(self, height: int, ordered: torch.Tensor) -> None:
        """Move every other value of ``ordered`` (a level's values, sorted), from a random first one, up a level;
        an odd one out (the largest) stays. The choices are numpy's on the CPU wherever the values are, so that
        a sketch on a GPU makes the ones a sketch on the CPU makes."""
        half = ordered.shape[1] // 2
        pairs = ordered[:, : 2 * half].reshape(self.channels, half, 2)
        chosen = np.random.default_rng(self.seed * 1_000_003 + self.compactions)
        self.compactions += 1
        second = torch.from_numpy(chosen.integers(0, 2, size=(self.channels, 1)).astype(bool)).to(ordered.device)
        up = torch.where(second, pairs[:, :, 1], pairs[:, :, 0])  # several times faster than a gather of the indices
        self.levels[height] = torch.cat([self.levels[height], ordered[:, 2 * half :]], dim=1)
        if height + 1 == len(self.levels):
            self.levels.append(up)
        else:
            self.levels[height + 1] = torch.cat([self.levels[height + 1], up], dim=1)

    def quantiles(self, levels: Sequence[float]) -> torch.Tensor:
        """Each channel's value at each of ``levels`` (in [0, 1]), float64 ``[C, Q]``; NaN before any value.

        Sorts each level in place (the order of a level's values means nothing to the sketch)."""
        device = self.levels[0].device
        if not self.count:
            return torch.full((self.channels, len(levels)), float("nan"), dtype=torch.float64, device=device)
        # The smallest value whose rank reaches the level, found by halving the range of 32-bit keys that sort as
        # the values do (:func:`_values_of_keys`): 32 rounds of searches in each level, sorted, for the value of a key,
        # instead of a sort of every value held.
        held = [sort_rows(level, stable=True) for level in self.levels]
        # NaN (sorted last) would break the searches: searched as infinity, and its weight kept apart.
        unknown = torch.zeros(self.channels, 1, dtype=torch.int64, device=device)
        for h, level in enumerate(held):
            missing = level.isnan()
            if missing.any():
                unknown += missing.sum(dim=1, keepdim=True) << h
                held[h] = level.masked_fill(missing, float("inf"))

        def rank(keys: torch.Tensor) -> torch.Tensor:
            values = _values_of_keys(keys.to(torch.int32))
            found = sum(torch.searchsorted(level, values, right=True) << h for h, level in enumerate(held))
            return found - torch.where(keys == _HIGHEST, unknown, 0)

        wanted = torch.tensor(levels, dtype=torch.float64, device=device).mul(self.count).expand(self.channels, -1)
        low = torch.full(wanted.shape, _LOWEST, dtype=torch.int64, device=device)
        high = torch.full(wanted.shape, _HIGHEST, dtype=torch.int64, device=device)
        for _ in range(32):
            middle = (low + high) // 2
            reached = rank(middle)
            enough = (reached >= wanted) & (reached > 0)
            high, low = torch.where(enough, middle, high), torch.where(enough, low, middle + 1)
        reached = rank(high)
        # Plus zero: minus zero's key comes first and reaches the rank of the zeros, which may all be plus zero.
        found = _values_of_keys(high.to(torch.int32)).double() + 0.0
        return torch.where((reached >= wanted) & (reached > 0), found, float("nan"))  # NaN: past every number

    def state(self) -> dict[str, torch.Tensor]:
        found = {f"level{height}": level.cpu() for height, level in enumerate(self.levels)}
        found["info"] = torch.tensor([self.count, self.k, self.seed, self.compactions], dtype=torch.int64)
        return found

    @classmethod
    def from_state(cls, state: Mapping[str, torch.Tensor]) -> QuantileSketch:
        count, k, seed, compactions = (int(n) for n in stored(state, "info", 1, length=4).tolist())
        # Levels are sorted in place: a part's arrays may be read-only, so each is a copy.
        levels = [stored(state, f"level{h}", 2).to(torch.float32, copy=True) for h in range(max(1, _heights(state)))]
        made = cls(levels[0].shape[0], k=k, seed=seed)
        made.count, made.compactions, made.levels = count, compactions, levels
        return made


def _heights(state: Mapping[str, torch.Tensor]) -> int:
    height = 0
    while f"level{height}" in state:
        height += 1
    return height


def _values_of_keys(keys: torch.Tensor) -> torch.Tensor:
    """The float32 values of int32 ``keys`` that sort as the values do (a negative value's magnitude bits turned
    over: the same change both ways)."""
    return (keys ^ ((keys >> 31) & 0x7FFFFFFF)).view(torch.float32)


#: The keys of minus and plus infinity.
_LOWEST, _HIGHEST = -1 - 0x7F800000, 0x7F800000
