"""A planned run carried out: :func:`execute` streams its batches into its writer and reports as it goes;
:func:`run_request` plans a checked request and runs it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path

from hookcli.errors import ImageError
from hookcli.events import Advanced, Damaged, Event, Note, Skipped, Started, Wrote
from hookcli.pictures.cams import CamOverlays
from hookcli.pictures.grids import draw_grids
from hookcli.pictures.options import GridOptions
from hookcli.run.pipeline import iter_batches
from hookcli.run.plan import RunPlan, plan_request
from hookcli.run.request import RunRequest
from hookcli.storage import writers
from hookcli.storage.features import Features
from hookcli.storage.shards import open_features

__all__ = [
    "draw_grids",
    "execute",
    "run_request",
]


def _ignore(event: Event) -> None:
    pass


def execute(run: RunPlan, progress: Callable[[Event], None] | None = None):
    """Run ``run`` into its output and return what its command's function returns.

    In memory: the rows as :class:`~hookcli.storage.features.Features` (with ``facts``
    and ``notes``); written: the path written (a shard folder's
    ``index.jsonl``; a CAM folder's ``cams.safetensors``); to stdout: None.
    Raises :class:`~hookcli.errors.ImageError` when no input could be read.
    """
    emit = progress or _ignore
    notes: list[str] = []

    def note(text: str) -> None:
        notes.append(text)
        emit(Note(text))

    for text in run.notes:
        note(text)
    writer = _writer(run, note)
    with contextlib.closing(run.team) if run.team is not None else contextlib.nullcontext():
        try:
            order = writer.begin(run.settings.batch_size)
            emit(Started(total=len(run.inputs), done=writer.done, output=run.output.path))
            if order is not None:
                for batch in iter_batches(
                    run.loaded,
                    run.layers,
                    run.inputs,
                    run.settings,
                    forward=run.forward,
                    order=order,
                    on_note=note,
                    picture=writer.picture if isinstance(writer, CamOverlays) else None,
                ):
                    writer.add(batch)
                    for index, error in batch.failures:
                        emit(Skipped(str(run.inputs[index]), error))
                    for index, said in batch.damaged:
                        emit(Damaged(str(run.inputs[index]), said))
                    emit(Advanced(len(batch.indices) + len(batch.failures)))
            if not writer.has_rows:
                raise ImageError(
                    "none of the input images could be read",
                    hint="every input was skipped, each with its reason (on stderr; in Python, the Skipped events)",
                )
            result = writer.finish()
        except BaseException:
            writer.abort()
            raise
        if run.team is not None:
            run.team.barrier()  # every process has listed its shards: the folder is complete
        complete = writer.complete or run.team is not None
        if not complete:
            note(
                f"'{run.output.path}' holds {writer.inputs_done} of its {len(run.inputs)} inputs: other processes "
                "are writing the rest (or run the same command again to finish it)"
            )
        if complete and (run.team is None or run.team.part.index == 0):  # one process of a team says what was written
            for path in writer.written:
                emit(Wrote(path))
        if isinstance(result, Features):
            result.notes = tuple(notes)
        if run.grid and complete and writer.finisher:
            with result if isinstance(result, Features) else open_features(run.output.named_path) as written:
                draw_grids(written, GridOptions(), run.grid, force=run.force, progress=emit)
    if run.output.kind == "stdout":
        return None
    return result


def _writer(run: RunPlan, note: Callable[[str], None]):
    kind = run.output.kind
    if kind == "memory":
        return writers.MemoryWriter(run.record, run.inputs)
    if kind == "stdout":
        return writers.StdoutWriter(run.record, run.inputs, run.output.stream)
    path = run.output.named_path
    if kind == "folder":
        share = (run.part.index, run.part.count) if run.part is not None else (0, 1)
        return writers.FolderWriter(
            run.record, run.inputs, path, shard_size=run.shard_size, force=run.force, part=share, on_note=note
        )
    if kind == "file":
        return writers.FileWriter(run.record, run.inputs, path, force=run.force)
    (layer,) = run.layers
    assert run.target is not None and run.cam_look is not None, "plan gives a cam run both"
    inner = writers.FileWriter(run.record, run.inputs, str(Path(path) / "cams.safetensors"), force=run.force)

    return CamOverlays(
        inner,
        run.inputs,
        path,
        preprocess=run.settings.preprocess,
        count=run.target.count,
        layer=layer,
        force=run.force,
        on_note=note,
        **run.cam_look,
    )


def run_request(asked: RunRequest, progress: Callable[[Event], None] | None = None):
    """Plan ``asked`` (:func:`~hookcli.run.plan.plan_request`: the model loads) and run it (:func:`execute`)."""
    return execute(plan_request(asked), progress)
