"""Each image's section of a report: an overview first (the photo as the model saw it, a classifier's
predictions, the targets of ``grad`` and ``cam``), then the final detections of a detection model, then each
tensor's picture and statistics.

:class:`ImageSections` writes them, and each page's table of contents, for
:func:`hookcli.pictures.reports.write_report`; rows are read one at a time,
each tensor once.

>>> [(c, round(logit, 2), round(p, 3)) for c, logit, p in top_outputs(np.array([0.0, 2.0, np.nan, 1.0]), 2)]
[(1, 2.0, 0.665), (3, 1.0, 0.245)]
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import json
import re
from collections.abc import Callable, Sequence

import numpy as np

from hookcli.errors import HookcliError
from hookcli.events import Note
from hookcli.families import FAMILIES, family_traits
from hookcli.inputs.preprocess import Preprocess
from hookcli.options.grid import GridOptions
from hookcli.pictures.drawing import Picture, render_detections, render_picture
from hookcli.pictures.grid_job import GridJob
from hookcli.pictures.grids import GridPlan
from hookcli.pictures.html import (
    channels_table,
    detections_table,
    escaped,
    picture_html,
    predictions_table,
    row_anchor,
    row_shape_html,
    stats_table,
    target_kind,
    target_name,
    targets_table,
)
from hookcli.pictures.photos import model_thumbnail
from hookcli.pictures.reading import (
    detection_keys,
    one_map_a_row,
    read_detections,
    recorded_categories,
    target_box,
)
from hookcli.pictures.render import NotDrawable, RowNotDrawable
from hookcli.storage.reader import FeatureReader
from hookcli.storage.shards import ShardedFeatures

__all__ = [
    "ImageSections",
    "ReportTensor",
    "RowTargets",
    "TOP_CHANNELS",
    "most_active",
    "report_tensors",
    "top_outputs",
]


#: The most active channels, and a classifier's highest outputs, listed per tensor and row.
TOP_CHANNELS = 5


_GRADIENT = re.compile(r"(?P<layer>.+)@grad(?:#(?P<target>\d+))?")


_CAM = re.compile(r"cam(?:#(?P<target>\d+))?")


@dataclasses.dataclass(frozen=True)
class ReportTensor:
    """A tensor the plan draws: its key, where its jobs start in the plan (one per row, in row order), its rows."""

    key: str
    start: int
    rows: int


def report_tensors(features: FeatureReader, plan: GridPlan) -> list[ReportTensor]:
    """The plan's tensors: planned without an image selection, each one's jobs are its rows 0, 1, … in order."""
    tensors, position = [], 0
    while position < len(plan):
        key = plan[position].key
        tensors.append(ReportTensor(key, position, features.shape(key)[0]))
        position += tensors[-1].rows
    return tensors


def most_active(values: np.ndarray, count: int = TOP_CHANNELS) -> list[tuple[int, float]]:
    """The ``count`` channels of one row with the highest mean over finite values: ``(index, mean)``, highest first.

    Channels are axis 0 of ``[C, H, W]``, the last axis of ``[T, D]`` and the
    values of ``[D]``; one without finite values is left out, ties keep
    channel order.

    >>> most_active(np.array([[1.0, 5.0, np.nan], [3.0, 5.0, np.nan]]), 2)
    [(1, 5.0), (0, 2.0)]
    """
    values = np.asarray(values, dtype=np.float64)
    per_channel = {3: lambda v: v.reshape(len(v), -1), 2: lambda v: v.T, 1: lambda v: v[:, None]}
    if values.ndim not in per_channel or values.size == 0:
        return []
    channels = per_channel[values.ndim](values)
    finite = np.isfinite(channels)
    with np.errstate(over="ignore", invalid="ignore"):
        means = channels.mean(axis=1)
        for i in np.flatnonzero(~finite.all(axis=1)):  # the mean of a channel's finite values alone
            kept = channels[i][finite[i]]
            means[i] = kept.mean() if kept.size else np.nan
    order = np.argsort(-np.nan_to_num(means, nan=-np.inf), kind="stable")[:count]
    return [(int(i), float(means[i])) for i in order if not np.isnan(means[i])]


def top_outputs(logits: np.ndarray, count: int = TOP_CHANNELS) -> list[tuple[int, float, float]]:
    """A classifier's ``count`` highest outputs: ``(class, logit, probability)``, highest first, the probabilities
    the softmax of the row's finite logits (a NaN or ±inf output is left out)."""
    values = np.asarray(logits, dtype=np.float64)
    finite = np.isfinite(values)
    if not finite.any():
        return []
    weights = np.exp(np.where(finite, values - values[finite].max(), -np.inf))
    return [(index, logit, float(weights[index] / weights.sum())) for index, logit in most_active(values, count)]


