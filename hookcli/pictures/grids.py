"""Render PNG pictures of saved features: one per (tensor, image).

:func:`plan_grids` picks tensors (``keys``, globs), images (``images``: row
index or input file name) and names each PNG
``<key>__<row>_<input name>.png`` (``….overlay.png`` for overlays;
``<key>.frame<T>__…`` for one frame of a clip) so a folder
sorts by tensor, then row. Every planned path is checked before anything is
drawn; :func:`write_grids` then reads one row at a time (only the channels it
draws) and writes each PNG atomically.

What each tensor becomes is chosen here (:mod:`hookcli.pictures.render` draws it): a
video clip's ``[C, T, H, W]`` row is a table of channels by frames, or with
``frame`` the ``[C, H, W]`` of one frame; the ``[2, H, W]`` rows of a file
whose metadata says ``"family": "optical_flow"`` are colour-coded flow
fields (``flow_as_channels``: two channel maps, dx and dy).

Rows of their own shapes (a *ragged* key: a detection model's maps, a
segmentation model's images of their own sizes) are each drawn at their own
shape from their own values; the plan is made from the largest row. A
detection file's final detections (``detections#boxes``, ``#labels``,
``#scores``, …) are not maps: each image gets one picture of them, its boxes
with label and score over the photo (:func:`~hookcli.pictures.reading.read_detections` reads them).

>>> from hookcli.storage.features import Features
>>> features = Features({"x": np.ones((1, 4, 3, 3), dtype="float32")}, {"inputs": '["/photos/cat.jpg"]'})
>>> options = GridOptions(channels="0:2", plain=True)
>>> jobs = plan_grids(features, options, "grids")
>>> [str(job.path) for job in jobs]
['grids/x__00000_cat.png']
>>> from hookcli.pictures.drawing import render_job
>>> render_job(features, jobs[0], options).shape
(37, 72, 3)
"""

from __future__ import annotations

import bisect
import itertools
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
from hookcli.pictures.ablation_grids import draw_ablation_grids
from hookcli.pictures.compare_grids import draw_compare_grids
from hookcli.pictures.drawing import render_picture
from hookcli.pictures.file_names import capped, file_stems, safe_name
from hookcli.pictures.grid_job import DEFAULT_MAPS, GridJob
from hookcli.pictures.patch_grids import draw_patch_grids
from hookcli.pictures.png import save_png
from hookcli.pictures.reading import (
    BOXES,
    DRAWN_DETECTIONS,
    channels_first,
    detection_keys,
    drawn_shape,
    draws_flow,
    input_names,
    recorded_prefix_tokens,
    row_drawn,
    select_rows,
)
from hookcli.pictures.render import (
    CLIPS,
    MAX_PIXELS,
    STRIPS,
    NotDrawable,
    RowNotDrawable,
    check_cmap,
    map_layout,
    tiles_that_fit,
)
from hookcli.pictures.stats_grids import draw_stats_grids
from hookcli.storage.ablation_format import is_ablation
from hookcli.storage.compare_format import is_comparison
from hookcli.storage.fileformat import DETECTIONS, PRODUCER
from hookcli.storage.patch_format import is_patch
from hookcli.storage.reader import FeatureReader
from hookcli.storage.stats_format import is_stats

__all__ = [
    "FOREIGN_PICTURES",
    "GridPlan",
    "draw_grids",
    "plan_grids",
    "render_all",
    "write_grids",
]


@dataclass(frozen=True)
class _KeyPlan:
    """What is drawn of one tensor: its file-name stem, the rows, and at most ``limit`` of its selected maps."""

    key: str
    stem: str
    rows: Sequence[int]
    limit: int | None


