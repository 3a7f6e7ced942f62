"""What every command is to a run (:class:`Command`): the request, the plan and :func:`~hookcli.run.execute.execute`
ask it, never its name. A command's module holds one subclass; :mod:`hookcli.run.commands` lists them.

What a command needs of torch (its forward, its writer) it imports when the run is planned, so that the request's
checks answer before torch loads.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from hookcli.errors import UsageProblem
from hookcli.files import refuse_written_output
from hookcli.options.run import LARGE_INPUT, RunOptions
from hookcli.run.launch import block_of
from hookcli.run.outputs import check_file_output, default_output_name, rows_output
from hookcli.run.selectors import resolve_layers
from hookcli.run.settings import RunSettings
from hookcli.storage.claims import check_folder_target

if TYPE_CHECKING:
    from hookcli.families import FamilyTraits
    from hookcli.models.loaded import LoadedModel
    from hookcli.run.launch import Part
    from hookcli.run.outputs import Output
    from hookcli.run.targets import Target
    from hookcli.run.team import Team
    from hookcli.statistics.layer import StatsChoice
    from hookcli.storage.fileformat import RunRecord
    from hookcli.storage.rows_writer import RowsWriter

__all__ = ["Command", "Planned", "named_model", "refuse_unsupported", "selectors"]


class Planned(Protocol):
    """What a command's writer takes of a planned run (:class:`~hookcli.run.planned.RunPlan` offers it)."""

    @property
    def record(self) -> RunRecord: ...
    @property
    def inputs(self) -> tuple[os.PathLike[str], ...]: ...
    @property
    def output(self) -> Output: ...
    @property
    def settings(self) -> RunSettings: ...
    @property
    def layers(self) -> Mapping[str, str]: ...
    @property
    def shard_size(self) -> int | None: ...
    @property
    def force(self) -> bool: ...
    @property
    def part(self) -> Part | None: ...
    @property
    def team(self) -> Team | None: ...
    @property
    def target(self) -> Target | None: ...
    @property
    def cam_look(self) -> Mapping[str, Any] | None: ...
    @property
    def stats(self) -> StatsChoice | None: ...


