"""A run's request checked before any model loads: :func:`request` turns a command's options into a
:class:`RunRequest`, or refuses them.

Everything that can be said without torch is said here, in this order: the
options (choices, ranges, flags that conflict), the model's and weights'
names (from the registry cache, once: the plan builds what they name without
checking them again), options the model's family has no use for, the run's
settings, the layer selectors, the output, this process's part of a shard folder, then the inputs
(found, not decoded), the output's name and whether it exists.
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
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hookcli.console import counted
from hookcli.errors import UsageProblem, VideoError
from hookcli.families import CPU_ONLY, DEFAULT_CLIP_LENGTH, family_traits
from hookcli.files import check_folder_output, regular_file_problem
from hookcli.inputs import clips
from hookcli.inputs.clips import ImagePair
from hookcli.inputs.discovery import FoundInputs, find_inputs
from hookcli.models.catalog import ModelChoice, choose_model
from hookcli.models.loaded import LoadedModel
from hookcli.options.run import CLIPS, RunOptions, run_options
from hookcli.run.commands import COMMANDS, Command, command_named
from hookcli.run.commands.base import selectors
from hookcli.run.interventions import Intervention, parse_interventions
from hookcli.run.launch import Part, detect_part, joins_team
from hookcli.run.outputs import refuse_drawn_grids
from hookcli.run.selectors import selector_keys
from hookcli.run.settings import RunSettings
from hookcli.run.targets import parse_region

__all__ = [
    "RunRequest",
    "arguments_of",
    "as_model",
    "gather_rows",
    "request",
    "selectors",
    "shared_file",
    "with_rows",
]


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
    kind: str  # what output_kind says: memory, file, folder, stdout, cam or default
    path: str | None
    stream: Any = None  # a binary stream given as the output
    part: Part | None = None
    choice: ModelChoice | None = None  # the model and weights names, checked (None for a model given loaded)
    rows: FoundInputs | None = None
    notes: tuple[str, ...] = ()
    interventions: tuple[Intervention, ...] = ()  # the edits --intervene asks for, in order


def as_model(model) -> str | LoadedModel:
    """A model as a run takes it: a name (or a factory's path), a :class:`~hookcli.models.loaded.LoadedModel`, or
    an ``nn.Module`` handed in, alone or with its preprocessing, made a loaded model that is given back as it came
    (:mod:`hookcli.models.sources.given`)."""
    if isinstance(model, str | LoadedModel):
        return model
    if isinstance(model, os.PathLike):
        return os.fspath(model)
    if "torch" in sys.modules:  # a caller holding a module has imported torch already
        from hookcli.models.sources.given import is_handed_module, loaded_from_module

        if is_handed_module(model):
            return loaded_from_module(model)
    raise UsageProblem(
        "a model is a name, an nn.Module or a module and its preprocessing, and this is of type "
        f"{type(model).__name__}",
        hint="'hookcli models' lists the names",
    )


def request(
    command: str, model, layers, inputs, *, output=None, rows: FoundInputs | None = None, **options
) -> RunRequest:
    """Check a run of ``command`` (``extract``, ``grad``, ``cam``, ``stats`` or ``compare``) with the options of
    :mod:`hookcli.api`; see :func:`hookcli.run.plan.plan` for the arguments. ``rows``: the inputs another
    request found already (a second model run over them), not looked for again. Raises the library's errors."""
    does = command_named(command)
    opts = run_options(command, options)
    help_hint = f"see 'hookcli {command} --help'"
    if opts.incomplete:
        raise UsageProblem(
            "--incomplete takes saved features from a shard folder, and a model runs here", hint=help_hint
        )
    if opts.seed is not None and opts.weights.strip().lower() != "none":
        raise UsageProblem(
            "--seed only applies to --weights none (pretrained and file weights are fixed)", hint=help_hint
        )
    choice: ModelChoice | None = None
    interventions = _interventions(opts)
    model = as_model(model)
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
    does.check_family(family, family_traits(family))
    opts = _fitted_to_family(family, opts, options, help_hint)
    settings = does.settings(opts)  # from the options as the family fits them (a quantized model's CPU)
    keys = selector_keys(selectors(layers)) if does.selects_layers else None
    kind, path = does.output(output, model_name)
    output_at = _OUTPUTS[kind]
    if opts.shard_size and not output_at.shared:
        raise UsageProblem("--shard-size applies to a folder output (-o DIR/)", hint=help_hint)
    part = _part(opts, output_at, output)
    if part is not None and output_at.by_default:
        kind = does.shared_kind()  # many processes share the work of one shard folder (or one file's parts)
    stream = output if hasattr(output, "write") else None
    if output_at.stdout and (stream or sys.stdout).isatty():
        raise UsageProblem(
            "refusing to write binary safetensors data to a terminal; pipe or redirect -o -", hint=help_hint
        )
    does.check_output(kind, path, opts)
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
    if rows is not None:
        return with_rows(asked, rows, ())
    if part is not None and joins_team(part):
        return asked  # the rows are found once the processes have formed their group
    return with_rows(asked, *gather_rows(asked))


def _interventions(opts: RunOptions) -> tuple[Intervention, ...]:
    """The edits ``--intervene`` asks for, each refused in one line before the model loads when its spec is not one,
    or the file it reads is not there."""
    found = parse_interventions(opts.intervene)
    for spec in found:
        problem = None if spec.file is None else regular_file_problem(Path(spec.file))
        if problem is not None:
            raise UsageProblem(
                f"--intervene '{spec.text}': '{spec.file}' {problem}",
                hint="mean:FILE takes a stats file of the same model and layer; add:FILE any safetensors file",
            )
    if opts.capture_edited and not found:
        raise UsageProblem("--capture-edited applies to layers edited with --intervene", hint="give --intervene too")
    return found


def with_rows(asked: RunRequest, rows: FoundInputs, notes: tuple[str, ...]) -> RunRequest:
    """``asked`` with its rows, and what can be checked once they are known: the default output's name when the
    selectors name their keys, and the output and ``--grid`` folders."""
    kind, path, opts = asked.kind, asked.path, asked.opts
    does = command_named(asked.command)
    if _OUTPUTS[kind].by_default:
        kind = does.default_kind(len(rows.paths))
        # Named after the layers' keys: known now unless a glob or a type selector leaves them to the model.
        path = None if asked.keys is None else does.planned_path(kind, None, asked.model_name, asked.keys)
    does.check_target(kind, path, rows.paths, opts.force or shared_file(does, asked.part))
    if opts.grid:
        check_folder_output(opts.grid)
        if asked.keys is not None and not opts.force:  # known without the model: said before torch loads
            refuse_drawn_grids(opts.grid, asked.keys)
    return dataclasses.replace(asked, kind=kind, path=path, rows=rows, notes=notes)


def shared_file(does: Command, part: Part | None) -> bool:
    """Whether the output is a file that many processes gather, which may already be there, written by the one that
    finished it: the writer tells that apart from another run's file
    (:class:`~hookcli.storage.gathering_writer.GatheringWriter`)."""
    return does.gathers and part is not None


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


def _part(opts: RunOptions, output_at: _Output, output) -> Part | None:
    """This process's :class:`~hookcli.run.launch.Part` of a shard folder that many write (``--part``, or what a
    launcher says), or None."""
    if opts.part is not None:
        if not output_at.shared:
            raise UsageProblem(
                "--part applies to a shard folder output (-o DIR/)", hint="the processes share the work of one folder"
            )
        return opts.part
    if output_at.memory:
        return None  # a Python caller's own loop: it decides who computes what
    part = detect_part()
    if part is not None and not output_at.shared:
        raise UsageProblem(
            f"{part.count} processes started by {part.launcher} would each write all of '{output}'",
            hint=output_at.alone,
        )
    return part


def arguments_of(inputs) -> list[str]:
    """Inputs as given (a path, or a list of them) as a list of strings."""
    return [os.fspath(p) for p in ([inputs] if isinstance(inputs, str | os.PathLike) else inputs)]


def gather_rows(asked: RunRequest) -> tuple[FoundInputs, tuple[str, ...]]:
    """``(rows, notes)``: the run's rows, images (:class:`~hookcli.inputs.discovery.FoundInputs`) or for video and
    optical-flow models the clips or frame pairs of the videos given (:mod:`hookcli.inputs.clips`), and what to tell."""
    family, opts = asked.family, asked.opts
    recursive = opts.recursive
    arguments = arguments_of(asked.inputs)
    if not family_traits(family).videos:
        found = find_inputs(arguments, recursive=recursive)
        return found, (found.note,) if found.note else ()
    if opts.pair_with:
        return _image_pairs(arguments, opts, recursive), ()
    rows: list[os.PathLike[str]] = []
    notes: list[str] = []
    for path in clips.find_videos(arguments, recursive=recursive):
        try:
            if family_traits(family).row == "clip":
                cut = clips.find_clips(
                    path,
                    length=opts.clip_length or DEFAULT_CLIP_LENGTH,
                    stride=opts.frame_stride,
                    clips=opts.clips_per_video or None,
                )
            else:
                cut = clips.find_pairs(path, stride=opts.frame_stride)
        except VideoError as err:  # its clips cannot be counted, so it has no rows to skip one by one
            if opts.on_error != "skip":
                raise
            notes.append(f"skipped video '{path}': {err}")
            continue
        if any(len(set(clip.frames)) < len(clip.frames) for clip in cut):
            notes.append(f"'{path}' is shorter than a clip: its last frame is repeated to fill one")
        rows += cut
    if not rows:
        raise VideoError("none of the input videos could be read", hint="every one was skipped, each with its reason")
    return FoundInputs(rows, 0, 0, True), tuple(notes)


def _image_pairs(arguments: list[str], opts: RunOptions, recursive: bool):
    """Optical flow from two image lists: the inputs are each pair's first images, ``pair_with`` its second ones."""
    if opts.frame_stride != 1:
        raise UsageProblem(
            "--frame-stride applies to pairs cut from videos, not to pairs given as two image lists",
            hint="see 'hookcli extract --help'",
        )
    pair_with = opts.pair_with or ()  # given: the caller checked
    if "-" in arguments and "-" in pair_with:
        raise UsageProblem(
            "stdin (-) can give one of the two image lists, not both", hint="name the other list's files or folder"
        )
    firsts = find_inputs(arguments, recursive=recursive).paths
    seconds = find_inputs(arguments_of(pair_with), recursive=recursive).paths
    if len(firsts) != len(seconds):
        raise UsageProblem(
            f"the two image lists differ in length: {counted(len(firsts), 'first image')} and "
            f"{len(seconds)} given with --pair-with",
            hint="give one second image for each input image, in order",
        )
    return FoundInputs([ImagePair(a, b) for a, b in zip(firsts, seconds, strict=True)])


def _fitted_to_family(family: str, opts: RunOptions, given: Mapping, help_hint: str) -> RunOptions:
    """Refuse a command or options that do not apply to the model's family; quantized models run on the CPU
    (``auto`` picks it).

    Said before any model loads: the family comes from the registry cache.
    """
    traits = family_traits(family)
    if opts.region is not None and traits.output != "masks":
        raise UsageProblem("--region applies to segmentation models", hint=help_hint)
    if opts.region is not None:
        parse_region(opts.region)

    clip_options = [name for name in CLIPS if name in given and given[name] != getattr(RunOptions, name)]
    if not traits.videos and clip_options:
        users = "video and optical-flow models" if clip_options[0] == "frame_stride" else "video models"
        raise UsageProblem(
            f"--{clip_options[0].replace('_', '-')} applies to {users}, and this one is {family.replace('_', ' ')}",
            hint=help_hint,
        )
    if traits.row == "pair" and {"clip_length", "clips_per_video"} & set(clip_options):
        raise UsageProblem(
            "optical-flow models take pairs of frames: --clip-length and --clips-per-video do not "
            "apply (--frame-stride sets how far apart the two frames are)",
            hint=help_hint,
        )
    if traits.row == "clip" and opts.memory_format == "channels_last":
        raise UsageProblem(
            "video models take 5-D clips, which have no channels-last layout",
            hint="leave --memory-format at auto or contiguous",
        )
    if opts.pair_with and traits.row != "pair":
        raise UsageProblem(
            f"--pair-with applies to optical-flow models, and this one is {family.replace('_', ' ')}", hint=help_hint
        )
    if opts.flow and traits.output != "flow":
        raise UsageProblem(
            f"--flow applies to optical-flow models, and this one is {family.replace('_', ' ')}", hint=help_hint
        )
    if opts.detections and traits.output != "detections":
        raise UsageProblem(
            f"--detections applies to detection models, and this one is {family.replace('_', ' ')}", hint=help_hint
        )
    if family in CPU_ONLY:
        if opts.device not in ("auto", "cpu"):
            raise UsageProblem(
                f"quantized models run on the CPU only, not on '{opts.device}'",
                hint="use --device cpu (or auto), or the model without the quantized_ prefix",
            )
        if opts.precision != "fp32":
            raise UsageProblem(
                f"quantized models compute in int8 and take --precision fp32 only, not {opts.precision}", hint=help_hint
            )
        return dataclasses.replace(opts, device="cpu")
    return opts