class GridPlan(Sequence):
    """The PNGs to write, as a sequence of :class:`GridJob` made on demand (a file may have millions of rows).

    Jobs come tensor by tensor in the order the tensors were chosen, each tensor's rows in selection order (ascending
    when none is given), so a tensor's job for a row can be found by position. ``notes`` say what will not be drawn in
    full: undrawable tensors, channel ranges that miss a tensor, pictures cut to their limits. ``detections``: the
    chosen keys of a detection file's final detections (:func:`detection_keys`), drawn together as one picture a row
    under ``detections#boxes`` when the photos can be found.
    """

    def __init__(
        self,
        keys: Sequence[_KeyPlan],
        names: Callable[[int], str],
        inputs: Sequence[str] | None,
        out_dir: Path,
        suffix: str,
        notes: Sequence[str],
        detections: Sequence[str] = (),
    ) -> None:
        self._keys, self._names, self._inputs = list(keys), names, inputs
        self._out_dir, self._suffix, self.notes = out_dir, suffix, tuple(notes)
        self.detections = tuple(detections)
        self._starts = list(itertools.accumulate((len(k.rows) for k in self._keys), initial=0))

    def __len__(self) -> int:
        return self._starts[-1]

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        if not -len(self) <= index < len(self):
            raise IndexError(f"job {index} out of range")
        index %= len(self)
        number = bisect.bisect_right(self._starts, index) - 1
        plan = self._keys[number]
        row = plan.rows[index - self._starts[number]]
        name = self._names(row)
        stem = capped(safe_name(Path(name).stem or f"row{row:05d}"), _INPUT_STEM)
        path = self._out_dir / f"{plan.stem}__{row:05d}_{stem}{self._suffix}"
        return GridJob(
            plan.key, row, Path(name).name, path, self._inputs[row] if self._inputs is not None else None, plan.limit
        )


#: The longest input part of a PNG's name: with the key's (:func:`~hookcli.pictures.file_names.file_stems`), the row
#: number, suffix and a temporary name's extras, well under 255 bytes.
_INPUT_STEM = 60


#: Pictures of a file hookcli did not write (a checkpoint, say) past which a note says how they were read.
FOREIGN_PICTURES = 64


