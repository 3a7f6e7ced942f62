"""The interface every writer of a run's rows offers (:class:`RowsWriter`): the memory, file, stdout and shard-folder
writers (:mod:`hookcli.storage.writers`), a gathering run's (:mod:`hookcli.storage.gathering_writer`) and the CAM
pictures' (:mod:`hookcli.pictures.cams`). :func:`hookcli.run.execute.execute` feeds one: ``begin``, then ``add``
for each batch of the inputs it asks for, then ``finish`` (``abort`` on a failure)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from hookcli.parsing import Part
    from hookcli.storage.fileformat import RunRecord

__all__ = ["GatheringRun", "RowsWriter"]


class RowsWriter(Protocol):
    """The interface every writer offers (see the module): what :func:`hookcli.run.execute.execute` feeds."""

    @property
    def done(self) -> int:
        """Inputs an earlier run (or another process) did, known once :meth:`begin` returns."""
        ...

    @property
    def kept(self) -> str | None:
        """Where their work is, when that is not the output itself."""
        ...

    @property
    def written(self) -> Sequence[str | Path]:
        """The paths to report once :meth:`finish` returns, in order."""
        ...

    @property
    def complete(self) -> bool:
        """Whether the output held every input once :meth:`finish` returned."""
        ...

    @property
    def finisher(self) -> bool:
        """Whether this process completed the output (and so draws its pictures)."""
        ...

    @property
    def inputs_done(self) -> int:
        """Inputs the output holds, said of an output other processes still write."""
        ...

    @property
    def has_rows(self) -> bool:
        """Whether any input gave rows (a run none of whose inputs could be read fails)."""
        ...

    def begin(self, batch_size: int) -> Iterable[list[int]] | None:
        """The batches to compute, in order (lists of input indices), or None when nothing is left."""
        ...

    def add(self, batch: Any) -> None:
        """Take the next :class:`~hookcli.run.settings.Batch`."""
        ...

    def finish(self) -> Any:
        """Complete the output; what the run returns (the features in memory, or the path written)."""
        ...

    def abort(self) -> None:
        """Give up after a failure, leaving nothing half-written."""
        ...


class GatheringRun(Protocol):
    """What :meth:`~hookcli.storage.gathering_writer.GatheringWriter.of` takes of a planned run
    (:class:`~hookcli.run.planned.RunPlan` offers it)."""

    @property
    def record(self) -> RunRecord: ...
    @property
    def inputs(self) -> Sequence[Any]: ...
    @property
    def output(self) -> Any: ...  # where it goes (hookcli.run.outputs.Output): its path, None in memory
    @property
    def shard_size(self) -> int | None: ...
    @property
    def force(self) -> bool: ...
    @property
    def part(self) -> Part | None: ...
    @property
    def team(self) -> object | None: ...
    @property
    def settings(self) -> Any: ...  # its resolved hookcli.run.settings.RunSettings: the device it runs on
