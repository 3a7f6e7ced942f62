"""Each comparison method's sums behind one interface (:class:`MethodSums`): what a shard of ``hookcli compare``
keeps of the representations it is given, and the tensors the file holds of them. :data:`SUMS` names the class of
each method; :class:`~hookcli.statistics.comparison.GatheredComparison` holds one and asks it, never its class.

>>> sides = Sides(keys=("a", "b"), rows=2, columns=2, same=True, labels=(["a", "b"], ["a", "b"]))
>>> sums = SUMS["linear-cka"](sides, debiased=False)
>>> x = torch.randn(6, 4, dtype=torch.float64)
>>> sums.update([x, 3 * x], torch.arange(6))
>>> [[round(v, 9) for v in row] for row in sums.tensors()["linear-cka"].tolist()]
[[1.0, 1.0], [1.0, 1.0]]
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

import torch

from hookcli.errors import UsageProblem
from hookcli.statistics.debiased_cka import DebiasedLinearCKA
from hookcli.statistics.similarity import (
    MAX_WIDTH,
    MIN_BATCH,
    LinearCKA,
    MinibatchCKA,
    RSARows,
    compare_rdms,
    dissimilarities,
)
from hookcli.storage.compare_format import RDM, second_names

__all__ = ["SUMS", "MethodSums", "Sides", "linear_cka"]


@dataclass(frozen=True)
class Sides:
    """What is compared: every representation's ``keys`` (the first side's ``rows`` of them, then the second's
    ``columns``, or the first side with itself when ``same``) and the ``labels`` of the file's rows and columns."""

    keys: tuple[str, ...]
    rows: int
    columns: int
    same: bool
    labels: tuple[list[str], list[str]]

    def split(self, representations: list[torch.Tensor]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """The first side's representations and the second's (none when ``same``)."""
        return representations[: self.rows], representations[self.rows :]


class MethodSums(Protocol):
    """One method's sums over the rows of a shard (or of shards merged)."""

    def update(self, representations: list[torch.Tensor], rows: torch.Tensor) -> None:
        """Add a batch: each representation ``[n, d]`` (in the order of :attr:`Sides.keys`) of inputs ``rows``."""
        ...

    def seal(self) -> None:
        """The shard is complete: rows still waiting for more are added now."""
        ...

    def merge(self, other: Any) -> None:
        """Add a later shard's sums (of the same method and sides)."""
        ...

    def state(self) -> dict[str, torch.Tensor]:
        """The sums as named tensors, for a part."""
        ...

    def check_part(self, inputs: int) -> None:
        """Refuse (ValueError) sums read from a part that its ``inputs`` inputs could not have made."""
        ...

    def tensors(self) -> dict[str, torch.Tensor]:
        """The comparison file's tensors: the matrix under the method's name, and what else the method keeps."""
        ...

    def widest(self) -> tuple[str, int] | None:
        """The label and width of the widest representation, where reading the matrix needs more inputs than
        values a row (plain linear CKA); None otherwise."""
        ...


def linear_cka(debiased: bool) -> type[LinearCKA]:
    """The accumulator of linear CKA, plain or ``debiased``."""
    return DebiasedLinearCKA if debiased else LinearCKA


_Accumulator = TypeVar("_Accumulator", LinearCKA, MinibatchCKA, RSARows)


class _Sums(Generic[_Accumulator]):
    """What the three methods' sums share: an accumulator, ``sums``, that merges, states and checks itself."""

    sums: _Accumulator

    def seal(self) -> None:
        pass

    def merge(self, other: Any) -> None:
        self.sums.merge(other.sums)

    def state(self) -> dict[str, torch.Tensor]:
        return self.sums.state()

    def check_part(self, inputs: int) -> None:
        self.sums.check_part(inputs)

    def widest(self) -> tuple[str, int] | None:
        return None


class LinearSums(_Sums[LinearCKA]):
    """Linear CKA's co-moments (:class:`~hookcli.statistics.similarity.LinearCKA`, or its debiased form)."""

    method = "linear-cka"

    def __init__(self, sides: Sides, *, debiased: bool = False, **_: Any) -> None:
        self.sides, self.debiased = sides, debiased
        self.sums = linear_cka(debiased)(sides.rows, sides.columns, same=sides.same)

    @classmethod
    def read(cls, state: Mapping[str, torch.Tensor], sides: Sides, *, debiased: bool = False, **_: Any) -> LinearSums:
        made = cls(sides, debiased=debiased)
        made.sums = linear_cka(debiased).from_state(state, sides.rows, sides.columns, same=sides.same)
        return made

    def update(self, representations: list[torch.Tensor], rows: torch.Tensor) -> None:
        _refuse_wide_comoments(self.sides.keys, representations)
        self.sums.update(*self.sides.split(representations))

    def tensors(self) -> dict[str, torch.Tensor]:
        found = {self.method: self.sums.result()}
        if self.sums.count:
            found.update({f"{self.method}@{name}": value for name, value in self.sums.state().items()})
        return found

    def widest(self) -> tuple[str, int] | None:
        if self.debiased or not self.sums.count:
            return None  # the debiased estimator reads alike however wide the representations
        labels = self.sides.labels[0] + ([] if self.sides.same else self.sides.labels[1])
        return max(zip(labels, self.sums.widths), key=lambda pair: pair[1])


class MinibatchSums(_Sums[MinibatchCKA]):
    """The minibatch CKA estimator's sums (:class:`~hookcli.statistics.similarity.MinibatchCKA`) over the run's
    batches; a batch of fewer than 4 rows (a shard's last, or one with inputs skipped) joins the one before it in
    its shard (or the next, for a shard's first), so that the estimate is never NaN."""

    method = "minibatch-cka"

    def __init__(self, sides: Sides, **_: Any) -> None:
        self.sides = sides
        self.sums = MinibatchCKA(sides.rows, sides.columns, same=sides.same)
        self.pending: list[torch.Tensor] | None = None  # the batch waiting for the next one

    @classmethod
    def read(cls, state: Mapping[str, torch.Tensor], sides: Sides, **_: Any) -> MinibatchSums:
        made = cls(sides)
        made.sums = MinibatchCKA.from_state(state, sides.rows, sides.columns, same=sides.same)
        return made

    def update(self, representations: list[torch.Tensor], rows: torch.Tensor) -> None:
        if self.pending is None:
            self.pending = representations
        elif min(self.pending[0].shape[0], representations[0].shape[0]) < MIN_BATCH:
            self.pending = [torch.cat([a, b]) for a, b in zip(self.pending, representations)]
        else:
            self.sums.update(*self.sides.split(self.pending))
            self.pending = representations

    def seal(self) -> None:
        if self.pending is None:
            return
        if self.pending[0].shape[0] < MIN_BATCH:
            raise UsageProblem(
                f"a shard of {self.pending[0].shape[0]} rows: minibatch CKA needs batches of at least {MIN_BATCH}",
                hint="choose a --shard-size and --batch-size that leave every shard 4 rows or more",
            )
        self.sums.update(*self.sides.split(self.pending))
        self.pending = None

    def tensors(self) -> dict[str, torch.Tensor]:
        return {self.method: self.sums.result()}


class RSASums(_Sums[RSARows]):
    """RSA's rows (:class:`~hookcli.statistics.similarity.RSARows`): the first ``rsa_rows`` of each representation,
    made into RDMs and compared by rank at the end; ``save_rdms`` keeps each RDM in the file."""

    method = "rsa"

    def __init__(
        self,
        sides: Sides,
        *,
        rsa_rows: int = 1000,
        rsa_distance: str = "correlation",
        rsa_compare: str = "spearman",
        save_rdms: bool = False,
        **_: Any,
    ) -> None:
        self.sides, self.distance, self.ranking, self.save_rdms = sides, rsa_distance, rsa_compare, save_rdms
        self.sums = RSARows(len(sides.keys), rsa_rows)

    @classmethod
    def read(cls, state: Mapping[str, torch.Tensor], sides: Sides, **settings: Any) -> RSASums:
        made = cls(sides, **settings)
        made.sums = RSARows.from_state(state, len(sides.keys), made.sums.limit)
        return made

    def update(self, representations: list[torch.Tensor], rows: torch.Tensor) -> None:
        self.sums.update(representations, rows)

    def tensors(self) -> dict[str, torch.Tensor]:
        matrices = [dissimilarities(rows, self.distance) for rows in self.sums.matrices()]
        first, second = self.sides.split(matrices)
        second = second or first
        found = {
            self.method: torch.tensor(
                [[compare_rdms(a, b, self.ranking) for b in second] for a in first], dtype=torch.float64
            )  # fmt: skip
        }
        if self.save_rdms:
            mine, theirs = self.sides.labels
            # A second side's label the first has too (two models' layer4) is stored as 2:<label>.
            labels = mine + ([] if self.sides.same else second_names(mine, theirs))
            found.update({f"{RDM}{label}": rdm.to(torch.float32) for label, rdm in zip(labels, matrices)})
        return found


#: Each method's sums.
SUMS: dict[str, type[LinearSums] | type[MinibatchSums] | type[RSASums]] = {
    sums.method: sums for sums in (LinearSums, MinibatchSums, RSASums)
}


def _refuse_wide_comoments(keys: Sequence[str], representations: list[torch.Tensor]) -> None:
    """Linear CKA keeps one float64 co-moment over every representation's values together: refuse, before it is
    made, one wider than :data:`MAX_WIDTH` values in all."""
    total = sum(x.shape[1] for x in representations)
    if total > MAX_WIDTH:
        widths = ", ".join(f"{key} {x.shape[1]:,}" for key, x in zip(keys, representations))
        raise UsageProblem(
            f"the representations give {total:,} values a row together ({widths}): linear CKA keeps the "
            f"co-moments of at most {MAX_WIDTH:,} (a {MAX_WIDTH:,}² matrix)",
            hint="pool them (--pool avg), compare fewer at once, or use --method minibatch-cka",
        )