def plan_grids(
    features: FeatureReader, options: GridOptions, out_dir: str | os.PathLike | None, *, force: bool = False
) -> GridPlan:
    """List the PNGs to write under ``out_dir`` (None: drawn in memory, named but not written).

    Refuses unknown keys, bad image indices, selections with nothing to draw
    and existing files (unless ``force``).

    Nothing is read but the header: what each picture will cost is known from
    the shapes (a ragged key's largest row), and :data:`~hookcli.pictures.render.MAX_TILES`
    and :data:`~hookcli.pictures.render.MAX_PIXELS` bound it. The keys of final
    detections chosen make one picture a row, in the place of the first.
    """
    check_cmap(options.overlay_cmap if options.overlay else options.maps_cmap)
    if out_dir is not None:
        check_folder_output(out_dir)
    keys = select_keys(features.keys(), options.keys, features.name)
    detections = detection_keys(features, keys)
    drawable: dict[str, tuple[int | None, str | None]] = {}
    notes: list[str] = []
    refusals: list[str] = []
    for key in keys:
        if key in detections:
            if key == detections[0]:
                _plan_detections(features, detections, drawable, notes, refusals)
            continue
        try:
            drawable[key] = _maps_limit(
                channels_first(features, drawn_shape(features, key)),
                options,
                flow=draws_flow(features, key, options),
                prefix=recorded_prefix_tokens(features.metadata),
            )
        except NotDrawable as reason:
            refusals.append(f"'{key}' (shape {features.shape(key)}): {reason}")
            notes.append(f"skipped '{key}' (shape {features.shape(key)}): {reason}")
            continue
        if drawable[key][1]:
            notes.append(f"'{key}': {drawable[key][1]}")
    if not drawable:
        shown = "; ".join(refusals[:3]) + (f"; and {len(refusals) - 3} more tensors" if len(refusals) > 3 else "")
        raise UsageProblem(
            f"nothing to draw in '{features.name}': {shown}",
            hint="'hookcli info' shows the shapes; choose other tensors (-k) or channels",
        )
    if options.frame is not None and not any(len(drawn_shape(features, key)) == 5 for key in keys):
        notes.append(
            f"--frame {options.frame} chooses a frame of video clips ([C, T, H, W] per row), and none of "
            "the tensors has them"
        )
    rows = max(features.shape(k)[0] for k in drawable)
    inputs = input_names(features.metadata, rows)
    listed = inputs is not None
    chosen_rows = select_rows(options.images, inputs, rows)
    if options.overlay and not listed:
        raise UsageProblem(
            f"--overlay needs the input images, and '{features.name}' does not list them",
            hint="overlays work on files written by hookcli extract, whose 'inputs' metadata names the images",
        )
    plans = []
    for key, stem in zip(drawable, file_stems([DETECTIONS if key == BOXES else key for key in drawable])):
        if options.frame is not None and key != BOXES and len(drawn_shape(features, key)) == 5:
            stem += f".frame{options.frame}"  # one frame of a clip: named apart from the whole clip's picture
        count = features.shape(key)[0]
        key_rows = (
            chosen_rows[: bisect.bisect_left(chosen_rows, count)]
            if isinstance(chosen_rows, range)
            else [r for r in chosen_rows if r < count]
        )
        plans.append(_KeyPlan(key, stem, key_rows, drawable[key][0]))
    pictures = sum(len(plan.rows) for plan in plans)
    if features.metadata.get("producer") != PRODUCER and not options.keys and pictures > FOREIGN_PICTURES:
        notes.append(
            f"'{features.name}' was not written by hookcli: each tensor's first dimension is read as its images, "
            f"{pictures} picture{'s' * (pictures != 1)} of {len(plans)} tensor{'s' * (len(plans) != 1)}; "
            "-k chooses tensors, -i images"
        )
    names = (lambda row: inputs[row]) if inputs is not None else (lambda row: f"row{row:05d}")
    plan = GridPlan(
        plans,
        names,
        inputs if listed else None,
        Path(out_dir or ""),
        ".overlay.png" if options.overlay else ".png",
        notes,
        detections,
    )
    if out_dir is not None:
        refuse_existing((job.path for job in plan), force=force)
    return plan


def _plan_detections(
    features: FeatureReader,
    chosen: Sequence[str],
    drawable: dict[str, tuple[int | None, str | None]],
    notes: list[str],
    refusals: list[str],
) -> None:
    """Plan the detections picture (under :data:`BOXES`), or say why there is none; note what it leaves out."""
    if BOXES not in features.keys():
        reason = f"there is no '{BOXES}' to draw them from"
    elif input_names(features.metadata, features.shape(BOXES)[0]) is None:
        reason = f"they are drawn over the input images, and '{features.name}' does not list them"
    else:
        drawable[BOXES] = (None, None)
        left_out = ", ".join(f"'{key}'" for key in chosen if key not in DRAWN_DETECTIONS)
        if left_out:
            notes.append(f"not drawn: {left_out} (the detections picture shows each image's boxes, labels and scores)")
        return
    named = ", ".join(f"'{key}'" for key in chosen)
    refusals.append(f"the detections ({named}): {reason}")
    notes.append(f"skipped the detections ({named}): {reason}")


