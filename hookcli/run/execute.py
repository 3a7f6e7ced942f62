"""A planned run carried out: :func:`execute` streams its batches into its writer and reports as it goes;
:func:`run_request` plans a checked request and runs it.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Protocol

from hookcli.errors import nothing_read
from hookcli.events import Advanced, Damaged, Event, Note, Skipped, Started, Wrote
from hookcli.options.grid import GridOptions
from hookcli.pictures.grids import draw_grids
from hookcli.run.outputs import Output
from hookcli.run.plan import plan_request
from hookcli.run.request import RunRequest
from hookcli.run.settings import Batch
from hookcli.run.team import Team, TeamError
from hookcli.storage.features import Features
from hookcli.storage.rows_writer import RowsWriter
from hookcli.storage.shards import open_features

__all__ = ["Road", "draw_grids", "execute", "run_request"]


class Road(Protocol):
    """What :func:`execute` takes: a run's inputs and output, the writer that keeps what it computes and the
    batches it computes (a model's plan, :class:`~hookcli.run.planned.RunPlan`; saved features read again; two
    models run side by side)."""

    @property
    def inputs(self) -> Sequence[Any]: ...

    @property
    def output(self) -> Output: ...

    @property
    def notes(self) -> tuple[str, ...]:
        """What is said as the run starts."""
        ...

    @property
    def batch_size(self) -> int: ...

    @property
    def team(self) -> Team | None:
        """torchrun's process group, left when the run ends."""
        ...

    @property
    def grid(self) -> str | None:
        """Where to draw the grid pictures of what was written, once it is complete (None: nowhere)."""
        ...

    @property
    def force(self) -> bool: ...

    def writer(self, note: Callable[[str], None]) -> RowsWriter:
        """The writer of the run's output."""
        ...

    def batches(self, order: Iterable[list[int]], writer: RowsWriter, note: Callable[[str], None]) -> Iterable[Batch]:
        """A :class:`~hookcli.run.settings.Batch` for each list of input indices in ``order``, for ``writer``."""
        ...


def execute(run: Road, progress: Callable[[Event], None] | None = None) -> Features | Path | None:
    """Run ``run`` into its output and return what its command's function returns: the one loop every run shares,
    whatever computes its batches.

    The writer (:class:`~hookcli.storage.rows_writer.RowsWriter`) is fed the batches it asks for, and what happens
    is reported to ``progress`` as it goes. In memory the run returns the rows as
    :class:`~hookcli.storage.features.Features` (with ``facts`` and ``notes``); written, the path written (a shard
    folder's ``index.jsonl``; a CAM folder's ``cams.safetensors``); to stdout, None. torchrun's processes (``team``)
    wait for each other before the output is said to be complete. Raises
    :class:`~hookcli.errors.ImageError` (:class:`~hookcli.errors.VideoError` for clips) when no input could be read.
    """
    emit = progress or (lambda event: None)
    notes: list[str] = []
    inputs, team = run.inputs, run.team

    def note(text: str) -> None:
        notes.append(text)
        emit(Note(text))

    for text in run.notes:
        note(text)
    writer = run.writer(note)
    with contextlib.closing(team) if team is not None else contextlib.nullcontext():
        try:
            order = writer.begin(run.batch_size)
            emit(Started(total=len(inputs), done=writer.done, output=writer.kept or run.output.path))
            batches = run.batches(order, writer, note) if order is not None else ()  # None: nothing is left
            try:
                for batch in batches:
                    writer.add(batch)
                    for index, error in batch.failures:
                        emit(Skipped(str(inputs[index]), error))
                    for index, said in batch.damaged:
                        emit(Damaged(str(inputs[index]), said))
                    emit(Advanced(len(batch.indices) + len(batch.failures)))
            finally:  # a generator's blocks (a model handed in, taken to run) end now, not when an error is collected
                getattr(batches, "close", lambda: None)()
            if not writer.has_rows:
                raise nothing_read(inputs)
            result = writer.finish()
        except BaseException:
            writer.abort()
            if writer.kept is not None and os.path.isdir(writer.kept):  # a gathering run's parts, kept to continue
                note(f"'{writer.kept}' keeps the shards done so far: run the same command again to continue")
            raise
        if team is not None:
            try:
                team.barrier()  # every process has listed its shards: the folder is complete
            except TeamError as err:
                delivered = [os.fspath(path) for path in writer.written]  # the output itself, not a gathering's parts
                parts_left = writer.kept is not None and os.path.isdir(writer.kept)
                if not (writer.complete and delivered and all(map(os.path.exists, delivered)) and not parts_left):
                    raise
                note(f"{err.message}: '{delivered[0]}' is complete all the same")
        complete = writer.complete or team is not None
        if not complete:
            note(
                f"'{writer.kept or run.output.path}' holds {writer.inputs_done} of its {len(inputs)} inputs: other "
                "processes are writing the rest (or run the same command again to finish it)"
            )
        if complete and (team is None or team.part.index == 0):  # one process of a team says what was written
            for path in writer.written:
                emit(Wrote(path))
        if isinstance(result, Features):
            result.notes = tuple(notes)
        if run.grid and complete and writer.finisher:
            with result if isinstance(result, Features) else open_features(run.output.named_path) as written:
                draw_grids(written, GridOptions(), run.grid, force=run.force, progress=emit)
    assert isinstance(result, Features | Path), "a writer finishes with its rows or the path it wrote"
    return None if run.output.to_stdout else result


def run_request(asked: RunRequest, progress: Callable[[Event], None] | None = None) -> Features | Path | None:
    """Plan ``asked`` (:func:`~hookcli.run.plan.plan_request`: the model loads) and run it (:func:`execute`)."""
    return execute(plan_request(asked), progress)
