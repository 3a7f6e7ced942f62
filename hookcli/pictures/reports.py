"""A static HTML report of saved features: pictures, statistics, targets and metadata, a page of rows at a time.

:func:`write_report` writes ``index.html`` (page 1, with a summary of the
file) and ``page-00002.html``, ``page-00003.html``, … into a folder. Every
page stands alone: pictures are embedded as ``data:`` URIs, the style sheet is
inline, and a Content-Security-Policy lets the page fetch nothing (no script,
font or network), so the report opens from ``file://`` anywhere.

For each selected row (input image) and tensor a page holds the tensor's
picture, drawn as :func:`hookcli.pictures.drawing.render_picture` draws it for ``grid``, and
that row's statistics: min, mean and max over finite values, the share of
zeros, the count of NaN and ±inf, and the five channels with the highest mean
(channels: axis 0 of a ``[C, H, W]`` row, the last axis of a ``[T, D]`` row,
each value of a ``[D]`` row). A row of its own shape (a ragged key) is drawn
and measured in that shape, which its line of facts gives. Gradient runs show
each row's targets (class, logit, probability); CAM files draw each map over
the photo the model saw when the photo can be read. A detection file's final
detections are a picture of each image's boxes over its photo and a table of
them (label, score, box).

Rows are read one at a time, one read per tensor, and each page is streamed
to a temporary file that is renamed into place; ``index.html`` is written
last, so a complete report is one whose ``index.html`` exists. Everything
taken from the file (names, keys, metadata) is escaped.

>>> import tempfile
>>> from hookcli.storage.features import Features
>>> features = Features({"x": np.arange(2 * 4 * 9, dtype="float32").reshape(2, 4, 3, 3)},
...                     {"inputs": '["/photos/<cat>.jpg", "/photos/dog.jpg"]'})
>>> folder = Path(tempfile.mkdtemp(), "report")
>>> index = write_report(features, folder, GridOptions(), page_size=1)
>>> sorted(path.name for path in folder.iterdir())
['index.html', 'page-00002.html']
>>> "Image 0: &lt;cat&gt;.jpg" in index.read_text()
True
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import json
import math
import os
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

import numpy as np

from hookcli.errors import HookcliError, check_whole
from hookcli.events import Advanced, Note, Started, Wrote
from hookcli.files import atomic_path, check_folder_output, format_bytes, refuse_existing
from hookcli.pictures.drawing import Picture, render_picture
from hookcli.pictures.grids import GridPlan, plan_grids
from hookcli.pictures.html import (
    HEAD,
    STYLE,
    channels_table,
    detections_table,
    escaped,
    facts_table,
    file_details,
    new_pages,
    notes_html,
    page_name,
    pager,
    png_uri,
    row_anchor,
    row_shape_html,
    stats_table,
    target_name,
    targets_table,
)
from hookcli.pictures.options import GridJob, GridOptions
from hookcli.pictures.reading import (
    detection_keys,
    drawn_shape,
    input_names,
    read_detections,
    recorded_categories,
    select_rows,
)
from hookcli.pictures.render import NotDrawable, RowNotDrawable
from hookcli.pictures.stats_reports import write_stats_report
from hookcli.pictures.summary import describe_file
from hookcli.storage.fileformat import INDEX_NAME
from hookcli.storage.reader import FeatureReader
from hookcli.storage.shards import ShardedFeatures
from hookcli.storage.stats_format import is_stats
from hookcli.version import __version__

__all__ = [
    "CONTENT_SECURITY_POLICY",
    "DEFAULT_PAGE_SIZE",
    "default_report_folder",
    "MAX_PAGE_SIZE",
    "most_active",
    "TOP_CHANNELS",
    "write_report",
]


DEFAULT_PAGE_SIZE = 20


#: The most images on one page: a page holds every picture of its images, and one of many thousands is more than a
#: browser shows.
MAX_PAGE_SIZE = 10_000


#: The most active channels listed per tensor and row.
TOP_CHANNELS = 5


#: What the pages may load: nothing but their own inline style and embedded pictures.
CONTENT_SECURITY_POLICY = "default-src 'none'; img-src data:; style-src 'unsafe-inline'"


_GRADIENT = re.compile(r"(?P<layer>.+)@grad(?:#(?P<target>\d+))?")


_CAM = re.compile(r"cam(?:#(?P<target>\d+))?")


def default_report_folder(source) -> str:
    """Where report writes when no folder is given: ``<file stem>_report``, or ``report`` for stdin and memory."""
    if not isinstance(source, str | os.PathLike) or os.fspath(source) == "-":
        return "report"
    path = Path(source)
    if path.name == INDEX_NAME:  # a shard folder named by its index
        path = path.parent
    return f"{path.name.removesuffix('.safetensors') or 'features'}_report"


def write_report(
    features: FeatureReader,
    output: str | os.PathLike,
    options: GridOptions,
    *,
    page_size: int | None = None,
    force: bool = False,
    progress: Callable | None = None,
) -> Path:
    """Write the report of ``features`` into folder ``output`` and return the path of its ``index.html``.

    ``options`` are grid's: which tensors (``keys``) and rows (``images``:
    an index, an input's file name, or a range ``A:B`` of indices) and how
    pictures are drawn. Selected rows are shown in file order,
    ``page_size`` to a page. Refuses what grid refuses, and existing pages
    unless ``force``; reports :class:`~hookcli.events.Started`,
    :class:`~hookcli.events.Advanced` (a row), :class:`~hookcli.events.Note` and
    :class:`~hookcli.events.Wrote` (``index.html``) events to ``progress``. ``page_size`` defaults to
    :data:`DEFAULT_PAGE_SIZE`. A statistics file's report is its layers' channels
    (:func:`~hookcli.pictures.stats_reports.write_stats_report`, ``page_size`` channels a page).
    """
    if is_stats(features.metadata):
        return write_stats_report(features, output, options, page_size=page_size, force=force, progress=progress)
    emit = progress or (lambda event: None)
    page_size = DEFAULT_PAGE_SIZE if page_size is None else page_size
    check_whole("page_size", page_size, 1, MAX_PAGE_SIZE)
    folder = check_folder_output(output)
    plan = plan_grids(features, dataclasses.replace(options, images=()), None)
    tensors = _tensors(features, plan)
    rows = _selected_rows(features, options, max(t.rows for t in tensors))
    total = sum(len(r) for r in rows)
    pages = math.ceil(total / page_size)
    index = folder / page_name(1)
    refuse_existing((folder / page_name(n) for n in range(1, pages + 1)), force=force)
    notes = [*getattr(features, "reading_notes", ()), *plan.notes]
    for text in notes:
        emit(Note(text))
    emit(Started(total=total))
    with new_pages(folder) as track:
        pages_of_rows = _batches(itertools.chain.from_iterable(rows), page_size)
        report = _Report(features, plan, tensors, options, pages, emit)

        def write(number: int, page_rows: list[int], summary: tuple[str, str] = ("", "")) -> None:
            report.write_page(track(folder / page_name(number)), number, page_rows, force=force, summary=summary)

        first = next(pages_of_rows)
        for number, page_rows in enumerate(pages_of_rows, start=2):
            write(number, page_rows)
        write(1, first, _summary(features, tensors, plan.detections, total, page_size, pages, notes))  # last: done
    emit(Wrote(index))
    return index


@dataclasses.dataclass(frozen=True)
class _Tensor:
    """A tensor the plan draws: its key, where its jobs start in the plan (one per row, in row order), its rows."""

    key: str
    start: int
    rows: int


def _tensors(features: FeatureReader, plan: GridPlan) -> list[_Tensor]:
    """The plan's tensors: planned without an image selection, each one's jobs are its rows 0, 1, … in order."""
    tensors, position = [], 0
    while position < len(plan):
        key = plan[position].key
        tensors.append(_Tensor(key, position, features.shape(key)[0]))
        position += tensors[-1].rows
    return tensors


def _selected_rows(features: FeatureReader, options: GridOptions, rows: int) -> list[range]:
    """The rows ``options.images`` selects (grid's selection: indices, names, ranges ``A:B``) as sorted, disjoint
    ranges, so that pages follow the file's order."""
    selected = select_rows(options.images, input_names(features.metadata, rows), rows)
    if isinstance(selected, range):
        return [selected]
    merged: list[range] = []
    for row in sorted(selected):
        if merged and row == merged[-1].stop:
            merged[-1] = range(merged[-1].start, row + 1)
        else:
            merged.append(range(row, row + 1))
    return merged


def _batches(items: Iterable[int], size: int) -> Iterator[list[int]]:
    iterator = iter(items)
    return iter(lambda: list(itertools.islice(iterator, size)), [])


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


class _Targets:
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
            self._starts = list(itertools.accumulate((len(e["inputs"]) for e in self._sharded.shards), initial=0))
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
            entry = self._sharded.shards[number]
            self._cached = (number, self._parse(self._sharded.shard_targets(number), len(entry["inputs"])))
        rows = self._cached[1]
        return rows[row - self._starts[number]] if rows else []


class _Report:
    """Writes pages: for each row its targets, its detections, then each tensor's picture and statistics."""

    def __init__(
        self,
        features: FeatureReader,
        plan: GridPlan,
        tensors: Sequence[_Tensor],
        options: GridOptions,
        pages: int,
        emit: Callable,
    ) -> None:
        self.features, self.plan = features, plan
        # A detection file's final detections: one picture a row (planned under detections#boxes) and a table.
        self.boxes = next((t for t in tensors if detection_keys(features, [t.key])), None)
        self.tensors = [t for t in tensors if t is not self.boxes]
        self.detections_problem = False
        # CAMs: one map a row, drawn over the photo, with no channels to rank.
        self.cams = {t.key for t in tensors if drawn_shape(features, t.key) != features.shape(t.key)}
        self.options, self.pages, self.emit = options, pages, emit
        self.longest = max(tensors, key=lambda t: t.rows)  # it has every row, and each row's name
        self.targets = _Targets(features, self.longest.rows, lambda text: emit(Note(text)))
        self.metadata = features.metadata
        self.categories = recorded_categories(self.metadata)
        self.undrawable: set[str] = set()
        self.photo_problem = False

    def write_page(
        self, path: Path, number: int, rows: Sequence[int], *, force: bool, summary: tuple[str, str] = ("", "")
    ) -> None:
        title = f"{self.features.name} · hookcli report · page {number} of {self.pages}"
        with atomic_path(path, force=force) as temporary, open(temporary, "w", encoding="utf-8") as page:
            page.write(HEAD.format(policy=CONTENT_SECURITY_POLICY, title=escaped(title), style=STYLE))
            page.write(f"<header><h1>hookcli report: {escaped(self.features.name)}</h1>\n")
            page.write(pager(number, self.pages) + "</header>\n<main>\n")
            page.write(summary[0])  # page 1: the file in a few lines; its tensors and metadata after the pictures
            page.write(self._contents(number, rows))
            for row in rows:
                page.write(self._row(row))
                self.emit(Advanced(1))
            page.write(summary[1])
            page.write(
                f"</main>\n<footer>{pager(number, self.pages)}<p>Written by hookcli "
                f"{escaped(__version__)}.</p></footer>\n</body>\n</html>\n"
            )

    def _job(self, tensor: _Tensor, row: int) -> GridJob:
        return self.plan[tensor.start + row]

    def _contents(self, number: int, rows: Sequence[int]) -> str:
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

    def _row(self, row: int) -> str:
        job = self._job(self.longest, row)
        parts = [f'<section class="image" id="{row_anchor(row)}">\n<h2>Image {row}: {escaped(job.name)}</h2>\n']
        if job.source_image is not None:
            parts.append(f'<p class="path">{escaped(job.source_image)}</p>\n')
        targets = self.targets(row)
        if targets:
            parts.append(targets_table(targets))
        if self.plan.detections:
            parts.append(self._detections(row))
        for number, tensor in enumerate(self.tensors):
            if row < tensor.rows:
                parts.append(self._tensor(number, tensor, row, targets))
        parts.append("</section>\n")
        return "".join(parts)

    def _tensor(self, number: int, tensor: _Tensor, row: int, targets: list) -> str:
        values = self.features.read(tensor.key, row)
        role = self._role(tensor.key, targets)
        parts = [
            f'<article class="tensor" id="{row_anchor(row, number)}">\n<h3>{escaped(tensor.key)}</h3>\n',
            f'<p class="shape">{escaped(row_shape_html(self.features, tensor.key, row))}'
            f"{' · ' + escaped(role) if role else ''}</p>\n",
            '<div class="body">',
            self._picture(tensor, row, values),
            stats_table(values),
            channels_table(most_active(values), self._class_names(values)) if tensor.key not in self.cams else "",
            "</div>\n</article>\n",
        ]
        return "".join(parts)

    def _class_names(self, values: np.ndarray) -> list[str] | None:
        """The weights' class names when ``values`` are one score a class (a classifier's logits), else None."""
        return self.categories if values.ndim == 1 and self.categories and len(values) == len(self.categories) else None

    def _role(self, key: str, targets: list) -> str:
        """What a gradient or CAM tensor is, and which of the row's targets it is for."""
        gradient = "target" in self.metadata and _GRADIENT.fullmatch(key)
        cam = key in self.cams and _CAM.fullmatch(key)
        found = gradient or cam
        if not found:
            return ""
        k = int(found["target"] or 0)
        if gradient:
            what = f"gradient of the target logit with respect to '{gradient['layer']}'"
        else:
            what = (
                f"class-activation map ({self.metadata.get('method', 'unknown method')} at "
                f"'{self.metadata.get('cam_layer', '?')}')"
            )
        return what + (f", for target {k + 1}: {target_name(targets[k])}" if k < len(targets) else "")

    def _detections(self, row: int) -> str:
        """The row's detections: their picture (when planned) and their table."""
        parts = [
            f'<article class="detections" id="{row_anchor(row, "detections")}">\n<h3>Detections</h3>\n'
            '<div class="body">'
        ]
        if self.boxes is None:
            parts.append('<p class="missing">No picture (see the notes).</p>')
        elif row < self.boxes.rows:
            parts.append(self._picture(self.boxes, row, None))
        try:
            parts.append(detections_table(read_detections(self.features, row)))
        except NotDrawable as reason:
            if not self.detections_problem:
                self.detections_problem = True
                self.emit(Note(f"the detections of '{self.features.name}' cannot be read: {reason}"))
            parts.append(f'<p class="missing">No table: {escaped(str(reason))}.</p>')
        parts.append("</div>\n</article>\n")
        return "".join(parts)

    def _picture(self, tensor: _Tensor, row: int, values: np.ndarray | None) -> str:
        if tensor.key in self.undrawable:
            return '<p class="missing">No picture (see the notes).</p>'
        job, options = self._job(tensor, row), self.options
        try:
            picture = None
            if tensor.key in self.cams:
                options = dataclasses.replace(options, channels=None, top=None)
                picture = self._cam_over_photo(job, options, values)
            if picture is None:
                picture = render_picture(self.features, job, options, values=values)
        except RowNotDrawable as reason:
            self.emit(Note(f"skipped '{tensor.key}' of image {row} ({job.name}): {reason}"))
            return f'<p class="missing">No picture: {escaped(str(reason))}.</p>'
        except NotDrawable as reason:
            self.undrawable.add(tensor.key)
            self.emit(Note(f"skipped '{tensor.key}' (shape {self.features.shape(tensor.key)}): {reason}"))
            return f'<p class="missing">No picture: {escaped(str(reason))}.</p>'
        for text in picture.notes:
            self.emit(Note(text))
        pixels = picture.pixels
        height, width = pixels.shape[:2]
        return (
            f'<img src="data:image/png;base64,{png_uri(pixels)}" width="{width}" height="{height}" '
            f'alt="{escaped(tensor.key)}, image {row}">'
        )

    def _cam_over_photo(self, job: GridJob, options: GridOptions, values: np.ndarray | None) -> Picture | None:
        """The map over the photo the model saw, or None when the photo cannot be read (said once)."""
        if job.source_image is None:
            return None
        try:
            return render_picture(self.features, job, dataclasses.replace(options, overlay=True), values=values)
        except HookcliError as err:
            if not self.photo_problem:
                self.photo_problem = True
                self.emit(
                    Note(
                        f"CAMs are drawn without their photo where it cannot be read, first for image "
                        f"{job.row}: {err.message}"
                    )
                )
            return None


def _summary(
    features: FeatureReader,
    tensors: Sequence[_Tensor],
    detections: Sequence[str],
    shown: int,
    page_size: int,
    pages: int,
    notes: Sequence[str],
) -> tuple[str, str]:
    """``(summary, file)``: the short summary the first page opens with, and the file's tensors and metadata in a
    collapsed section that follows its pictures."""
    described = describe_file(features, stats=False)
    drawn = {t.key for t in tensors} | set(detections)
    rows = max(t.rows for t in tensors)
    selection = f"{rows:,}" if shown == rows else f"{rows:,}, {shown:,} of them shown"
    facts = [
        ("source", features.name),
        ("images (rows)", selection),
        ("pages", f"{pages:,} of up to {page_size:,} images"),
        ("size", format_bytes(described["bytes"])),
    ]
    top = (
        f'<section id="summary">\n<h2>Summary</h2>\n{facts_table(facts)}{notes_html(notes)}'
        '<p><a href="#file">The file\'s tensors and metadata</a> follow the pictures.</p>\n</section>\n'
    )
    return top, file_details(described, drawn)
