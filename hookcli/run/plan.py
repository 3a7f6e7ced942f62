"""The run layer: a command's options → one frozen :class:`RunPlan` → :func:`execute`.

:func:`plan` resolves everything once, and first what needs no model (and
no torch): it validates the options (choices, ranges, flags that conflict)
and the layer selectors, finds the inputs, checks the output (the default
output name too when the selectors name their layers' keys), then the model
and weights names (from :mod:`hookcli.models.registry`'s cache). Then it resolves
the device, loads the model, resolves the layers and the target (and the
default output name when globs or types leave it to the model), and picks the
forward strategy and the writer. :func:`execute` runs the one batch pipeline
(:func:`hookcli.run.pipeline.iter_batches`) into that writer
(:mod:`hookcli.storage.writers`) and returns what the command's Python function
returns. The command line, the Python API (:mod:`hookcli.api`), the
benchmarks and any launcher of many processes all go through these two.

What happens along the way is reported to an optional ``progress``
callback as values: :class:`Started`, :class:`Advanced`, :class:`Skipped`,
:class:`Note` and :class:`Wrote`.

>>> import tempfile
>>> from hookcli.models.loading import load_model
>>> photo = __import__("matplotlib.cbook").cbook.get_sample_data("grace_hopper.jpg", asfileobj=False)
>>> run = plan("extract", load_model("resnet18", "none"), "layer2", photo, resize=64, crop=64)
>>> run.output, run.settings.memory_format, run.layers
(Output(kind='memory', path=None), 'channels_last', {'layer2': 'layer2'})
>>> events = []
>>> features = execute(run, progress=events.append)
>>> features["layer2"].shape, events[0]
(torch.Size([1, 128, 8, 8]), Started(total=1, done=0, output=None))
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import functools
import json
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from hookcli.inputs.archives import input_key
from hookcli.errors import ImageError, UsageProblem, check_choice, check_whole
from hookcli.events import Advanced, Event, Note, Skipped, Started, Wrote
from hookcli.storage.fileformat import RunRecord
from hookcli.files import check_folder_output, refuse_existing

__all__ = [
    "COMMAND_OPTIONS", "DEFAULT_OUTPUT", "LARGE_INPUT", "Output", "RunOptions", "RunPlan", "default_output_name",
    "draw_grids", "execute", "plan", "refuse_unknown",
]

#: Above this many images, a run whose output is left to its default writes a shard folder instead of one file.
LARGE_INPUT = 10_000


class _DefaultOutput:
    def __repr__(self) -> str:
        return "DEFAULT_OUTPUT"


#: ``output=DEFAULT_OUTPUT``: write where the command line writes when no ``-o`` is given.
DEFAULT_OUTPUT = _DefaultOutput()




def _ignore(event: Event) -> None:
    pass


# -- options ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunOptions:
    """Every option of extract, grad and cam, named like the command line's long options, with their defaults."""

    weights: str = "DEFAULT"
    seed: int | None = None
    capture: str = "output"
    resize: int | None = None
    crop: int | None = None
    mean: tuple[float, float, float] | None = None
    std: tuple[float, float, float] | None = None
    interpolation: str | None = None
    fast_decode: bool = False
    decode: str = "cpu"  # hookcli.inputs.preprocess.DECODERS
    device: str = "auto"
    batch_size: int = 16
    precision: str = "fp32"
    memory_format: str = "auto"
    compile: bool = False
    workers: int | None = None
    recursive: bool = False
    on_error: str = "fail"
    force: bool = False
    pool: str | None = None
    dtype: str = "float32"
    shard_size: int | None = None
    fuse: bool | None = None  # None: by the number of inputs (hookcli.run.speed.choose_fuse)
    grid: str | None = None
    target: str = "top1"
    method: str = "gradcam"
    alpha: float = 0.5
    cmap: str = "inferno"
    clip_length: int | None = None  # video models: None is 16 (hookcli.families.DEFAULT_CLIP_LENGTH)
    frame_stride: int = 1
    clips_per_video: int = 1  # 0: every clip, one after another
    detections: bool = False
    flow: bool = False
    region: str | None = None  # segmentation targets: x0,y0,x1,y1 as fractions of the image
    pair_with: tuple | None = None  # optical flow from two image lists: the second images, as inputs are given
    part: str | None = None  # K/N: this process is the K-th of N sharing a shard folder (hookcli.run.launch)

    def __post_init__(self) -> None:
        from hookcli.run.device import parse_device
        from hookcli.run.gradients import CAM_METHODS
        from hookcli.inputs.preprocess import DECODERS, INTERPOLATIONS, MAX_SIDE, check_normalisation, parse_triple

        for name, high in (("resize", MAX_SIDE), ("crop", MAX_SIDE), ("shard_size", None), ("clip_length", 4096)):
            check_whole(name, getattr(self, name), 1, high, optional=True)
        check_whole("frame_stride", self.frame_stride, 1, 4096)
        check_whole("clips_per_video", self.clips_per_video, 0, 4096)
        if self.interpolation is not None:
            check_choice("interpolation", self.interpolation, INTERPOLATIONS)
        check_choice("decode", self.decode, DECODERS)
        if self.fast_decode and self.decode == "device":
            raise UsageProblem("--fast-decode and --decode device cannot be combined",
                               hint="--fast-decode is a reduced scale of the CPU's decoder; give one of them")
        for name in ("mean", "std"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, _parsed(name, parse_triple, getattr(self, name)))
        try:
            check_normalisation(self.mean, self.std)
        except ValueError as err:
            raise UsageProblem(str(err), hint="see --help for --mean and --std") from None
        object.__setattr__(self, "device", _parsed("device", parse_device, self.device))
        check_choice("method", self.method, CAM_METHODS)
        if not 0 <= self.alpha <= 1:
            raise UsageProblem(f"alpha must be between 0 and 1, not {self.alpha!r}")
        if isinstance(self.pair_with, str | os.PathLike):  # one folder or file, as inputs may be given
            object.__setattr__(self, "pair_with", (self.pair_with,))
        if self.seed is not None and not isinstance(self.seed, int):
            raise UsageProblem(f"seed must be a whole number, not {self.seed!r}")
        if self.part is not None:
            from hookcli.run.launch import parse_part

            parse_part(self.part)


