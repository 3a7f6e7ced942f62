"""Each channel's count, mean, standard deviation, minimum, maximum and share of exact zeros over every value it
takes, in float64.

Values combine by Chan, Golub and LeVeque's pairwise update (each row's mean and sum of squared deviations from
it, merged with the batch's other rows, and the batch's into the running ones), never by a running sum of squares,
whose cancellation loses the variance of channels with a large mean. ``std`` is the population standard deviation
(``numpy.std``'s default, ``ddof=0``).

>>> from hookcli.statistics.units import UnitBatch, UnitLayout
>>> layout = UnitLayout.of((2, 1, 3))  # two channels, three positions
>>> first, second = Moments(2), Moments(2)
>>> first.update(UnitBatch(torch.tensor([[[[0.0, 1, 2]], [[5, 5, 5]]]]), torch.tensor([0]), layout))
>>> second.update(UnitBatch(torch.tensor([[[[3.0, 4, 5]], [[5, 5, 0]]]]), torch.tensor([1]), layout))
>>> first.merge(second)
>>> first.count, first.mean.tolist(), first.std.tolist()[0] ** 2, first.zeros.tolist()
(6, [2.5, 4.166666666666667], 2.9166666666666665, [0.16666666666666666, 0.16666666666666666])
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from hookcli.statistics.base import stored
from hookcli.statistics.units import UnitBatch

__all__ = ["Moments"]

_F64 = torch.float64


class Moments:
    """Running moments of ``channels`` channels (see the module's description)."""

    def __init__(self, channels: int, *, device=None) -> None:
        self.count = 0
        self._mean = torch.zeros(channels, dtype=_F64, device=device)
        self._squares = torch.zeros(channels, dtype=_F64, device=device)  # the sum of squared deviations from the mean
        self.min = torch.full((channels,), float("inf"), dtype=_F64, device=device)
        self.max = torch.full((channels,), float("-inf"), dtype=_F64, device=device)
        self._zeros = torch.zeros(channels, dtype=torch.int64, device=device)

    def update(self, batch: UnitBatch) -> None:
        means = batch.pooled  # each row's mean, and its squared deviations: groups of equal size, merged
        if not means.shape[0]:
            return
        mean = means.mean(dim=0)
        squares = batch.spread.sum(dim=0) + batch.layout.positions * (means - mean).square().sum(dim=0)
        if batch.maps.dtype == torch.float32:  # sorted for the quantiles already: the ends are the extremes
            ordered = batch.ordered
            low, high = ordered[:, 0].to(_F64), ordered[:, -1].to(_F64)
            low = torch.where(high.isnan(), high, low)  # NaN sorts last: a channel that has one has no minimum
            zero = torch.zeros(ordered.shape[0], 1, device=ordered.device)
            zeros = (torch.searchsorted(ordered, zero, right=True) - torch.searchsorted(ordered, zero))[:, 0]
        else:  # float64 values, which the sorted float32 copy would round
            low, high = batch.values.amin(dim=1), batch.values.amax(dim=1)
            zeros = (batch.values == 0).sum(dim=1)
        self._combine(means.shape[0] * batch.layout.positions, mean, squares, low, high)
        self._zeros += zeros

    def merge(self, other: Moments) -> None:
        if other.count:
            device = self._mean.device
            mean, squares, low, high = (t.to(device) for t in (other._mean, other._squares, other.min, other.max))
            self._combine(other.count, mean, squares, low, high)
            self._zeros += other._zeros.to(device)

    def _combine(self, count: int, mean, squares, low, high) -> None:
        total = self.count + count
        if self.count:
            delta = mean - self._mean
            # An infinite mean stays infinite (NaN against one of the other sign), as numpy's mean of the values gives:
            # the update's difference of two of them would be NaN, or turn an infinite one NaN.
            infinite = self._mean.isinf() | mean.isinf()
            self._mean = torch.where(infinite, self._mean + mean, self._mean + delta * (count / total))
            self._squares = self._squares + squares + delta * delta * (self.count * count / total)
        else:
            self._mean, self._squares = mean.clone(), squares.clone()
        self.count = total
        self.min = torch.minimum(self.min, low)
        self.max = torch.maximum(self.max, high)

    @property
    def mean(self) -> torch.Tensor:
        return self._mean

    @property
    def std(self) -> torch.Tensor:
        return (self._squares / max(self.count, 1)).sqrt()

    @property
    def zeros(self) -> torch.Tensor:
        """The share of each channel's values that are exactly zero."""
        return self._zeros.to(_F64) / max(self.count, 1)

    def state(self) -> dict[str, torch.Tensor]:
        return {
            "count": torch.tensor(self.count, dtype=torch.int64),
            "mean": self._mean.cpu(),
            "squares": self._squares.cpu(),
            "min": self.min.cpu(),
            "max": self.max.cpu(),
            "zeros": self._zeros.cpu(),
        }

    @classmethod
    def from_state(cls, state: Mapping[str, torch.Tensor]) -> Moments:
        mean = stored(state, "mean", 1)
        made = cls(mean.shape[0])
        made.count = int(stored(state, "count", 0))
        made._mean, made._squares = mean.to(_F64), stored(state, "squares", 1).to(_F64)
        made.min, made.max = stored(state, "min", 1).to(_F64), stored(state, "max", 1).to(_F64)
        made._zeros = stored(state, "zeros", 1).to(torch.int64)
        return made
