"""How alike two sets of representations are, gathered a batch at a time: linear CKA from running sums, the
minibatch CKA estimator, and representational similarity analysis.

Each accumulator compares every representation of one side (``A`` of them,
``[n, d_a]`` each, the same rows in the same order) with every one of the
other (``B``), and merges with another over other rows:

- :class:`LinearCKA` is exact linear CKA (Kornblith et al., 2019) in feature
  space: ``‖XcᵀYc‖²_F / (‖XcᵀXc‖_F ‖YcᵀYc‖_F)`` from each pair's co-moment
  ``XcᵀYc`` (``Xc``: ``X`` less its column means), kept in float64 and merged
  by the pairwise update (a batch's deviations from its own means, then the
  product of the differences of means), never from raw sums whose
  cancellation loses small spreads. It holds ``(Σd_a + Σd_b)²`` numbers:
  representations of up to :data:`MAX_WIDTH` values in all.
- :class:`MinibatchCKA` is the estimator of Nguyen, Raghu and Kornblith (2021):
  the unbiased HSIC of Song et al. (2012) of each minibatch's linear Gram
  matrices, averaged over minibatches, then normalised. A minibatch needs 4
  rows at least; what it holds is three sums a pair, whatever the width.
- :class:`RSARows` keeps the first ``limit`` rows of each representation, from
  which :func:`dissimilarities` makes each one's RDM (``1 − Pearson
  correlation`` between rows, or their Euclidean distance) and
  :func:`compare_rdms` compares their upper triangles by Spearman's, Pearson's
  or Kendall's correlation.

A representation with no spread (every row the same) has no CKA: its entries
are NaN, and :func:`undefined` names them.

>>> rng = torch.Generator().manual_seed(0)
>>> x = torch.randn(50, 8, generator=rng, dtype=torch.float64)
>>> cka = LinearCKA(2, 1)
>>> cka.update([x, 3 * x], [x @ torch.linalg.qr(torch.randn(8, 8, generator=rng, dtype=torch.float64))[0]])
>>> [round(v, 12) for v in cka.result()[:, 0].tolist()]
[1.0, 1.0]
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import torch

from hookcli.statistics.base import stored
from hookcli.storage.compare_format import MOST_COLUMNS

__all__ = [
    "MAX_WIDTH",
    "MIN_BATCH",
    "LinearCKA",
    "MinibatchCKA",
    "RSARows",
    "compare_rdms",
    "dissimilarities",
    "hsic_unbiased",
    "undefined",
]

#: The widest representation linear CKA keeps the co-moments of (values a row): wider ones want ``minibatch-cka``
#: or pooling.
MAX_WIDTH = MOST_COLUMNS
#: The fewest rows the unbiased HSIC is defined for.
MIN_BATCH = 4

_F64 = torch.float64


def check_widths(mine: LinearCKA, other: LinearCKA) -> None:
    """Refuse (ValueError) to merge sums over representations of other widths (a part of another run, or one
    whose widths were changed): they would pair columns that are not each other's."""
    if mine.count and other.count and mine.widths != other.widths:
        raise ValueError(f"its representations' widths {other.widths} are not the other parts' {mine.widths}")


