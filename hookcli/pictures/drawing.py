"""One grid job drawn: the maps of one row of one key (or its flow field, its detections, its overlay over
the photo) as a :class:`Picture` with its title, colour bar and notes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from hookcli.console import printable
from hookcli.errors import FeatureFileError, HookcliError
from hookcli.inputs.preprocess import Preprocess
from hookcli.options.grid import GridOptions
from hookcli.pictures.boxes import BOX_COLOURS, draw_boxes
from hookcli.pictures.file_names import capped
from hookcli.pictures.flow import add_flow_legend, flow_colours, longest_flow
from hookcli.pictures.grid_job import GridJob
from hookcli.pictures.photos import heat_picture, model_photo_scaled
from hookcli.pictures.reading import (
    Detections,
    attention_label,
    attention_maps,
    channels_last,
    detection_keys,
    drawn_row_shape,
    draws_flow,
    frames_text,
    is_attention,
    one_map_a_row,
    read_detections,
    recorded_prefix_tokens,
    row_drawn,
)
from hookcli.pictures.render import (
    CLIPS,
    STRIPS,
    NotDrawable,
    RowNotDrawable,
    add_colorbar,
    add_title,
    as_maps,
    frame_layout,
    map_layout,
    scale_maps,
    strip,
    tile_frames,
    tile_layout,
    tile_maps,
    value_range,
)
from hookcli.pictures.text import number
from hookcli.storage.fileformat import DETECTIONS
from hookcli.storage.reader import FeatureReader

__all__ = ["Picture", "render_detections", "render_job", "render_picture"]


_LAYOUTS = {
    "tokens": "tokens as a square",
    "tokens+cls": "tokens as a square, class token left out",
    "matrix": "tokens x dims",
}


#: Tiled pictures are enlarged to at least this width, so one channel or a few are not a thumbnail.
_MIN_WIDTH = 384


@dataclass(frozen=True)
class Picture:
    """A drawn picture: ``pixels`` (``uint8 [H, W, 3]``) and ``notes`` on what it shows (an all-zero map, say)."""

    pixels: np.ndarray
    notes: tuple[str, ...] = ()


def render_job(
    features: FeatureReader, job: GridJob, options: GridOptions, values: np.ndarray | None = None
) -> np.ndarray:
    """Pixels for one job (:func:`render_picture` without its notes)."""
    return render_picture(features, job, options, values).pixels


def render_picture(
    features: FeatureReader,
    job: GridJob,
    options: GridOptions,
    values: np.ndarray | None = None,
    *,
    boxes: np.ndarray | None = None,
) -> Picture:
    """Draw one job, at most ``job.limit`` of the selected maps, with labels, a colour bar and a caption.

    A video clip is drawn as channels by frames (``options.frame``: one frame's maps), optical flow colour-coded with
    its colour wheel, a ragged key's row at its own shape, and a detection file's final detections as boxes over the
    photo. ``values``: the job's whole row in its own shape, if the caller has read it already. ``boxes`` (``[K, 4]``,
    x1, y1, x2, y2 in pixels of the image the model was given, from the file's targets): the detection a detection
    model's CAM explains, outlined over an overlay. Raises :class:`~hookcli.pictures.render.NotDrawable` for shapes
    without a picture and :class:`~hookcli.pictures.render.RowNotDrawable` for a row without one.
    """
    if job.key in detection_keys(features, [job.key]):
        return render_detections(features, job, options, read_detections(features, job.row))
    if not features.ragged(job.key):
        return _row_picture(features, job, options, values, boxes)
    try:
        return _row_picture(features, job, options, values, boxes)
    except NotDrawable as reason:  # what one row's shape rules out says nothing of the others
        raise RowNotDrawable(str(reason)) from None


def _row_picture(
    features: FeatureReader, job: GridJob, options: GridOptions, values: np.ndarray | None, boxes: np.ndarray | None
) -> Picture:
    if draws_flow(features, job.key, options):
        return _flow_picture(features, job, options, values)
    single = one_map_a_row(features, job.key)
    attention = is_attention(features, job.key)
    stored = drawn_row_shape(features, job.key, job.row)
    last = channels_last(features, stored)  # [H, W, C] rows are drawn as their C maps
    shape, frame = row_drawn([stored[2], stored[0], stored[1]] if last else stored, options)
    prefix = recorded_prefix_tokens(features.metadata)
    count, _, _, layout = map_layout(shape, prefix)
    selected = range(count)[options.channels] if options.channels is not None else range(count)
    if job.limit is not None and options.top is None:
        selected = selected[: job.limit]
    # Channels of [C, H, W] rows and of clips are read a range at a time; other layouts are sliced after reading.
    direct = (
        values is None
        and len(stored) >= 3
        and options.top is None
        and selected != range(count)
        and not single
        and not last
        and not attention
    )
    part = slice(selected.start, selected.stop, selected.step) if direct else None
    if values is None:
        values = features.read(job.key, job.row, part)
    if attention:  # the class token's attention to each patch, a map a head
        values = attention_maps(features, values.reshape(features.row_shape(job.key, job.row)))
    values = values.reshape(len(selected), *stored[1:]) if direct else values.reshape(stored)
    if last:
        values = np.moveaxis(values, -1, 0)
    maps, layout = as_maps(values if frame is None else values[:, frame], prefix)
    if not direct and selected != range(count):
        maps = maps[selected.start : selected.stop : selected.step]
    if len(maps) == 0:
        raise NotDrawable("no channels in the selected range")
    kind = "head" if attention else "value" if layout in STRIPS else "channel"
    labels = None if single else list(selected)
    picked = f"{kind}s {selected[0]}-{selected[-1]}" if len(maps) > 1 else f"{kind} {selected[0]}"
    if single:
        picked = "class-activation map"
    named = attention_label(features) if attention else None
    if named is not None:  # one map, of no one head
        picked, labels = named, None
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
        pixels, note = _overlay_picture(features, job, maps, options, boxes)
        picked = f"mean of {picked}" if len(maps) > 1 else picked
        if note:
            notes.append(f"{job.key}, {job.name}: {note}")
    elif layout in STRIPS:
        scaled = scale_maps(maps.reshape(1, 1, -1), "grid").reshape(-1)
        pixels = strip(scaled, None if options.plain else labels, cmap=options.maps_cmap)
        if not options.plain:
            pixels = add_colorbar(pixels, options.maps_cmap, *_ends(value_range(maps)), "one scale for the strip")
    elif layout in CLIPS:
        look: dict[str, Any] = {  # the drawing options frame_layout and tile_frames share
            "padding": 0 if layout == "pooled-frames" else options.padding,
            "min_tile": options.min_tile,
            "labels": None if options.plain else labels,
            "min_width": 0 if options.plain else _MIN_WIDTH,
        }
        framing = frame_layout(*maps.shape, **look)
        labelled = options.plain or labels is None or framing.margin > 0
        pixels = tile_frames(scale_maps(maps, options.scale), cmap=options.maps_cmap, layout=framing, **look)
        if not options.plain:
            pixels = add_colorbar(
                pixels,
                options.maps_cmap,
                *_scale_legend(
                    maps,
                    options.scale,
                    "the channel's range over its frames",
                    "each channel scaled to its own range over its frames",
                ),
            )
    else:
        look = {
            "columns": options.columns,
            "padding": options.padding,
            "min_tile": options.min_tile,
            "labels": None if options.plain else labels,
            "min_width": 0 if options.plain else _MIN_WIDTH,
        }
        tiling = tile_layout(len(maps), *maps.shape[1:], **look)
        labelled = options.plain or labels is None or tiling.band > 0
        pixels = tile_maps(scale_maps(maps, options.scale), cmap=options.maps_cmap, layout=tiling, **look)
        if not options.plain:
            pixels = add_colorbar(
                pixels,
                options.maps_cmap,
                *_scale_legend(maps, options.scale, "the map's range", "each tile scaled to its own range"),
            )
    if options.title and not options.plain:
        own = stored[1:] if single else stored  # a map a row is drawn as one channel; its shape is its own
        parts = [printable(capped(job.key, 200)), printable(capped(job.name, 120)), str(list(own)), picked]
        if layout in _LAYOUTS:
            parts.append(_LAYOUTS[layout])
        elif layout == "tokens+prefix":
            parts.append(f"tokens as a square, the {prefix} prefix tokens (class, registers) left out")
        if last:
            parts.append("stored channels last [H, W, C]")
        if layout in CLIPS:
            parts.append(f"rows: channels, columns: frames 0-{maps.shape[1] - 1}")
        if frame is not None:
            parts.append(f"frame {frame} of {frames_text(stored[1])}")
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


def _flow_picture(features: FeatureReader, job: GridJob, options: GridOptions, values: np.ndarray | None) -> Picture:
    """An optical-flow field in colour (:func:`~hookcli.pictures.flow.flow_colours`), enlarged as one tile is, with the
    colour wheel and the longest vector's length; a note when there is no motion to show."""
    shape = features.row_shape(job.key, job.row)
    flow = (features.read(job.key, job.row) if values is None else values).reshape(shape)
    longest = longest_flow(flow)
    factor = tile_layout(
        1, *shape[1:], padding=0, min_tile=options.min_tile, min_width=0 if options.plain else _MIN_WIDTH
    ).factor
    pixels = flow_colours(flow).repeat(factor, axis=0).repeat(factor, axis=1)
    length = "no finite vectors" if longest is None else f"longest vector {number(longest)} px"
    if not options.plain:
        lines = [
            "hue: direction of motion, as from the wheel's centre",
            f"white: still; full colour: {number(longest)} px" if longest else "white: still",
        ]
        if not np.isfinite(flow).all():
            lines.append("black: NaN or ±inf")
        pixels = add_flow_legend(pixels, lines)
    if options.title and not options.plain:
        pixels = add_title(
            pixels,
            [printable(capped(job.key, 200)), printable(capped(job.name, 120)), str(shape), "optical flow", length],
        )
    flat = (
        "has no finite values: drawn black"
        if longest is None
        else "is 0 everywhere (nothing moves): drawn white"
        if longest == 0
        else None
    )
    return Picture(pixels, (f"{job.key}, {job.name}: the flow field {flat}",) if flat else ())


def _overlay_picture(
    features: FeatureReader, job: GridJob, maps: np.ndarray, options: GridOptions, boxes: np.ndarray | None
) -> tuple[np.ndarray, str | None]:
    """The mean of ``maps`` over the photo the model saw, with a colour bar and ``boxes``; a note when the map is
    flat."""
    try:
        preprocess = Preprocess.from_metadata(features.metadata.get("preprocess"))
    except ValueError as err:
        raise FeatureFileError(
            f"'{features.name}' has unusable preprocess metadata: {err}",
            hint="draw without --overlay, or write the file again with hookcli extract",
        ) from None
    photo, scale = model_photo_scaled(job.source_image, preprocess, enlarge=not options.plain)
    heat = np.nanmean(np.where(np.isfinite(maps), maps, np.nan), axis=0) if len(maps) > 1 else maps[0]
    what = features.metadata.get("method", "cam") if one_map_a_row(features, job.key) else "activation"
    if is_attention(features, job.key):
        what = attention_label(features) or "attention"
    return heat_picture(
        photo,
        heat,
        cmap=options.overlay_cmap,
        alpha=options.alpha,
        what=what,
        legend=not options.plain,
        boxes=None if boxes is None else boxes * scale,
    )


def render_detections(features: FeatureReader, job: GridJob, options: GridOptions, found: Detections) -> Picture:
    """The photo the model was given with each of ``found`` (row ``job.row``'s detections, read by the caller, who
    may show them otherwise too) as a box, coloured by its label, and on it its label and score (``plain``: the
    boxes alone, over the photo at the size the model was given it)."""
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
    shown = [
        what for what, there in (("label (class index)", found.labels), ("score", found.scores)) if there is not None
    ]
    texts = None if options.plain or not shown else [_detection_text(found, i) for i in drawn]
    pixels, unlabelled = draw_boxes(photo, found.boxes[drawn] * scale, colours, texts)
    count = len(found.boxes)
    if options.title and not options.plain:
        parts = [
            DETECTIONS,
            printable(capped(job.name, 120)),
            "no detections" if count == 0 else f"{count} detection{'s' if count != 1 else ''}",
        ]
        if texts:
            parts.append(f"{' and '.join(shown)} on each box")
        if unlabelled:
            better = "higher-scoring ones" if found.scores is not None else "the others"
            parts[-1] = f"{' and '.join(shown)} on {len(drawn) - unlabelled} boxes"
            theirs = "its label" if unlabelled == 1 else "their labels"
            parts.append(f"{unlabelled} unlabelled, where {theirs} would cover those of {better}")
        pixels = add_title(pixels, parts)
    missing = count - len(drawn)
    return Picture(
        pixels,
        (f"{DETECTIONS}, {job.name}: {missing} of its {count} boxes have NaN or ±inf and are not drawn",)
        if missing
        else (),
    )


def _detection_text(found: Detections, index: int) -> str:
    """A box's tab: ``label (score)``, or whichever of the two the file has."""
    score = None if found.scores is None else f"{float(found.scores[index]):.2f}"
    if found.labels is None:
        return score or ""
    label = str(int(found.labels[index]))
    return label if score is None else f"{label} ({score})"
