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
``[R, R]``). A batch's sums are taken about its own means and moved to a fixed
point, the first batch's means (only the difference of the means enters, and
the batch's own rows); the state a file keeps, and a merge, take them about the
running means, as the co-moments are. No raw sum is held whose cancellation
would lose a small spread. A representation with a value that is not finite
has no CKA (its co-moments say so); its debiased sums are taken as 0 wherever
they meet another's, so that they leave the others' as they are.

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
from hookcli.statistics.similarity import MIN_BATCH, LinearCKA, check_widths

__all__ = ["DebiasedLinearCKA"]

_F64 = torch.float64


class DebiasedLinearCKA(LinearCKA):
    """Debiased linear CKA of ``rows`` representations against ``columns`` (one side when ``same``), from running
    float64 sums (see the module); needs :data:`~hookcli.statistics.similarity.MIN_BATCH` inputs at least."""

    def __init__(self, rows: int, columns: int, *, same: bool = False) -> None:
        super().__init__(rows, columns, same=same)
        self.third: torch.Tensor | None = None  # [D, R]: Σ xc_i ‖yc_i‖², a column x of each representation y
        self.fourth: torch.Tensor | None = None  # [R, R]: Σ ‖xc_i‖² ‖yc_i‖²
        # What third and fourth are taken about while batches are added: a fixed point (the first batch's means),
        # so that a batch shifts by the difference of its means alone, without a pass over the [D, D] co-moments.
        # None: about the running means (once merged or read back).
        self.reference: torch.Tensor | None = None
        self._made_members: dict[str, torch.Tensor] = {}

    def update(self, first: Sequence[torch.Tensor], second: Sequence[torch.Tensor]) -> None:
        joined = self._joined(first, second)
        members = self._members(joined.device)
        count, mean = joined.shape[0], joined.mean(dim=0)
        centred = joined - mean
        clean, clean_mean = _finite(centred), _finite(mean)
        squares = clean.square() @ members  # [n, R]: each row's squared norm, a representation
        third, fourth, spread = clean.T @ squares, squares.T @ squares, squares.sum(dim=0)
        if self.third is None or self.fourth is None or self.mean is None:
            self.third, self.fourth, self.reference = third, fourth, clean_mean
        else:
            if self.reference is None:
                self.reference = _finite(self.mean)  # the running means, held still (a copy: they change in place)
            shift = clean_mean - self.reference
            # The batch's co-moments enter only against the shift: Σ yc (yc·s), without making the [D, D] matrix.
            pulled = clean.T @ (clean @ (shift[:, None] * members))
            moved = _shifted(count, third, fourth, spread, shift, members, pulled=pulled)
            self.third, self.fourth = self.third + moved[0], self.fourth + moved[1]
        self._add(mean, centred)  # the means and co-moments, as plain CKA keeps them

    def merge(self, other: LinearCKA) -> None:
        assert isinstance(other, DebiasedLinearCKA), "debiased sums merge with debiased sums"
        if not other.count:
            return
        check_widths(self, other)
        if self.mean is None:
            self.count, self.mean, self.comoment, self.widths = other.count, other.mean, other.comoment, other.widths
            self.third, self.fourth, self.reference = other.third, other.fourth, other.reference
            return
        assert other.mean is not None and other.comoment is not None and self.comoment is not None
        device = self.mean.device
        members = self._members(device)
        mine, theirs = self._about_means(), other._about_means()
        total = self.count + other.count
        joint = self.mean + (other.mean.to(device) - self.mean) * (other.count / total)
        comoment = other.comoment.to(device)
        held = _shifted(self.count, *mine, self._spread(members), self.mean - joint, members, self.comoment)
        spread = _finite(torch.diagonal(comoment)) @ members
        moved = _shifted(
            other.count, theirs[0].to(device), theirs[1].to(device), spread, other.mean.to(device) - joint, members,
            comoment,
        )  # fmt: skip
        super().merge(other)  # the counts, the means and the co-moments, by the pairwise update
        self.third, self.fourth, self.reference = held[0] + moved[0], held[1] + moved[1], None

    def _about_means(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``third`` and ``fourth`` about the running means (one pass over the co-moments): the sums about the
        reference are those about the means moved to it, so the move is taken back."""
        assert self.third is not None and self.fourth is not None
        if self.reference is None:
            return self.third, self.fourth
        assert self.mean is not None and self.comoment is not None, "made with the means"
        members = self._members(self.comoment.device)
        shift, spread = _finite(self.mean) - self.reference, self._spread(members)
        pulled = _finite(self.comoment) @ (shift[:, None] * members)
        third = self.third - _moves(self.count, self.third, spread, shift, members, pulled=pulled)[0]
        return third, self.fourth - _moves(self.count, third, spread, shift, members, pulled=pulled)[1]

    def _members(self, device) -> torch.Tensor:
        """``[D, R]``: 1 where a column belongs to a representation (made once a device, not once a batch)."""
        made = self._made_members.get(str(device))
        if made is None or made.shape != (sum(self.widths), len(self.widths)):
            made = torch.zeros(sum(self.widths), len(self.widths), dtype=_F64, device=device)
            for number, block in enumerate(self._blocks()):
                made[block, number] = 1
            self._made_members[str(device)] = made
        return made

    def _spread(self, members: torch.Tensor) -> torch.Tensor:
        """``[R]``: Σ ‖xc_i‖² of each representation, the traces of its co-moments."""
        assert self.comoment is not None, "made with the means"
        return _finite(torch.diagonal(self.comoment)) @ members

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
        blocks, comoment, fourth = self._blocks(), self.comoment.cpu(), self._about_means()[1].cpu()
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
            third, fourth = self._about_means()
            state.update(third=third.cpu(), fourth=fourth.cpu())
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


def _shifted(
    count: int,
    third: torch.Tensor,
    fourth: torch.Tensor,
    spread: torch.Tensor,
    shift: torch.Tensor,
    members: torch.Tensor,
    comoment: torch.Tensor | None = None,
    *,
    pulled: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``third`` and ``fourth`` of ``count`` rows, taken about their means, about the means moved by ``shift`` (the
    means less the new point). ``spread`` is each representation's Σ ‖xc_i‖²; the co-moments (about the means)
    enter only as ``comoment @ (shift by representation)``, given whole (``comoment``) or already made (``pulled``)."""
    moved = _moves(count, third, spread, shift, members, comoment, pulled)
    return third + moved[0], fourth + moved[1]


def _moves(count, third, spread, shift, members, comoment=None, pulled=None) -> tuple[torch.Tensor, torch.Tensor]:
    """What :func:`_shifted` adds to ``third`` and to ``fourth`` (``third``: about the means)."""
    third, spread, shift = _finite(third), _finite(spread), _finite(shift)
    moved = shift.square() @ members  # [R]: ‖shift‖², a representation
    parted = shift[:, None] * members  # [D, R]: the shift of each representation alone
    if pulled is None:
        assert comoment is not None, "the co-moments or their product with the shift"
        pulled = _finite(comoment) @ parted  # [D, R]
    pulled = _finite(pulled)
    across = parted.T @ third  # [R, R]: shift_xᵀ Σ xc_i ‖yc_i‖²
    third_added = 2 * pulled + torch.outer(shift, spread) + count * torch.outer(shift, moved)
    fourth_added = (
        2 * (across + across.T)
        + torch.outer(spread, moved)
        + torch.outer(moved, spread)
        + 4 * parted.T @ pulled
        + count * torch.outer(moved, moved)
    )
    return third_added, fourth_added


def _finite(values: torch.Tensor) -> torch.Tensor:
    """``values`` with 0 for each value that is not finite (a copy): what a representation that holds one adds to the
    others' sums, where a product with its 0 in ``members`` would make them NaN."""
    return torch.nan_to_num(values, nan=0.0, posinf=0.0, neginf=0.0)