def _parsed(name: str, parse: Callable, value):
    try:
        return parse(value)
    except ValueError as err:
        raise UsageProblem(f"invalid {name}: {err}") from None


_COMMON = ("weights", "seed", "resize", "crop", "mean", "std", "interpolation", "fast_decode", "decode", "device",
           "batch_size", "precision", "memory_format", "compile", "workers", "recursive", "on_error", "force")
#: The options each command takes (the Python function's keywords, the command line's long options).
_CLIPS = ("clip_length", "frame_stride", "clips_per_video")
COMMAND_OPTIONS = {
    "extract": (*_COMMON, "capture", "pool", "dtype", "shard_size", "part", "fuse", "grid", *_CLIPS, "detections",
                "flow", "pair_with"),
    "grad": (*_COMMON, "target", "dtype", "shard_size", "part", *_CLIPS, "region"),
    "cam": (*_COMMON, "target", "method", "alpha", "cmap", "region"),
}


def refuse_unknown(command: str, given: Mapping, allowed: Sequence[str]) -> None:
    """A keyword a command does not take is a TypeError, as Python's own, naming the closest one."""
    unknown = [name for name in given if name not in allowed]
    if unknown:
        closest = difflib.get_close_matches(unknown[0], allowed, n=1)
        suggestion = f"; did you mean '{closest[0]}'?" if closest else ""
        raise TypeError(f"{command}() got an unexpected keyword argument '{unknown[0]}'{suggestion} "
                        f"(it takes {', '.join(allowed)})")


def _options(command: str, given: Mapping) -> RunOptions:
    refuse_unknown(command, given, COMMAND_OPTIONS[command])
    return RunOptions(**given)


# -- the plan --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Output:
    """Where rows go: ``memory`` (returned), ``file``, ``stdout``, ``folder`` (shards) or ``cam`` (a CAM folder)."""

    kind: str
    path: str | None = None
    #: Where ``stdout`` rows go when the caller gave a binary stream instead of ``-`` (None: ``sys.stdout``).
    stream: BinaryIO | None = field(default=None, repr=False)


@dataclass(frozen=True)
class RunPlan:
    """A run with nothing left to decide. Build one with :func:`plan`, run it with :func:`execute`.

    ``record`` is the run as its files describe it; ``forward`` builds the
    forward strategy; ``notes`` are said when the run starts.
    """

    command: str
    loaded: object
    layers: Mapping[str, str]
    inputs: tuple[Path, ...]
    settings: object
    output: Output
    record: RunRecord
    forward: Callable
    shard_size: int | None = None
    force: bool = False
    grid: str | None = None
    target: object = None
    cam_look: Mapping | None = None
    notes: tuple[str, ...] = ()
    part: object = None  # hookcli.run.launch.Part: this process's share of a shard folder written by many
    team: object = None  # hookcli.run.launch.Team: torchrun's process group, left when the run ends


