"""What ``hookcli compare`` gathers: the representations of two sides (or of one, with itself) made from a batch's
features, fed to the method's accumulator (:mod:`hookcli.statistics.similarity`) shard by shard, and the
comparison file they make (:mod:`hookcli.storage.compare_format`).

A representation is a key's rows pooled over their positions (``pool`` ``avg`` or ``max``, as the channels and
positions of :class:`~hookcli.statistics.units.UnitLayout` say: the mean or maximum of each channel) or flattened
whole (``none``). Each method has its default (:data:`DEFAULT_POOL`).

>>> choice = CompareChoice(method="linear-cka")
>>> gathering = CompareGathering(choice, first=["a", "b"], labels=(["a", "b"], ["a", "b"]))
>>> shard = gathering.start(0)
>>> x = torch.randn(6, 4, 3, 3)
>>> shard.update({"a": x, "b": 2 * x}, torch.arange(6))
>>> shard.seal()
>>> [[round(v, 9) for v in row] for row in shard.result(torch.arange(6))["linear-cka"].tolist()]
[[1.0, 1.0], [1.0, 1.0]]
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from hookcli.errors import CaptureError, UsageProblem
from hookcli.options.compare import CompareOptions
from hookcli.statistics.comparison_sums import SUMS, MethodSums, Sides
from hookcli.statistics.similarity import MAX_WIDTH, MIN_BATCH, undefined
from hookcli.statistics.units import UnitLayout, width_of
from hookcli.storage.compare_format import MOST_LABELS, compare_metadata
from hookcli.storage.gathering import Made

__all__ = [
    "DEFAULT_POOL",
    "FEWEST_INPUTS",
    "CompareChoice",
    "CompareGathering",
    "GatheredComparison",
    "few_inputs_note",
    "no_spread_note",
]

#: How each method pools a representation unless told: linear CKA keeps a width-squared state and RSA a row of
#: each representation, so both pool by the mean; the minibatch estimator takes maps whole.
DEFAULT_POOL = {"linear-cka": "avg", "minibatch-cka": "none", "rsa": "avg"}


#: The fewest inputs over which a comparison's matrix is read without a note. Below it (and, for linear CKA, below
#: a representation's width) similarities are dominated by chance: biased CKA of unrelated representations of
#: width ``p`` over ``n`` inputs is far from 0 while ``n`` is not well above ``p``, and an RDM of ``n`` inputs has
#: only ``n(n-1)/2`` pairs to correlate.
FEWEST_INPUTS = 100


def few_inputs_note(inputs: int, widest: tuple[str, int] | None = None) -> str | None:
    """What a comparison over ``inputs`` inputs says when they are too few to read its matrix (None when they are
    enough); ``widest``: the label and width of the widest representation, where the method's reading needs more
    inputs than values a row.

    >>> few_inputs_note(3, ("layer3", 256))
    "3 inputs are too few to read the matrix: give more than the 256 values a row of 'layer3' (with fewer, \
similarities are high even between unrelated representations)"
    >>> few_inputs_note(40, ("fc", 10))[:69]
    '40 inputs are too few to read the matrix: give 100 at least, and more'
    >>> few_inputs_note(500, ("layer3", 256)) is None
    True
    """
    width = widest[1] if widest is not None else 0
    if inputs >= FEWEST_INPUTS and inputs > width:
        return None
    more = f", and more than the {width:,} values a row of '{widest[0]}'" if widest is not None else ""
    if widest is not None and width >= FEWEST_INPUTS:
        more = f"more than the {width:,} values a row of '{widest[0]}'"
    else:
        more = f"{FEWEST_INPUTS} at least" + more
    why = "similarities are high even between unrelated representations" if widest else "similarities are noise"
    counted = f"{inputs:,} input{'s are' if inputs != 1 else ' is'}"
    return f"{counted} too few to read the matrix: give {more} (with fewer, {why})"


def no_spread_note(label: str) -> str:
    """What a run or a merge says of representation ``label``, whose similarities are undefined."""
    return (
        f"'{label}' has no spread (every row alike, or values that are not finite): its similarities are undefined, "
        "NaN in the file"
    )


@dataclass(frozen=True)
class CompareChoice(CompareOptions):
    """How to compare, as ``hookcli compare``'s options say (:class:`hookcli.options.compare.CompareOptions`), with
    the pool filled in from the method's :data:`DEFAULT_POOL`."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.pool is None:
            object.__setattr__(self, "pool", DEFAULT_POOL[self.method])
        if self.debiased and self.method != "linear-cka":
            raise UsageProblem(
                f"--debiased applies to linear-cka, not {self.method}",
                hint="leave it out (minibatch-cka's estimator is unbiased already), or give --method linear-cka",
            )

    def check_inputs(self, count: int) -> None:
        """Refuse, before any work, a debiased or minibatch comparison of fewer inputs than its estimator needs."""
        if (self.debiased or self.method == "minibatch-cka") and count < MIN_BATCH:
            what = "debiased CKA" if self.debiased else "minibatch CKA"
            other = "leave out --debiased" if self.debiased else "use another --method"
            raise UsageProblem(
                f"{what} needs {MIN_BATCH} inputs at least, and {count} {'were' if count != 1 else 'was'} given",
                hint=f"give more inputs, or {other}",
            )

    def check_batches(self, batch_size: int) -> None:
        """Refuse batches too small for the minibatch estimator, which takes the run's: each must have the rows the
        unbiased HSIC needs."""
        if self.method == "minibatch-cka" and batch_size < MIN_BATCH:
            raise UsageProblem(
                f"minibatch-cka takes the run's batches, and a batch of {batch_size} rows is too few for the unbiased "
                f"estimator ({MIN_BATCH} at least)",
                hint=f"give --batch-size {MIN_BATCH} or more (the minibatch is the batch)",
            )

    def describe(self) -> dict:
        """The settings a comparison file records (``settings``)."""
        found: dict = {"pool": self.pool}
        if self.debiased:
            found["estimator"] = "debiased"
        if self.method == "rsa":
            found.update(rows=self.rsa_rows, distance=self.rsa_distance, ranking=self.rsa_compare)
        if self.method == "minibatch-cka":
            found["minibatch"] = f"the run's batches (at least {MIN_BATCH} rows)"
        return found

    def identity(self) -> dict:
        found = dataclasses.asdict(self)
        if not self.debiased:
            del found["debiased"]  # as runs made before the choice existed say it
        return found


