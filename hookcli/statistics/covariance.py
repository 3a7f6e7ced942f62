"""The covariance of each input's channel vector (its map pooled by the mean over positions), and its principal
components.

Batches combine by the pairwise update of the co-moment matrix (a batch's
deviations from its own mean, then the outer product of the difference of
means), in float64. :attr:`Covariance.matrix` divides by ``n - 1`` as
``numpy.cov`` does. :func:`principal_components` gives its eigenvalues,
largest first (the variance each direction explains), and its unit
eigenvectors, one per column (LAPACK's MRRR, ``syevr``), each signed so that its largest component (the
first of equal ones) is positive.

A layer of ``C`` channels holds a ``C × C`` matrix: 32 MiB at 2,048 channels,
and :data:`MAX_CHANNELS` at most.

>>> from hookcli.statistics.units import UnitBatch, UnitLayout
>>> covariance = Covariance(2)
>>> rows = torch.tensor([[1.0, 2.0], [2.0, 4.0], [3.0, 6.0]])
>>> covariance.update(UnitBatch(rows, torch.arange(3), UnitLayout.of((2,))))
>>> covariance.matrix.tolist()
[[1.0, 2.0], [2.0, 4.0]]
>>> values, vectors = principal_components(covariance.matrix)
>>> [round(v, 12) for v in values.tolist()], [round(v, 6) for v in vectors[:, 0].tolist()]
([5.0, 0.0], [0.447214, 0.894427])
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch

from hookcli.statistics.units import UnitBatch

__all__ = ["MAX_CHANNELS", "Covariance", "principal_components"]

#: The widest layer whose covariance is kept: 8,192 channels make a 512 MiB matrix.
MAX_CHANNELS = 8192

_F64 = torch.float64


class Covariance:
    """The running covariance of ``channels`` pooled channels (see the module's description)."""

    def __init__(self, channels: int) -> None:
        self.count = 0
        self.mean = torch.zeros(channels, dtype=_F64)
        self.comoment = torch.zeros(channels, channels, dtype=_F64)

    def update(self, batch: UnitBatch) -> None:
        pooled = batch.pooled
        if not pooled.shape[0]:
            return
        mean = pooled.mean(dim=0)
        deviations = pooled - mean
        count, total = pooled.shape[0], self.count + pooled.shape[0]
        # The batch's co-moment and the correction for the two means in one product, added in place: one pass
        # over the C x C matrix a batch.
        delta = mean - self.mean
        rows = torch.cat([deviations, (delta * math.sqrt(self.count * count / total))[None]])
        self.comoment.addmm_(rows.T, rows)
        self.mean += delta * (count / total)
        self.count = total

    def merge(self, other: Covariance) -> None:
        if not other.count:
            return
        total = self.count + other.count
        delta = other.mean - self.mean
        self.comoment = self.comoment + other.comoment + torch.outer(delta, delta) * (self.count * other.count / total)
        self.mean = self.mean + delta * (other.count / total)
        self.count = total

    @property
    def matrix(self) -> torch.Tensor:
        """The covariance (``n - 1`` in the denominator; zeros for fewer than two inputs)."""
        return self.comoment / max(self.count - 1, 1)

    def state(self) -> dict[str, torch.Tensor]:
        return {"count": torch.tensor(self.count, dtype=torch.int64), "mean": self.mean, "comoment": self.comoment}

    @classmethod
    def from_state(cls, state: Mapping[str, torch.Tensor]) -> Covariance:
        made = cls(state["mean"].shape[0])
        made.count = int(state["count"])
        made.mean, made.comoment = state["mean"].to(_F64), state["comoment"].to(_F64)
        return made


def principal_components(matrix: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(eigenvalues [C], eigenvectors [C, C])`` of a symmetric matrix: values largest first, one unit vector per
    column, each signed so that its largest component is positive."""
    from scipy.linalg import eigh  # LAPACK's MRRR: several times faster than torch's at thousands of channels

    found, turned = eigh(matrix.to(_F64).numpy(), driver="evr")
    values, vectors = torch.from_numpy(found).flip(0), torch.from_numpy(turned).flip(1)
    largest = vectors.abs().argmax(dim=0)
    signs = vectors.gather(0, largest[None]).sign()
    signs[signs == 0] = 1
    return values, vectors * signs