def plan(command: str, model, layers, inputs, *, output=None, **options) -> RunPlan:
    """Resolve a run of ``command`` (``extract``, ``grad`` or ``cam``) with the options of :mod:`hookcli.api`.

    ``model`` is a model name or a :class:`~hookcli.models.loading.LoadedModel`;
    ``layers`` one selector or a list (cam: one selector or None for the
    default layer); ``inputs`` a path, a folder, ``-`` or a list of them;
    ``output`` None (in memory), :data:`DEFAULT_OUTPUT`, a file, ``-`` or a
    binary stream (the file's bytes go there), or a folder (a string ending in
    ``/``, or an existing folder: a ``pathlib.Path`` drops the trailing slash). Raises the library's errors; usage
    errors before any model loads.
    """
    from hookcli.models.loading import LoadedModel, model_family, resolve_weights
    from hookcli.run.selectors import selector_keys

    if command not in COMMAND_OPTIONS:
        raise UsageProblem(f"unknown command '{command}'", hint=f"use one of {', '.join(COMMAND_OPTIONS)}")
    opts = _options(command, options)
    settings = _settings(command, opts)
    help_hint = f"see 'hookcli {command} --help'"
    if opts.seed is not None and opts.weights.strip().lower() != "none":
        raise UsageProblem("--seed only applies to --weights none (pretrained and file weights are fixed)",
                           hint=help_hint)
    model_name = model.name if isinstance(model, LoadedModel) else str(model)
    family = model.family if isinstance(model, LoadedModel) else model_family(model_name)
    opts = _fitted_to_family(command, family, opts, options, help_hint)
    keys = selector_keys(_selectors(layers)) if command != "cam" else None
    kind, path = _output_kind(command, output, model_name)
    if opts.shard_size and kind not in ("folder", "default"):
        raise UsageProblem("--shard-size applies to a folder output (-o DIR/)", hint=help_hint)
    part = _part(opts, kind, output)
    if part is not None and kind == "default":
        kind = "folder"  # many processes share the work of one shard folder
    stream = output if hasattr(output, "write") else None
    if kind == "stdout" and (stream or sys.stdout).isatty():
        raise UsageProblem("refusing to write binary safetensors data to a terminal; pipe or redirect -o -",
                           hint=help_hint)
    if command == "cam":
        from hookcli.pictures.render import check_cmap

        check_cmap(opts.cmap)
        if kind == "cam":
            check_folder_output(path)
            refuse_existing([Path(path) / "cams.safetensors"], force=opts.force)
    from hookcli.run.launch import join_team

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
            path = None if keys is None else _default_output(command, model_name, keys, kind)
        if path is not None and kind in ("file", "folder"):
            _check_target(kind, path, paths, opts.force)
        if opts.grid:
            check_folder_output(opts.grid)
            if keys is not None and not opts.force:  # known without the model: said before torch loads
                _refuse_drawn_grids(opts.grid, keys)
        if not isinstance(model, LoadedModel):
            # The last check before torch: the registry cache answers it, and only a cold cache imports torchvision.
            resolve_weights(model_name, opts.weights)

        from hookcli.run.device import resolve_device
        from hookcli.families import DEFAULT_CLIP_LENGTH
        from hookcli.run.launch import cpu_threads, local_device
        from hookcli.run.speed import check_precision

        device = resolve_device(local_device(part, opts.device))
        if device.type == "cpu" and cpu_threads(part):
            import torch

            torch.set_num_threads(cpu_threads(part))  # the processes on this machine share its cores
        check_precision(opts.precision, device)
        if opts.decode == "device" and device.type not in ("cuda", "cpu"):
            raise UsageProblem(f"--decode device decodes on CUDA GPUs (nvJPEG), not on {device.type}",
                               hint="leave out --decode device: the decode workers feed it")
        loaded = model if isinstance(model, LoadedModel) else _load(model_name, opts)
        settings = dataclasses.replace(settings, device=device, preprocess=_preprocess(loaded, opts))
        settings = settings.resolved(loaded, len(paths))
        notes = gathered + loaded.notes_for(options)
        if command == "extract" and opts.compile and not settings.compile:
            notes += (f"--compile applies to classification models; this {loaded.family.replace('_', ' ')} model runs "
                      "eagerly",)
        if command != "extract" and opts.compile:
            notes += ("--compile: gradients need the eager graph with hooks; running eagerly",)
        target = None
        if command != "extract":
            from hookcli.run.gradients import parse_target
            from hookcli.models.loading import num_classes

            target = parse_target(opts.target, loaded.categories, loaded.classes or num_classes(loaded.module),
                                  region=opts.region, family=loaded.family)
            if loaded.scores not in (None, "logits"):
                notes += (f"{loaded.name} has no classifier: targets are units of its "
                          f"{'image embedding' if loaded.scores == 'embedding' else loaded.scores}",)
        selected, forward, entries = _command_parts(command, loaded, layers, settings, opts, target)
        if loaded.family == "video":
            entries = {**entries, "clip_length": str(opts.clip_length or DEFAULT_CLIP_LENGTH),
                       "frame_stride": str(opts.frame_stride), "clips_per_video": str(opts.clips_per_video)}
        elif loaded.family == "optical_flow" and opts.pair_with:  # a resumed run must pair the same second images
            from hookcli.storage.fileformat import inputs_digest

            entries = {**entries, "second_inputs_sha256": inputs_digest([input_key(p.second) for p in paths])}
        elif loaded.family == "optical_flow":
            entries = {**entries, "frame_stride": str(opts.frame_stride)}
        if path is None and kind in ("file", "folder"):
            path = _default_output(command, loaded.name, list(selected.values()), kind)
            _check_target(kind, path, paths, opts.force)
        if opts.grid and not opts.force:
            _refuse_drawn_grids(opts.grid, list(selected.values()))
        if kind == "cam":
            from hookcli.pictures.cams import cam_png_name

            names = [cam_png_name(i, p, k, target.count) for i, p in enumerate(paths) for k in range(target.count)]
            planned = [Path(path) / "cams.safetensors", *(Path(path) / n for n in names)]
            refuse_existing(planned, force=opts.force)
            _refuse_overwriting_inputs(planned, paths)
        modules = dict(loaded.module.named_modules())
        record = RunRecord(
            model=loaded.name, weights=loaded.weights, layers=dict(selected),
            layer_types={p: type(modules[p]).__name__ for p in selected}, capture=settings.capture,
            preprocess=json.loads(settings.preprocess.to_json()), pool=settings.pool or "none", dtype=settings.dtype,
            precision=settings.precision, memory_format=settings.memory_format, fuse=settings.fusing,
            device=str(settings.device), on_error=settings.on_error, shard_size=opts.shard_size,
            inputs=tuple(input_key(p) for p in paths), command=entries, family=loaded.family,
            prefix_tokens=loaded.prefix_tokens,
        )
        cam_look = {"method": opts.method, "alpha": opts.alpha, "cmap": opts.cmap} if command == "cam" else None
        if team is not None:
            from hookcli.storage.fileformat import identity

            team.check_same(identity(record))
        return RunPlan(command=command, loaded=loaded, layers=selected, inputs=tuple(paths), settings=settings,
                       output=Output(kind, path, stream), record=record, forward=forward, shard_size=opts.shard_size,
                       force=opts.force, grid=opts.grid, target=target, cam_look=cam_look, notes=notes, part=part,
                       team=team)

