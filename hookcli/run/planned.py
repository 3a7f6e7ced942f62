"""A run with nothing left to decide (:class:`RunPlan`), as :func:`hookcli.api.plan` makes it and
:func:`hookcli.run.execute.execute` runs it."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass

from hookcli.models.loaded import LoadedModel
from hookcli.run.commands import COMMANDS
from hookcli.run.launch import Part
from hookcli.run.outputs import Output
from hookcli.run.pipeline import iter_batches
from hookcli.run.settings import Batch, RunSettings
from hookcli.run.targets import Target
from hookcli.run.team import Team
from hookcli.statistics.layer import StatsChoice
from hookcli.storage.fileformat import RunRecord
from hookcli.storage.rows_writer import RowsWriter

__all__ = ["RunPlan"]


@dataclass(frozen=True)
class RunPlan:
    """A run with nothing left to decide. Build one with :func:`plan`, run it with :func:`execute`.

    ``record`` is the run as its files describe it; ``forward`` builds the
    forward strategy; ``notes`` are said when the run starts.
    """

    command: str
    loaded: LoadedModel
    layers: Mapping[str, str]
    inputs: tuple[os.PathLike[str], ...]  # files, tar members, clips or frame pairs (hookcli.inputs)
    settings: RunSettings
    output: Output
    record: RunRecord
    forward: Callable
    shard_size: int | None = None
    force: bool = False
    grid: str | None = None
    target: Target | None = None  # what grad and cam take gradients of
    cam_look: Mapping | None = None
    notes: tuple[str, ...] = ()
    part: Part | None = None  # this process's share of a shard folder written by many
    team: Team | None = None  # torchrun's process group, left when the run ends
    stats: StatsChoice | None = None  # what a statistics run gathers

    @property
    def batch_size(self) -> int:
        return self.settings.batch_size

    def writer(self, note: Callable[[str], None]) -> RowsWriter:
        """The writer its command keeps its rows with."""
        return COMMANDS[self.command].writer(self, note)

    def batches(self, order: Iterable[list[int]], writer: RowsWriter, note: Callable[[str], None]) -> Iterator[Batch]:
        """The model run over the inputs of each list of indices in ``order`` (a picture of each image made as it
        is decoded, when ``writer`` draws one)."""
        yield from iter_batches(self.loaded, self.layers, self.inputs, self.settings, forward=self.forward, order=order,
                                on_note=note, picture=getattr(writer, "picture", None),
                                rows_on_device=COMMANDS[self.command].rows_on_device)  # fmt: skip
