"""The run layer: a command's options → one frozen :class:`RunPlan` → :func:`~hookcli.run.execute.execute`.

:func:`plan` resolves everything once, and first what needs no model (and
no torch): it validates the options (choices, ranges, flags that conflict)
and the layer selectors, finds the inputs, checks the output (the default
output name too when the selectors name their layers' keys), then the model
and weights names (from :mod:`hookcli.models.registry`'s cache). Then it resolves
the device, loads the model, resolves the layers and the target (and the
default output name when globs or types leave it to the model), and picks the
forward strategy and the writer. :func:`~hookcli.run.execute.execute` runs the one batch pipeline
(:func:`hookcli.run.pipeline.iter_batches`) into that writer
(:mod:`hookcli.storage.writers`) and returns what the command's Python function
returns. The command line, the Python API (:mod:`hookcli.api`), the
benchmarks and any launcher of many processes all go through these two.

What happens along the way is reported to an optional ``progress``
callback as values (:mod:`hookcli.events`).

>>> import tempfile
>>> from hookcli.models.loading import load_model
>>> photo = __import__("matplotlib.cbook").cbook.get_sample_data("grace_hopper.jpg", asfileobj=False)
>>> run = plan("extract", load_model("resnet18", "none"), "layer2", photo, resize=64, crop=64)
>>> run.output, run.settings.memory_format, run.layers
(Output(kind='memory', path=None), 'channels_last', {'layer2': 'layer2'})
>>> from hookcli.run.execute import execute
>>> events = []
>>> features = execute(run, progress=events.append)
>>> features["layer2"].shape, events[0]
(torch.Size([1, 128, 8, 8]), Started(total=1, done=0, output=None))

Imports inside :func:`plan`'s helpers are deliberate: the inputs' decoders
(Pillow), the gradient targets and the pictures (numpy) load after the
checks that need none of them, so that a refused command answers at once.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from hookcli.console import counted
from hookcli.errors import UsageProblem, VideoError
from hookcli.families import CPU_ONLY, DEFAULT_CLIP_LENGTH, family_traits, map_batch, natural_input
from hookcli.files import check_folder_output, refuse_existing
from hookcli.inputs.archives import input_key
from hookcli.inputs.preprocess import DEVICE_DECODE_KINDS
from hookcli.models import loading
from hookcli.models.loaded import LoadedModel, num_classes
from hookcli.models.loading import model_family, resolve_weights
from hookcli.options import LARGE_INPUT
from hookcli.run.device import resolve_device
from hookcli.run.forwards import extraction_forward
from hookcli.run.launch import cpu_threads, detect_part, join_team, local_device, parse_part
from hookcli.run.options import CLIPS, COMMAND_OPTIONS, RunOptions, run_options
from hookcli.run.outputs import (
    Output,
    check_target,
    default_output,
    output_kind,
    refuse_drawn_grids,
    refuse_overwriting_inputs,
)
from hookcli.run.selectors import resolve_layers, selector_keys
from hookcli.run.settings import RunSettings
from hookcli.run.speed import check_precision
from hookcli.storage.fileformat import RunRecord, identity, inputs_digest

if TYPE_CHECKING:  # the engine's types: their modules load when a run needs them
    from hookcli.models.loaded import LoadedModel
    from hookcli.run.gradients import Target
    from hookcli.run.launch import Part, Team
    from hookcli.run.settings import RunSettings

__all__ = ["plan", "RunPlan"]


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


def plan(command: str, model, layers, inputs, *, output=None, **options) -> RunPlan:
    """Resolve a run of ``command`` (``extract``, ``grad`` or ``cam``) with the options of :mod:`hookcli.api`.

    ``model`` is a model name or a :class:`~hookcli.models.loaded.LoadedModel`;
    ``layers`` one selector or a list (cam: one selector or None for the
    default layer); ``inputs`` a path, a folder, ``-`` or a list of them;
    ``output`` None (in memory), :data:`DEFAULT_OUTPUT`, a file, ``-`` or a
    binary stream (the file's bytes go there), or a folder (a string ending in
    ``/``, or an existing folder: a ``pathlib.Path`` drops the trailing slash). Raises the library's errors; usage
    errors before any model loads.
    """
    if command not in COMMAND_OPTIONS:
        raise UsageProblem(f"unknown command '{command}'", hint=f"use one of {', '.join(COMMAND_OPTIONS)}")
    opts = run_options(command, options)
    settings = _settings(command, opts)
    help_hint = f"see 'hookcli {command} --help'"
    if opts.seed is not None and opts.weights.strip().lower() != "none":
        raise UsageProblem(
            "--seed only applies to --weights none (pretrained and file weights are fixed)", hint=help_hint
        )
    model_name = model.name if isinstance(model, LoadedModel) else str(model)
    family = model.family if isinstance(model, LoadedModel) else model_family(model_name)
    opts = _fitted_to_family(command, family, opts, options, help_hint)
    keys = selector_keys(_selectors(layers)) if command != "cam" else None
    kind, path = output_kind(command, output, model_name)
    if opts.shard_size and kind not in ("folder", "default"):
        raise UsageProblem("--shard-size applies to a folder output (-o DIR/)", hint=help_hint)
    part = _part(opts, kind, output)
    if part is not None and kind == "default":
        kind = "folder"  # many processes share the work of one shard folder
    stream = output if hasattr(output, "write") else None
    if kind == "stdout" and (stream or sys.stdout).isatty():
        raise UsageProblem(
            "refusing to write binary safetensors data to a terminal; pipe or redirect -o -", hint=help_hint
        )
    if command == "cam":
        from hookcli.pictures.render import check_cmap

        check_cmap(opts.cmap)
        if kind == "cam":
            assert path is not None, "output_kind names a cam run's folder"
            check_folder_output(path)
            refuse_existing([Path(path) / "cams.safetensors"], force=opts.force)
    team = join_team(part)
    with _left_on_error(team):
        if team is not None and "-" in _arguments(inputs) + _arguments(opts.pair_with or ()):
            # Rank 0 reads the list from stdin; the others get it from rank 0.
            found, gathered = team.share(lambda: _gather(inputs, family, opts))
        else:
            found, gathered = _gather(inputs, family, opts)
        paths = found.paths
        if kind == "default":
            kind = "folder" if len(paths) > LARGE_INPUT else "file"
            # Named after the layers' keys: known now unless a glob or a type selector leaves them to the model.
            path = None if keys is None else default_output(command, model_name, keys, kind)
        if path is not None and kind in ("file", "folder"):
            check_target(kind, path, paths, opts.force)
        if opts.grid:
            check_folder_output(opts.grid)
            if keys is not None and not opts.force:  # known without the model: said before torch loads
                refuse_drawn_grids(opts.grid, keys)
        if not isinstance(model, LoadedModel):
            # The last check before torch: the registry cache answers it, and only a cold cache imports torchvision.
            resolve_weights(model_name, opts.weights)

        device = _device(part, opts)
        loaded = model if isinstance(model, LoadedModel) else _load(model_name, opts)
        settings = dataclasses.replace(settings, device=device, preprocess=_preprocess(loaded, opts))
        settings = settings.resolved(loaded, len(paths))
        target, notes = _target_and_notes(command, loaded, settings, opts)
        notes = gathered + loaded.notes_for(options) + notes
        selected, forward, entries = _command_parts(command, loaded, layers, settings, opts, target)
        entries = {**entries, **_row_entries(loaded, opts, paths)}
        if path is None and kind in ("file", "folder"):
            path = default_output(command, loaded.name, list(selected.values()), kind)
            check_target(kind, path, paths, opts.force)
        if opts.grid and not opts.force:
            refuse_drawn_grids(opts.grid, list(selected.values()))
        if kind == "cam":
            assert target is not None and path is not None, "a cam run has a target and a folder"
            _refuse_cam_outputs(path, paths, target.count, opts.force)
        record = _record(loaded, selected, settings, opts, paths, entries)
        cam_look = {"method": opts.method, "alpha": opts.alpha, "cmap": opts.cmap} if command == "cam" else None
        if team is not None:
            team.check_same(identity(record))
        return RunPlan(
            command=command,
            loaded=loaded,
            layers=selected,
            inputs=tuple(paths),
            settings=settings,
            output=Output(kind, path, stream),
            record=record,
            forward=forward,
            shard_size=opts.shard_size,
            force=opts.force,
            grid=opts.grid,
            target=target,
            cam_look=cam_look,
            notes=notes,
            part=part,
            team=team,
        )


def _device(part, opts: RunOptions):
    """The run's device, this process's threads on a CPU shared by several, and what the device refuses."""
    device = resolve_device(local_device(part, opts.device))
    threads = cpu_threads(part)
    if device.type == "cpu" and threads:
        import torch

        torch.set_num_threads(threads)  # the processes on this machine share its cores
    check_precision(opts.precision, device)
    if opts.decode == "device" and device.type not in ("cuda", "cpu"):
        raise UsageProblem(
            f"--decode device decodes on CUDA GPUs (nvJPEG), not on {device.type}",
            hint="leave out --decode device: the decode workers feed it",
        )
    return device


def _target_and_notes(command: str, loaded: LoadedModel, settings: RunSettings, opts: RunOptions):
    """``(target or None, notes)``: grad's and cam's target read against the model, and what the run says of the
    model and of ``--compile``."""
    notes: tuple[str, ...] = ()
    if command == "extract" and opts.compile and not settings.compile:
        notes += (
            f"--compile applies to classification models; this {loaded.family.replace('_', ' ')} model runs eagerly",
        )
    if command != "extract" and opts.compile:
        notes += ("--compile: gradients need the eager graph with hooks; running eagerly",)
    if command == "extract":
        return None, notes
    from hookcli.run.gradients import parse_target

    target = parse_target(
        opts.target,
        loaded.categories,
        loaded.classes or num_classes(loaded.module),
        region=opts.region,
        family=loaded.family,
    )
    if loaded.scores not in (None, "logits"):
        notes += (
            f"{loaded.name} has no classifier: targets are units of its "
            f"{'image embedding' if loaded.scores == 'embedding' else loaded.scores}",
        )
    return target, notes


def _row_entries(loaded: LoadedModel, opts: RunOptions, paths) -> dict[str, str]:
    """What a run of clips or pairs of frames records of how its rows were cut (a resumed run must cut the same)."""
    row = family_traits(loaded.family).row
    if row == "clip":
        return {
            "clip_length": str(opts.clip_length or DEFAULT_CLIP_LENGTH),
            "frame_stride": str(opts.frame_stride),
            "clips_per_video": str(opts.clips_per_video),
        }
    if row == "pair" and opts.pair_with:  # a resumed run must pair the same second images
        return {"second_inputs_sha256": inputs_digest([input_key(p.second) for p in paths])}
    if row == "pair":
        return {"frame_stride": str(opts.frame_stride)}
    return {}


def _refuse_cam_outputs(folder: str, paths, count: int, force: bool) -> None:
    """Refuse a CAM folder whose files exist (without ``force``) or would overwrite an input."""
    from hookcli.pictures.cams import cam_png_name

    names = [cam_png_name(i, p, k, count) for i, p in enumerate(paths) for k in range(count)]
    planned = [Path(folder) / "cams.safetensors", *(Path(folder) / n for n in names)]
    refuse_existing(planned, force=force)
    refuse_overwriting_inputs(planned, paths)


def _record(loaded: LoadedModel, selected, settings: RunSettings, opts: RunOptions, paths, entries) -> RunRecord:
    """The run as its files record it."""
    assert settings.preprocess is not None, "resolved settings carry their preprocessing"
    modules = dict(loaded.module.named_modules())
    return RunRecord(
        model=loaded.name,
        weights=loaded.weights,
        layers=dict(selected),
        layer_types={p: type(modules[p]).__name__ for p in selected},
        capture=settings.capture,
        preprocess=json.loads(settings.preprocess.to_json()),
        pool=settings.pool or "none",
        dtype=settings.dtype,
        precision=settings.precision,
        memory_format=settings.memory_format,
        fuse=settings.fusing,
        device=str(settings.device),
        on_error=settings.on_error,
        shard_size=opts.shard_size,
        inputs=tuple(input_key(p) for p in paths),
        command=entries,
        family=loaded.family,
        prefix_tokens=loaded.prefix_tokens,
    )


@contextlib.contextmanager
def _left_on_error(team):
    """Leave ``team``'s process group when planning fails (a plan that succeeds leaves it when it has run)."""
    try:
        yield
    except BaseException:
        if team is not None:
            team.close()
        raise