class LinearCKA:
    """Exact linear CKA of ``sides[0]`` representations against ``sides[1]`` (one side when ``same``: each
    compared with each other), from running float64 co-moments (see the module)."""

    def __init__(self, rows: int, columns: int, *, same: bool = False) -> None:
        self.shape, self.same = (rows, columns), same
        self.count = 0
        self.mean: torch.Tensor | None = None  # every representation's column means, one after the other
        self.comoment: torch.Tensor | None = None  # [D, D] over the columns of every representation
        self.widths: list[int] = []

    def update(self, first: Sequence[torch.Tensor], second: Sequence[torch.Tensor]) -> None:
        """Add a batch: ``first`` (and ``second``) as ``[n, d]`` tensors, the same rows in each."""
        joined = self._joined(first, second)
        mean = joined.mean(dim=0)
        self._add(mean, joined - mean)

    def _joined(self, first: Sequence[torch.Tensor], second: Sequence[torch.Tensor]) -> torch.Tensor:
        """A batch's representations side by side, ``[n, D]`` float64 (the widths noted from the first)."""
        representations = first if self.same else [*first, *second]
        joined = torch.cat([x.to(_F64) for x in representations], dim=1)
        if self.mean is None:
            self.widths = [x.shape[1] for x in representations]
        return joined

    def _add(self, mean: torch.Tensor, centred: torch.Tensor) -> None:
        """Add a batch of rows, given as their means and the rows less them."""
        if self.mean is None:
            self.mean = torch.zeros(centred.shape[1], dtype=_F64, device=centred.device)
            self.comoment = torch.zeros(centred.shape[1], centred.shape[1], dtype=_F64, device=centred.device)
        assert self.comoment is not None, "made with the means"
        count, total = centred.shape[0], self.count + centred.shape[0]
        delta = mean - self.mean
        rows = torch.cat([centred, (delta * math.sqrt(self.count * count / total))[None]])
        self.comoment.addmm_(rows.T, rows)  # the batch's co-moment and the means' correction, in one product
        self.mean += delta * (count / total)
        self.count = total

    def merge(self, other: LinearCKA) -> None:
        if not other.count:
            return
        check_widths(self, other)
        if self.mean is None or self.comoment is None:
            self.count, self.mean, self.comoment, self.widths = other.count, other.mean, other.comoment, other.widths
            return
        assert other.mean is not None and other.comoment is not None, "a count comes with its sums"
        total = self.count + other.count
        other_mean, other_comoment = other.mean.to(self.mean.device), other.comoment.to(self.mean.device)
        delta = other_mean - self.mean
        self.comoment = self.comoment + other_comoment + torch.outer(delta, delta) * (self.count * other.count / total)
        self.mean = self.mean + delta * (other.count / total)
        self.count = total

    def _blocks(self) -> list[slice]:
        ends = np.cumsum([0, *self.widths])
        return [slice(int(a), int(b)) for a, b in zip(ends[:-1], ends[1:])]

    def result(self) -> torch.Tensor:
        """CKA of each pair, float64 ``[A, B]`` (NaN where a representation has no spread)."""
        rows, columns = self.shape
        if self.comoment is None:
            return torch.full(self.shape, float("nan"), dtype=_F64)
        blocks = self._blocks()
        second = blocks if self.same else blocks[rows:]
        comoment = self.comoment.cpu()
        norms = [torch.linalg.matrix_norm(comoment[b, b]) for b in blocks]
        second_norms = norms if self.same else norms[rows:]
        found = torch.empty(self.shape, dtype=_F64)
        for i in range(rows):
            for j in range(columns):
                cross = comoment[blocks[i], second[j]]
                found[i, j] = (cross * cross).sum() / (norms[i] * second_norms[j])
        return found

    def check_part(self, rows: int) -> None:
        """Refuse (ValueError) sums read from a part that its ``rows`` inputs could not have made."""
        if self.count not in (0, rows):
            raise ValueError(f"its linear-cka sums count {self.count} inputs, not its {rows}")

    def state(self) -> dict[str, torch.Tensor]:
        if self.comoment is None or self.mean is None:
            return {"count": torch.tensor(0, dtype=torch.int64)}
        return {
            "count": torch.tensor(self.count, dtype=torch.int64),
            "widths": torch.tensor(self.widths, dtype=torch.int64),
            "mean": self.mean.cpu(),
            "comoment": self.comoment.cpu(),
        }

    @classmethod
    def from_state(cls, state: Mapping[str, torch.Tensor], rows: int, columns: int, *, same: bool) -> LinearCKA:
        made = cls(rows, columns, same=same)
        made.count = int(stored(state, "count", 0))
        if made.count:
            representations = rows if same else rows + columns
            made.widths = [int(n) for n in stored(state, "widths", 1, length=representations).tolist()]
            if min(made.widths) < 1 or sum(made.widths) > MAX_WIDTH:
                raise ValueError(f"its widths {made.widths} are not those of {representations} representations")
            made.mean, made.comoment = stored(state, "mean", 1).to(_F64), stored(state, "comoment", 2).to(_F64)
            if sum(made.widths) != made.mean.shape[0] or made.comoment.shape != (made.mean.shape[0],) * 2:
                raise ValueError("its widths, means and co-moments disagree")
            if bool((made.comoment.diagonal() < 0).any()):
                raise ValueError("its co-moments give a column a negative variance")
        return made


def hsic_unbiased(first: torch.Tensor, second: torch.Tensor) -> torch.Tensor:
    """The unbiased HSIC (Song et al., 2012) of two ``[m, m]`` Gram matrices, ``m`` ≥ 4, in float64."""
    m = first.shape[0]
    k = first.to(_F64).clone()
    ell = second.to(_F64).clone()
    k.fill_diagonal_(0)
    ell.fill_diagonal_(0)
    ones_k, ones_l = k.sum(dim=1), ell.sum(dim=1)
    trace = (k * ell).sum()
    return (trace + ones_k.sum() * ones_l.sum() / ((m - 1) * (m - 2)) - 2 * (ones_k @ ones_l) / (m - 2)) / (m * (m - 3))


def _varied(x: torch.Tensor) -> torch.Tensor:
    """Whether the rows of a minibatch of one representation are not all alike (on its device: no wait for it, and
    no copy of the batch)."""
    flat = x.reshape(x.shape[0], -1)
    return (flat.amax(dim=0) != flat.amin(dim=0)).any()