@contextlib.contextmanager
def _left_on_error(team):
    """Leave ``team``'s process group when planning fails (a plan that succeeds leaves it when it has run)."""
    try:
        yield
    except BaseException:
        if team is not None:
            team.close()
        raise


def _part(opts: RunOptions, kind: str, output) -> object:
    """This process's :class:`~hookcli.run.launch.Part` of a shard folder that many write (``--part``, or what a
    launcher says), or None."""
    from hookcli.run.launch import detect_part, parse_part

    if opts.part is not None:
        if kind not in ("folder", "default"):
            raise UsageProblem("--part applies to a shard folder output (-o DIR/)",
                               hint="the processes share the work of one folder")
        return parse_part(opts.part)
    if kind == "memory":
        return None  # a Python caller's own loop: it decides who computes what
    part = detect_part()
    if part is not None and kind in ("file", "stdout", "cam"):
        raise UsageProblem(f"{part.count} processes started by {part.launcher} would each write all of '{output}'",
                           hint="write a shard folder (-o DIR/): they share its work" if kind != "cam" else
                           "run cam as one process")
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
    from hookcli.run.pipeline import RunSettings

    extracting = command == "extract"
    return RunSettings(
        capture=opts.capture if extracting else "output", device=opts.device, batch_size=opts.batch_size,
        workers=opts.workers, pool=opts.pool if extracting else None,
        dtype=opts.dtype if command != "cam" else "float32", on_error=opts.on_error, precision=opts.precision,
        memory_format=opts.memory_format, compile=opts.compile, fuse=opts.fuse if extracting else False,
        final_output=opts.detections or opts.flow,
    )


