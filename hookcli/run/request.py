"""A run's request checked before any model loads: :func:`request` turns a command's options into a
:class:`RunRequest`, or refuses them.

Everything that can be said without torch is said here, in this order: the
options (choices, ranges, flags that conflict), the model's and weights'
names (from the registry cache, once: the plan builds what they name without
checking them again), options the model's family has no use for, the run's
settings, the layer selectors, what the command refuses, the output, this process's part of a shard folder,
then the inputs (found, not decoded), the output's name and whether it exists.
:func:`hookcli.run.plan.plan_request` loads the model and makes the plan.
The inputs of torchrun's processes are found there, once the processes have
formed their group (rank 0 reads a list from stdin and hands it to the
others).

>>> photo = __import__("matplotlib.cbook").cbook.get_sample_data("grace_hopper.jpg", asfileobj=False)
>>> asked = request("extract", "resnet18", "layer2", photo, weights="none", resize=64)
>>> asked.kind, asked.family, len(asked.rows.paths), asked.opts.resize
('memory', 'classification', 1, 64)
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hookcli.errors import UsageProblem
from hookcli.families import family_traits
from hookcli.files import check_folder_output
from hookcli.inputs.discovery import FoundInputs
from hookcli.inputs.preprocess import refuse_device_decoding
from hookcli.inputs.rows import find_rows
from hookcli.models.catalog import ModelChoice, as_model, choose_model
from hookcli.models.loaded import LoadedModel
from hookcli.options.family import fitted_to_family
from hookcli.options.interventions import Intervention, asked_interventions, read_beside
from hookcli.options.run import LARGE_INPUT, RunOptions, run_options
from hookcli.run.commands import COMMANDS
from hookcli.run.launch import Part, joins_team, run_part
from hookcli.run.outputs import default_path, refuse_drawn_grids
from hookcli.run.selectors import as_selectors, selector_keys
from hookcli.run.settings import RunSettings

__all__ = ["RunRequest", "request", "with_rows"]


@dataclass(frozen=True)
class RunRequest:
    """A command's request, checked: what :func:`request` could say of it before any model loads.

    ``rows`` (the inputs found) is None for torchrun's processes until they
    have formed their group (:func:`with_rows` then adds them); ``notes``
    are what finding them had to say.
    """

    command: str
    model: str | LoadedModel
    model_name: str
    family: str
    layers: Any  # as given: one selector, a list of them, or None (cam's default layer)
    inputs: Any  # as given: a path, a list of them, or "-"
    opts: RunOptions
    given: Mapping[str, Any]  # the keywords as the caller gave them (a loaded model's notes depend on them)
    settings: RunSettings
    keys: list[str] | None  # the layers' keys, when the selectors name them without the model
    kind: str  # what the command's output() says: memory, file, folder, stdout, cam, a gathering command's name, or
    # default (named once the inputs are known)
    path: str | None
    stream: Any = None  # a binary stream given as the output
    part: Part | None = None
    choice: ModelChoice | None = None  # the model and weights names, checked (None for a model given loaded)
    rows: FoundInputs | None = None
    notes: tuple[str, ...] = ()
    interventions: tuple[Intervention, ...] = ()  # the edits --intervene asks for, in order
    named_later: bool = False  # the output is named by default once the model tells the layers' keys


def request(
    command: str, model, layers, inputs, *, output=None, rows: FoundInputs | None = None, **options
) -> RunRequest:
    """Check a run of ``command`` (a name of :data:`~hookcli.run.commands.COMMANDS`) with the options of
    :mod:`hookcli.api`. ``model`` is a model name or a :class:`~hookcli.models.loaded.LoadedModel`; ``layers`` one
    selector or a list (cam: one selector or None for the default layer); ``inputs`` a path, a folder, ``-`` or a
    list of them; ``output`` None (in memory), :data:`~hookcli.run.outputs.DEFAULT_OUTPUT`, a file, ``-`` or a
    binary stream (the file's bytes go there), or a folder (a string ending in ``/``, or an existing folder: a
    ``pathlib.Path`` drops the trailing slash). ``rows``: the inputs another request found already (a second model
    run over them), not looked for again. Raises the library's errors."""
    if command not in COMMANDS:
        raise UsageProblem(f"unknown command '{command}'", hint=f"use one of {', '.join(COMMANDS)}")
    does = COMMANDS[command]
    opts = run_options(command, options)
    help_hint = f"see 'hookcli {command} --help'"
    if opts.incomplete:
        raise UsageProblem(
            "--incomplete takes saved features from a shard folder, and a model runs here", hint=help_hint
        )
    interventions = asked_interventions(opts)
    resampled = opts.how == "resample" or any(spec.edit == "resample" for spec in interventions)
    if opts.seed is not None and opts.weights.strip().lower() != "none" and not resampled:
        raise UsageProblem(
            "--seed only applies to --weights none and to resample's pairing (pretrained and file weights are fixed)",
            hint=help_hint,
        )
    model = as_model(model)
    choice: ModelChoice | None = None
    if isinstance(model, LoadedModel) and "weights" in options:
        raise UsageProblem(
            f"weights choose what hookcli builds a model from a name with, and {model.name} is built already",
            hint="load the weights into the model first, or give the model by its name",
        )
    if isinstance(model, LoadedModel):
        model_name, family = model.name, model.family
    else:  # from the registry cache: only a cold cache imports torchvision
        choice = choose_model(str(model), opts.weights)
        model_name, family = choice.name, choice.family
    opts = fitted_to_family(command, family, opts, options)  # a quantized model's CPU
    settings = RunSettings.asked(opts, captures=does.captures_as_asked, stores=does.stores_as_asked, fuses=does.fuses)
    keys = selector_keys(as_selectors(layers)) if does.selects_layers else None
    does.check(family, family_traits(family), opts)
    if family_traits(family).videos:  # before the inputs are read, which takes PyAV
        refuse_device_decoding(opts.decode, family)
    kind, path = does.output(output, model_name, opts)
    output_at = _OUTPUTS[kind]
    if opts.shard_size and not output_at.shared:
        raise UsageProblem("--shard-size applies to a folder output (-o DIR/)", hint=help_hint)
    part = run_part(opts.part, output, shared=output_at.shared, memory=output_at.memory, alone=output_at.alone)
    if part is not None and output_at.by_default:
        kind = does.shared_kind  # many processes share the work of one shard folder (or one file's parts)
    stream = output if hasattr(output, "write") else None
    if output_at.stdout and (stream or sys.stdout).isatty():
        raise UsageProblem(
            "refusing to write binary safetensors data to a terminal; pipe or redirect -o -", hint=help_hint
        )
    asked = RunRequest(
        command,
        model,
        model_name,
        family,
        layers,
        inputs,
        opts,
        dict(options),
        settings,
        keys,
        kind,
        path,
        stream,
        part,
        choice,
        interventions=interventions,
    )
    notes: tuple[str, ...] = ()
    if rows is None and (part is None or not joins_team(part)):  # torchrun's find them once they form their group
        rows, notes = find_rows(inputs, family, opts)
    return asked if rows is None else with_rows(asked, rows, notes)


