"""The covariance of each input's channel vector (its map pooled by the mean over positions), and its principal
components.

Batches combine by the pairwise update of the co-moment matrix (a batch's
deviations from its own mean, then the outer product of the difference of
means), in float64. :attr:`Covariance.matrix` divides by ``n - 1`` as
``numpy.cov`` does. :meth:`Covariance.components` gives its eigenvalues,
largest first (the variance each direction explains), and its unit
eigenvectors, one per column, each signed so that its largest component (the
first of equal ones) is positive.

While a layer has seen few inputs (at most a third of its channels), the
covariance has a rank below that count, and the pooled rows are what is kept
(fewer numbers than the matrix, which is made from them in one product when it
is asked for): the components then come from the rows' singular value
decomposition, ``O(n² C)``, and an orthonormal completion of the directions it
finds, instead of the eigendecomposition of the ``C × C`` matrix, ``O(C³)``
(LAPACK's divide and conquer, ``syevd``: a second at 2,048 channels). The
eigenvalues past the rank are 0. Past that count the rows make the mean and
co-moment, and batches update those.

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

import contextlib
import functools
import math
from collections.abc import Iterator, Mapping

import torch

from hookcli.statistics.base import stored
from hookcli.statistics.units import UnitBatch
from hookcli.storage.stats_format import MOST_COVARIED

__all__ = ["MAX_CHANNELS", "Covariance", "principal_components"]

#: The widest layer whose covariance is kept: 8,192 channels make a 512 MiB matrix.
MAX_CHANNELS = MOST_COVARIED

_F64 = torch.float64


class Covariance:
    """The running covariance of ``channels`` pooled channels (see the module's description).

    While few, the pooled rows themselves are the state (``rows``; ``mean``
    and ``comoment`` None); past :attr:`most_rows`, the mean and co-moment
    matrix (computed from the rows in one go, then updated batch by batch).
    """

    def __init__(self, channels: int, *, device=None) -> None:
        self.channels, self.count = channels, 0
        self.rows: torch.Tensor | None = torch.zeros(0, channels, dtype=_F64, device=device)
        self.mean: torch.Tensor | None = None
        self.comoment: torch.Tensor | None = None

    @property
    def most_rows(self) -> int:
        """The rows kept at most: a third of the channels (past about half, the decomposition of the matrix is as
        quick as the rows')."""
        return self.channels // 3

    def update(self, batch: UnitBatch) -> None:
        pooled = batch.pooled
        if not pooled.shape[0]:
            return
        if self.rows is not None and self.count + pooled.shape[0] <= self.most_rows:
            self.rows = torch.cat([self.rows, pooled])
            self.count += pooled.shape[0]
            return
        mean, comoment = self._moments()
        batch_mean = pooled.mean(dim=0)
        count, total = pooled.shape[0], self.count + pooled.shape[0]
        # The batch's co-moment and the correction for the two means in one product, added in place: one pass
        # over the C x C matrix a batch.
        delta = batch_mean - mean
        rows = torch.cat([pooled - batch_mean, (delta * math.sqrt(self.count * count / total))[None]])
        comoment.addmm_(rows.T, rows)
        mean += delta * (count / total)
        self.count = total

    def _moments(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The mean and co-moment, made from the rows (which go) the first time they are asked for."""
        if self.mean is None or self.comoment is None:
            assert self.rows is not None, "the rows or the moments are kept"
            self.mean, self.comoment = _moments_of(self.rows, self.channels)
            self.rows = None
        return self.mean, self.comoment

    def merge(self, other: Covariance) -> None:
        if not other.count:
            return
        device = (self.rows if self.rows is not None else self.mean).device  # type: ignore[union-attr]
        if self.rows is not None and other.rows is not None and self.count + other.count <= self.most_rows:
            self.rows = torch.cat([self.rows, other.rows.to(device)])
            self.count += other.count
            return
        mean, comoment = self._moments()
        other_mean, other_comoment = (
            (other.mean, other.comoment) if other.rows is None else _moments_of(other.rows, self.channels)
        )
        assert other_mean is not None and other_comoment is not None, "the rows or the moments are kept"
        other_mean, other_comoment = other_mean.to(device), other_comoment.to(device)
        total = self.count + other.count
        delta = other_mean - mean
        comoment += other_comoment
        comoment.add_(torch.outer(delta, delta), alpha=self.count * other.count / total)
        mean += delta * (other.count / total)
        self.count = total

    @property
    def matrix(self) -> torch.Tensor:
        """The covariance (``n - 1`` in the denominator; zeros for fewer than two inputs)."""
        if self.rows is not None:
            return _moments_of(self.rows, self.channels)[1].div_(max(self.count - 1, 1))
        assert self.comoment is not None, "the rows or the moments are kept"
        return self.comoment / max(self.count - 1, 1)

    def components(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(eigenvalues [C], eigenvectors [C, C])`` of :attr:`matrix`, as :func:`principal_components` gives
        them; from the pooled rows while they are kept (see the module's description)."""
        if self.rows is None or self.count < 2:
            return principal_components(self.matrix.cpu())
        rows = self.rows.cpu()
        with one_thread():
            try:
                _, singular, turned = torch.linalg.svd(rows - rows.mean(dim=0), full_matrices=False)
            except torch.linalg.LinAlgError:  # the divide and conquer SVD can fail to converge: the matrix's then
                return principal_components(self.matrix.cpu())
            values = torch.zeros(self.channels, dtype=_F64)
            values[: len(singular)] = singular.square() / (self.count - 1)
            return values, _signed(_completed(turned.T))

    def state(self) -> dict[str, torch.Tensor]:
        found = {"count": torch.tensor(self.count, dtype=torch.int64)}
        if self.rows is not None:
            return {**found, "rows": self.rows.cpu()}
        assert self.mean is not None and self.comoment is not None, "the rows or the moments are kept"
        return {**found, "mean": self.mean.cpu(), "comoment": self.comoment.cpu()}

    @classmethod
    def from_state(cls, state: Mapping[str, torch.Tensor]) -> Covariance:
        if "rows" in state:
            rows = stored(state, "rows", 2)
            made = cls(rows.shape[1])
            made.rows = rows.to(_F64)
        else:
            mean, comoment = stored(state, "mean", 1), stored(state, "comoment", 2)
            made = cls(mean.shape[0])
            made.rows, made.mean, made.comoment = None, mean.to(_F64), comoment.to(_F64)
        made.count = int(stored(state, "count", 0))
        return made


def _moments_of(rows: torch.Tensor, channels: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The mean and co-moment matrix (the sum of the outer products of the deviations) of ``rows``."""
    if not rows.shape[0]:
        zeros = functools.partial(torch.zeros, dtype=_F64, device=rows.device)
        return zeros(channels), zeros(channels, channels)
    mean = rows.mean(dim=0)
    deviations = rows - mean
    return mean, deviations.T @ deviations


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
    with one_thread():
        found, _ = eigh(scratch.T, driver="evd", overwrite_a=True, check_finite=False)
    for low in range(channels // 2):  # largest first, in place
        high = channels - 1 - low
        scratch[[low, high]] = scratch[[high, low]]
    return torch.from_numpy(found[::-1].copy()), _signed(torch.from_numpy(scratch).T)


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """LAPACK (scipy's and torch's) on one thread inside: its results depend on how many threads it runs, and a
    stats file is the same bytes whichever process merges it, of however many threads."""
    from threadpoolctl import threadpool_limits

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with threadpool_limits(limits=1):
            yield
    finally:
        torch.set_num_threads(threads)


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