def _part(opts: RunOptions, kind: str, output) -> Part | None:
    """This process's :class:`~hookcli.run.launch.Part` of a shard folder that many write (``--part``, or what a
    launcher says), or None."""
    if opts.part is not None:
        if kind not in ("folder", "default"):
            raise UsageProblem(
                "--part applies to a shard folder output (-o DIR/)", hint="the processes share the work of one folder"
            )
        return parse_part(opts.part)
    if kind == "memory":
        return None  # a Python caller's own loop: it decides who computes what
    part = detect_part()
    if part is not None and kind in ("file", "stdout", "cam"):
        raise UsageProblem(
            f"{part.count} processes started by {part.launcher} would each write all of '{output}'",
            hint="write a shard folder (-o DIR/): they share its work" if kind != "cam" else "run cam as one process",
        )
    return part


def _arguments(inputs) -> list[str]:
    """Inputs as given (a path, or a list of them) as a list of strings."""
    return [os.fspath(p) for p in ([inputs] if isinstance(inputs, str | os.PathLike) else inputs)]


#: Why a family has no gradients (or no CAM pictures), said as the hint.
_NO_GRADIENTS = {
    "video": "a clip has no one photo to draw a map over; 'hookcli grad' gives the gradients of a video model",
    "optical_flow": "a flow field is not a class score; extract the layers instead",
    "quantized": "quantized kernels have no backward; use the float model (the name without quantized_)",
}


