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
with label and score over the photo (:func:`read_detections` reads them).

>>> from hookcli.storage.features import Features
>>> features = Features({"x": np.ones((1, 4, 3, 3), dtype="float32")}, {"inputs": '["/photos/cat.jpg"]'})
>>> options = GridOptions(channels="0:2", plain=True)
>>> jobs = plan_grids(features, options, "grids")
>>> [str(job.path) for job in jobs]
['grids/x__00000_cat.png']
>>> render_job(features, jobs[0], options).shape
(37, 72, 3)
"""

from __future__ import annotations

import bisect
import collections
import hashlib
import itertools
import json
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from hookcli.console import printable
from hookcli.errors import FeatureFileError, HookcliError, UsageProblem, check_choice, check_whole
from hookcli.storage.fileformat import DETECTIONS
from hookcli.inputs.preprocess import Preprocess
from hookcli.pictures.render import (
    BOX_COLOURS,
    CLIPS,
    MAX_PIXELS,
    STRIPS,
    NotDrawable,
    RowNotDrawable,
    add_colorbar,
    add_flow_legend,
    add_title,
    as_maps,
    check_cmap,
    draw_boxes,
    flow_colours,
    frame_layout,
    longest_flow,
    map_layout,
    number,
    overlay,
    scale_maps,
    strip,
    tile_frames,
    tile_layout,
    tile_maps,
    tiles_that_fit,
    value_range,
)
from hookcli.patterns import glob_to_regex
from hookcli.files import check_folder_output, refuse_existing

__all__ = [
    "DEFAULT_MAPS", "SCALES", "Detections", "GridJob", "GridOptions", "GridPlan", "Picture", "default_grid_folder",
    "detection_keys", "drawn_shape", "heat_picture", "input_names", "model_photo", "parse_channels", "plan_grids",
    "recorded_prefix_tokens",
    "read_detections", "render_all", "render_job", "render_picture", "safe_name", "select_rows", "write_grids",
]

SCALES = ("channel", "grid")

_UNSAFE = re.compile(r"[^A-Za-z0-9._@#+=-]+")
_LAYOUTS = {"tokens": "tokens as a square", "tokens+cls": "tokens as a square, class token left out",
            "matrix": "tokens x dims"}
#: Channels drawn when neither --channels nor --top is given: a wide layer's first 64, with a note on the rest.
DEFAULT_MAPS = 64
#: Tiled pictures are enlarged to at least this width, so one channel or a few are not a thumbnail.
_MIN_WIDTH = 384
#: The ``family`` metadata of files whose ``[2, H, W]`` rows are optical-flow fields.
_FLOW_FAMILY = "optical_flow"
#: The ``family`` metadata of files whose ``detections#…`` keys are a detection model's final detections.
_DETECTION_FAMILY = "detection"
#: The key the detections picture is planned under; the other ``detections#…`` keys are drawn with it.
_BOXES = f"{DETECTIONS}#boxes"
#: What the detections picture shows of them.
_DRAWN_DETECTIONS = (_BOXES, f"{DETECTIONS}#labels", f"{DETECTIONS}#scores")


def recorded_prefix_tokens(metadata) -> int | None:
    """The ``prefix_tokens`` a file's metadata records (class and register tokens of a vision transformer), or None
    when it records none or something that is not a small whole number (the metadata is untrusted)."""
    text = metadata.get("prefix_tokens") if hasattr(metadata, "get") else None
    try:
        count = int(text) if isinstance(text, str) and text.strip().isdigit() else None
    except ValueError:
        return None
    return count if count is not None and count <= 4096 else None


def parse_channels(value) -> slice | None:
    """A channel selection as a slice: ``"A:B"`` (either end may be left out), one channel ``K``, or a slice."""
    if value is None or isinstance(value, slice):
        return value
    text = str(value).strip()
    try:
        if ":" not in text:
            index = int(text)
            return slice(index, index + 1 if index != -1 else None)
        start, stop = text.split(":")
        return slice(int(start) if start else None, int(stop) if stop else None)
    except ValueError:
        raise ValueError(f"'{value}' is not a channel range; use A:B, A:, :B or one index K") from None


def default_grid_folder(source) -> str:
    """Where grid writes when no folder is given: ``<file stem>_grids``, or ``grids`` for stdin and memory."""
    if not isinstance(source, str | os.PathLike) or os.fspath(source) == "-":
        return "grids"
    return f"{Path(source).name.removesuffix('.safetensors') or 'features'}_grids"


@dataclass(frozen=True)
class GridOptions:
    """How to draw: which tensors and images, which channels, and the look of the grid.

    ``keys`` and ``images`` take one value or a list; ``channels`` a slice,
    ``"A:B"`` or one channel. ``plain`` draws just the tiles: no caption,
    channel numbers or colour bar, and no enlargement past ``min_tile``.
    ``frame``: draw only this frame (from 0) of video clips, as ``[C, H, W]``
    maps. ``flow_as_channels``: draw optical-flow fields as their two
    channels rather than in colour. Values are checked here, with the
    library's errors.
    """

    keys: Sequence[str] = ()
    images: Sequence[str] = ()
    channels: slice | None = None
    top: int | None = None
    columns: int | None = None
    padding: int = 2
    cmap: str = "viridis"
    scale: str = "channel"
    min_tile: int = 32
    title: bool = True
    plain: bool = False
    overlay: bool = False
    alpha: float = 0.5
    overlay_cmap: str = "inferno"
    frame: int | None = None
    flow_as_channels: bool = False

    def __post_init__(self) -> None:
        for name in ("keys", "images"):
            value = getattr(self, name)
            object.__setattr__(self, name, (value,) if isinstance(value, str | int) else tuple(value))
        object.__setattr__(self, "images", tuple(str(i) for i in self.images))
        try:
            object.__setattr__(self, "channels", parse_channels(self.channels))
        except ValueError as err:
            raise UsageProblem(f"invalid channels: {err}") from None
        for name, low, high in (("top", 1, None), ("columns", 1, None), ("padding", 0, 64), ("min_tile", 1, 1024),
                                ("frame", 0, None)):
            check_whole(name, getattr(self, name), low, high, optional=True)
        check_choice("scale", self.scale, SCALES)
        if not 0 <= self.alpha <= 1:
            raise UsageProblem(f"alpha must be between 0 and 1, not {self.alpha!r}")


@dataclass(frozen=True)
class GridJob:
    """One PNG to draw: tensor ``key``, row ``row`` (input ``name``), written to ``path``.

    ``limit``: how many of the selected maps the picture holds (None: all).
    """

    key: str
    row: int
    name: str
    path: Path
    source_image: str | None = field(default=None, repr=False)
    limit: int | None = None


@dataclass(frozen=True)
class _KeyPlan:
    """What is drawn of one tensor: its file-name stem, the rows, and at most ``limit`` of its selected maps."""

    key: str
    stem: str
    rows: Sequence[int]
    limit: int | None


class GridPlan(Sequence):
    """The PNGs to write, as a sequence of :class:`GridJob` made on demand (a file may have millions of rows).

    Jobs come tensor by tensor, in the order the tensors were chosen, and
    each tensor's rows in the order of the image selection (ascending when
    none is given), so a tensor's job for a row can be found by position.

    ``notes`` say what will not be drawn, or not all of it: undrawable
    tensors, channel ranges that miss a tensor, pictures cut to their limits.
    ``detections``: the chosen keys of a detection file's final detections
    (:func:`detection_keys`), drawn together as one picture a row, planned
    under ``detections#boxes`` (when the photos can be found).
    """

    def __init__(self, keys: Sequence[_KeyPlan], names: Callable[[int], str], inputs: Sequence[str] | None,
                 out_dir: Path, suffix: str, notes: Sequence[str], detections: Sequence[str] = ()) -> None:
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
        stem = _capped(safe_name(Path(name).stem or f"row{row:05d}"), _INPUT_STEM)
        path = self._out_dir / f"{plan.stem}__{row:05d}_{stem}{self._suffix}"
        return GridJob(plan.key, row, Path(name).name, path, self._inputs[row] if self._inputs is not None else None,
                       plan.limit)


#: Longest parts of a PNG's name: with the row number, suffix and a temporary name's extras, well under 255 bytes.
_KEY_STEM, _INPUT_STEM = 100, 60


def plan_grids(features, options: GridOptions, out_dir: str | os.PathLike | None, *,
               force: bool = False) -> GridPlan:
    """List the PNGs to write under ``out_dir`` (None: drawn in memory, named but not written).

    Refuses unknown keys, bad image indices, selections with nothing to draw
    and existing files (unless ``force``).

    Nothing is read but the header: what each picture will cost is known from
    the shapes (a ragged key's largest row), and :data:`~hookcli.pictures.render.MAX_TILES`
    and :data:`~hookcli.pictures.render.MAX_PIXELS` bound it. The keys of final
    detections chosen make one picture a row, in the place of the first.
    """
    check_cmap(options.overlay_cmap if options.overlay else options.cmap)
    if out_dir is not None:
        check_folder_output(out_dir)
    keys = _select_keys(features.keys(), options.keys, features.name)
    detections = detection_keys(features, keys)
    drawable, notes, refusals = {}, [], []
    for key in keys:
        if key in detections:
            if key == detections[0]:
                _plan_detections(features, detections, drawable, notes, refusals)
            continue
        try:
            drawable[key] = _maps_limit(_channels_first(features, drawn_shape(features, key)), options,
                                        flow=_draws_flow(features, key, options),
                                        prefix=recorded_prefix_tokens(features.metadata))
        except NotDrawable as reason:
            refusals.append(f"'{key}' (shape {features.shape(key)}): {reason}")
            notes.append(f"skipped '{key}' (shape {features.shape(key)}): {reason}")
            continue
        if drawable[key][1]:
            notes.append(f"'{key}': {drawable[key][1]}")
    if not drawable:
        shown = "; ".join(refusals[:3]) + (f"; and {len(refusals) - 3} more tensors" if len(refusals) > 3 else "")
        raise UsageProblem(f"nothing to draw in '{features.name}': {shown}",
                           hint="'hookcli info' shows the shapes; choose other tensors (-k) or channels")
    if options.frame is not None and not any(len(drawn_shape(features, key)) == 5 for key in keys):
        notes.append(f"--frame {options.frame} chooses a frame of video clips ([C, T, H, W] per row), and none of "
                     "the tensors has them")
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
    for key, stem in zip(drawable, _file_stems([DETECTIONS if key == _BOXES else key for key in drawable])):
        if options.frame is not None and key != _BOXES and len(drawn_shape(features, key)) == 5:
            stem += f".frame{options.frame}"  # one frame of a clip: named apart from the whole clip's picture
        count = features.shape(key)[0]
        key_rows = chosen_rows[:bisect.bisect_left(chosen_rows, count)] if isinstance(chosen_rows, range) else \
            [r for r in chosen_rows if r < count]
        plans.append(_KeyPlan(key, stem, key_rows, drawable[key][0]))
    names = (lambda row: inputs[row]) if listed else (lambda row: f"row{row:05d}")
    plan = GridPlan(plans, names, inputs if listed else None, Path(out_dir or ""),
                    ".overlay.png" if options.overlay else ".png", notes, detections)
    if out_dir is not None:
        refuse_existing((job.path for job in plan), force=force)
    return plan


def _plan_detections(features, chosen: Sequence[str], drawable: dict, notes: list, refusals: list) -> None:
    """Plan the detections picture (under :data:`_BOXES`), or say why there is none; note what it leaves out."""
    if _BOXES not in features.keys():
        reason = f"there is no '{_BOXES}' to draw them from"
    elif input_names(features.metadata, features.shape(_BOXES)[0]) is None:
        reason = f"they are drawn over the input images, and '{features.name}' does not list them"
    else:
        drawable[_BOXES] = (None, None)
        left_out = ", ".join(f"'{key}'" for key in chosen if key not in _DRAWN_DETECTIONS)
        if left_out:
            notes.append(f"not drawn: {left_out} (the detections picture shows each image's boxes, labels and "
                         "scores)")
        return
    named = ", ".join(f"'{key}'" for key in chosen)
    refusals.append(f"the detections ({named}): {reason}")
    notes.append(f"skipped the detections ({named}): {reason}")


def _maps_limit(shape: Sequence[int], options: GridOptions, *, flow: bool = False,
                prefix: int | None = None) -> tuple[int | None, str | None]:
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
            raise NotDrawable("--overlay does not draw optical-flow fields (--flow-as-channels draws dx and dy "
                              "as maps)")
        if shape[2] * shape[3] > MAX_PIXELS:
            raise NotDrawable(f"a {shape[2]}x{shape[3]} flow field is larger than a picture may be "
                              f"({MAX_PIXELS:,} pixels)")
        return None, None
    row, _ = _row_drawn(shape[1:], options)
    count, height, width, layout = map_layout(row, prefix)
    selected = range(count)[options.channels] if options.channels is not None else range(count)
    kind = "value" if layout in STRIPS else "channel"
    if not selected:
        described = f"{count} {kind}s (0-{count - 1})" if count > 1 else f"one {kind} (0)"
        raise NotDrawable(f"--channels {_text(options.channels)} selects none of its {described}")
    if options.overlay:
        if layout in STRIPS or layout == "matrix":
            raise NotDrawable("--overlay needs maps laid out like the image, and these values are not")
        if len(shape) == 5:
            raise NotDrawable("--overlay needs the photo the model saw, and a video clip's frames are not kept")
        return None, None
    wanted = min(len(selected), options.top) if options.top is not None else len(selected)
    fits = tiles_that_fit(height, width, padding=options.padding, layout=layout)
    if layout in CLIPS:
        fits //= row[1]  # a channel is a row of T tiles
    if fits == 0:
        what = f"one channel's {row[1]} frames of {height}x{width} are" if layout in CLIPS else \
            f"one {height}x{width} map is"
        raise NotDrawable(f"{what} larger than a picture may be ({MAX_PIXELS:,} pixels)")
    if options.channels is None and options.top is None and layout not in STRIPS and count > DEFAULT_MAPS:
        return DEFAULT_MAPS, (f"drew channels 0-{DEFAULT_MAPS - 1} of {count}; --channels {DEFAULT_MAPS}:"
                              f"{2 * DEFAULT_MAPS} draws the next {DEFAULT_MAPS}, --top {DEFAULT_MAPS} the most "
                              f"active, --channels : all of them" + (f" ({fits} a picture)" if fits < count else ""))
    if wanted <= fits:
        return None, None
    what = "values" if layout in STRIPS else f"channels of {row[1]} frames of {height}x{width}" \
        if layout in CLIPS else f"tiles of {height}x{width}"
    if options.top is not None:
        return fits, f"drew the top {fits} of the {wanted} asked for: a picture holds at most {fits} {what}"
    first, last = selected[0], selected[fits - 1]
    following = f"{selected[fits]}:{selected[fits] + fits * selected.step}" if selected.step == 1 else \
        f"{selected[fits]}:"
    return fits, (f"drew {kind}s {first}-{last} of {count}: a picture holds at most {fits} {what}; "
                  f"--channels {following} draws the next")


def _text(channels: slice) -> str:
    start = "" if channels.start is None else channels.start
    stop = "" if channels.stop is None else channels.stop
    return f"{start}:{stop}"


def _file_stems(keys: Sequence[str]) -> list[str]:
    """Each key's part of the PNG names: safe characters, capped length, and never two alike.

    Keys that would give the same name (``a/b`` and ``a:b``; ``A`` and ``a`` on
    a file system that ignores case) get a short hash of the key appended.
    """
    stems = [_capped(safe_name(key), _KEY_STEM) for key in keys]
    seen = collections.Counter(stem.casefold() for stem in stems)
    return [f"{stem}~{_digest(key)}" if seen[stem.casefold()] > 1 else stem for key, stem in zip(keys, stems)]


def _capped(text: str, limit: int) -> str:
    return text if len(text) <= limit else f"{text[:limit - 9]}~{_digest(text)}"


def _digest(text: str) -> str:
    return hashlib.sha1(text.encode("utf-8", "surrogatepass")).hexdigest()[:8]


def safe_name(text: str) -> str:
    """``text`` for a file name: runs of characters other than letters, digits and ``._@#+=-`` become ``_``."""
    return _UNSAFE.sub("_", text)


def _select_keys(available: list[str], patterns: Sequence[str], name: str) -> list[str]:
    if not available:
        raise FeatureFileError(f"'{name}' holds no tensors")
    if not patterns:
        return list(available)
    chosen = []
    for pattern in patterns:
        try:
            regex = glob_to_regex(pattern)
        except re.error as err:
            raise UsageProblem(f"invalid key pattern '{pattern}': {err}",
                               hint="patterns take * ? and [abc] or [a-z] ranges written low to high") from None
        found = [k for k in available if regex.fullmatch(k)]
        if not found:
            import difflib

            closest = difflib.get_close_matches(pattern, available, n=3, cutoff=0.0)
            raise UsageProblem(
                f"no tensor '{pattern}' in '{name}' (closest: {', '.join(closest)})",
                hint="'hookcli info' lists the keys",
            )
        chosen.extend(k for k in found if k not in chosen)
    return chosen


def input_names(metadata, rows: int) -> list[str] | None:
    """The metadata's ``inputs``, one name a row, or None when it does not list ``rows`` names."""
    try:
        inputs = json.loads(metadata.get("inputs", "[]"))
    except (ValueError, RecursionError):
        return None
    listed = isinstance(inputs, list) and len(inputs) == rows and all(isinstance(p, str) for p in inputs)
    return inputs if listed else None


_ROW_RANGE = re.compile(r"(-?\d*):(-?\d*)")


def select_rows(wanted: Sequence[str], names: Sequence[str] | None, rows: int) -> Sequence[int]:
    """The rows ``wanted`` picks, in the order given and each once: row indices, input names, ranges ``A:B``.

    All rows when nothing is wanted. One range alone stays a ``range``, so a
    selection of a million rows costs nothing to hold.
    """
    if not wanted:
        return range(rows)
    if len(wanted) == 1 and _ROW_RANGE.fullmatch(wanted[0]):
        return _row_range(wanted[0], rows)
    chosen = {}
    for item in wanted:
        if _ROW_RANGE.fullmatch(item):
            found = _row_range(item, rows)
        elif re.fullmatch(r"-?\d+", item):
            index = int(item)
            if not -rows <= index < rows:
                raise UsageProblem(
                    f"image index {index} is out of range: the file has {rows} image{'s' if rows != 1 else ''}",
                    hint=("the file has no rows" if not rows else "use 0, or the input's file name" if rows == 1
                          else f"use 0 to {rows - 1}, or an input file name"),
                )
            found = [index % rows]
        else:
            found = [i for i, n in enumerate(names or ()) if item in (n, Path(n).name, Path(n).stem)]
            if not found:
                raise UsageProblem(f"no image named '{item}' in the file",
                                   hint="give a row index, a range A:B or an input's file name ('hookcli info' "
                                   "lists them)")
        chosen.update(dict.fromkeys(found))
    return list(chosen)


def _row_range(text: str, rows: int) -> range:
    """Rows A to B - 1 of ``A:B`` as a Python slice takes them: ends may be negative, left out or past the file."""
    start, stop = (int(end) if end else None for end in text.split(":"))
    chosen = range(rows)[start:stop]
    if not chosen:
        images = f"{rows} image{'s' if rows != 1 else ''}"
        raise UsageProblem(f"image range '{text}' selects no images: the file has {images}",
                           hint=f"A:B takes rows A to B-1, as a Python slice does; the rows are 0 to {rows - 1}"
                           if rows else "the file has no rows")
    return chosen


_CAM_KEY = re.compile(r"cam(#\d+)?")


def drawn_shape(features, key: str) -> list[int]:
    """The shape ``key`` is drawn as: its own, except a CAM file's maps (``cam``, ``cam#k``: ``[N, h, w]``, one map a
    row), drawn as ``[N, 1, h, w]`` so that an ``h × w`` map is never read as ViT tokens. A ragged key's is
    ``[N, *largest row]``; :func:`_drawn_row_shape` gives each row's."""
    shape = list(features.shape(key))
    return [shape[0], 1, *shape[1:]] if _one_map_a_row(features, key) else shape


def _one_map_a_row(features, key: str) -> bool:
    """Whether ``key`` is a CAM file's maps (``cam``, ``cam#k``: ``[N, h, w]``): one map a row, with no channels."""
    return "cam_layer" in features.metadata and _CAM_KEY.fullmatch(key) is not None and len(features.shape(key)) == 3


def _drawn_row_shape(features, key: str, row: int) -> list[int]:
    """The shape row ``row`` of ``key`` is drawn as (:func:`drawn_shape`): its own when ``key`` is ragged."""
    own = features.row_shape(key, row)
    return [1, *own] if _one_map_a_row(features, key) else own


def detection_keys(features, keys: Sequence[str]) -> list[str]:
    """The keys among ``keys`` that hold a detection model's final detections, in the order given.

    They are ``detections#boxes``, ``#labels``, ``#scores`` (and ``#masks``,
    ``#keypoints``, … for some models): one entry per detected object, a
    different number each image. None unless the file's ``family`` is
    ``detection``, so a layer named ``detections`` elsewhere stays a layer.
    """
    if features.metadata.get("family") != _DETECTION_FAMILY:
        return []
    return [key for key in keys if key.startswith(DETECTIONS + "#")]


@dataclass(frozen=True)
class Detections:
    """One image's final detections: ``boxes`` (float64 ``[K, 4]``: x1, y1, x2, y2 in the pixels of the image the
    model was given), and ``labels`` (class indices) and ``scores`` (``[K]`` each), None where the file has none."""

    boxes: np.ndarray
    labels: np.ndarray | None
    scores: np.ndarray | None


def read_detections(features, row: int) -> Detections:
    """Row ``row``'s final detections, from a detection file's ``detections#…`` keys.

    Raises :class:`~hookcli.pictures.render.NotDrawable` when the file's rows are not
    ``[K, 4]`` boxes with K labels and K scores.

    >>> from hookcli.storage.features import Features
    >>> features = Features({"detections#boxes": np.array([[[1, 2, 30, 40]]], dtype="float32"),
    ...                      "detections#labels": np.array([[7]])}, {"family": "detection"})
    >>> found = read_detections(features, 0)
    >>> found.boxes.tolist(), found.labels.tolist(), found.scores
    ([[1.0, 2.0, 30.0, 40.0]], [7], None)
    """
    keys = set(features.keys())
    if _BOXES not in keys:
        raise NotDrawable(f"there is no '{_BOXES}'")
    boxes = np.asarray(features.read(_BOXES, row), dtype=np.float64)
    if boxes.ndim != 2 or boxes.shape[1] != 4:
        raise NotDrawable(f"row {row} of '{_BOXES}' is {list(boxes.shape)}, not [K, 4] boxes")
    found = {}
    for name in ("labels", "scores"):
        key = f"{DETECTIONS}#{name}"
        found[name] = np.asarray(features.read(key, row)) if key in keys else None
        if found[name] is not None and found[name].shape != boxes.shape[:1]:
            raise NotDrawable(f"row {row} of '{key}' is {list(found[name].shape)}, not one value for each of its "
                              f"{len(boxes)} boxes")
    if found["labels"] is not None and found["labels"].dtype.kind not in "iu":
        raise NotDrawable(f"'{DETECTIONS}#labels' holds {found['labels'].dtype} values, not class indices")
    return Detections(boxes, found["labels"], found["scores"])


def _row_drawn(row: Sequence[int], options: GridOptions) -> tuple[list[int], int | None]:
    """``(the per-row shape drawn, the frame drawn or None)``: a video clip's ``[C, T, H, W]`` is the ``[C, H, W]`` of
    ``options.frame`` when one is given; NotDrawable when the clip has no such frame."""
    row = list(row)
    if options.frame is None or len(row) != 4:
        return row, None
    if options.frame >= row[1]:
        raise NotDrawable(f"--frame {options.frame} is out of range: it has {_frames_text(row[1])}")
    return [row[0], *row[2:]], options.frame


def _channels_last(features, row: Sequence[int]) -> bool:
    """Whether rows of this shape are ``[H, W, C]`` maps (see :func:`hookcli.families.channels_last_output`): told
    only for a file whose preprocessing made every image square."""
    from hookcli.families import channels_last_output, square_input

    if len(row) != 3 or not channels_last_output([0, *row]):
        return False
    try:
        return square_input(Preprocess.from_metadata(features.metadata.get("preprocess")))
    except ValueError:  # untrusted metadata that does not parse: draw as stored
        return False


def _channels_first(features, shape: Sequence[int]) -> list[int]:
    """A tensor's shape as it is drawn: ``[N, H, W, C]`` rows (:func:`_channels_last`) as ``[N, C, H, W]``."""
    shape = list(shape)
    return [shape[0], shape[3], shape[1], shape[2]] if _channels_last(features, shape[1:]) else shape


def _frames_text(frames: int) -> str:
    return "no frames" if frames == 0 else "one frame (0)" if frames == 1 else f"{frames} frames (0-{frames - 1})"


def _draws_flow(features, key: str, options: GridOptions) -> bool:
    """Whether ``key`` is drawn as optical flow: its rows are ``[2, H, W]`` and the file's metadata says
    ``"family": "optical_flow"``, and ``options.flow_as_channels`` does not ask for the two channels."""
    shape = features.shape(key)
    return (not options.flow_as_channels and features.metadata.get("family") == _FLOW_FAMILY and len(shape) == 4
            and shape[1] == 2)


@dataclass(frozen=True)
class Picture:
    """A drawn picture: ``pixels`` (``uint8 [H, W, 3]``) and ``notes`` on what it shows (an all-zero map, say)."""

    pixels: np.ndarray
    notes: tuple[str, ...] = ()


def render_job(features, job: GridJob, options: GridOptions, values: np.ndarray | None = None) -> np.ndarray:
    """Pixels for one job (:func:`render_picture` without its notes)."""
    return render_picture(features, job, options, values).pixels


def render_picture(features, job: GridJob, options: GridOptions, values: np.ndarray | None = None) -> Picture:
    """Draw one job, at most ``job.limit`` of the selected maps, with labels, a colour bar and a caption.

    A video clip is a table of its channels by its frames (``options.frame``:
    one frame's channel maps), and an optical-flow field a colour-coded
    picture with its colour wheel. A row of a ragged key is drawn at its own
    shape, and a detection file's final detections as boxes over the photo.
    ``values``: the job's whole row (in its own shape) when the caller has
    already read it (otherwise only the channels drawn are read). Raises
    :class:`~hookcli.pictures.render.NotDrawable` for shapes without a picture, and
    :class:`~hookcli.pictures.render.RowNotDrawable` for a row without one.
    """
    if job.key in detection_keys(features, [job.key]):
        return _detections_picture(features, job, options)
    if not features.ragged(job.key):
        return _row_picture(features, job, options, values)
    try:
        return _row_picture(features, job, options, values)
    except NotDrawable as reason:  # what one row's shape rules out says nothing of the others
        raise RowNotDrawable(str(reason)) from None


def _row_picture(features, job: GridJob, options: GridOptions, values: np.ndarray | None) -> Picture:
    if _draws_flow(features, job.key, options):
        return _flow_picture(features, job, options, values)
    one_map_a_row = _one_map_a_row(features, job.key)
    stored = _drawn_row_shape(features, job.key, job.row)
    last = _channels_last(features, stored)  # [H, W, C] rows are drawn as their C maps
    shape, frame = _row_drawn([stored[2], stored[0], stored[1]] if last else stored, options)
    prefix = recorded_prefix_tokens(features.metadata)
    count, _, _, layout = map_layout(shape, prefix)
    selected = range(count)[options.channels] if options.channels is not None else range(count)
    if job.limit is not None and options.top is None:
        selected = selected[:job.limit]
    # Channels of [C, H, W] rows and of clips are read a range at a time; other layouts are sliced after reading.
    direct = (values is None and len(stored) >= 3 and options.top is None and selected != range(count)
              and not one_map_a_row and not last)
    part = slice(selected.start, selected.stop, selected.step) if direct else None
    if values is None:
        values = features.read(job.key, job.row, part)
    values = values.reshape(len(selected), *stored[1:]) if direct else values.reshape(stored)
    if last:
        values = np.moveaxis(values, -1, 0)
    maps, layout = as_maps(values if frame is None else values[:, frame], prefix)
    if not direct and selected != range(count):
        maps = maps[selected.start:selected.stop:selected.step]
    if len(maps) == 0:
        raise NotDrawable("no channels in the selected range")
    kind = "value" if layout in STRIPS else "channel"
    labels = None if one_map_a_row else list(selected)
    picked = f"{kind}s {selected[0]}-{selected[-1]}" if len(maps) > 1 else f"{kind} {selected[0]}"
    if one_map_a_row:
        picked = "class-activation map"
    if selected.step != 1 and len(maps) > 1:
        picked += f" every {selected.step}"
    if options.top is not None:
        means = np.nanmean(np.where(np.isfinite(maps), maps, np.nan).reshape(len(maps), -1), axis=1)
        top = min(options.top, job.limit) if job.limit is not None else options.top
        order = np.argsort(-np.nan_to_num(means, nan=-np.inf), kind="stable")[:top]
        maps, labels = maps[order], labels and [labels[i] for i in order]
        picked = f"top {len(maps)} by {'value' if layout in STRIPS else 'mean'}"
    notes, labelled = [], True
    if options.overlay:
        pixels, note = _overlay_picture(features, job, maps, options)
        picked = f"mean of {picked}" if len(maps) > 1 else picked
        if note:
            notes.append(f"{job.key}, {job.name}: {note}")
    elif layout in STRIPS:
        scaled = scale_maps(maps.reshape(1, 1, -1), "grid").reshape(-1)
        pixels = strip(scaled, None if options.plain else labels, cmap=options.cmap)
        if not options.plain:
            pixels = add_colorbar(pixels, options.cmap, *_ends(value_range(maps)), "one scale for the strip")
    elif layout in CLIPS:
        look = {"padding": 0 if layout == "pooled-frames" else options.padding, "min_tile": options.min_tile,
                "labels": None if options.plain else labels, "min_width": 0 if options.plain else _MIN_WIDTH}
        framing = frame_layout(*maps.shape, **look)
        labelled = options.plain or labels is None or framing.margin > 0
        pixels = tile_frames(scale_maps(maps, options.scale), cmap=options.cmap, layout=framing, **look)
        if not options.plain:
            pixels = add_colorbar(pixels, options.cmap, *_scale_legend(
                maps, options.scale, "the channel's range over its frames",
                "each channel scaled to its own range over its frames"))
    else:
        look = {"columns": options.columns, "padding": options.padding, "min_tile": options.min_tile,
                "labels": None if options.plain else labels, "min_width": 0 if options.plain else _MIN_WIDTH}
        tiling = tile_layout(len(maps), *maps.shape[1:], **look)
        labelled = options.plain or labels is None or tiling.band > 0
        pixels = tile_maps(scale_maps(maps, options.scale), cmap=options.cmap, layout=tiling, **look)
        if not options.plain:
            pixels = add_colorbar(pixels, options.cmap, *_scale_legend(maps, options.scale, "the map's range",
                                                                       "each tile scaled to its own range"))
    if options.title and not options.plain:
        own = stored[1:] if one_map_a_row else stored  # a map a row is drawn as one channel; its shape is its own
        parts = [printable(_capped(job.key, 200)), printable(_capped(job.name, 120)), str(list(own)), picked]
        if layout in _LAYOUTS:
            parts.append(_LAYOUTS[layout])
        elif layout == "tokens+prefix":
            parts.append(f"tokens as a square, the {prefix} prefix tokens (class, registers) left out")
        if last:
            parts.append("stored channels last [H, W, C]")
        if layout in CLIPS:
            parts.append(f"rows: channels, columns: frames 0-{maps.shape[1] - 1}")
        if frame is not None:
            parts.append(f"frame {frame} of {_frames_text(stored[1])}")
        if not labelled:
            parts.append("tiles too small for channel numbers (raise --min-tile)")
        pixels = add_title(pixels, parts)
    return Picture(pixels, tuple(notes))


def _ends(span: tuple[float, float] | None) -> tuple[str, str]:
    return (number(span[0]), number(span[1])) if span is not None else ("nan", "nan")


def _scale_legend(maps: np.ndarray, scale: str, one: str, each: str) -> tuple[str, str, str]:
    """A colour bar's ends and words: the range of a single map (``one``) or of all maps with ``--scale grid``, else
    ``each`` map scaled alone."""
    if len(maps) == 1:
        return (*_ends(value_range(maps)), one)
    if scale == "grid":
        return (*_ends(value_range(maps)), "one scale for all tiles")
    return "low", "high", each


def _flow_picture(features, job: GridJob, options: GridOptions, values: np.ndarray | None) -> Picture:
    """An optical-flow field in colour (:func:`~hookcli.pictures.render.flow_colours`), enlarged as one tile is, with the
    colour wheel and the longest vector's length; a note when there is no motion to show."""
    shape = features.row_shape(job.key, job.row)
    flow = (features.read(job.key, job.row) if values is None else values).reshape(shape)
    longest = longest_flow(flow)
    factor = tile_layout(1, *shape[1:], padding=0, min_tile=options.min_tile,
                         min_width=0 if options.plain else _MIN_WIDTH).factor
    pixels = flow_colours(flow).repeat(factor, axis=0).repeat(factor, axis=1)
    length = "no finite vectors" if longest is None else f"longest vector {number(longest)} px"
    if not options.plain:
        lines = ["hue: direction of motion, as from the wheel's centre",
                 f"white: still; full colour: {number(longest)} px" if longest else "white: still"]
        if not np.isfinite(flow).all():
            lines.append("black: NaN or ±inf")
        pixels = add_flow_legend(pixels, lines)
    if options.title and not options.plain:
        pixels = add_title(pixels, [printable(_capped(job.key, 200)), printable(_capped(job.name, 120)),
                                    str(shape), "optical flow", length])
    flat = "has no finite values: drawn black" if longest is None else \
        "is 0 everywhere (nothing moves): drawn white" if longest == 0 else None
    return Picture(pixels, (f"{job.key}, {job.name}: the flow field {flat}",) if flat else ())


def _overlay_picture(features, job: GridJob, maps: np.ndarray, options: GridOptions) -> tuple[np.ndarray, str | None]:
    """The mean of ``maps`` over the photo the model saw, with a colour bar; a note when the map is flat."""
    try:
        preprocess = Preprocess.from_metadata(features.metadata.get("preprocess"))
    except ValueError as err:
        raise FeatureFileError(f"'{features.name}' has unusable preprocess metadata: {err}",
                               hint="draw without --overlay, or write the file again with hookcli extract") from None
    photo = model_photo(job.source_image, preprocess, enlarge=not options.plain)
    heat = np.nanmean(np.where(np.isfinite(maps), maps, np.nan), axis=0) if len(maps) > 1 else maps[0]
    what = features.metadata.get("method", "cam") if _one_map_a_row(features, job.key) else "activation"
    return heat_picture(photo, heat, cmap=options.overlay_cmap, alpha=options.alpha, what=what,
                        legend=not options.plain)


def model_photo(path, preprocess, *, enlarge: bool = True) -> np.ndarray:
    """The part of the photo at ``path`` the model saw (its resize and centre crop), drawn larger.

    The view is at least :data:`_OVERLAY_MIN` pixels a side (twice a
    224-pixel crop, more for small ones) and at most :data:`_OVERLAY_SIDE`,
    resampled from the original photo, so the heat map sits over a picture
    large enough to see (``enlarge=False``: the crop's own size, at most
    :data:`_OVERLAY_SIDE`). Without a crop (segmentation and detection
    models) the view is the whole photo, its shorter side at the resize when
    there is one: a detection model resizes inside, by rules the metadata
    does not record, and its maps and boxes cover the whole photo all the
    same. Without preprocessing facts the whole photo is used.
    """
    return model_photo_scaled(path, preprocess, enlarge=enlarge)[0]


def model_photo_scaled(path, preprocess, *, enlarge: bool = True) -> tuple[np.ndarray, float]:
    """:func:`model_photo`, and its pixels to one pixel of the image the model was given (the unit of boxes)."""

    from hookcli.inputs.images import load_rgb, model_view

    photo = load_rgb(path, max_side=2 * _OVERLAY_SIDE)
    if preprocess is None:
        width = _upright_size(path)[0]
        photo.thumbnail((_OVERLAY_SIDE, _OVERLAY_SIDE))
        return np.asarray(photo), photo.width / width
    if isinstance(preprocess.resize, tuple) and preprocess.kind == "classification":
        return _squashed_photo(photo, preprocess, enlarge)
    resize = preprocess.resize if isinstance(preprocess.resize, int) else None
    # Without a resize the model was given the photo at its own size, which the reduced loading of a large one hides.
    size = _upright_size(path) if resize is None or preprocess.crop is None else None
    short = resize or min(size)
    if preprocess.crop is not None:
        side = min(_OVERLAY_SIDE, max(_OVERLAY_MIN, 2 * preprocess.crop) if enlarge else preprocess.crop)
        scale = side / preprocess.crop
        return np.asarray(model_view(photo, resize=max(1, round(short * scale)), crop=max(1, side),
                                     interpolation=preprocess.interpolation)), scale
    # The resized photo as torchvision makes it: shorter side `short`, the longer one in proportion, rounded down.
    given_size = [short if n == min(size) else int(short * n / min(size)) for n in size]
    scale = min(max(_OVERLAY_MIN, 2 * short) / short if enlarge else 1.0, _OVERLAY_SIDE / max(given_size))
    drawn = tuple(max(1, round(n * scale)) for n in given_size)
    from hookcli.inputs.images import RESAMPLE as resample
    return np.asarray(photo.resize(drawn, resample[preprocess.interpolation])), scale


def _squashed_photo(photo, preprocess, enlarge: bool) -> tuple[np.ndarray, float]:
    """The view of a model that squashes the photo to ``[height, width]`` (then centre-crops it, if it crops)."""

    height, width = preprocess.resize
    crop_h, crop_w = (preprocess.crop, preprocess.crop) if preprocess.crop else (height, width)
    longest = max(crop_h, crop_w)
    scale = min(_OVERLAY_SIDE, max(_OVERLAY_MIN, 2 * longest) if enlarge else longest) / longest
    from hookcli.inputs.images import RESAMPLE as resample
    squashed = photo.resize((max(1, round(width * scale)), max(1, round(height * scale))),
                            resample[preprocess.interpolation])
    left, top = round(int(round((width - crop_w) / 2.0)) * scale), round(int(round((height - crop_h) / 2.0)) * scale)
    box = (left, top, left + max(1, round(crop_w * scale)), top + max(1, round(crop_h * scale)))
    return np.asarray(squashed.crop(box)), scale


def _upright_size(path) -> tuple[int, int]:
    """The width and height of the image at ``path`` as it is decoded upright (its EXIF orientation applied), read
    from its header: the size of what the model was given when nothing resized it."""
    from PIL import Image

    from hookcli.inputs.images import open_input

    with open_input(path) as handle, Image.open(handle) as image:
        width, height = image.size
        turned = image.getexif().get(0x0112) in (5, 6, 7, 8)  # a quarter turn, as ImageOps.exif_transpose makes
    return (height, width) if turned else (width, height)


def _detections_picture(features, job: GridJob, options: GridOptions) -> Picture:
    """The photo the model was given with each detection's box, coloured by its label, and on it its label and
    score (``plain``: the boxes alone, over the photo at the size the model was given it)."""
    found = read_detections(features, job.row)
    try:
        preprocess = Preprocess.from_metadata(features.metadata.get("preprocess"))
    except ValueError as err:
        raise NotDrawable(f"'{features.name}' has unusable preprocess metadata: {err}") from None
    try:
        photo, scale = model_photo_scaled(job.source_image, preprocess, enlarge=not options.plain)
    except HookcliError as err:
        raise RowNotDrawable(f"its photo cannot be read: {err.message}") from None
    finite = np.isfinite(found.boxes).all(axis=1)
    ranked = np.argsort(found.scores, kind="stable") if found.scores is not None else range(len(found.boxes))
    drawn = [i for i in ranked if finite[i]]  # lowest score first, so the best are drawn over the rest
    labels = found.labels if found.labels is not None else np.zeros(len(found.boxes), dtype=np.int64)
    colours = [BOX_COLOURS[int(labels[i]) % len(BOX_COLOURS)] for i in drawn]
    texts = None if options.plain else [_detection_text(found, i) for i in drawn]
    pixels = draw_boxes(photo, found.boxes[drawn] * scale, colours, texts)
    count = len(found.boxes)
    if options.title and not options.plain:
        parts = [DETECTIONS, printable(_capped(job.name, 120)),
                 "no detections" if count == 0 else f"{count} detection{'s' if count != 1 else ''}"]
        shown = [what for what, there in (("label (class index)", found.labels), ("score", found.scores))
                 if there is not None]
        if drawn and shown:
            parts.append(f"{' and '.join(shown)} on each box")
        pixels = add_title(pixels, parts)
    missing = count - len(drawn)
    return Picture(pixels, (f"{DETECTIONS}, {job.name}: {missing} of its {count} boxes have NaN or ±inf and are not "
                            "drawn",) if missing else ())


def _detection_text(found: Detections, index: int) -> str:
    """A box's tab: ``label (score)``, or whichever of the two the file has."""
    score = None if found.scores is None else f"{float(found.scores[index]):.2f}"
    if found.labels is None:
        return score or ""
    label = str(int(found.labels[index]))
    return label if score is None else f"{label} ({score})"


def heat_picture(photo: np.ndarray, heat: np.ndarray, *, cmap: str, alpha: float, what: str,
                 legend: bool = True) -> tuple[np.ndarray, str | None]:
    """``heat`` over ``photo`` with a colour bar giving the map's range; ``(pixels, note)``, a note when it is flat.

    A map with no spread (all zero, as a CAM is when no position raises the
    class's score) is not drawn: the photo is shown as it is, and the bar and
    the note say why. ``legend=False`` leaves the bar out.
    """
    span = value_range(np.asarray(heat))
    flat = "has no finite values" if span is None else f"is {number(span[0])} everywhere" \
        if span[0] == span[1] else None
    pixels = overlay(photo, heat, cmap=cmap, alpha=alpha)  # a flat map leaves the photo as it is
    if legend:
        ends, said = (("low", "high"), f"the map {flat}: nothing to overlay") if flat else \
            ((number(span[0]), number(span[1])), f"{what}, this image's range")
        pixels = add_colorbar(pixels, cmap, *ends, said)
    return pixels, (f"the {what} map {flat}: the photo is drawn without it" if flat else None)


#: Overlays are drawn at least _OVERLAY_MIN and at most _OVERLAY_SIDE pixels a side.
_OVERLAY_MIN, _OVERLAY_SIDE = 512, 2048


def write_grids(
    features, jobs: GridPlan, options: GridOptions, *, force: bool = False,
    on_note: Callable[[str], None] | None = None, on_written: Callable[[Path], None] | None = None,
) -> list[Path]:
    """Render and write every job's PNG (atomically); undrawable tensors and pictures' notes go to ``on_note``."""
    from PIL import Image

    from hookcli.files import atomic_path

    written = []
    for job, pixels in _rendered(features, jobs, options, on_note):
        job.path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(job.path, force=force) as temporary:
            # zlib level 1: a third of the default's time for files about a tenth larger.
            Image.fromarray(pixels).save(temporary, format="PNG", compress_level=1)
        written.append(job.path)
        if on_written is not None:
            on_written(job.path)
    return written


def render_all(features, jobs: GridPlan, options: GridOptions, *, on_note: Callable[[str], None] | None = None,
               on_drawn: Callable[[str], None] | None = None) -> dict[str, np.ndarray]:
    """Every job's pixels by file name, in memory."""
    pictures = {}
    for job, pixels in _rendered(features, jobs, options, on_note):
        pictures[job.path.name] = pixels
        if on_drawn is not None:
            on_drawn(job.path.name)
    return pictures


def _rendered(features, jobs: GridPlan, options: GridOptions, on_note):
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
