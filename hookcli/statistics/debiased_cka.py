"""Debiased linear CKA over every input, from running sums: :class:`DebiasedLinearCKA`.

Biased CKA (:class:`~hookcli.statistics.similarity.LinearCKA`) of two
unrelated representations is far from 0 until the inputs well outnumber their
widths. The debiased form replaces each HSIC with the unbiased estimator of
Song et al. (2012), whose value for unrelated representations is 0 in
expectation over any number of inputs (4 at least):

``HSIC_u(K, L) = [tr(K̃L̃) + 1ᵀK̃1 · 1ᵀL̃1 / ((n−1)(n−2)) − 2/(n−2) · 1ᵀK̃L̃1] / (n(n−3))``,

``K̃`` the linear Gram matrix ``XXᵀ`` with its diagonal zeroed. It does not
change when a representation is shifted, so it is computed about the final
column means, where every row sum of ``K`` is 0 and it reduces to

``[‖XcᵀYc‖²_F + A_x A_y / ((n−1)(n−2)) − n/(n−2) · Σ_i ‖xc_i‖² ‖yc_i‖²] / (n(n−3))``

with ``A_x = Σ_i ‖xc_i‖²``. Besides the co-moments linear CKA keeps, it keeps
``Σ_i xc_i ‖yc_i‖²`` for every column and representation (``third``,
``[D, R]``) and ``Σ_i ‖xc_i‖² ‖yc_i‖²`` for every pair (``fourth``,
``[R, R]``), each about its own rows' means, and merges them as the co-moments
are merged: shifted to the joint means (only the means' differences enter),
then added. No raw sum is held whose cancellation would lose a small spread.

>>> from hookcli.statistics.similarity import hsic_unbiased
>>> rng = torch.Generator().manual_seed(0)
>>> x, y = (torch.randn(30, width, generator=rng, dtype=torch.float64) for width in (6, 4))
>>> whole, halves = DebiasedLinearCKA(1, 1), DebiasedLinearCKA(1, 1)
>>> whole.update([x], [y]); halves.update([x[:13]], [y[:13]]); halves.update([x[13:]], [y[13:]])
>>> hsic = lambda a, b: hsic_unbiased(a @ a.T, b @ b.T)
>>> expected = float(hsic(x, y) / (hsic(x, x) * hsic(y, y)).sqrt())
>>> abs(float(whole.result()[0, 0]) - expected) < 1e-12, abs(float(halves.result()[0, 0]) - expected) < 1e-12
(True, True)
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch

from hookcli.errors import CaptureError
from hookcli.statistics.base import stored
from hookcli.statistics.similarity import MIN_BATCH, LinearCKA

__all__ = ["DebiasedLinearCKA"]

_F64 = torch.float64


class DebiasedLinearCKA(LinearCKA):
    """Debiased linear CKA of ``rows`` representations against ``columns`` (one side when ``same``), from running
    float64 sums (see the module); needs :data:`~hookcli.statistics.similarity.MIN_BATCH` inputs at least."""

    def __init__(self, rows: int, columns: int, *, same: bool = False) -> None:
        super().__init__(rows, columns, same=same)
        self.third: torch.Tensor | None = None  # [D, R]: Σ xc_i ‖yc_i‖², a column x of each representation y
        self.fourth: torch.Tensor | None = None  # [R, R]: Σ ‖xc_i‖² ‖yc_i‖²

    def update(self, first: Sequence[torch.Tensor], second: Sequence[torch.Tensor]) -> None:
        representations = first if self.same else [*first, *second]
        joined = torch.cat([x.to(_F64) for x in representations], dim=1)
        batch = DebiasedLinearCKA(*self.shape, same=self.same)
        batch.widths = [x.shape[1] for x in representations]
        batch.count, batch.mean = joined.shape[0], joined.mean(dim=0)
        centred = joined - batch.mean
        squares = centred.square() @ batch._members(joined.device)  # [n, R]: each row's squared norm, a representation
        batch.comoment, batch.third, batch.fourth = centred.T @ centred, centred.T @ squares, squares.T @ squares
        self.merge(batch)

    def merge(self, other: LinearCKA) -> None:
        assert isinstance(other, DebiasedLinearCKA), "debiased sums merge with debiased sums"
        if not other.count:
            return
        if self.mean is None:
            self.count, self.mean, self.comoment, self.widths = other.count, other.mean, other.comoment, other.widths
            self.third, self.fourth = other.third, other.fourth
            return
        assert other.mean is not None and other.third is not None and other.fourth is not None
        device = self.mean.device
        total = self.count + other.count
        joint = self.mean + (other.mean.to(device) - self.mean) * (other.count / total)
        mine = self._shifted(self.mean - joint)
        theirs = other._shifted(other.mean.to(device) - joint)
        super().merge(other)  # the counts, the means and the co-moments, by the pairwise update
        self.third, self.fourth = mine[0] + theirs[0], mine[1] + theirs[1]

    def _members(self, device) -> torch.Tensor:
        """``[D, R]``: 1 where a column belongs to a representation."""
        members = torch.zeros(sum(self.widths), len(self.widths), dtype=_F64, device=device)
        for number, block in enumerate(self._blocks()):
            members[block, number] = 1
        return members

    def _shifted(self, shift: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``third`` and ``fourth`` about means moved by ``shift`` (the old means less the new)."""
        assert self.comoment is not None and self.third is not None and self.fourth is not None
        device = self.comoment.device
        members = self._members(device)
        shift, third, fourth = shift.to(device), self.third.to(device), self.fourth.to(device)
        spread = torch.diagonal(self.comoment) @ members  # [R]: Σ ‖xc_i‖², a representation
        moved = shift.square() @ members  # [R]: ‖shift‖², a representation
        parted = shift[:, None] * members  # [D, R]: the shift of each representation alone
        pulled = self.comoment @ parted  # [D, R]
        across = parted.T @ third  # [R, R]: shift_xᵀ Σ xc_i ‖yc_i‖²
        n = self.count
        third = third + 2 * pulled + torch.outer(shift, spread) + n * torch.outer(shift, moved)
        fourth = (
            fourth
            + 2 * (across + across.T)
            + torch.outer(spread, moved)
            + torch.outer(moved, spread)
            + 4 * parted.T @ pulled
            + n * torch.outer(moved, moved)
        )
        return third, fourth

    def result(self) -> torch.Tensor:
        """Debiased CKA of each pair, float64 ``[A, B]`` (NaN where a representation's unbiased HSIC with itself
        is not positive: no spread, or too few inputs to show it)."""
        if self.comoment is None:
            return torch.full(self.shape, float("nan"), dtype=_F64)
        n = self.count
        if n < MIN_BATCH:
            raise CaptureError(
                f"debiased CKA needs {MIN_BATCH} inputs at least, and the run had {n}",
                hint="give more inputs, or leave out --debiased",
            )
        assert self.fourth is not None
        blocks, comoment, fourth = self._blocks(), self.comoment.cpu(), self.fourth.cpu()
        spread = torch.stack([torch.diagonal(comoment[b, b]).sum() for b in blocks])

        def hsic(x: int, y: int) -> torch.Tensor:
            cross = comoment[blocks[x], blocks[y]]
            summed = (cross * cross).sum() + spread[x] * spread[y] / ((n - 1) * (n - 2)) - fourth[x, y] * n / (n - 2)
            return summed / (n * (n - 3))

        rows, columns = self.shape
        second = range(columns) if self.same else range(rows, rows + columns)
        own = [hsic(x, x) for x in range(len(blocks))]
        found = torch.empty(self.shape, dtype=_F64)
        for i in range(rows):
            for j, y in enumerate(second):
                scale = own[i] * own[y]
                found[i, j] = hsic(i, y) / math.sqrt(scale) if scale > 0 and own[i] > 0 else float("nan")
        return found

    def state(self) -> dict[str, torch.Tensor]:
        state = super().state()
        if self.third is not None and self.fourth is not None:
            state.update(third=self.third.cpu(), fourth=self.fourth.cpu())
        return state

    @classmethod
    def from_state(cls, state: Mapping[str, torch.Tensor], rows: int, columns: int, *, same: bool) -> DebiasedLinearCKA:
        plain = LinearCKA.from_state(state, rows, columns, same=same)
        made = cls(rows, columns, same=same)
        made.count, made.mean, made.comoment, made.widths = plain.count, plain.mean, plain.comoment, plain.widths
        if made.count:
            made.third, made.fourth = stored(state, "third", 2).to(_F64), stored(state, "fourth", 2).to(_F64)
            width, count = sum(made.widths), len(made.widths)
            if made.third.shape != (width, count) or made.fourth.shape != (count, count):
                raise ValueError(f"its debiased sums are not of shapes [{width}, {count}] and [{count}, {count}]")
        return made