class Command:
    """A command that runs a model over inputs and keeps a row an input (extract's behaviour; the others change
    what differs)."""

    #: The command's name, as the command line and the API call it.
    name: ClassVar[str] = ""
    #: What its default file's name says it holds, before ``.safetensors`` (``.grad``).
    named: ClassVar[str] = ""
    #: Whether its layers are given as selectors (cam's one layer may be left to the model).
    selects_layers: ClassVar[bool] = True
    #: Whether it gathers over its inputs into one file (``stats``, ``compare``) rather than keeping rows.
    gathers: ClassVar[bool] = False
    #: Whether its batches' rows stay on the device for the writer (what gathers computes there).
    rows_on_device: ClassVar[bool] = False
    #: Whether it captures what ``--capture`` and ``--pool`` say (the others capture the layers' outputs whole).
    captures_as_asked: ClassVar[bool] = True
    #: Whether it stores its rows as ``--dtype`` says (what gathers reads float32 at least).
    stores_as_asked: ClassVar[bool] = True
    #: Whether its forward may fuse (a gradient's forward never does).
    fuses: ClassVar[bool] = True

    def output(self, output: Any, model_name: str) -> tuple[str, str | None]:
        """What ``output`` names: ``(kind, path)`` (:class:`~hookcli.run.outputs.Output`'s kinds, or ``default``:
        the command's own name for it, decided once the inputs are known)."""
        return rows_output(output)

    def check_output(self, kind: str, path: str | None, opts: RunOptions) -> None:
        """Refuse, before the inputs are looked for, an output the command cannot write (a CAM folder's file)."""

    def check_target(self, kind: str, path: str | None, inputs: Sequence[Any], force: bool) -> None:
        """Refuse, once the inputs are known, an output of a path that could not be written or would write over
        what it must not (an input, a file of another format, a file hookcli wrote)."""
        if path is None:
            return
        if kind == "folder":
            check_folder_target(path)
        elif kind == "file":
            check_file_output(path, inputs, force)
            refuse_written_output(path)

    def planned_path(self, kind: str, path: str | None, model_name: str, keys: Sequence[str]) -> str | None:
        """The output's path: ``path``, or the default name (after the model and the layers' ``keys``) of an
        output named by default; None in memory."""
        if path is not None or kind == "memory":
            return path
        return str(default_output_name(model_name, keys, folder=kind == "folder", kind=self.named))

    def default_kind(self, inputs: int) -> str:
        """The kind of the default output of a run over ``inputs`` inputs."""
        return "folder" if inputs > LARGE_INPUT else "file"

    def shared_kind(self) -> str:
        """The kind of the default output of a run that many processes share."""
        return "folder"

    def settings(self, opts: RunOptions) -> RunSettings:
        """The run settings ``opts`` ask for; preprocessing is the model's, filled in once it loads."""
        return RunSettings(
            capture=opts.capture if self.captures_as_asked else "output",
            device=opts.device,
            batch_size=opts.batch_size,
            workers=opts.workers,
            pool=opts.pool if self.captures_as_asked else None,
            dtype=opts.dtype if self.stores_as_asked else "float32",
            on_error=opts.on_error,
            precision=opts.precision,
            memory_format=opts.memory_format,
            compile=opts.compile,
            fuse=opts.fuse if self.fuses else False,
            final_output=opts.detections or opts.flow,
            capture_edited=opts.capture_edited,
            attention=opts.attention if self.captures_as_asked else "all",
        )

    def check_family(self, family: str, traits: FamilyTraits) -> None:
        """Refuse, before the model loads, a family the command does not apply to."""

    def check_options(self, opts: RunOptions) -> None:
        """Refuse, as the run is planned, options only the command's own libraries can check."""

    def compile_notes(self, loaded: LoadedModel, settings: RunSettings, opts: RunOptions) -> tuple[str, ...]:
        """What the run says of ``--compile``."""
        if opts.compile and not settings.compile:
            family = loaded.family.replace("_", " ")
            return (f"--compile applies to classification models; this {family} model runs eagerly",)
        return ()

    def target(self, loaded: LoadedModel, opts: RunOptions) -> tuple[Target | None, tuple[str, ...]]:
        """What the command takes gradients of, read against the model, and what it says of it: none."""
        return None, ()

    def parts(
        self, loaded: LoadedModel, layers: Any, settings: RunSettings, opts: RunOptions, target: Target | None
    ) -> tuple[dict[str, str], Callable[..., Any], dict[str, str]]:
        """``(layers, forward factory, the command's own metadata entries)``."""
        from hookcli.run.forwards import extraction_forward

        return (
            resolve_layers(loaded.module, selectors(layers), model_name=named_model(loaded)),
            extraction_forward(settings),
            {},
        )

    def check_planned(
        self, kind: str, path: str | None, paths: Sequence[Any], target: Target | None, opts: RunOptions
    ) -> None:
        """Refuse, once the layers and target are known, outputs the run would write over."""

    def extras(self, opts: RunOptions) -> Mapping[str, Any]:
        """What the plan keeps for the command's writer (:class:`~hookcli.run.plan.RunPlan`'s fields)."""
        return {}

    def writer(self, run: Planned, note: Callable[[str], None]) -> RowsWriter:
        """The writer of the rows of ``run``, into its output."""
        from hookcli.storage import writers

        kind = run.output.kind
        if kind == "memory":
            return writers.MemoryWriter(run.record, run.inputs)
        if kind == "stdout":
            return writers.StdoutWriter(run.record, run.inputs, run.output.stream)
        path = run.output.named_path
        if kind == "folder":
            share = block_of(run.part)
            return writers.FolderWriter(
                run.record, run.inputs, path, shard_size=run.shard_size, force=run.force, part=share, on_note=note
            )
        return writers.FileWriter(run.record, run.inputs, path, force=run.force)

    def picture(self, writer: RowsWriter) -> Any:
        """What makes a picture of each image as it is decoded, for the writer (None: nothing)."""
        return None


def selectors(layers: str | Sequence[str]) -> list[str]:
    return [layers] if isinstance(layers, str) else list(layers)


def named_model(loaded: LoadedModel) -> str | None:
    """The name the command line knows a model by (None for a module handed in, which has none)."""
    return None if loaded.source == "module" else loaded.name


def refuse_unsupported(name: str, family: str, hint: str) -> UsageProblem:
    """The error of a command that does not apply to a family."""
    return UsageProblem(f"{name} does not apply to {family.replace('_', ' ')} models", hint=hint)