class MinibatchCKA:
    """The minibatch CKA estimator of ``rows`` representations against ``columns`` (see the module): sums over
    minibatches of each pair's unbiased HSIC and of each representation's with itself."""

    def __init__(self, rows: int, columns: int, *, same: bool = False) -> None:
        self.shape, self.same = (rows, columns), same
        self.batches = 0
        self.cross = torch.zeros(rows, columns, dtype=_F64)
        self.first = torch.zeros(rows, dtype=_F64)
        self.second = torch.zeros(columns, dtype=_F64)
        # The batches whose rows of each representation differ: a representation whose rows are alike in every one
        # has no spread (its self-HSIC sums to rounding noise of either sign, never exactly 0).
        self.varied_first = torch.zeros(rows, dtype=torch.int64)
        self.varied_second = torch.zeros(columns, dtype=torch.int64)

    def update(self, first: Sequence[torch.Tensor], second: Sequence[torch.Tensor]) -> None:
        """Add a minibatch of at least :data:`MIN_BATCH` rows (the caller makes them so)."""
        size = first[0].shape[0]
        if size < MIN_BATCH:
            raise ValueError(f"a minibatch of {size} rows: the unbiased HSIC takes {MIN_BATCH} at least")
        grams = [self._gram(x) for x in first]
        others = grams if self.same else [self._gram(y) for y in second]
        self._to(grams[0].device)
        own = torch.stack([hsic_unbiased(g, g) for g in grams])
        self.first += own
        self.second += own if self.same else torch.stack([hsic_unbiased(g, g) for g in others])
        self.cross += torch.stack([torch.stack([hsic_unbiased(g, h) for h in others]) for g in grams])
        varied = torch.stack([_varied(x) for x in first]).to(torch.int64)
        self.varied_first += varied
        self.varied_second += varied if self.same else torch.stack([_varied(y) for y in second]).to(torch.int64)
        self.batches += 1

    @staticmethod
    def _gram(x: torch.Tensor) -> torch.Tensor:
        """The batch's Gram matrix, of its rows less their mean: the unbiased HSIC is the same of either, and without
        a large common offset its sums do not cancel to rounding noise."""
        flat = x.reshape(x.shape[0], -1).to(_F64)
        flat = flat - flat.mean(dim=0)
        return flat @ flat.T

    def _to(self, device) -> None:
        """The sums on ``device``, where the minibatches are."""
        self.cross, self.first, self.second = (t.to(device) for t in (self.cross, self.first, self.second))
        self.varied_first, self.varied_second = self.varied_first.to(device), self.varied_second.to(device)

    def merge(self, other: MinibatchCKA) -> None:
        device = self.cross.device
        self.batches += other.batches
        self.varied_first += other.varied_first.to(self.varied_first.device)
        self.varied_second += other.varied_second.to(self.varied_second.device)
        self.cross += other.cross.to(device)
        self.first += other.first.to(device)
        self.second += other.second.to(device)

    def result(self) -> torch.Tensor:
        """The estimate of each pair, float64 ``[A, B]`` (NaN where a representation has no spread)."""
        if not self.batches:
            return torch.full(self.shape, float("nan"), dtype=_F64)
        first, second, cross = self.first.cpu(), self.second.cpu(), self.cross.cpu()
        scale = torch.sqrt(first[:, None] * second[None, :])
        varied_first, varied_second = self.varied_first.cpu(), self.varied_second.cpu()
        defined = (scale > 0) & (varied_first[:, None] > 0) & (varied_second[None, :] > 0)
        return torch.where(defined, cross / scale, torch.full_like(scale, float("nan")))

    def check_part(self, rows: int) -> None:
        """Refuse (ValueError) sums read from a part that its ``rows`` inputs could not have made."""
        if not 0 <= self.batches <= rows // MIN_BATCH:
            raise ValueError(f"its minibatch-cka sums count {self.batches} batches of its {rows} inputs")
        for varied in (self.varied_first.cpu(), self.varied_second.cpu()):
            if bool(((varied < 0) | (varied > self.batches)).any()):
                raise ValueError(f"its minibatch-cka sums count batches of spread beyond its {self.batches}")

    def state(self) -> dict[str, torch.Tensor]:
        return {
            "batches": torch.tensor(self.batches, dtype=torch.int64),
            "cross": self.cross.cpu(),
            "first": self.first.cpu(),
            "second": self.second.cpu(),
            "varied_first": self.varied_first.cpu(),
            "varied_second": self.varied_second.cpu(),
        }

    @classmethod
    def from_state(cls, state: Mapping[str, torch.Tensor], rows: int, columns: int, *, same: bool) -> MinibatchCKA:
        made = cls(rows, columns, same=same)
        made.batches = int(stored(state, "batches", 0))
        made.cross = stored(state, "cross", 2).to(_F64)
        made.first, made.second = stored(state, "first", 1).to(_F64), stored(state, "second", 1).to(_F64)
        made.varied_first = stored(state, "varied_first", 1, length=rows).to(torch.int64)
        made.varied_second = stored(state, "varied_second", 1, length=columns).to(torch.int64)
        if made.cross.shape != (rows, columns) or made.first.shape != (rows,) or made.second.shape != (columns,):
            raise ValueError("its sums do not have the comparison's shape")
        return made