def _preprocess(loaded, opts: RunOptions):
    """The weights' preprocessing with the options' overrides. A model that squashes images to ``[height,
    width]`` takes ``--resize N`` as ``[N, N]`` unless ``--crop`` is given too."""
    resize = opts.resize
    if resize is not None and isinstance(loaded.preprocess.resize, tuple) and loaded.preprocess.kind == \
            "classification" and loaded.preprocess.crop is None and opts.crop is None:
        resize = (resize, resize)
    from hookcli.inputs.preprocess import DEVICE_DECODE_KINDS

    kind = loaded.preprocess.kind
    if opts.decode == "device" and kind not in DEVICE_DECODE_KINDS:
        raise UsageProblem(f"--decode device reads image files, and this {kind.replace('_', ' ')} model takes frames "
                           "decoded on the CPU", hint="leave out --decode device")
    return loaded.preprocess.replace(resize=resize, crop=opts.crop, mean=opts.mean, std=opts.std,
                                     interpolation=opts.interpolation, fast_decode=opts.fast_decode or None,
                                     decode=opts.decode)


def _output_kind(command: str, output, model_name: str) -> tuple[str, str | None]:
    if command == "cam":
        if output is None:
            return "memory", None
        return "cam", str(f"{_label(model_name)}-cam" if output is DEFAULT_OUTPUT else output)
    if output is None:
        return "memory", None
    if output is DEFAULT_OUTPUT:
        return "default", None
    if hasattr(output, "write"):
        return "stdout", "-"
    text = os.fspath(output)
    if text == "-":
        return "stdout", text
    if text.endswith(("/", os.sep)) or _is_dir(text):
        return "folder", text
    return "file", text


def _is_dir(path: str) -> bool:
    try:
        return Path(path).is_dir()
    except OSError:  # a name too long, say: the output checks say so in their words
        return False


def default_output_name(model_name: str, keys: Sequence[str], *, folder: bool = False, kind: str = "") -> Path:
    """``<model>-<key>`` for one layer's key, ``<model>-<n>layers`` for more; then ``<kind>.safetensors`` unless a
    folder."""
    label = keys[0] if len(keys) == 1 else f"{len(keys)}layers"
    name = f"{_label(model_name)}-{label.replace(os.sep, '_')}"
    return Path(name) if folder else Path(f"{name}{kind}.safetensors")


def _label(model_name: str) -> str:
    """The model's name as a file name: ``timm-resnet50`` for ``timm:resnet50`` (see :mod:`hookcli.models.sources`)."""
    from hookcli.models.sources import parse_model

    return parse_model(model_name).label


def _default_output(command: str, model_name: str, keys: Sequence[str], kind: str) -> str:
    return str(default_output_name(model_name, keys, folder=kind == "folder",
                                   kind=".grad" if command == "grad" else ""))


def _check_target(kind: str, path: str, inputs: Sequence[Path], force: bool) -> None:
    """Refuse a file or folder output that could not be written, and a file output that is one of the inputs or is
    named like another format."""
    _check_output(kind, path, force)
    if kind == "file":
        _refuse_overwriting_inputs([path], inputs)
        _refuse_other_format(path)


def _check_output(kind: str, path: str, force: bool) -> None:
    from hookcli.storage.shards import check_folder_target
    from hookcli.files import check_writable

    if kind == "folder":
        check_folder_target(path)
    else:
        check_writable(path, force=force)


#: Suffixes of formats other than safetensors (besides images'): an output file is refused under such a name.
_OTHER_FORMATS = frozenset({
    ".pt", ".pth", ".bin", ".ckpt", ".npy", ".npz", ".h5", ".hdf5", ".pkl", ".pickle", ".joblib", ".json",
    ".jsonl", ".csv", ".tsv", ".txt", ".parquet", ".arrow", ".feather", ".onnx", ".gguf", ".mat", ".zip", ".tar",
    ".gz", ".svg", ".pdf",
})


