"""The covariance of each input's channel vector (its map pooled by the mean over positions), and its principal
components.

Batches combine by the pairwise update of the co-moment matrix (a batch's
deviations from its own mean, then the outer product of the difference of
means), in float64. :attr:`Covariance.matrix` divides by ``n - 1`` as
``numpy.cov`` does. :meth:`Covariance.components` gives its eigenvalues,
largest first (the variance each direction explains), and its unit
eigenvectors, one per column, each signed so that its largest component (the
first of equal ones) is positive.

While a layer has seen few inputs (at most a quarter of its channels), the
covariance has a rank below that count, and the pooled rows are kept (fewer
numbers than the matrix): the components then come from the rows' singular
value decomposition, ``O(n² C)``, and an orthonormal completion of the
directions it finds, instead of the eigendecomposition of the ``C × C``
matrix, ``O(C³)`` (LAPACK's divide and conquer, ``syevd``: a second at
2,048 channels). The eigenvalues past the rank are 0.

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
        self.rows: torch.Tensor | None = torch.zeros(0, channels, dtype=_F64)  # the pooled rows, while few

    @property
    def _most_rows(self) -> int:
        return self.mean.shape[0] // 4

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
        self._keep(pooled)

    def _keep(self, rows: torch.Tensor | None) -> None:
        if self.rows is None or rows is None or self.count > self._most_rows:
            self.rows = None
        else:
            self.rows = torch.cat([self.rows, rows])

    def merge(self, other: Covariance) -> None:
        if not other.count:
            return
        total = self.count + other.count
        delta = other.mean - self.mean
        self.comoment = self.comoment + other.comoment + torch.outer(delta, delta) * (self.count * other.count / total)
        self.mean = self.mean + delta * (other.count / total)
        self.count = total
        self._keep(other.rows)

    @property
    def matrix(self) -> torch.Tensor:
        """The covariance (``n - 1`` in the denominator; zeros for fewer than two inputs)."""
        return self.comoment / max(self.count - 1, 1)

    def components(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(eigenvalues [C], eigenvectors [C, C])`` of :attr:`matrix`, as :func:`principal_components` gives
        them; from the pooled rows while they are kept (see the module's description)."""
        if self.rows is None or self.count < 2:
            return principal_components(self.matrix)
        try:
            _, singular, turned = torch.linalg.svd(self.rows - self.rows.mean(dim=0), full_matrices=False)
        except torch.linalg.LinAlgError:  # the divide and conquer SVD can fail to converge: the matrix's then
            return principal_components(self.matrix)
        values = torch.zeros(self.mean.shape[0], dtype=_F64)
        values[: len(singular)] = singular.square() / (self.count - 1)
        return values, _signed(_completed(turned.T))

    def state(self) -> dict[str, torch.Tensor]:
        found = {"count": torch.tensor(self.count, dtype=torch.int64), "mean": self.mean, "comoment": self.comoment}
        if self.rows is not None:
            found["rows"] = self.rows
        return found

    @classmethod
    def from_state(cls, state: Mapping[str, torch.Tensor]) -> Covariance:
        made = cls(state["mean"].shape[0])
        made.count = int(state["count"])
        made.mean, made.comoment = state["mean"].to(_F64), state["comoment"].to(_F64)
        made.rows = state["rows"].to(_F64) if "rows" in state else None
        return made


def principal_components(matrix: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(eigenvalues [C], eigenvectors [C, C])`` of a symmetric matrix: values largest first, one unit vector per
    column, each signed so that its largest component is positive."""
    from scipy.linalg import eigh  # divide and conquer: faster than MRRR on the low-rank matrices of few inputs

    channels = matrix.shape[0]
    if not matrix.isfinite().all():  # NaN or infinite values came in: there are no components to find
        return torch.full((channels,), float("nan"), dtype=_F64), torch.full_like(matrix, float("nan"), dtype=_F64)
    # LAPACK works on columns: a C-ordered copy, transposed, is the same symmetric matrix in that order, and the
    # eigenvectors come back in its memory (one column each; a row of the copy), smallest first. One C x C copy.
    scratch = matrix.to(_F64, copy=True).numpy()
    found, _ = eigh(scratch.T, driver="evd", overwrite_a=True, check_finite=False)
    for low in range(channels // 2):  # largest first, in place
        high = channels - 1 - low
        scratch[[low, high]] = scratch[[high, low]]
    return torch.from_numpy(found[::-1].copy()), _signed(torch.from_numpy(scratch).T)


def _signed(vectors: torch.Tensor) -> torch.Tensor:
    """``vectors``, each column turned in place where needed so that its largest component (the first of equal
    magnitude) is positive: found from each column's maximum and minimum, with no copy of the matrix."""
    high, at_high = vectors.max(dim=0)  # the first of equal ones
    low, at_low = vectors.min(dim=0)
    turned = (-low > high) | ((-low == high) & (at_low < at_high))
    return vectors.mul_(torch.where(turned, -1.0, 1.0).to(vectors.dtype))


def _completed(basis: torch.Tensor) -> torch.Tensor:
    """``[C, C]``: the ``r`` orthonormal columns of ``basis`` ``[C, r]``, then ``C - r`` more that complete them
    to an orthonormal basis: those of the Householder QR of ``basis``, its reflectors accumulated in one block
    (``Q = I - Y T Yᵀ``, ``T`` by LAPACK's ``larft`` recurrence) and applied to the identity in one product,
    several times faster than LAPACK's ``orgqr`` here."""
    channels, rank = basis.shape
    packed, tau = torch.geqrf(basis)
    reflectors = packed.tril(-1)
    reflectors.diagonal().fill_(1)
    gram = reflectors.T @ reflectors
    block = torch.zeros(rank, rank, dtype=_F64)
    for i in range(rank):
        block[i, i] = tau[i]
        block[:i, i] = -tau[i] * (block[:i, :i] @ gram[:i, i])
    rest = -(reflectors @ block) @ reflectors[rank:].T  # columns rank.. of I - Y T Yᵀ
    rest[rank:] += torch.eye(channels - rank, dtype=_F64)
    return torch.cat([basis, rest], dim=1)