def _settings(command: str, opts: RunOptions):
    """The run settings the options ask for, validated; preprocessing is the model's, filled in once it loads."""
    extracting = command == "extract"
    return RunSettings(
        capture=opts.capture if extracting else "output",
        device=opts.device,
        batch_size=opts.batch_size,
        workers=opts.workers,
        pool=opts.pool if extracting else None,
        dtype=opts.dtype if command != "cam" else "float32",
        on_error=opts.on_error,
        precision=opts.precision,
        memory_format=opts.memory_format,
        compile=opts.compile,
        fuse=opts.fuse if extracting else False,
        final_output=opts.detections or opts.flow,
    )


def _preprocess(loaded, opts: RunOptions):
    """The weights' preprocessing with the options' overrides. A model that squashes images to ``[height,
    width]`` takes ``--resize N`` as ``[N, N]`` unless ``--crop`` is given too."""
    resize: int | tuple[int, int] | None = opts.resize
    if (
        opts.resize is not None
        and isinstance(loaded.preprocess.resize, tuple)
        and loaded.preprocess.kind == "classification"
        and loaded.preprocess.crop is None
        and opts.crop is None
    ):
        resize = (opts.resize, opts.resize)
    kind = loaded.preprocess.kind
    if opts.decode == "device" and kind not in DEVICE_DECODE_KINDS:
        raise UsageProblem(
            f"--decode device reads image files, and this {kind.replace('_', ' ')} model takes frames "
            "decoded on the CPU",
            hint="leave out --decode device",
        )
    return loaded.preprocess.replace(
        resize=resize,
        crop=opts.crop,
        mean=opts.mean,
        std=opts.std,
        interpolation=opts.interpolation,
        fast_decode=opts.fast_decode or None,
        decode=opts.decode,
    )