class CompareGathering:
    """Compares the keys ``first`` of a batch's features with the keys ``second`` (None: ``first`` with itself),
    labelled ``labels`` (rows, columns) in the file. ``prefix_tokens`` and ``square`` say how a row's channels
    are read (:class:`~hookcli.statistics.units.UnitLayout`)."""

    def __init__(
        self,
        choice: CompareChoice,
        *,
        first: Sequence[str],
        second: Sequence[str] | None = None,
        labels: tuple[Sequence[str], Sequence[str]],
        prefix_tokens: tuple[int | None, int | None] = (None, None),
        square: tuple[bool, bool] = (False, False),
        widths: Mapping[str, int | None] | None = None,
    ) -> None:
        self.choice, self.first, self.second = choice, list(first), None if second is None else list(second)
        self.labels = (list(labels[0]), list(labels[1]))
        widest = max(len(self.first), len(self.second or ()))
        if widest > MOST_LABELS:
            raise UsageProblem(
                f"a side of the comparison has {widest:,} representations, more than a comparison holds "
                f"({MOST_LABELS:,})",
                hint="compare fewer layers or keys at once",
            )
        self.prefix_tokens, self.square, self.widths = prefix_tokens, square, dict(widths or {})
        self.layouts: dict[str, UnitLayout] = {}
        rows, columns = len(self.first), len(self.second or self.first)
        self.sides = Sides(tuple(self.keys), rows, columns, self.second is None, self.labels)
        #: What the method's sums take of the choice.
        self.settings = {
            name: value for name, value in dataclasses.asdict(choice).items() if name not in ("method", "pool")
        }

    @property
    def fewest(self) -> int:
        """The fewest rows a shard may have: a minibatch's least."""
        return MIN_BATCH if self.choice.method == "minibatch-cka" else 1

    @property
    def merges_on_device(self) -> bool:
        """CKA's sums merge where the rows were (a GPU's float64 products); RSA's rows are kept on the CPU."""
        return self.choice.method != "rsa"

    @property
    def keys(self) -> list[str]:
        return self.first + (self.second or [])

    def start(self, number: int) -> GatheredComparison:
        return GatheredComparison(self)

    def read(self, state: Mapping[str, torch.Tensor], described: Mapping, inputs: Sequence[int]) -> GatheredComparison:
        own = {name.partition("/")[2]: value for name, value in state.items()}
        sums = SUMS[self.choice.method].read(own, self.sides, **self.settings)
        sums.check_part(len(inputs))
        return GatheredComparison(self, sums)

    def representation(self, key: str, value, side: int) -> torch.Tensor:
        """A key's rows as ``[n, d]``: pooled over their positions, or flattened."""
        if isinstance(value, list):
            raise CaptureError(
                f"'{key}' has rows of their own shapes: a comparison needs every row of a representation in one shape",
                hint="give the models inputs of one size (--resize and --crop), or choose other layers",
            )
        if self.choice.pool == "none":
            flat = value.reshape(value.shape[0], -1)
        else:
            if key not in self.layouts:
                self.layouts[key] = UnitLayout.of(
                    value.shape[1:],
                    prefix_tokens=self.prefix_tokens[side],
                    channels_last=self.square[side],
                    key=key,
                    width=width_of(self.widths, key),
                )
            units = self.layouts[key].units(value)
            flat = units.amax(dim=2) if self.choice.pool == "max" else units.to(torch.float64).mean(dim=2)
        if self.choice.method == "linear-cka" and flat.shape[1] > MAX_WIDTH:
            weights = key.endswith("@attention")  # each value its own unit: pooling leaves them as they are
            raise UsageProblem(
                f"'{key}' gives {flat.shape[1]:,} values a row: linear CKA keeps the co-moments of at most "
                f"{MAX_WIDTH:,} (a {MAX_WIDTH:,}² matrix)",
                hint="keep less of the weights (extract --attention class or class-mean), or use --method rsa or "
                "minibatch-cka"
                if weights
                else "pool it (--pool avg), or use --method minibatch-cka, which takes maps whole",
            )
        return flat

    def notes(self, gathered: GatheredComparison, tensors: Mapping[str, torch.Tensor], *, inputs: int) -> list[str]:
        """The representations whose similarities are undefined (NaN in the matrix), and whether its ``inputs``
        inputs are too few to read it."""
        few = few_inputs_note(inputs, gathered.widest())
        return [no_spread_note(label) for label in self._undefined(tensors)] + ([few] if few else [])

    def _undefined(self, tensors: Mapping[str, torch.Tensor]) -> list[str]:
        return undefined(tensors[self.choice.method], *self.labels)

    def metadata(self, run: Mapping[str, str], made: Made) -> dict[str, str]:
        return compare_metadata(
            run,
            method=self.choice.method,
            rows=self.labels[0],
            columns=self.labels[1],
            settings=self.choice.describe(),
            inputs=made.inputs,
            skipped=made.skipped,
            identity=made.identity,
            same=self.second is None,
            undefined=self._undefined(made.tensors),
        )