class RowTargets:
    """Each row's targets (``grad`` and ``cam`` files): the file's ``targets`` metadata, or each shard's in a folder.

    Targets are untrusted: a list that is not one entry per row, or an entry
    that is not a list of objects, is left out, and ``note`` is told once.
    """

    def __init__(self, features: FeatureReader, rows: int, note: Callable[[str], None]) -> None:
        self._name, self._note = features.name, note
        self._cached: tuple[int | None, list] = (None, [])
        self._broken = False
        self._sharded = features if isinstance(features, ShardedFeatures) and "target" in features.metadata else None
        if self._sharded is not None:
            self._starts = list(itertools.accumulate((line.rows for line in self._sharded.shards), initial=0))
        else:
            self._rows = self._parse(features.metadata.get("targets"), rows)

    def _parse(self, text: str | None, rows: int) -> list:
        if text is None:
            return []
        try:
            found = json.loads(text)
        except (ValueError, RecursionError):
            found = None
        if (
            not isinstance(found, list)
            or len(found) != rows
            or not all(isinstance(entry, list) and all(isinstance(t, dict) for t in entry) for entry in found)
        ):
            if not self._broken:
                self._broken = True
                self._note(f"'{self._name}' has targets that are not one list of objects per image; they are left out")
            return []
        return found

    def __call__(self, row: int) -> list[dict]:
        if self._sharded is None:
            return self._rows[row] if row < len(self._rows) else []
        number = bisect.bisect_right(self._starts, row) - 1
        if self._cached[0] != number:
            self._cached = (
                number,
                self._parse(self._sharded.shard_targets(number), self._sharded.shards[number].rows),
            )
        rows = self._cached[1]
        return rows[row - self._starts[number]] if rows else []