def _maps_limit(
    shape: Sequence[int], options: GridOptions, *, flow: bool = False, prefix: int | None = None
) -> tuple[int | None, str | None]:
    """``(how many selected maps one picture holds or None for all, a note when not all)``; NotDrawable if none.

    Without ``--channels`` or ``--top``, a layer of more than
    :data:`DEFAULT_MAPS` channels is drawn by its first :data:`DEFAULT_MAPS`,
    and the note says how to draw the others. A video clip's map is a
    channel's row of frames. ``flow``: the rows are drawn as optical-flow
    fields, which use both their channels whatever the selection.
    """
    if not shape:
        raise NotDrawable("a 0-dimensional tensor has no rows")
    if shape[0] == 0:
        raise NotDrawable("it has no rows")
    if flow:
        if options.overlay:
            raise NotDrawable(
                "--overlay does not draw optical-flow fields (--flow-as-channels draws dx and dy as maps)"
            )
        if shape[2] * shape[3] > MAX_PIXELS:
            raise NotDrawable(
                f"a {shape[2]}x{shape[3]} flow field is larger than a picture may be ({MAX_PIXELS:,} pixels)"
            )
        return None, None
    row, _ = row_drawn(shape[1:], options)
    count, height, width, layout = map_layout(row, prefix)
    kind = "value" if layout in STRIPS else "channel"
    selected, reach = range(count), None
    if options.channels is not None:
        selected = selected[options.channels]
        described = f"{count} {kind}s (0-{count - 1})" if count > 1 else f"one {kind} (0)"
        if not selected:  # a layout has one map at least
            raise NotDrawable(f"--channels {_text(options.channels)} selects none of its {described}")
        start, stop = options.channels.start, options.channels.stop
        if (stop is not None and stop > count) or (start is not None and start < -count):
            reach = f"--channels {_text(options.channels)} reaches past its {described}: it selects {_span(selected)}"
    if options.overlay:
        if layout in STRIPS or layout == "matrix":
            raise NotDrawable("--overlay needs maps laid out like the image, and these values are not")
        if len(shape) == 5:
            raise NotDrawable("--overlay needs the photo the model saw, and a video clip's frames are not kept")
        return None, reach
    wanted = min(len(selected), options.top) if options.top is not None else len(selected)
    fits = tiles_that_fit(height, width, padding=options.padding, layout=layout)
    if layout in CLIPS:
        fits //= row[1]  # a channel is a row of T tiles
    if fits == 0:
        what = (
            f"one channel's {row[1]} frames of {height}x{width} are"
            if layout in CLIPS
            else f"one {height}x{width} map is"
        )
        raise NotDrawable(f"{what} larger than a picture may be ({MAX_PIXELS:,} pixels)")
    if options.channels is None and options.top is None and layout not in STRIPS and count > DEFAULT_MAPS:
        return DEFAULT_MAPS, (
            f"drew channels 0-{DEFAULT_MAPS - 1} of {count}; --channels {DEFAULT_MAPS}:"
            f"{2 * DEFAULT_MAPS} draws the next {DEFAULT_MAPS}, --top {DEFAULT_MAPS} the most "
            f"active, --channels : all of them" + (f" ({fits} a picture)" if fits < count else "")
        )
    if wanted <= fits:
        return None, reach
    what = (
        "values"
        if layout in STRIPS
        else f"channels of {row[1]} frames of {height}x{width}"
        if layout in CLIPS
        else f"tiles of {height}x{width}"
    )
    if options.top is not None:
        top = f"drew the top {fits} of the {wanted} asked for: a picture holds at most {fits} {what}"
        return fits, _joined(reach, top)
    first, last = selected[0], selected[fits - 1]
    following = (
        f"{selected[fits]}:{selected[fits] + fits * selected.step}" if selected.step == 1 else f"{selected[fits]}:"
    )
    return fits, _joined(
        reach,
        f"drew {kind}s {first}-{last} of {count}: a picture holds at most {fits} {what}; "
        f"--channels {following} draws the next",
    )


def _span(selected: range) -> str:
    return f"{selected[0]}-{selected[-1]}" if len(selected) > 1 else f"{selected[0]}"


def _joined(*notes: str | None) -> str | None:
    """The notes given, in one line (None when there are none)."""
    return "; ".join(note for note in notes if note) or None


def _text(channels: slice) -> str:
    """``--channels`` as text: ``A:B``, or ``K`` for the one channel ``K:K+1``."""
    if channels.start is not None and channels.stop == channels.start + 1:
        return str(channels.start)
    start = "" if channels.start is None else channels.start
    stop = "" if channels.stop is None else channels.stop
    return f"{start}:{stop}"