def _refuse_other_format(path: str) -> None:
    """What a file output holds is safetensors; a name that promises another format would mislead its reader.

    Any other name is written as given, one without a suffix too.
    """
    from hookcli.inputs.names import IMAGE_SUFFIXES

    suffix = Path(path).suffix
    if suffix.lower() in _OTHER_FORMATS | IMAGE_SUFFIXES:
        raise UsageProblem(f"output '{path}' ends in {suffix}, the suffix of another format",
                           hint=f"hookcli writes safetensors: name it '{Path(path).with_suffix('.safetensors')}', "
                           "or end the path with / for a shard folder")


def _refuse_drawn_grids(folder: str, keys: Sequence[str]) -> None:
    """``--grid``: refuse, before any work, a folder that already holds pictures of these keys (grid writes a layer's
    PNGs under names that start with its key; see :mod:`hookcli.pictures.grids`)."""
    from hookcli.errors import OutputExistsError
    from hookcli.pictures.grids import safe_name

    try:
        names = sorted(entry.name for entry in os.scandir(folder) if entry.name.endswith(".png"))
    except OSError:  # not there yet: nothing to overwrite
        return
    prefixes = tuple(safe_name(key) for key in keys)
    drawn = [name for name in names if name.startswith(prefixes)]
    if drawn:
        more = f" and {len(drawn) - 1} more" if len(drawn) > 1 else ""
        raise OutputExistsError(f"--grid folder '{folder}' already holds pictures of these layers ('{drawn[0]}'{more})",
                                hint="add --force to draw them again, or give another --grid folder")


def _refuse_overwriting_inputs(outputs: Sequence, inputs: Sequence[Path]) -> None:
    """An output that is one of the inputs would destroy it, --force or not."""
    def identity(path) -> tuple[int, int] | None:
        try:
            found = os.stat(path)
        except OSError:
            return None
        return found.st_dev, found.st_ino

    existing = {identity(p) for p in outputs} - {None}
    if not existing:
        return
    for source in inputs:
        if identity(source) in existing:
            raise UsageProblem(f"output '{next(p for p in outputs if identity(p) == identity(source))}' is the "
                               f"input '{source}'", hint="write the output somewhere else with -o")


def _gather(inputs, family: str, opts: RunOptions) -> tuple:
    """``(rows, notes)``: the run's rows, images (:class:`~hookcli.inputs.images.FoundInputs`) or for video and
    optical-flow models the clips or frame pairs of the videos given (:mod:`hookcli.inputs.video`), and what to tell."""
    from hookcli.families import DEFAULT_CLIP_LENGTH, family_traits
    from hookcli.inputs.images import FoundInputs, find_inputs

    recursive = opts.recursive
    arguments = _arguments(inputs)
    if not family_traits(family).videos:
        found = find_inputs(arguments, recursive=recursive)
        return found, (found.note,) if found.note else ()
    from hookcli.inputs import video
    from hookcli.errors import VideoError

    if opts.pair_with:
        return _image_pairs(arguments, opts, recursive), ()
    rows, notes = [], []
    for path in video.find_videos(arguments, recursive=recursive):
        try:
            if family == "video":
                clips = video.find_clips(path, length=opts.clip_length or DEFAULT_CLIP_LENGTH,
                                         stride=opts.frame_stride, clips=opts.clips_per_video or None)
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
    from hookcli.console import counted
    from hookcli.inputs.images import FoundInputs, find_inputs
    from hookcli.inputs.video import ImagePair

    if opts.frame_stride != 1:
        raise UsageProblem("--frame-stride applies to pairs cut from videos, not to pairs given as two image lists",
                           hint="see 'hookcli extract --help'")
    if "-" in arguments and "-" in opts.pair_with:
        raise UsageProblem("stdin (-) can give one of the two image lists, not both",
                           hint="name the other list's files or folder")
    firsts = find_inputs(arguments, recursive=recursive).paths
    seconds = find_inputs(_arguments(opts.pair_with), recursive=recursive).paths
    if len(firsts) != len(seconds):
        raise UsageProblem(f"the two image lists differ in length: {counted(len(firsts), 'first image')} and "
                           f"{len(seconds)} given with --pair-with",
                           hint="give one second image for each input image, in order")
    return FoundInputs([ImagePair(a, b) for a, b in zip(firsts, seconds, strict=True)])