class ImageSections:
    """Writes each image's section (:meth:`section`) and a page's table of contents (:meth:`contents`).

    A section opens with its overview: the photo as the model saw it (for
    models whose rows are images, when it can be read), the highest outputs
    of the classifier's logits (the tensor of one value for each of the
    weights' class names, named by them) and the row's targets. A detection
    file's final detections follow, then every other tensor's picture and
    statistics.
    """

    def __init__(
        self,
        features: FeatureReader,
        plan: GridPlan,
        tensors: Sequence[ReportTensor],
        options: GridOptions,
        emit: Callable,
    ) -> None:
        self.features, self.plan, self.options, self.emit = features, plan, options, emit
        self.metadata = features.metadata
        # A detection file's final detections: one picture a row (planned under detections#boxes) and a table.
        self.boxes = next((t for t in tensors if detection_keys(features, [t.key])), None)
        self.tensors = [t for t in tensors if t is not self.boxes]
        self.detections_problem = False
        # CAMs: one map a row, drawn over the photo, with no channels to rank.
        self.cams = {t.key for t in tensors if one_map_a_row(features, t.key)}
        self.longest = max(tensors, key=lambda t: t.rows)  # it has every row, and each row's name
        self.targets = RowTargets(features, self.longest.rows, lambda text: emit(Note(text)))
        self.categories = recorded_categories(self.metadata)
        self.logits = next((t for t in self.tensors if self._are_logits(t.key)), None)
        family = self.metadata.get("family", "classification")
        self.photos = family in FAMILIES and family_traits(family).row == "image"
        try:
            self.preprocess = Preprocess.from_metadata(self.metadata.get("preprocess"))
        except ValueError:  # untrusted metadata: the thumbnail is the whole photo, and says so
            self.preprocess = None
        self.undrawable: set[str] = set()
        self.photo_problem = False

    def _are_logits(self, key: str) -> bool:
        """Whether ``key`` holds a classifier's logits: one value a class name of the weights, and a layer's output
        (not its input nor a gradient)."""
        shape = self.features.shape(key)
        return self.categories is not None and "@" not in key and shape[1:] == [len(self.categories)]

    def _job(self, tensor: ReportTensor, row: int) -> GridJob:
        return self.plan[tensor.start + row]

    def contents(self, number: int, rows: Sequence[int]) -> str:
        """Page ``number``'s table of contents: each of its images, and in each its detections and tensors."""
        items = []
        for row in rows:
            job = self._job(self.longest, row)
            tensors = "".join(
                f'<li><a href="#{row_anchor(row, n)}">{escaped(t.key)}</a></li>'
                for n, t in enumerate(self.tensors)
                if row < t.rows
            )
            if self.plan.detections:
                tensors = f'<li><a href="#{row_anchor(row, "detections")}">detections</a></li>{tensors}'
            items.append(
                f'<li><a href="#{row_anchor(row)}">Image {row}: {escaped(job.name)}</a><ul>{tensors}</ul></li>'
            )
        back = "" if number == 1 else '<p><a href="index.html#summary">Summary of the file</a></p>'
        start = rows[0] if rows else 0  # numbered as the images are, from 0 and on from page to page
        return (
            f'<nav id="contents" aria-label="contents"><h2>On this page</h2>{back}<ol start="{start}">'
            f"{''.join(items)}</ol></nav>\n"
        )

    def section(self, row: int) -> str:
        """Row ``row``'s section: its overview, its detections, then its tensors."""
        job = self._job(self.longest, row)
        parts = [f'<section class="image" id="{row_anchor(row)}">\n<h2>Image {row}: {escaped(job.name)}</h2>\n']
        if job.source_image is not None:
            parts.append(f'<p class="path">{escaped(job.source_image)}</p>\n')
        targets = self.targets(row)
        logits = self.features.read(self.logits.key, row) if self.logits and row < self.logits.rows else None
        overview = [self._thumbnail(job), self._predictions(logits), targets_table(targets) if targets else ""]
        if any(overview):
            parts.append(f'<div class="overview">{"".join(overview)}</div>\n')
        if self.plan.detections:
            parts.append(self._detections(row))
        for number, tensor in enumerate(self.tensors):
            if row < tensor.rows:
                values = logits if logits is not None and tensor is self.logits else self.features.read(tensor.key, row)
                parts.append(self._tensor(number, tensor, row, values, targets))
        parts.append("</section>\n")
        return "".join(parts)

    def picture_of(self, tensor: ReportTensor, row: int) -> str:
        """``tensor``'s picture of row ``row``, embedded, as the row's section shows it."""
        return self._tensor_picture(tensor, row, self.features.read(tensor.key, row), self.targets(row))

    def row_title(self, row: int) -> str:
        """``Image N: name`` of row ``row``, escaped."""
        return f"Image {row}: {escaped(self._job(self.longest, row).name)}"

    def _thumbnail(self, job: GridJob) -> str:
        """The photo as the model saw it, small; nothing where the rows are not photos or it cannot be read."""
        if not self.photos or job.source_image is None:
            return ""
        try:
            pixels = model_thumbnail(job.source_image, self.preprocess)
        except HookcliError as err:
            self._photo_unread(job.row, err.message)
            return ""
        what = "as the model saw it" if self.preprocess is not None else "the photo"
        return (
            f'<figure class="thumbnail">{picture_html(pixels, f"{job.name}, {what}")}'
            f"<figcaption>{what}</figcaption></figure>"
        )

    def _predictions(self, logits: np.ndarray | None) -> str:
        if logits is None or self.logits is None or self.categories is None:
            return ""
        return predictions_table(self.logits.key, top_outputs(logits), self.categories)

    def _photo_unread(self, row: int, message: str) -> None:
        """Say once that photos that cannot be read are left out, naming the first."""
        if self.photo_problem:
            return
        self.photo_problem = True
        cams = ", CAMs as plain maps" if self.cams else ""
        shown = f"images whose photo cannot be read are shown without it (no thumbnail{cams})"
        self.emit(Note(f"{shown}, first image {row}: {message}"))

    def _tensor(self, number: int, tensor: ReportTensor, row: int, values: np.ndarray, targets: list) -> str:
        role = self._role(tensor.key, targets)
        listed = tensor.key not in self.cams and tensor is not self.logits  # the logits' highest are predictions
        parts = [
            f'<article class="tensor" id="{row_anchor(row, number)}">\n<h3>{escaped(tensor.key)}</h3>\n',
            f'<p class="shape">{escaped(row_shape_html(self.features, tensor.key, row))}'
            f"{' · ' + escaped(role) if role else ''}</p>\n",
            '<div class="body">',
            self._tensor_picture(tensor, row, values, targets),
            stats_table(values),
            channels_table(most_active(values), self._class_names(values)) if listed else "",
            "</div>\n</article>\n",
        ]
        return "".join(parts)

    def _class_names(self, values: np.ndarray) -> list[str] | None:
        """The weights' class names when ``values`` hold one value a class (a gradient with respect to the logits, say),
        else None."""
        return self.categories if values.ndim == 1 and self.categories and len(values) == len(self.categories) else None

    def _target_number(self, key: str) -> int | None:
        """Which of a row's targets a gradient or CAM tensor is for (from 0), None for other tensors."""
        found = "target" in self.metadata and _GRADIENT.fullmatch(key) or key in self.cams and _CAM.fullmatch(key)
        return int(found["target"] or 0) if found else None

    def _role(self, key: str, targets: list) -> str:
        """What a gradient or CAM tensor is, and which of the row's targets it is for."""
        k = self._target_number(key)
        if k is None:
            return ""
        gradient = _GRADIENT.fullmatch(key) if key not in self.cams else None
        if gradient:
            scored = "logit" if target_kind(targets) == "classification" else "score"
            what = f"gradient of the target {scored} with respect to '{gradient['layer']}'"
        else:
            what = (
                f"class-activation map ({self.metadata.get('method', 'unknown method')} at "
                f"'{self.metadata.get('cam_layer', '?')}')"
            )
        return what + (f", for target {k + 1}: {target_name(targets[k])}" if k < len(targets) else "")

    def _detections(self, row: int) -> str:
        """The row's detections, read once: their picture (when planned) and their table."""
        parts = [
            f'<article class="detections" id="{row_anchor(row, "detections")}">\n<h3>Detections</h3>\n'
            '<div class="body">'
        ]
        try:
            found = read_detections(self.features, row)
        except NotDrawable as reason:
            if not self.detections_problem:
                self.detections_problem = True
                self.emit(Note(f"the detections of '{self.features.name}' cannot be read: {reason}"))
            parts.append(f'<p class="missing">No picture and no table: {escaped(str(reason))}.</p>')
        else:
            if self.boxes is None:
                parts.append('<p class="missing">No picture (see the notes).</p>')
            elif row < self.boxes.rows:
                parts.append(
                    self._picture(
                        self.boxes, row, lambda job, options: render_detections(self.features, job, options, found)
                    )
                )
            parts.append(detections_table(found))
        parts.append("</div>\n</article>\n")
        return "".join(parts)

    def _tensor_picture(self, tensor: ReportTensor, row: int, values: np.ndarray, targets: list) -> str:
        """A tensor's picture for the row: a CAM over the photo the model saw when it can be read, with the box of
        the detection it explains."""

        def draw(job: GridJob, options: GridOptions) -> Picture:
            if tensor.key in self.cams:
                options = dataclasses.replace(options, channels=None, top=None)
                k = self._target_number(tensor.key)
                box = target_box(targets[k]) if k is not None and k < len(targets) else None
                over_photo = self._cam_over_photo(job, options, values, box)
                if over_photo is not None:
                    return over_photo
            return render_picture(self.features, job, options, values=values)

        return self._picture(tensor, row, draw)

    def _picture(self, tensor: ReportTensor, row: int, draw: Callable[[GridJob, GridOptions], Picture]) -> str:
        """``draw(job, options)`` for the tensor's job of the row, embedded; what stops it is said as grid says it."""
        if tensor.key in self.undrawable:
            return '<p class="missing">No picture (see the notes).</p>'
        job = self._job(tensor, row)
        try:
            picture = draw(job, self.options)
        except RowNotDrawable as reason:
            self.emit(Note(f"skipped '{tensor.key}' of image {row} ({job.name}): {reason}"))
            return f'<p class="missing">No picture: {escaped(str(reason))}.</p>'
        except NotDrawable as reason:
            self.undrawable.add(tensor.key)
            self.emit(Note(f"skipped '{tensor.key}' (shape {self.features.shape(tensor.key)}): {reason}"))
            return f'<p class="missing">No picture: {escaped(str(reason))}.</p>'
        for text in picture.notes:
            self.emit(Note(text))
        # Over the photo (--overlay), a picture is a photograph's worth of detail, which JPEG keeps in a tenth of PNG's.
        return picture_html(picture.pixels, f"{tensor.key}, image {row}", jpeg=self.options.overlay)

    def _cam_over_photo(
        self, job: GridJob, options: GridOptions, values: np.ndarray | None, box: np.ndarray | None
    ) -> Picture | None:
        """The map over the photo the model saw, with ``box``, or None when the photo cannot be read (said once)."""
        if job.source_image is None:
            return None
        try:
            overlay = dataclasses.replace(options, overlay=True)
            return render_picture(self.features, job, overlay, values=values, boxes=box)
        except HookcliError as err:
            self._photo_unread(job.row, err.message)
            return None