def _gather(inputs, family: str, opts: RunOptions) -> tuple:
    """``(rows, notes)``: the run's rows, images (:class:`~hookcli.inputs.images.FoundInputs`) or for video and
    optical-flow models the clips or frame pairs of the videos given (:mod:`hookcli.inputs.video`), and what to tell."""
    from hookcli.inputs.images import FoundInputs, find_inputs

    recursive = opts.recursive
    arguments = _arguments(inputs)
    if not family_traits(family).videos:
        found = find_inputs(arguments, recursive=recursive)
        return found, (found.note,) if found.note else ()
    from hookcli.inputs import video

    if opts.pair_with:
        return _image_pairs(arguments, opts, recursive), ()
    rows: list[os.PathLike[str]] = []
    notes: list[str] = []
    for path in video.find_videos(arguments, recursive=recursive):
        try:
            if family_traits(family).row == "clip":
                clips = video.find_clips(
                    path,
                    length=opts.clip_length or DEFAULT_CLIP_LENGTH,
                    stride=opts.frame_stride,
                    clips=opts.clips_per_video or None,
                )
            else:
                clips = video.find_pairs(path, stride=opts.frame_stride)
        except VideoError as err:  # its clips cannot be counted, so it has no rows to skip one by one
            if opts.on_error != "skip":
                raise
            notes.append(f"skipped video '{path}': {err}")
            continue
        if any(len(set(clip.frames)) < len(clip.frames) for clip in clips):
            notes.append(f"'{path}' is shorter than a clip: its last frame is repeated to fill one")
        rows += clips
    if not rows:
        raise VideoError("none of the input videos could be read", hint="every one was skipped, each with its reason")
    return FoundInputs(rows, 0, 0, True), tuple(notes)


