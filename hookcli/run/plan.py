"""The run layer: a command's options → one frozen :class:`RunPlan` → :func:`~hookcli.run.execute.execute`.

:func:`hookcli.api.plan` resolves everything once. First what needs no model, and no
torch (:func:`hookcli.run.request.request`: the options, the layer
selectors, the inputs, the output, the model's and weights' names); then
:func:`plan_request` resolves the device, loads the model, resolves the
layers and the target (and the default output name when globs or types
leave it to the model), and the forward strategy, asking the command.
:func:`~hookcli.run.execute.execute` runs the one batch pipeline
(:func:`hookcli.run.pipeline.iter_batches`) into the writer the command gives
(:mod:`hookcli.storage.writers`) and returns what the command's Python function
returns. The command line, the Python API (:mod:`hookcli.api`), the
benchmarks and any launcher of many processes all go through these two.

What happens along the way is reported to an optional ``progress``
callback as values (:mod:`hookcli.events`).

>>> import tempfile
>>> from hookcli.models.loading import load_model
>>> from hookcli.run.request import request
>>> photo = __import__("matplotlib.cbook").cbook.get_sample_data("grace_hopper.jpg", asfileobj=False)
>>> run = plan_request(request("extract", load_model("resnet18", "none"), "layer2", photo, resize=64, crop=64))
>>> run.output, run.settings.memory_format, run.layers
(Output(kind='memory', path=None), 'channels_last', {'layer2': 'layer2'})
>>> from hookcli.run.execute import execute
>>> events = []
>>> features = execute(run, progress=events.append)
>>> features["layer2"].shape, events[0]
(torch.Size([1, 128, 8, 8]), Started(total=1, done=0, output=None))
"""

from __future__ import annotations

import dataclasses
import functools
import json

from hookcli.families import DEFAULT_CLIP_LENGTH, family_traits
from hookcli.inputs.archives import input_key
from hookcli.inputs.decoding import device_jpeg_decoder
from hookcli.inputs.rows import arguments_of, find_rows
from hookcli.models import loading
from hookcli.models.loaded import LoadedModel
from hookcli.options.interventions import read_beside
from hookcli.run.commands import COMMANDS
from hookcli.run.edits import edits_entries, resampled_alone, unseen_by_attention, with_edits
from hookcli.run.outputs import Output, default_path, refuse_drawn_grids
from hookcli.run.planned import RunPlan
from hookcli.run.request import RunRequest, with_rows
from hookcli.run.settings import RunSettings
from hookcli.run.speed import resolve_settings, run_device
from hookcli.run.team import join_team, left_on_error
from hookcli.statistics.units import known_units
from hookcli.storage.fileformat import RunRecord, identity, inputs_digest

__all__ = ["RunPlan", "plan_request"]


