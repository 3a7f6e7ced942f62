"""``hookcli grid`` on a statistics file: a PNG for each chosen layer and channel, its dataset examples
(:func:`~hookcli.pictures.examples.examples_picture`), named ``<layer>__channel<NNNNN>.png``.

Layers are chosen with ``keys`` (globs over the layer keys), channels with
``channels`` and ``top`` (the channels of highest mean, highest first); without
either, a layer's first :data:`~hookcli.pictures.grid_job.DEFAULT_MAPS` channels
are drawn and a note says how to draw the others. ``images`` and ``frame`` choose
rows and frames of a features file, which a statistics file does not have.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hookcli.errors import UsageProblem
from hookcli.events import Advanced, Event, Note, Started, Wrote
from hookcli.files import check_folder_output, refuse_existing
from hookcli.options.grid import GridOptions
from hookcli.patterns import select_keys
from hookcli.pictures.examples import EXAMPLE_SIDE, ExamplePhotos, examples_picture, unit_word
from hookcli.pictures.file_names import file_stems
from hookcli.pictures.grid_job import DEFAULT_MAPS
from hookcli.pictures.png import save_png
from hookcli.pictures.render import check_cmap
from hookcli.storage.reader import FeatureReader
from hookcli.storage.stats_file import StatsFile, StatsLayer, read_stats

__all__ = ["ChosenUnits", "choose_units", "draw_stats_grids"]


@dataclass(frozen=True)
class ChosenUnits:
    """A layer's channels to show, in order, and its part of file names."""

    layer: StatsLayer
    stem: str
    channels: Sequence[int]


def choose_units(stats: StatsFile, options: GridOptions, *, limit: int | None) -> tuple[list[ChosenUnits], list[str]]:
    """The layers ``options.keys`` chooses and the channels ``options.channels`` and ``options.top`` choose of each
    (``limit``: how many a layer gives when neither does, None for all), with notes on what is left out. Refuses
    options that choose rows or frames or draw maps otherwise, and a channel range that selects none of any layer's
    channels."""
    if options.images or options.frame is not None:
        raise UsageProblem(
            f"{'--image' if options.images else '--frame'} chooses rows of a features file, and '{stats.name}' "
            "holds statistics of channels",
            hint="choose layers with -k and channels with --channels or --top",
        )
    if options.overlay or options.scale != "channel":  # the examples are always maps over photos, each its own range
        raise UsageProblem(
            f"{'--overlay' if options.overlay else '--scale'} applies to a features file's maps, and '{stats.name}' "
            "holds statistics, whose examples are each drawn over its photo on its own range",
            hint="leave it out",
        )
    keys = select_keys(list(stats.layers), options.keys, stats.name, what="layer")
    chosen, notes, refused = [], [], ""  # the first layer's refusal, said when no layer has the channels
    for key, stem in zip(keys, file_stems(keys)):
        layer = stats.layers[key]
        selected = range(layer.channels)[options.channels] if options.channels is not None else range(layer.channels)
        if not selected:  # a layer of fewer channels is left out, as grid leaves out a features file's
            none = f"--channels selects none of the {layer.channels} channels (0-{layer.channels - 1}) of '{key}'"
            refused = refused or none
            notes.append(f"skipped '{key}': {none}")
            continue
        channels: Sequence[int] = selected  # a range: a layer's channels are never listed one by one
        if options.top is not None:
            numbers = np.arange(selected.start, selected.stop, selected.step)
            means = np.nan_to_num(stats.read(key, "mean")[numbers], nan=-np.inf)
            channels = [int(numbers[i]) for i in np.argsort(-means, kind="stable")[: options.top]]
        elif options.channels is None and limit is not None and layer.channels > limit:
            channels = channels[:limit]
            notes.append(
                f"'{key}': drew channels 0-{limit - 1} of {layer.channels}; --channels {limit}:{2 * limit} draws "
                f"the next {limit}, --top {limit} those of highest mean, --channels : all of them"
            )
        if layer.examples == 0:
            notes.append(f"'{key}' kept no examples: its pictures are empty")
        chosen.append(ChosenUnits(layer, stem, channels))
    if not chosen:
        raise UsageProblem(refused, hint="give a range within them, or leave --channels out")
    return chosen, notes


def draw_stats_grids(
    features: FeatureReader,
    options: GridOptions,
    output: str | os.PathLike | None,
    *,
    force: bool = False,
    progress: Callable[[Event], None] | None = None,
) -> dict[str, np.ndarray] | list[Path]:
    """grid's pictures of a statistics file (see the module), written under ``output`` (their paths returned in
    order) or, with ``output=None``, returned by file name as ``uint8 [H, W, 3]`` pixels. A photo that cannot be
    read is said once, as a :class:`~hookcli.events.Note`."""
    emit = progress or (lambda event: None)
    stats = read_stats(features)
    check_cmap(options.overlay_cmap)
    if output is not None:
        check_folder_output(output)
    units, notes = choose_units(stats, options, limit=DEFAULT_MAPS)
    folder = Path(output or "")
    jobs = [
        (unit, channel, folder / f"{unit.stem}__{unit_word(unit.layer.key)}{channel:05d}.png")
        for unit in units
        for channel in unit.channels
    ]
    if output is not None and not force:
        jobs = _new_pictures(jobs, notes)
    for text in notes:
        emit(Note(text))
    emit(Started(total=len(jobs)))
    photos, said = ExamplePhotos(stats, EXAMPLE_SIDE), set()
    if photos.unusable is not None and any(unit.layer.spatial for unit in units):
        emit(Note(f"the maps are drawn without their photos: {photos.unusable}"))
    drawn: dict[str, np.ndarray] = {}
    written: list[Path] = []
    for unit, channel, path in jobs:
        picture = examples_picture(stats, unit.layer, channel, options, photos)
        for text in picture.notes:
            if text not in said:
                said.add(text)
                emit(Note(text))
        if output is None:
            drawn[path.name] = picture.pixels
        else:
            save_png(picture.pixels, path, force=force)
            written.append(path)
            emit(Wrote(path))
        emit(Advanced(1))
    return drawn if output is None else written


def _new_pictures(jobs: list, notes: list[str]) -> list:
    """The ``jobs`` whose pictures are not there yet, the others said in a note (all there: refused, as any output
    that exists)."""
    there = [job for job in jobs if job[2].exists()]
    if len(there) == len(jobs):
        refuse_existing((path for _, _, path in jobs), force=False)
    if there:
        names = ", ".join(path.name for _, _, path in there[:3]) + (
            f" and {len(there) - 3} more" if len(there) > 3 else ""
        )
        plural = "s" if len(there) > 1 else ""
        that = "that exist as they are" if plural else "that exists as it is"
        notes.append(
            f"left {len(there)} picture{plural} {that}: {names} (--force draws {'them' if plural else 'it'} again)"
        )
    kept = {path for _, _, path in there}
    return [job for job in jobs if job[2] not in kept]