class GatheredComparison:
    """What one shard (or several, merged) gathered for a comparison: the representations of each batch, made from
    its features, added to the method's sums (:mod:`hookcli.statistics.comparison_sums`)."""

    def __init__(self, gathering: CompareGathering, sums: MethodSums | None = None) -> None:
        self.gathering = gathering
        self.sums: MethodSums = sums or SUMS[gathering.choice.method](gathering.sides, **gathering.settings)

    def update(self, features: Mapping, rows: torch.Tensor) -> None:
        gathering = self.gathering
        for key in gathering.keys:
            if key not in features:
                elements = [name for name in features if name.startswith(f"{key}#")]
                raise CaptureError(
                    f"'{key}' returns several values ({', '.join(elements) or 'none a tensor'}): a comparison takes "
                    "layers that return one tensor",
                    hint=f"choose another layer, or extract this one and compare the value saved, as "
                    f"hookcli compare FILE -k '{elements[0] if elements else key}'",
                )
        representations = [
            gathering.representation(key, features[key], 0 if n < len(gathering.first) else 1)
            for n, key in enumerate(gathering.keys)
        ]
        self.sums.update(representations, rows)

    def seal(self) -> None:
        self.sums.seal()

    def merge(self, other: GatheredComparison) -> None:
        self.sums.merge(other.sums)

    def state(self) -> dict[str, torch.Tensor]:
        return {f"{self.gathering.choice.method}/{name}": value for name, value in self.sums.state().items()}

    def describe(self) -> dict:
        return {"method": self.gathering.choice.method}

    def result(self, positions: torch.Tensor) -> dict[str, torch.Tensor]:
        return self.sums.tensors()

    def widest(self) -> tuple[str, int] | None:
        return self.sums.widest()