def write_grids(
    features: FeatureReader,
    jobs: GridPlan,
    options: GridOptions,
    *,
    force: bool = False,
    on_note: Callable[[str], None] | None = None,
    on_written: Callable[[Path], None] | None = None,
) -> list[Path]:
    """Render and write every job's PNG (atomically); undrawable tensors and pictures' notes go to ``on_note``."""
    written = []
    for job, pixels in _rendered(features, jobs, options, on_note):
        save_png(pixels, job.path, force=force)
        written.append(job.path)
        if on_written is not None:
            on_written(job.path)
    return written


def render_all(
    features: FeatureReader,
    jobs: GridPlan,
    options: GridOptions,
    *,
    on_note: Callable[[str], None] | None = None,
    on_drawn: Callable[[str], None] | None = None,
) -> dict[str, np.ndarray]:
    """Every job's pixels by file name, in memory."""
    pictures = {}
    for job, pixels in _rendered(features, jobs, options, on_note):
        pictures[job.path.name] = pixels
        if on_drawn is not None:
            on_drawn(job.path.name)
    return pictures


def _rendered(features: FeatureReader, jobs: GridPlan, options: GridOptions, on_note):
    undrawable = set()
    for job in jobs:
        if job.key in undrawable:
            continue
        try:
            picture = render_picture(features, job, options)
        except RowNotDrawable as reason:
            if on_note is not None:
                on_note(f"skipped '{job.key}' of image {job.row} ({job.name}): {reason}")
            continue
        except NotDrawable as reason:
            undrawable.add(job.key)
            if on_note is not None:
                on_note(f"skipped '{job.key}' (shape {features.shape(job.key)}): {reason}")
            continue
        if on_note is not None:
            for text in picture.notes:
                on_note(text)
        yield job, picture.pixels


def draw_grids(
    features: FeatureReader,
    options: GridOptions,
    output: str | os.PathLike | None,
    *,
    force: bool = False,
    progress: Callable[[Event], None] | None = None,
) -> dict[str, np.ndarray] | list[Path]:
    """Draw the grids ``options`` ask for; write them under ``output`` (a folder), or return them by file name.

    Written: the PNG paths in order. In memory (``output=None``): a dict of
    file name → ``uint8 [H, W, 3]`` pixels. Undrawable tensors are reported
    as :class:`Note` s. A statistics file's pictures are its channels' dataset
    examples (:func:`~hookcli.pictures.stats_grids.draw_stats_grids`), a comparison file's one heatmap of its
    matrix (:func:`~hookcli.pictures.compare_grids.draw_compare_grids`), an ablation file's one of its units and
    classes (:func:`~hookcli.pictures.ablation_grids.draw_ablation_grids`), a patching file's of its effects
    (:func:`~hookcli.pictures.patch_grids.draw_patch_grids`).
    """
    if is_stats(features.metadata):
        return draw_stats_grids(features, options, output, force=force, progress=progress)
    if is_comparison(features.metadata):
        return draw_compare_grids(features, options, output, force=force, progress=progress)
    if is_ablation(features.metadata):
        return draw_ablation_grids(features, options, output, force=force, progress=progress)
    if is_patch(features.metadata):
        return draw_patch_grids(features, options, output, force=force, progress=progress)
    emit = progress or (lambda event: None)
    jobs = plan_grids(features, options, output, force=force)
    for text in (*getattr(features, "reading_notes", ()), *jobs.notes):
        emit(Note(text))
    emit(Started(total=len(jobs)))
    if output is None:
        return render_all(
            features, jobs, options, on_note=lambda text: emit(Note(text)), on_drawn=lambda name: emit(Advanced(1))
        )

    def written(path: Path) -> None:
        emit(Wrote(path))
        emit(Advanced(1))

    return write_grids(features, jobs, options, force=force, on_written=written, on_note=lambda text: emit(Note(text)))