class RSARows:
    """The first ``limit`` rows of each representation, by row number, in float64, for RDMs made at the end."""

    def __init__(self, count: int, limit: int) -> None:
        self.count, self.limit = count, limit
        self.rows: list[list[torch.Tensor]] = [[] for _ in range(count)]
        self.kept = 0

    def update(self, representations: Sequence[torch.Tensor], rows: torch.Tensor) -> None:
        wanted = int((rows < self.limit).sum())  # rows come in order: the first ones are those below the limit
        if wanted:
            for kept, x in zip(self.rows, representations):  # a few rows, kept on the CPU for the RDMs
                kept.append(x[:wanted].reshape(wanted, -1).to("cpu", _F64))
            self.kept += wanted

    def merge(self, other: RSARows) -> None:
        for kept, more in zip(self.rows, other.rows):
            kept.extend(more)
        self.kept += other.kept

    def matrices(self) -> list[torch.Tensor]:
        return [torch.cat(kept) if kept else torch.empty(0, 0) for kept in self.rows]

    def check_part(self, rows: int) -> None:
        """Refuse (ValueError) rows read from a part that its ``rows`` inputs could not have made."""
        if not 0 <= self.kept <= rows:
            raise ValueError(f"it keeps {self.kept} rows for the RDMs of its {rows} inputs")

    def state(self) -> dict[str, torch.Tensor]:
        return {str(number): matrix for number, matrix in enumerate(self.matrices())}

    @classmethod
    def from_state(cls, state: Mapping[str, torch.Tensor], count: int, limit: int) -> RSARows:
        made = cls(count, limit)
        for number in range(count):
            matrix = stored(state, str(number), 2).to(_F64)
            if matrix.numel():
                made.rows[number].append(matrix)
        made.kept = made.rows[0][0].shape[0] if made.rows and made.rows[0] else 0
        return made


def dissimilarities(rows: torch.Tensor, distance: str = "correlation") -> torch.Tensor:
    """The RDM of ``rows`` ``[r, d]``: ``1 −`` the Pearson correlation of each pair of rows, or their Euclidean
    distance; float64 ``[r, r]``. A row with no spread has no correlation: NaN; and every distance is NaN where a
    value is not finite."""
    x = rows.to(_F64).reshape(rows.shape[0], -1)
    if not bool(x.isfinite().all()):  # values that are not finite: no distances, the representation undefined
        return torch.full((x.shape[0], x.shape[0]), float("nan"), dtype=_F64, device=x.device)
    if distance == "euclidean":
        return torch.cdist(x, x).fill_diagonal_(0)
    centred = x - x.mean(dim=1, keepdim=True)
    norms = centred.norm(dim=1)
    scaled = centred / norms[:, None]
    return (1 - scaled @ scaled.T).fill_diagonal_(0)


def compare_rdms(first: torch.Tensor, second: torch.Tensor, ranking: str = "spearman") -> float:
    """How alike two RDMs are: Spearman's, Pearson's or Kendall's (tau-b) correlation of their upper triangles
    (the diagonal left out), over the pairs both define (a row with no spread has no correlation distance to any:
    its pairs are left out); NaN with fewer than 3 such pairs, or none that differ."""
    from scipy import stats  # the statistics of ranks, loaded when RDMs are compared

    upper = torch.triu_indices(first.shape[0], first.shape[0], offset=1)
    a, b = first[upper[0], upper[1]].numpy(), second[upper[0], upper[1]].numpy()
    defined = np.isfinite(a) & np.isfinite(b)
    a, b = a[defined], b[defined]
    if len(a) < 3 or a.std() == 0 or b.std() == 0:
        return float("nan")
    if ranking == "pearson":
        return float(stats.pearsonr(a, b).statistic)
    if ranking == "kendall":
        return float(stats.kendalltau(a, b).statistic)
    return float(stats.spearmanr(a, b).statistic)


def undefined(result: torch.Tensor, first: Sequence[str], second: Sequence[str]) -> list[str]:
    """The representations whose row or column of ``result`` is NaN: those with no spread."""
    nan = torch.isnan(result)
    return [first[i] for i in range(len(first)) if nan[i].all()] + [
        second[j] for j in range(len(second)) if nan[:, j].all() and second[j] not in first
    ]