def plan_request(asked: RunRequest) -> RunPlan:
    """The plan of a checked request: torchrun's processes form their group (and find their rows), the device is
    chosen, the model loads, its layers, target and default output name are resolved."""
    opts, does = asked.opts, COMMANDS[asked.command]
    team = join_team(asked.part)
    with left_on_error(team):
        if asked.rows is None:  # rank 0 reads a list given on stdin; the others get it from rank 0
            find = functools.partial(find_rows, asked.inputs, asked.family, opts)
            stdin = "-" in arguments_of(asked.inputs) + arguments_of(opts.pair_with or ())
            found, said = team.share(find) if team is not None and stdin else find()
            asked = with_rows(asked, found, said)
        assert asked.rows is not None, "with_rows gives the request its rows"
        kind, path, paths, model = asked.kind, asked.path, asked.rows.paths, asked.model
        held = model.module if isinstance(model, LoadedModel) else None  # a caller's module: run where it is
        device = run_device(asked.part, opts.device, opts.precision, opts.decode, held)
        if not isinstance(model, LoadedModel):
            assert asked.choice is not None, "a request names the model it does not hold loaded"
            model = dataclasses.replace(loading.build_model(asked.choice, seed=opts.seed or 0), handed_in=False)
        settings = dataclasses.replace(asked.settings, device=device, preprocess=model.preprocess.asked(opts))
        edit_notes: tuple[str, ...] = ()
        if asked.interventions:
            settings, edit_notes = with_edits(settings, model, asked.interventions, opts.seed or 0)
        settings = resolve_settings(settings, model, len(paths))
        parts = does.plan(asked, model, settings)
        notes = asked.notes + model.notes_for(asked.given) + (edit_notes or parts.compiled) + parts.notes
        notes += unseen_by_attention(settings.edits, parts.layers, settings.capture)
        resampled = [edit.intervention.named for edit in settings.edits if edit.intervention.edit == "resample"]
        notes += resampled_alone(resampled, settings.batch_size)
        notes += settings.preprocess.padding_notes() if settings.preprocess is not None else ()
        keys = list(parts.layers.values())
        if asked.named_later:
            path = default_path(kind, model.name, keys, does.named)
            read = [*paths, *read_beside(opts, asked.interventions)]
            does.check_target(kind, path, read, opts.force or (does.gathers and asked.part is not None))
        if opts.grid and not opts.force and asked.keys is None and asked.part is None:  # else checked then, or not
            refuse_drawn_grids(opts.grid, keys)
        record = _record(model, parts.layers, settings, opts, paths, parts.entries, edits_entries(settings))
        if team is not None:
            team.check_same(identity(record))
        return RunPlan(
            command=asked.command,
            loaded=model,
            layers=parts.layers,
            inputs=tuple(paths),
            settings=settings,
            output=Output(kind, path, asked.stream),
            record=record,
            forward=parts.forward,
            shard_size=opts.shard_size,
            force=opts.force,
            grid=opts.grid,
            target=parts.target,
            notes=notes,
            part=asked.part,
            team=team,
            **parts.extras,
        )


def _record(loaded: LoadedModel, selected, settings: RunSettings, opts, paths, entries, edits) -> RunRecord:
    """The run as its files record it: the command's ``entries``, how a run of clips or pairs of frames cut its rows
    (a resumed run must cut the same), then its ``edits``' entries."""
    assert settings.preprocess is not None, "resolved settings carry their preprocessing"
    row = family_traits(loaded.family).row
    cut: dict[str, str] = {}
    if row == "clip":
        cut = {
            "clip_length": str(opts.clip_length or DEFAULT_CLIP_LENGTH),
            "frame_stride": str(opts.frame_stride),
            "clips_per_video": str(opts.clips_per_video),
        }
    elif row == "pair" and opts.pair_with:  # a resumed run must pair the same second images
        cut = {"second_inputs_sha256": inputs_digest([input_key(p.second) for p in paths])}
    elif row == "pair":
        cut = {"frame_stride": str(opts.frame_stride)}
    modules = dict(loaded.module.named_modules())
    # The JPEG decoder of --decode device: its pixels differ from the others'.
    decoder = {"decoder": device_jpeg_decoder(settings.device)} if settings.preprocess.decode == "device" else {}
    return RunRecord(
        model=loaded.name,
        weights=loaded.weights,
        layers=dict(selected),
        layer_types={p: type(modules[p]).__name__ for p in selected},
        layer_units={p: known_units(modules[p]) for p in selected},
        capture=settings.recorded_capture,
        preprocess=json.loads(settings.preprocess.to_json()) | decoder,
        pool=settings.pool or "none",
        dtype=settings.dtype,
        precision=settings.precision,
        memory_format=settings.memory_format,
        fuse=settings.fusing,
        device=getattr(settings.device, "type", str(settings.device)),  # the kind: one GPU or several make one file
        on_error=settings.on_error,
        shard_size=opts.shard_size,
        inputs=tuple(input_key(p) for p in paths),
        command={**entries, **cut, **edits},
        family=loaded.family,
        prefix_tokens=loaded.prefix_tokens,
        categories=tuple(loaded.categories) if loaded.categories else None,
    )