def _fitted_to_family(command: str, family: str, opts: RunOptions, given: Mapping, help_hint: str) -> RunOptions:
    """Refuse a command or options that do not apply to the model's family; quantized models run on the CPU
    (``auto`` picks it).

    Said before any model loads: the family comes from the registry cache.
    """
    from hookcli.families import CPU_ONLY, family_traits

    traits = family_traits(family)
    if command == "cam" and not traits.cams or command == "grad" and not traits.gradients:
        raise UsageProblem(f"{command} does not apply to {family.replace('_', ' ')} models",
                           hint=_NO_GRADIENTS[family])
    if opts.region is not None and family != "segmentation":
        raise UsageProblem("--region applies to segmentation models", hint=help_hint)
    if opts.region is not None:
        from hookcli.run.gradients import parse_region

        parse_region(opts.region)

    clip_options = [name for name in _CLIPS if name in given and given[name] != getattr(RunOptions, name)]
    if not traits.videos and clip_options:
        users = "video and optical-flow models" if clip_options[0] == "frame_stride" else "video models"
        raise UsageProblem(f"--{clip_options[0].replace('_', '-')} applies to {users}, and this one is "
                           f"{family.replace('_', ' ')}", hint=help_hint)
    if family == "optical_flow" and {"clip_length", "clips_per_video"} & set(clip_options):
        raise UsageProblem("optical-flow models take pairs of frames: --clip-length and --clips-per-video do not "
                           "apply (--frame-stride sets how far apart the two frames are)", hint=help_hint)
    if family == "video" and opts.memory_format == "channels_last":
        raise UsageProblem("video models take 5-D clips, which have no channels-last layout",
                           hint="leave --memory-format at auto or contiguous")
    if opts.pair_with and family != "optical_flow":
        raise UsageProblem(f"--pair-with applies to optical-flow models, and this one is {family.replace('_', ' ')}",
                           hint=help_hint)
    if opts.flow and family != "optical_flow":
        raise UsageProblem(f"--flow applies to optical-flow models, and this one is {family.replace('_', ' ')}",
                           hint=help_hint)
    if opts.detections and family != "detection":
        raise UsageProblem(f"--detections applies to detection models, and this one is {family.replace('_', ' ')}",
                           hint=help_hint)
    if family in CPU_ONLY:
        if opts.device not in ("auto", "cpu"):
            raise UsageProblem(f"quantized models run on the CPU only, not on '{opts.device}'",
                               hint="use --device cpu (or auto), or the model without the quantized_ prefix")
        if opts.precision != "fp32":
            raise UsageProblem(f"quantized models compute in int8 and take --precision fp32 only, not "
                               f"{opts.precision}", hint=help_hint)
        return dataclasses.replace(opts, device="cpu")
    return opts


def _load(name: str, opts: RunOptions):
    from hookcli.models.loading import load_model

    return load_model(name, opts.weights, seed=opts.seed or 0)


def _command_parts(command, loaded, layers, settings, opts, target):
    """``(layers, forward factory, the command's own metadata entries)`` for ``command``."""
    from hookcli.run.selectors import resolve_layers

    if command == "extract":
        from hookcli.run.pipeline import extraction_forward

        return resolve_layers(loaded.module, _selectors(layers), model_name=loaded.name), \
            extraction_forward(settings), {}
    from hookcli.run.gradients import CamForward, GradientForward

    if command == "grad":
        return (resolve_layers(loaded.module, _selectors(layers), model_name=loaded.name),
                functools.partial(GradientForward, target=target, categories=loaded.categories,
                                  scores=loaded.scores), {"target": target.describe()})
    layer = _cam_layer(loaded, layers, settings)
    return ({layer: "cam"}, functools.partial(CamForward, target=target, categories=loaded.categories,
                                              method=opts.method, scores=loaded.scores,
                                              prefix_tokens=loaded.prefix_tokens),
            {"target": target.describe(), "method": opts.method, "cam_layer": layer})


def _selectors(layers) -> list[str]:
    return [layers] if isinstance(layers, str) else list(layers)


def _cam_layer(loaded, selector, settings) -> str:
    from hookcli.run.selectors import resolve_layers

    if selector:
        if not isinstance(selector, str):
            (selector,) = selector
        chosen = resolve_layers(loaded.module, [selector], model_name=loaded.name)
        if len(chosen) != 1:
            raise UsageProblem(f"cam takes one layer, and '{selector}' matches {len(chosen)}",
                               hint="see 'hookcli cam --help'")
        return next(iter(chosen))
    from hookcli.families import map_batch, natural_input
    from hookcli.run.gradients import default_cam_layer

    device = next(loaded.module.parameters()).device  # a model reused from an earlier run may be on a GPU
    example = natural_input(loaded.family, preprocess=settings.preprocess)
    return default_cam_layer(loaded, map_batch(example, lambda tensor: tensor.to(device)))


