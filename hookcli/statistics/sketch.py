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

from hookcli.statistics.units import UnitBatch

__all__ = ["DEFAULT_K", "QuantileSketch"]

#: The top level's capacity: the sketch's size and accuracy (rank error about ``2 / k`` at worst in tests).
DEFAULT_K = 4096
#: Each level's capacity against the one above.
_SHRINK = 2 / 3


class QuantileSketch:
    """A KLL sketch of each of ``channels`` channels (see the module's description)."""

    def __init__(self, channels: int, *, k: int = DEFAULT_K, seed: int = 0) -> None:
        self.channels, self.k, self.seed = channels, k, seed
        self.count = 0
        self.compactions = 0
        self.levels: list[np.ndarray] = [np.empty((channels, 0), dtype=np.float32)]

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
            self.levels[0] = np.concatenate([self.levels[0], ordered], axis=1)
        self._compress()

    def merge(self, other: QuantileSketch) -> None:
        if other.k != self.k:
            raise ValueError(f"a sketch of k={other.k} cannot merge into one of k={self.k}")
        for height, level in enumerate(other.levels):
            if height == len(self.levels):
                self.levels.append(level.copy())
            else:
                self.levels[height] = np.concatenate([self.levels[height], level], axis=1)
        self.count += other.count
        self._compress()

    def _capacity(self, height: int) -> int:
        return max(2, math.ceil(self.k * _SHRINK ** (len(self.levels) - 1 - height)))

    def _compress(self) -> None:
        height = 0
        while height < len(self.levels):
            level = self.levels[height]
            if level.shape[1] > self._capacity(height):
                self.levels[height] = np.empty((self.channels, 0), dtype=np.float32)
                # A level is runs already sorted (each compaction's), which a merging sort takes in near one pass.
                self._compact(height, np.sort(level, axis=1, kind="stable"))
            height += 1

    def _compact(self, height: int, ordered: np.ndarray) -> None:
        """Move every other value of ``ordered`` (a level's values, sorted), from a random first one, up a level;
        an odd one out (the largest) stays."""
        kept = ordered.shape[1] % 2
        pairs = ordered[:, : ordered.shape[1] - kept]
        chosen = np.random.default_rng(self.seed * 1_000_003 + self.compactions)
        self.compactions += 1
        start = chosen.integers(0, 2, size=(self.channels, 1))
        up = np.take_along_axis(pairs, start + 2 * np.arange(pairs.shape[1] // 2), axis=1)
        self.levels[height] = np.concatenate([self.levels[height], ordered[:, pairs.shape[1] :]], axis=1)
        if height + 1 == len(self.levels):
            self.levels.append(up)
        else:
            self.levels[height + 1] = np.concatenate([self.levels[height + 1], up], axis=1)

    def quantiles(self, levels: Sequence[float]) -> torch.Tensor:
        """Each channel's value at each of ``levels`` (in [0, 1]), float64 ``[C, Q]``; NaN before any value."""
        if not self.count:
            return torch.full((self.channels, len(levels)), float("nan"), dtype=torch.float64)
        held = np.concatenate(self.levels, axis=1)
        weights = np.concatenate([np.full(level.shape[1], 2.0**h) for h, level in enumerate(self.levels)])
        order = np.argsort(held, axis=1, kind="stable")
        reached = np.cumsum(weights[order], axis=1)
        wanted = np.asarray(levels, dtype=np.float64) * self.count
        found = np.stack([np.searchsorted(row, wanted) for row in reached]).clip(max=held.shape[1] - 1)
        return torch.from_numpy(np.take_along_axis(held, np.take_along_axis(order, found, axis=1), axis=1)).double()

    def state(self) -> dict[str, torch.Tensor]:
        found = {f"level{height}": torch.from_numpy(level) for height, level in enumerate(self.levels)}
        found["info"] = torch.tensor([self.count, self.k, self.seed, self.compactions], dtype=torch.int64)
        return found

    @classmethod
    def from_state(cls, state: Mapping[str, torch.Tensor]) -> QuantileSketch:
        count, k, seed, compactions = (int(n) for n in state["info"].tolist())
        levels = [state[f"level{height}"].to(torch.float32).numpy() for height in range(_heights(state))]
        made = cls(levels[0].shape[0], k=k, seed=seed)
        made.count, made.compactions, made.levels = count, compactions, levels
        return made


def _heights(state: Mapping[str, torch.Tensor]) -> int:
    height = 0
    while f"level{height}" in state:
        height += 1
    return height