def with_rows(asked: RunRequest, rows: FoundInputs, notes: tuple[str, ...]) -> RunRequest:
    """``asked`` with its rows, and what can be checked once they are known: the default output's name when the
    selectors name their keys, and the output and ``--grid`` folders."""
    kind, path, opts = asked.kind, asked.path, asked.opts
    does = COMMANDS[asked.command]
    if _OUTPUTS[kind].by_default:
        kind = does.shared_kind if len(rows.paths) > LARGE_INPUT else does.default_kind
        # Named after the layers' keys: known now unless a glob or a type selector leaves them to the model.
        path = None if asked.keys is None else default_path(kind, asked.model_name, asked.keys, does.named)
    # A file that many processes gather may be there already, written by the one that finished it: the writer
    # tells that apart from another run's file (hookcli.storage.gathering_writer).
    read = [*rows.paths, *read_beside(opts, asked.interventions)]
    does.check_target(kind, path, read, opts.force or (does.gathers and asked.part is not None))
    if opts.grid:
        check_folder_output(opts.grid)
        # Known without the model: said before torch loads. A process of many may find the pictures of its own run,
        # drawn by the one that completed it.
        if asked.keys is not None and not opts.force and asked.part is None:
            refuse_drawn_grids(opts.grid, asked.keys)
    later = path is None and not _OUTPUTS[kind].memory
    return dataclasses.replace(asked, kind=kind, path=path, rows=rows, notes=notes, named_later=later)


@dataclass(frozen=True)
class _Output:
    """What the request asks of an output kind: whether many processes may share it (a shard folder, a file
    gathered in parts, or one named by default, which becomes either), whether it is named by default, and whether
    it is stdout (and so never a terminal), whether it is the caller's own loop (in memory), and what to do
    instead when a launcher starts many processes that would each write all of an output not ``shared``."""

    shared: bool = False
    by_default: bool = False
    stdout: bool = False
    memory: bool = False
    alone: str = "write a shard folder (-o DIR/): they share its work"


#: Each output kind (:class:`~hookcli.run.outputs.Output`'s, and ``default``) as the request sees it.
_OUTPUTS = {
    "memory": _Output(memory=True),
    "default": _Output(shared=True, by_default=True),
    "file": _Output(),
    "stdout": _Output(stdout=True),
    "folder": _Output(shared=True),
    "cam": _Output(alone="run cam as one process"),
    **{name: _Output(shared=True) for name, does in COMMANDS.items() if does.gathers},
}