# -- execution -------------------------------------------------------------------------------------


def execute(run: RunPlan, progress: Callable[[Event], None] | None = None):
    """Run ``run`` into its output and return what its command's function returns.

    In memory: the rows as :class:`~hookcli.storage.features.Features` (with ``facts``
    and ``notes``); written: the path written (a shard folder's
    ``index.jsonl``; a CAM folder's ``cams.safetensors``); to stdout: None.
    Raises :class:`~hookcli.errors.ImageError` when no input could be read.
    """
    from hookcli.run.pipeline import iter_batches
    from hookcli.storage.features import Features

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
                for batch in iter_batches(run.loaded, run.layers, run.inputs, run.settings, forward=run.forward,
                                          order=order, on_note=note):
                    writer.add(batch)
                    for index, error in batch.failures:
                        emit(Skipped(str(run.inputs[index]), error))
                    emit(Advanced(len(batch.indices) + len(batch.failures)))
            if not writer.has_rows:
                raise ImageError("none of the input images could be read", hint="every input was skipped, each with "
                                 "its reason (on stderr; in Python, the Skipped events)")
            result = writer.finish()
        except BaseException:
            writer.abort()
            raise
        if run.team is not None:
            run.team.barrier()  # every process has listed its shards: the folder is complete
        complete = writer.complete or run.team is not None
        if not complete:
            note(f"'{run.output.path}' holds {writer.inputs_done} of its {len(run.inputs)} inputs: other processes "
                 "are writing the rest (or run the same command again to finish it)")
        if complete and (run.team is None or run.part.index == 0):  # one process of a team says what was written
            for path in writer.written:
                emit(Wrote(path))
        if isinstance(result, Features):
            result.notes = tuple(notes)
        if run.grid and complete and writer.finisher:
            from hookcli.pictures.grids import GridOptions
            from hookcli.storage.shards import open_features

            with result if isinstance(result, Features) else open_features(run.output.path) as written:
                draw_grids(written, GridOptions(), run.grid, force=run.force, progress=emit)
    if run.output.kind == "stdout":
        return None
    return result


def _writer(run: RunPlan, note: Callable[[str], None]):
    from hookcli.storage import writers

    kind, path = run.output.kind, run.output.path
    if kind == "memory":
        return writers.MemoryWriter(run.record, run.inputs)
    if kind == "stdout":
        return writers.StdoutWriter(run.record, run.inputs, run.output.stream)
    if kind == "folder":
        share = (run.part.index, run.part.count) if run.part is not None else (0, 1)
        return writers.FolderWriter(run.record, run.inputs, path, shard_size=run.shard_size, force=run.force,
                                    part=share, on_note=note)
    if kind == "file":
        return writers.FileWriter(run.record, run.inputs, path, force=run.force)
    (layer,) = run.layers
    inner = writers.FileWriter(run.record, run.inputs, str(Path(path) / "cams.safetensors"), force=run.force)
    from hookcli.pictures.cams import CamOverlays  # numpy and Pillow: not for the command line's start

    return CamOverlays(inner, run.inputs, path, preprocess=run.settings.preprocess, count=run.target.count,
                       layer=layer, force=run.force, on_note=note, **run.cam_look)


# -- pictures --------------------------------------------------------------------------------------


def draw_grids(features, options, output, *, force: bool = False,
               progress: Callable[[Event], None] | None = None):
    """Draw the grids ``options`` ask for; write them under ``output`` (a folder), or return them by file name.

    Written: the PNG paths in order. In memory (``output=None``): a dict of
    file name → ``uint8 [H, W, 3]`` pixels. Undrawable tensors are reported
    as :class:`Note` s.
    """
    from hookcli.pictures.grids import plan_grids, render_all, write_grids

    emit = progress or _ignore
    jobs = plan_grids(features, options, output, force=force)
    for text in (*getattr(features, "reading_notes", ()), *jobs.notes):
        emit(Note(text))
    emit(Started(total=len(jobs)))
    if output is None:
        return render_all(features, jobs, options, on_note=lambda text: emit(Note(text)),
                          on_drawn=lambda name: emit(Advanced(1)))

    def written(path: Path) -> None:
        emit(Wrote(path))
        emit(Advanced(1))

    return write_grids(features, jobs, options, force=force, on_written=written,
                       on_note=lambda text: emit(Note(text)))
