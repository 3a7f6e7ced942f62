"""What every command is to a run (:class:`Command`): the request, the plan and :func:`~hookcli.run.execute.execute`
ask it, never its name. A command's module holds one subclass; :mod:`hookcli.run.commands` lists them.

A command is asked four things: what its output is (:meth:`Command.output`) and what it refuses
(:meth:`Command.check`, :meth:`Command.check_target`), before any model loads (an output named after layers only
the model tells is checked again once it has loaded); what it adds to the plan once the model is loaded, refusing
what it can only tell then (:meth:`Command.plan`); and which writer keeps its rows (:meth:`Command.writer`). What it
needs of torch it imports in those last two, so that the request's checks answer before torch loads.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from hookcli.errors import UsageProblem
from hookcli.families import FamilyTraits
from hookcli.files import refuse_written_output
from hookcli.options.run import RunOptions
from hookcli.parsing import block_of
from hookcli.run.outputs import DEFAULT_OUTPUT, check_file_output, is_folder
from hookcli.run.selectors import selected_layers
from hookcli.run.settings import RunSettings
from hookcli.storage.claims import check_folder_target
from hookcli.storage.rows_writer import GatheringRun

if TYPE_CHECKING:
    from hookcli.inputs.discovery import FoundInputs
    from hookcli.models.loaded import LoadedModel
    from hookcli.run.outputs import Output
    from hookcli.run.targets import Target
    from hookcli.statistics.layer import StatsChoice
    from hookcli.storage.rows_writer import RowsWriter

__all__ = ["Asked", "Command", "Parts", "Planned", "refuse_unsupported"]


class Asked(Protocol):
    """What a command reads of a checked request (:class:`~hookcli.run.request.RunRequest` offers it)."""

    @property
    def opts(self) -> RunOptions: ...
    @property
    def layers(self) -> Any: ...
    @property
    def kind(self) -> str: ...
    @property
    def path(self) -> str | None: ...
    @property
    def rows(self) -> FoundInputs | None: ...


class Planned(GatheringRun, Protocol):
    """What a command's writer takes of a planned run (:class:`~hookcli.run.planned.RunPlan` offers it): what a
    gathering writer takes, and more."""

    @property
    def inputs(self) -> tuple[os.PathLike[str], ...]: ...
    @property
    def output(self) -> Output: ...
    @property
    def settings(self) -> RunSettings: ...
    @property
    def layers(self) -> Mapping[str, str]: ...
    @property
    def target(self) -> Target | None: ...
    @property
    def cam_look(self) -> Mapping[str, Any] | None: ...
    @property
    def stats(self) -> StatsChoice | None: ...
    @property
    def loaded(self) -> LoadedModel: ...


@dataclass(frozen=True)
class Parts:
    """What a command adds to its run's plan once the model is loaded."""

    layers: dict[str, str]  # module path → key
    forward: Callable[..., Any]  # the forward strategy's factory (hookcli.run.forwards)
    entries: Mapping[str, str] = field(default_factory=dict)  # the command's own metadata entries
    target: Target | None = None  # what gradients are taken of
    notes: tuple[str, ...] = ()  # what the run says as it starts
    compiled: tuple[str, ...] = ()  # what it says of --compile (edits, when there are any, say it instead)
    extras: Mapping[str, Any] = field(default_factory=dict)  # RunPlan fields its writer reads


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
    #: The kind of output it writes when none is named, and when that run has many inputs or many processes share it.
    default_kind: ClassVar[str] = "file"
    shared_kind: ClassVar[str] = "folder"
    #: Whether its batches' rows stay on the device for the writer (what gathers computes there).
    rows_on_device: ClassVar[bool] = False
    #: Whether it captures what ``--capture`` and ``--pool`` say (the others capture the layers' outputs whole).
    captures_as_asked: ClassVar[bool] = True
    #: Whether it stores its rows as ``--dtype`` says (what gathers reads float32 at least).
    stores_as_asked: ClassVar[bool] = True
    #: Whether its forward may fuse (a gradient's forward never does).
    fuses: ClassVar[bool] = True

    def output(self, output: Any, model_name: str, opts: RunOptions) -> tuple[str, str | None]:
        """What ``output`` names, ``(kind, path)``: a kind of :class:`~hookcli.run.outputs.Output`, or ``default``
        (named by the command once the inputs are known); refused when the command cannot write it."""
        if output is None or output is DEFAULT_OUTPUT:
            kind, path = ("memory" if output is None else "default"), None
        elif hasattr(output, "write") or os.fspath(output) == "-":
            kind, path = "stdout", "-"
        else:
            path = os.fspath(output)
            kind = "folder" if path.endswith(("/", os.sep)) or is_folder(path) else "file"
        return kind, path

    def check(self, family: str, traits: FamilyTraits, opts: RunOptions) -> None:
        """Refuse, before the model loads, a family (of ``traits``, :class:`~hookcli.families.FamilyTraits`) or
        options the command does not apply to."""
        if opts.attention != "all" and opts.capture != "attention":
            raise UsageProblem(
                f"--attention {opts.attention} says what --capture attention keeps, and the capture is {opts.capture}",
                hint="add --capture attention, or leave --attention out",
            )
        if opts.capture == "attention" and opts.pool not in (None, "none"):
            raise UsageProblem(
                f"--pool {opts.pool} pools maps and tokens, and attention weights are neither",
                hint="leave --pool out with --capture attention",
            )

    def check_target(self, kind: str, path: str | None, inputs: Sequence[Any], force: bool) -> None:
        """Refuse, once the inputs are known, an output of a path that could not be written or would write over
        what it must not (an input, a file of another format, a file hookcli wrote)."""
        if path is not None and kind == "folder":
            check_folder_target(path)
        elif path is not None and kind == "file":
            check_file_output(path, inputs, force)
            refuse_written_output(path)

    def plan(self, asked: Asked, loaded: LoadedModel, settings: RunSettings) -> Parts:
        """What the command adds to the plan of ``asked`` once ``loaded`` is: its layers and forward, and what it
        says."""
        from hookcli.run.forwards import extraction_forward

        registers = loaded.class_token is False and bool(loaded.prefix_tokens)  # a register comes first
        classless = loaded.prefix_tokens == 0 or registers
        if settings.capture == "attention" and settings.attention.startswith("class") and classless:
            raise UsageProblem(
                f"--attention {settings.attention} keeps the first token's row, and {loaded.name} has no class token "
                f"before its patches (the first token is {'a register' if registers else 'a patch'})",
                hint="keep every row (--attention all or mean)",
            )
        compiled: tuple[str, ...] = ()
        if asked.opts.compile and not settings.compile:
            family = loaded.family.replace("_", " ")
            compiled = (f"--compile applies to classification models; this {family} model runs eagerly",)
        return Parts(selected_layers(loaded, asked.layers), extraction_forward(settings), compiled=compiled)

    def writer(self, run: Planned, note: Callable[[str], None]) -> RowsWriter:
        """The writer of the rows of ``run``, into its output."""
        from hookcli.storage import writers

        kind = run.output.kind
        if kind == "memory":
            made: RowsWriter = writers.MemoryWriter(run.record, run.inputs)
        elif kind == "stdout":
            made = writers.StdoutWriter(run.record, run.inputs, run.output.stream)
        elif kind == "folder":
            made = writers.FolderWriter(run.record, run.inputs, run.output.named_path, shard_size=run.shard_size,
                                        force=run.force, part=block_of(run.part), on_note=note)  # fmt: skip
        else:
            made = writers.FileWriter(run.record, run.inputs, run.output.named_path, force=run.force)
        return made


def refuse_unsupported(name: str, family: str, hint: str) -> UsageProblem:
    """The error of a command that does not apply to a family."""
    return UsageProblem(f"{name} does not apply to {family.replace('_', ' ')} models", hint=hint)