def _image_pairs(arguments: list[str], opts: RunOptions, recursive: bool):
    """Optical flow from two image lists: the inputs are each pair's first images, ``pair_with`` its second ones."""
    from hookcli.inputs.images import FoundInputs, find_inputs
    from hookcli.inputs.video import ImagePair

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
    seconds = find_inputs(_arguments(pair_with), recursive=recursive).paths
    if len(firsts) != len(seconds):
        raise UsageProblem(
            f"the two image lists differ in length: {counted(len(firsts), 'first image')} and "
            f"{len(seconds)} given with --pair-with",
            hint="give one second image for each input image, in order",
        )
    return FoundInputs([ImagePair(a, b) for a, b in zip(firsts, seconds, strict=True)])


def _fitted_to_family(command: str, family: str, opts: RunOptions, given: Mapping, help_hint: str) -> RunOptions:
    """Refuse a command or options that do not apply to the model's family; quantized models run on the CPU
    (``auto`` picks it).

    Said before any model loads: the family comes from the registry cache.
    """
    traits = family_traits(family)
    if command == "cam" and not traits.cams or command == "grad" and not traits.gradients:
        raise UsageProblem(f"{command} does not apply to {family.replace('_', ' ')} models", hint=_NO_GRADIENTS[family])
    if opts.region is not None and traits.output != "masks":
        raise UsageProblem("--region applies to segmentation models", hint=help_hint)
    if opts.region is not None:
        from hookcli.run.gradients import parse_region

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


def _load(name: str, opts: RunOptions):
    return loading.load_model(name, opts.weights, seed=opts.seed or 0)  # looked up on use: a test's seam


def _command_parts(command, loaded, layers, settings, opts, target):
    """``(layers, forward factory, the command's own metadata entries)`` for ``command``."""
    if command == "extract":
        return (
            resolve_layers(loaded.module, _selectors(layers), model_name=loaded.name),
            extraction_forward(settings),
            {},
        )
    from hookcli.run.gradients import CamForward, GradientForward

    if command == "grad":
        return (
            resolve_layers(loaded.module, _selectors(layers), model_name=loaded.name),
            functools.partial(GradientForward, target=target, categories=loaded.categories, scores=loaded.scores),
            {"target": target.describe()},
        )
    layer = _cam_layer(loaded, layers, settings)
    return (
        {layer: "cam"},
        functools.partial(
            CamForward,
            target=target,
            categories=loaded.categories,
            method=opts.method,
            scores=loaded.scores,
            prefix_tokens=loaded.prefix_tokens,
        ),
        {"target": target.describe(), "method": opts.method, "cam_layer": layer},
    )


def _selectors(layers) -> list[str]:
    return [layers] if isinstance(layers, str) else list(layers)


def _cam_layer(loaded, selector, settings) -> str:
    if selector:
        if not isinstance(selector, str):
            (selector,) = selector
        chosen = resolve_layers(loaded.module, [selector], model_name=loaded.name)
        if len(chosen) != 1:
            raise UsageProblem(
                f"cam takes one layer, and '{selector}' matches {len(chosen)}", hint="see 'hookcli cam --help'"
            )
        return next(iter(chosen))
    from hookcli.run.gradients import default_cam_layer

    device = next(loaded.module.parameters()).device  # a model reused from an earlier run may be on a GPU
    example = natural_input(loaded.family, preprocess=settings.preprocess)
    return default_cam_layer(loaded, map_batch(example, lambda tensor: tensor.to(device)))
