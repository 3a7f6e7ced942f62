"""The run layer: a command's options → one frozen :class:`RunPlan` → :func:`~hookcli.run.execute.execute`.

:func:`plan` resolves everything once. First what needs no model, and no
torch (:func:`hookcli.run.request.request`: the options, the layer
selectors, the inputs, the output, the model's and weights' names); then
:func:`plan_request` resolves the device, loads the model, resolves the
layers and the target (and the default output name when globs or types
leave it to the model), and picks the forward strategy and the writer.
:func:`~hookcli.run.execute.execute` runs the one batch pipeline
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
"""

from __future__ import annotations

import contextlib
import dataclasses
import json

import torch

from hookcli.errors import UsageProblem
from hookcli.families import DEFAULT_CLIP_LENGTH, family_traits
from hookcli.inputs.archives import input_key
from hookcli.inputs.preprocess import DEVICE_DECODE_KINDS
from hookcli.models import loading
from hookcli.models.catalog import ModelChoice
from hookcli.models.loaded import LoadedModel
from hookcli.options.run import RunOptions
from hookcli.run.commands import command_named
from hookcli.run.device import resolve_device
from hookcli.run.edits import edits_entries, with_edits
from hookcli.run.launch import cpu_threads
from hookcli.run.outputs import Output, refuse_drawn_grids
from hookcli.run.planned import RunPlan
from hookcli.run.request import RunRequest, arguments_of, gather_rows, request, shared_file, with_rows
from hookcli.run.settings import RunSettings
from hookcli.run.speed import check_precision, resolve_settings
from hookcli.run.team import join_team, local_device
from hookcli.storage.fileformat import RunRecord, identity, inputs_digest

__all__ = [
    "RunPlan",
    "plan",
    "plan_request",
]


def plan(command: str, model, layers, inputs, *, output=None, **options) -> RunPlan:
    """Resolve a run of ``command`` (``extract``, ``grad``, ``cam``, ``stats`` or ``compare``) with the options of
    :mod:`hookcli.api`.

    ``model`` is a model name or a :class:`~hookcli.models.loaded.LoadedModel`;
    ``layers`` one selector or a list (cam: one selector or None for the
    default layer); ``inputs`` a path, a folder, ``-`` or a list of them;
    ``output`` None (in memory), :data:`DEFAULT_OUTPUT`, a file, ``-`` or a
    binary stream (the file's bytes go there), or a folder (a string ending in
    ``/``, or an existing folder: a ``pathlib.Path`` drops the trailing slash). Raises the library's errors; usage
    errors before any model loads (:func:`hookcli.run.request.request`).
    """
    return plan_request(request(command, model, layers, inputs, output=output, **options))


def plan_request(asked: RunRequest) -> RunPlan:
    """The plan of a checked request: torchrun's processes form their group (and find their rows), the device is
    chosen, the model loads, its layers, target and default output name are resolved."""
    command, opts = asked.command, asked.opts
    does = command_named(command)
    does.check_options(opts)
    team = join_team(asked.part)
    with _left_on_error(team):
        if asked.rows is None:
            if team is not None and "-" in arguments_of(asked.inputs) + arguments_of(opts.pair_with or ()):
                # Rank 0 reads the list from stdin; the others get it from rank 0.
                asked = with_rows(asked, *team.share(lambda: gather_rows(asked)))
            else:
                asked = with_rows(asked, *gather_rows(asked))
        assert asked.rows is not None, "with_rows gives the request its rows"
        kind, path, paths = asked.kind, asked.path, asked.rows.paths
        model = asked.model
        device = _device(asked.part, opts, model.module if isinstance(model, LoadedModel) else None)
        loaded = (
            model if isinstance(model, LoadedModel) else dataclasses.replace(_load(asked.choice, opts), handed_in=False)
        )
        settings = dataclasses.replace(asked.settings, device=device, preprocess=_preprocess(loaded, opts))
        edit_notes: tuple[str, ...] = ()
        if asked.interventions:
            settings, edit_notes = with_edits(settings, loaded, asked.interventions, opts.seed or 0)
        settings = resolve_settings(settings, loaded, len(paths))
        target, notes = does.target(loaded, opts)
        compiled = edit_notes or does.compile_notes(loaded, settings, opts)  # edits say what they leave out
        notes = asked.notes + loaded.notes_for(asked.given) + compiled + notes
        selected, forward, entries = does.parts(loaded, asked.layers, settings, opts, target)
        entries = {**entries, **_row_entries(loaded, opts, paths), **edits_entries(settings)}
        if path is None:
            path = does.planned_path(kind, path, loaded.name, list(selected.values()))
            does.check_target(kind, path, paths, opts.force or shared_file(does, asked.part))
        if opts.grid and not opts.force and asked.keys is None:  # keys known without the model were checked then
            refuse_drawn_grids(opts.grid, list(selected.values()))
        does.check_planned(kind, path, paths, target, opts)
        record = _record(loaded, selected, settings, opts, paths, entries)
        if team is not None:
            team.check_same(identity(record))
        return RunPlan(
            command=command,
            loaded=loaded,
            layers=selected,
            inputs=tuple(paths),
            settings=settings,
            output=Output(kind, path, asked.stream),
            record=record,
            forward=forward,
            shard_size=opts.shard_size,
            force=opts.force,
            grid=opts.grid,
            target=target,
            notes=notes,
            part=asked.part,
            team=team,
            **does.extras(opts),
        )


def _device(part, opts: RunOptions, module=None):
    """The run's device (with ``auto``, where a caller's ``module`` sits if not on the CPU), this process's threads
    on a CPU shared by several, and what the device refuses."""
    device = resolve_device(local_device(part, opts.device), module)
    threads = cpu_threads(part)
    if device.type == "cpu" and threads:
        torch.set_num_threads(threads)  # the processes on this machine share its cores
    check_precision(opts.precision, device)
    if opts.decode == "device" and device.type not in ("cuda", "cpu"):
        raise UsageProblem(
            f"--decode device decodes on CUDA GPUs (nvJPEG), not on {device.type}",
            hint="leave out --decode device: the decode workers feed it",
        )
    return device


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


def _record(loaded: LoadedModel, selected, settings: RunSettings, opts: RunOptions, paths, entries) -> RunRecord:
    """The run as its files record it."""
    assert settings.preprocess is not None, "resolved settings carry their preprocessing"
    modules = dict(loaded.module.named_modules())
    return RunRecord(
        model=loaded.name,
        weights=loaded.weights,
        layers=dict(selected),
        layer_types={p: type(modules[p]).__name__ for p in selected},
        capture=settings.recorded_capture,
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
        categories=tuple(loaded.categories) if loaded.categories else None,
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


def _load(choice: ModelChoice | None, opts: RunOptions):
    assert choice is not None, "a request names the model it does not hold loaded"
    return loading.build_model(choice, seed=opts.seed or 0)  # looked up on use: a test's seam
