"""What a run that gathers rather than stores rows (``stats``, ``compare``) gathers, as the writer of such runs
(:mod:`hookcli.storage.gathering_writer`) sees it: a :class:`Gathering` makes each shard's empty :class:`Gathered`,
reads one back from a part, and says what the output's metadata and notes hold; a :class:`GatheredShard` is one
shard's, with the inputs it has rows of.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple, Protocol

import torch

from hookcli.errors import UsageProblem
from hookcli.storage.fileformat import RunFacts
from hookcli.storage.stats_format import PART_ROWS

__all__ = [
    "AUTO_SHARDS",
    "MIN_SHARD_INPUTS",
    "Gathered",
    "GatheredShard",
    "Gathering",
    "Made",
    "checked_shard_size",
    "facts_entry",
    "stats_shard_size",
]


#: How many shards the inputs are cut into when no shard size is given...
AUTO_SHARDS = 8
#: ... unless that leaves shards of fewer inputs than this: each shard's state is written, read back and merged
#: (about 0.15 s a shard for resnet50's ``layer3`` and ``layer4``), which would cost a small run more than its
#: forward.
MIN_SHARD_INPUTS = 256


def stats_shard_size(inputs: int, batch_size: int, fewest: int = 1) -> int:
    """The shard size chosen when none is given: an eighth of the inputs, :data:`MIN_SHARD_INPUTS` at least, in
    whole batches, leaving no shard fewer than ``fewest`` rows. It never depends on how many processes share the
    run, so that any number of them give the same file.

    >>> stats_shard_size(200, 16), stats_shard_size(3000, 16), stats_shard_size(10**6, 64), stats_shard_size(600, 3)
    (256, 384, 125056, 258)
    """
    rows = max(-(-inputs // AUTO_SHARDS), MIN_SHARD_INPUTS)
    size = -(-rows // batch_size) * batch_size
    while size < inputs and (size < fewest or 0 < inputs % size < fewest):
        size += batch_size
    return size


def checked_shard_size(given: int | None, inputs: int, batch_size: int, fewest: int) -> int:
    """The shard size of a run over ``inputs`` inputs: ``given``, or :func:`stats_shard_size`'s; refused when it
    leaves a last shard of fewer than ``fewest`` rows."""
    size = given or stats_shard_size(inputs, batch_size, fewest)
    last = inputs % size
    if size < inputs and 0 < last < fewest:
        raise UsageProblem(
            f"--shard-size {size} leaves the last shard {last} of {inputs} inputs, and this run needs {fewest} a "
            "shard at least",
            hint=f"give --shard-size {min(stats_shard_size(inputs, batch_size, fewest), inputs)}, or leave it out",
        )
    return size


class Gathered(Protocol):
    """What one shard (or several, merged) has gathered."""

    def update(self, features: Mapping[str, Any], rows: torch.Tensor) -> None:
        """Add a batch: ``features`` by key, batch-first, from the inputs numbered ``rows``."""
        ...

    def merge(self, other: Any) -> None:
        """Add what a later shard gathered."""
        ...

    def state(self) -> dict[str, torch.Tensor]:
        """Everything it holds, as named tensors (a part's)."""
        ...

    def describe(self) -> dict[str, Any]:
        """What a part's metadata says of it (JSON), to read its state back."""
        ...

    def seal(self) -> None:
        """The shard is complete: nothing more comes (what waits for more rows is gathered now)."""
        ...

    def result(self, positions: torch.Tensor) -> dict[str, torch.Tensor]:
        """The output's tensors; ``positions`` gives each input's row in the output's ``inputs``."""
        ...


class Made(NamedTuple):
    """What a gathering run's output is made of: its ``tensors``, the ``inputs`` they have rows of, those
    ``skipped``, and the run's ``identity``."""

    tensors: Mapping[str, torch.Tensor]
    inputs: list[str]
    skipped: list[dict[str, Any]]
    identity: Mapping[str, Any]


class Gathering(Protocol):
    """What a run gathers: each shard's :class:`Gathered`, and the output's metadata. ``fewest``: the rows a shard
    needs at least; ``merges_on_device``: whether its parts merge on a CUDA run's GPU, as its shards merge in memory
    (accumulators that live where the rows are), rather than on the CPU
    (:func:`~hookcli.storage.parts.merge_device`)."""

    @property
    def fewest(self) -> int: ...

    @property
    def merges_on_device(self) -> bool: ...

    def start(self, number: int) -> Gathered:
        """Shard ``number``'s gathering, empty."""
        ...

    def read(self, state: Mapping[str, torch.Tensor], described: Mapping[str, Any], rows: Sequence[int]) -> Gathered:
        """A part's gathering, from its state, what its metadata says of it and the inputs it has rows of; ValueError
        where the state is not what those rows could make (a part is a file, and files are untrusted)."""
        ...

    def metadata(self, run: Mapping[str, str], made: Made) -> dict[str, str]:
        """The metadata of the output ``made``, from the run's (:func:`~hookcli.storage.fileformat.run_metadata`)."""
        ...

    def notes(self, gathered: Any, tensors: Mapping[str, torch.Tensor], *, inputs: int) -> list[str]:
        """What the output's ``tensors``, which ``gathered`` made of ``inputs`` inputs, call for saying (a
        ``Note:`` each)."""
        ...


class GatheredShard:
    """One shard's gathering, the inputs it has rows of (their numbers and names), those skipped, and what the
    forward learnt."""

    def __init__(self, number: int, gathered: Gathered) -> None:
        self.number, self.gathered = number, gathered
        self.rows: list[int] = []
        self.inputs: list[str] = []
        self.skipped: list[dict[str, Any]] = []
        self.facts: RunFacts | None = None

    @property
    def placed(self) -> int:
        return len(self.rows) + len(self.skipped)

    def state(self) -> dict[str, torch.Tensor]:
        tensors = {name: value.contiguous() for name, value in self.gathered.state().items()}
        tensors[PART_ROWS] = torch.tensor(self.rows, dtype=torch.int64)
        return tensors

    def merge(self, later: GatheredShard) -> None:
        """Add a later shard."""
        self.gathered.merge(later.gathered)
        self.rows += later.rows
        self.inputs += later.inputs
        self.skipped += later.skipped
        self.facts = self.facts or later.facts


def facts_entry(facts: RunFacts | None) -> dict[str, Any]:
    """What a part's ``facts`` metadata says of what the forward learnt."""
    if facts is None:
        return {}
    return {"calls": dict(facts.calls), "omitted": list(facts.omitted), "fused": facts.fused}
