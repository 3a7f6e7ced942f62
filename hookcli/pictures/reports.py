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

import base64
import bisect
import contextlib
import dataclasses
import html
import io
import itertools
import json
import math
import os
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

import numpy as np

from hookcli.console import printable
from hookcli.errors import HookcliError, check_whole
from hookcli.storage.fileformat import INDEX_NAME
from hookcli.pictures.options import GridJob, GridOptions
from hookcli.pictures.reading import Detections, detection_keys, drawn_shape, input_names, read_detections, select_rows
from hookcli.pictures.drawing import Picture, render_picture
from hookcli.pictures.grids import plan_grids
from hookcli.pictures.render import NotDrawable, RowNotDrawable
from hookcli.events import Advanced, Note, Started, Wrote
from hookcli.files import atomic_path, check_folder_output, format_bytes, refuse_existing
from hookcli.storage.features import FeatureFile
from hookcli.version import __version__
from hookcli.pictures.summary import describe_file, metadata_order, values_stats

__all__ = [
    "CONTENT_SECURITY_POLICY", "DEFAULT_PAGE_SIZE", "MAX_PAGE_SIZE", "PAGE_WINDOW", "TOP_CHANNELS",
    "default_report_folder", "most_active", "page_name", "write_report",
]

DEFAULT_PAGE_SIZE = 20
#: The most images on one page: a page holds every picture of its images, and one of many thousands is more than a
#: browser shows.
MAX_PAGE_SIZE = 10_000
#: Page links on each side of the current page (plus first, previous, next and last).
PAGE_WINDOW = 3
#: The most active channels listed per tensor and row.
TOP_CHANNELS = 5

#: What the pages may load: nothing but their own inline style and embedded pictures.
CONTENT_SECURITY_POLICY = "default-src 'none'; img-src data:; style-src 'unsafe-inline'"

_GRADIENT = re.compile(r"(?P<layer>.+)@grad(?:#(?P<target>\d+))?")
_CAM = re.compile(r"cam(?:#(?P<target>\d+))?")
#: Lists in the metadata table longer than this show their first and last items.
_LIST_SHOWN = 10
#: Longer text in the metadata table is cut; structure nested deeper is shown as JSON text.
_TEXT_SHOWN, _DEPTH_SHOWN = 4000, 6


def default_report_folder(source) -> str:
    """Where report writes when no folder is given: ``<file stem>_report``, or ``report`` for stdin and memory."""
    if not isinstance(source, str | os.PathLike) or os.fspath(source) == "-":
        return "report"
    path = Path(source)
    if path.name == INDEX_NAME:  # a shard folder named by its index
        path = path.parent
    return f"{path.name.removesuffix('.safetensors') or 'features'}_report"


def page_name(number: int) -> str:
    """The file of page ``number`` (from 1): ``index.html``, then ``page-00002.html``, …"""
    return "index.html" if number == 1 else f"page-{number:05d}.html"


def write_report(features, output: str | os.PathLike, options: GridOptions, *, page_size: int = DEFAULT_PAGE_SIZE,
                 force: bool = False, progress: Callable | None = None) -> Path:
    """Write the report of ``features`` into folder ``output`` and return the path of its ``index.html``.

    ``options`` are grid's: which tensors (``keys``) and rows (``images``:
    an index, an input's file name, or a range ``A:B`` of indices) and how
    pictures are drawn. Selected rows are shown in file order,
    ``page_size`` to a page. Refuses what grid refuses, and existing pages
    unless ``force``; reports :class:`~hookcli.events.Started`,
    :class:`~hookcli.events.Advanced` (a row), :class:`~hookcli.events.Note` and
    :class:`~hookcli.events.Wrote` (``index.html``) events to ``progress``.
    """
    emit = progress or (lambda event: None)
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
    made_folder = not folder.exists()
    folder.mkdir(parents=True, exist_ok=True)
    new_pages = []  # removed again should the report fail part-way (a damaged shard, Ctrl-C)
    try:
        pages_of_rows = _batches(itertools.chain.from_iterable(rows), page_size)
        report = _Report(features, plan, tensors, options, pages, emit)

        def write(number: int, page_rows: list[int], summary: str = "") -> None:
            path = folder / page_name(number)
            if not path.exists():
                new_pages.append(path)
            report.write_page(path, number, page_rows, force=force, summary=summary)

        first = next(pages_of_rows)
        for number, page_rows in enumerate(pages_of_rows, start=2):
            write(number, page_rows)
        write(1, first, _summary(features, tensors, plan.detections, total, page_size, pages, notes))  # last: done
    except BaseException:
        for path in new_pages:
            path.unlink(missing_ok=True)
        if made_folder:
            with contextlib.suppress(OSError):
                folder.rmdir()
        raise
    emit(Wrote(index))
    return index


# -- what is drawn ---------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Tensor:
    """A tensor the plan draws: its key, where its jobs start in the plan (one per row, in row order), its rows."""

    key: str
    start: int
    rows: int


def _tensors(features, plan) -> list[_Tensor]:
    """The plan's tensors: planned without an image selection, each one's jobs are its rows 0, 1, … in order."""
    tensors, position = [], 0
    while position < len(plan):
        key = plan[position].key
        tensors.append(_Tensor(key, position, features.shape(key)[0]))
        position += tensors[-1].rows
    return tensors


def _selected_rows(features, options: GridOptions, rows: int) -> list[range]:
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

    def __init__(self, features, rows: int, note: Callable[[str], None]) -> None:
        self._features, self._cached, self._note = features, (None, []), note
        self._broken = False
        self._shards = getattr(features, "shards", None) if "target" in features.metadata else None
        if self._shards is not None:
            self._starts = list(itertools.accumulate((len(e["inputs"]) for e in self._shards), initial=0))
        else:
            self._rows = self._parse(features.metadata.get("targets"), rows)

    def _parse(self, text: str | None, rows: int) -> list:
        if text is None:
            return []
        try:
            found = json.loads(text)
        except (ValueError, RecursionError):
            found = None
        if not isinstance(found, list) or len(found) != rows or not all(
                isinstance(entry, list) and all(isinstance(t, dict) for t in entry) for entry in found):
            if not self._broken:
                self._broken = True
                self._note(f"'{self._features.name}' has targets that are not one list of objects per image; "
                           "they are left out")
            return []
        return found

    def __call__(self, row: int) -> list[dict]:
        if self._shards is None:
            return self._rows[row] if row < len(self._rows) else []
        number = bisect.bisect_right(self._starts, row) - 1
        if self._cached[0] != number:
            entry = self._shards[number]
            with FeatureFile(self._features.folder / entry["file"], follow_links=False) as shard:
                self._cached = (number, self._parse(shard.metadata.get("targets"), len(entry["inputs"])))
        rows = self._cached[1]
        return rows[row - self._starts[number]] if rows else []


# -- pages -----------------------------------------------------------------------------------------


class _Report:
    """Writes pages: for each row its targets, its detections, then each tensor's picture and statistics."""

    def __init__(self, features, plan, tensors: Sequence[_Tensor], options: GridOptions, pages: int,
                 emit: Callable) -> None:
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
        self.undrawable: set[str] = set()
        self.photo_problem = False

    def write_page(self, path: Path, number: int, rows: Sequence[int], *, force: bool, summary: str = "") -> None:
        title = f"{self.features.name} · hookcli report · page {number} of {self.pages}"
        with atomic_path(path, force=force) as temporary, open(temporary, "w", encoding="utf-8") as page:
            page.write(_HEAD.format(policy=CONTENT_SECURITY_POLICY, title=_text(title), style=_STYLE))
            page.write(f'<header><h1>hookcli report: {_text(self.features.name)}</h1>\n')
            page.write(_pager(number, self.pages) + "</header>\n<main>\n")
            if summary:
                page.write(summary)
            page.write(self._contents(number, rows))
            for row in rows:
                page.write(self._row(row))
                self.emit(Advanced(1))
            page.write(f"</main>\n<footer>{_pager(number, self.pages)}<p>Written by hookcli "
                       f"{_text(__version__)}.</p></footer>\n</body>\n</html>\n")

    def _job(self, tensor: _Tensor, row: int) -> GridJob:
        return self.plan[tensor.start + row]

    def _contents(self, number: int, rows: Sequence[int]) -> str:
        items = []
        for row in rows:
            job = self._job(self.longest, row)
            tensors = "".join(f'<li><a href="#{_anchor(row, n)}">{_text(t.key)}</a></li>'
                              for n, t in enumerate(self.tensors) if row < t.rows)
            if self.plan.detections:
                tensors = f'<li><a href="#{_anchor(row, "detections")}">detections</a></li>{tensors}'
            items.append(f'<li><a href="#{_anchor(row)}">Image {row}: {_text(job.name)}</a><ul>{tensors}</ul></li>')
        back = "" if number == 1 else '<p><a href="index.html#summary">Summary of the file</a></p>'
        return (f'<nav id="contents" aria-label="contents"><h2>On this page</h2>{back}<ol>{"".join(items)}</ol>'
                f"</nav>\n")

    def _row(self, row: int) -> str:
        job = self._job(self.longest, row)
        parts = [f'<section class="image" id="{_anchor(row)}">\n<h2>Image {row}: {_text(job.name)}</h2>\n']
        if job.source_image is not None:
            parts.append(f'<p class="path">{_text(job.source_image)}</p>\n')
        targets = self.targets(row)
        if targets:
            parts.append(_targets_table(targets))
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
        parts = [f'<article class="tensor" id="{_anchor(row, number)}">\n<h3>{_text(tensor.key)}</h3>\n',
                 f'<p class="shape">{_text(_shape_text(self.features, tensor.key, row))}'
                 f'{" · " + _text(role) if role else ""}</p>\n',
                 '<div class="body">', self._picture(tensor, row, values), _stats_table(values),
                 _channels_table(most_active(values)) if tensor.key not in self.cams else "",
                 "</div>\n</article>\n"]
        return "".join(parts)

    def _role(self, key: str, targets: list) -> str:
        """What a gradient or CAM tensor is, and which of the row's targets it is for."""
        gradient = "target" in self.metadata and _GRADIENT.fullmatch(key)
        cam = key in self.cams and _CAM.fullmatch(key)
        if not gradient and not cam:
            return ""
        k = int((gradient or cam)["target"] or 0)
        if gradient:
            what = f"gradient of the target logit with respect to '{gradient['layer']}'"
        else:
            what = (f"class-activation map ({self.metadata.get('method', 'unknown method')} at "
                    f"'{self.metadata.get('cam_layer', '?')}')")
        return what + (f", for target {k + 1}: {_target_name(targets[k])}" if k < len(targets) else "")

    def _detections(self, row: int) -> str:
        """The row's detections: their picture (when planned) and their table."""
        parts = [f'<article class="detections" id="{_anchor(row, "detections")}">\n<h3>Detections</h3>\n'
                 '<div class="body">']
        if self.boxes is None:
            parts.append('<p class="missing">No picture (see the notes).</p>')
        elif row < self.boxes.rows:
            parts.append(self._picture(self.boxes, row, None))
        try:
            parts.append(_detections_table(read_detections(self.features, row)))
        except NotDrawable as reason:
            if not self.detections_problem:
                self.detections_problem = True
                self.emit(Note(f"the detections of '{self.features.name}' cannot be read: {reason}"))
            parts.append(f'<p class="missing">No table: {_text(str(reason))}.</p>')
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
            return f'<p class="missing">No picture: {_text(str(reason))}.</p>'
        except NotDrawable as reason:
            self.undrawable.add(tensor.key)
            self.emit(Note(f"skipped '{tensor.key}' (shape {self.features.shape(tensor.key)}): {reason}"))
            return f'<p class="missing">No picture: {_text(str(reason))}.</p>'
        for text in picture.notes:
            self.emit(Note(text))
        pixels = picture.pixels
        height, width = pixels.shape[:2]
        return (f'<img src="data:image/png;base64,{_png(pixels)}" width="{width}" height="{height}" '
                f'alt="{_text(tensor.key)}, image {row}">')

    def _cam_over_photo(self, job: GridJob, options: GridOptions, values: np.ndarray) -> Picture | None:
        """The map over the photo the model saw, or None when the photo cannot be read (said once)."""
        if job.source_image is None:
            return None
        try:
            return render_picture(self.features, job, dataclasses.replace(options, overlay=True), values=values)
        except HookcliError as err:
            if not self.photo_problem:
                self.photo_problem = True
                self.emit(Note(f"CAMs are drawn without their photo where it cannot be read, first for image "
                               f"{job.row}: {err.message}"))
            return None


def _summary(features, tensors: Sequence[_Tensor], detections: Sequence[str], shown: int, page_size: int, pages: int,
             notes: Sequence[str]) -> str:
    described = describe_file(features, stats=False)
    drawn = {t.key for t in tensors} | set(detections)
    rows = max(t.rows for t in tensors)
    selection = f"{rows:,}" if shown == rows else f"{rows:,}, {shown:,} of them shown"
    facts = [("source", features.name), ("images (rows)", selection),
             ("pages", f"{pages:,} of up to {page_size:,} images"), ("size", format_bytes(described["bytes"]))]
    parts = ['<section id="summary">\n<h2>Summary</h2>\n<table class="facts">',
             *(f"<tr><th>{_text(name)}</th><td>{_text(value)}</td></tr>" for name, value in facts),
             '</table>\n<h3>Tensors</h3>\n<table class="tensors"><tr><th>key</th><th>dtype</th><th>shape</th>'
             '<th>size</th><th>in the report</th></tr>']
    for t in described["tensors"]:
        parts.append(f"<tr><td>{_text(t['key'])}</td><td>{_text(t['dtype'])}</td><td>{_text(_shape(t['shape']))}"
                     f"</td><td>{format_bytes(t['bytes'])}</td><td>{'yes' if t['key'] in drawn else 'no'}</td></tr>")
    parts.append("</table>\n")
    if notes:
        parts.append('<h3>Notes</h3>\n<ul class="notes">' + "".join(f"<li>{_text(n)}</li>" for n in notes) + "</ul>\n")
    if described["metadata"]:
        parts.append('<h3>Metadata</h3>\n<table class="metadata">')
        metadata = described["metadata"]
        parts.extend(f"<tr><th>{_text(key)}</th><td>{_value(metadata[key])}</td></tr>"
                     for key in metadata_order(metadata))
        parts.append("</table>\n")
    parts.append("</section>\n")
    return "".join(parts)


def _value(value, depth: int = 0) -> str:
    """A metadata value, readable: text as it is; objects as tables and lists as numbered lists, nested; short
    lists of plain values on one line; long lists (a run's inputs) by their first and last items."""
    if isinstance(value, str):
        return _text(_capped(value))
    if not value or depth >= _DEPTH_SHOWN or not isinstance(value, dict | list):
        return _text(_capped(_plain(value)))
    if isinstance(value, dict):
        cells = "".join(f"<tr><th>{_text(k)}</th><td>{_value(v, depth + 1)}</td></tr>" for k, v in value.items())
        return f'<table class="inner">{cells}</table>'
    if len(value) <= _LIST_SHOWN and not any(isinstance(item, dict | list | str) for item in value):
        return _text(", ".join(map(_plain, value)))
    shown = list(enumerate(value))
    if len(value) > _LIST_SHOWN:
        shown = [*shown[:5], (None, f"… {len(value) - 7:,} more …"), *shown[-2:]]
    items = "".join(f'<li value="{n}">{_value(item, depth + 1)}</li>' if n is not None else
                    f'<li class="more">{_text(item)}</li>' for n, item in shown)
    return f'<ol class="inner" start="0">{items}</ol>'


def _plain(value) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _capped(text: str) -> str:
    return text if len(text) <= _TEXT_SHOWN else f"{text[:_TEXT_SHOWN]}… ({len(text):,} characters)"


def _targets_table(targets: list[dict]) -> str:
    rows = "".join(f"<tr><td>{k + 1}</td><td>{_text(_plain(t.get('class')))}</td><td>{_text(_name(t))}</td>"
                   f"<td>{_number(t.get('logit'), '.2f')}</td><td>{_number(t.get('probability'), '.1%')}</td></tr>"
                   for k, t in enumerate(targets))
    return ('<table class="targets"><caption>Targets</caption><tr><th>target</th><th>class</th><th>name</th>'
            f"<th>logit</th><th>probability</th></tr>{rows}</table>\n")


def _name(target: dict) -> str:
    return target["name"] if isinstance(target.get("name"), str) else "-"


def _target_name(target: dict) -> str:
    number = f"class {_plain(target.get('class'))}"
    return f"{target['name']} ({number})" if isinstance(target.get("name"), str) else number


def _stats_table(values: np.ndarray) -> str:
    stats = values_stats([values])
    cells = [("min", stats["min"], ".4g"), ("mean", stats["mean"], ".4g"), ("max", stats["max"], ".4g"),
             ("zeros", stats["zeros"], ".1%")]
    if stats["nonfinite"]:
        cells.append(("NaN/inf", stats["nonfinite"], "d"))
    header = "".join(f"<th>{name}</th>" for name, _, _ in cells)
    body = "".join(f"<td{_data(value)}>{_number(value, spec)}</td>" for _, value, spec in cells)
    return f'<table class="stats"><tr>{header}</tr><tr>{body}</tr></table>'


def _detections_table(found: Detections) -> str:
    """One row a detection: its label (a class index), score and box, in the file's order (by score, from
    torchvision's models); a line saying there are none when there are none."""
    count = len(found.boxes)
    if count == 0:
        return '<p class="none">No detections.</p>'
    columns = [("label", found.labels, ""), ("score", found.scores, ".3f")]
    columns = [(name, values, spec) for name, values, spec in columns if values is not None]
    header = "".join(f"<th>{name}</th>" for name, _, _ in columns)
    rows = []
    for k, box in enumerate(found.boxes.tolist()):
        cells = "".join(f"<td{_data(values[k].item())}>{_number(values[k].item(), spec)}</td>"
                        for _, values, spec in columns)
        corners = "".join(f"<td{_data(value)}>{_number(value, '.1f')}</td>" for value in box)
        rows.append(f"<tr><td>#{k}</td>{cells}{corners}</tr>")  # numbered as --target '#N' names them
    plural = "s" if count != 1 else ""
    return (f'<table class="detections"><caption>{count} detection{plural}: label (class index), score, and box '
            f"corners in pixels of the image the model was given</caption><tr><th>detection</th>{header}<th>x1</th>"
            f"<th>y1</th><th>x2</th><th>y2</th></tr>{''.join(rows)}</table>")


def _channels_table(channels: list[tuple[int, float]]) -> str:
    if len(channels) < 2:
        return ""
    rows = "".join(f"<tr><td>{index}</td><td{_data(mean)}>{_number(mean, '.4g')}</td></tr>"
                   for index, mean in channels)
    return (f'<table class="channels"><caption>Most active channels</caption><tr><th>channel</th>'
            f"<th>mean</th></tr>{rows}</table>")


def _data(value) -> str:
    """The exact value, for scripts (and tests), beside the rounded one shown."""
    return f' data-value="{value!r}"' if isinstance(value, float | int) else ""


def _number(value, spec: str) -> str:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return "-" if value is None else _text(str(value))
    return f"{value:{spec}}"


def _pager(number: int, pages: int) -> str:
    """Links to the first, previous, next and last pages and to :data:`PAGE_WINDOW` pages on each side."""
    if pages == 1:
        return ""

    def link(target: int, text: str, rel: str = "") -> str:
        if target == number or not 1 <= target <= pages:
            return f'<span class="off">{text}</span>'
        attribute = f' rel="{rel}"' if rel else ""
        return f'<a href="{page_name(target)}"{attribute}>{text}</a>'

    low, high = max(1, number - PAGE_WINDOW), min(pages, number + PAGE_WINDOW)
    window = [f'<span aria-current="page">{n:,}</span>' if n == number else link(n, f"{n:,}")
              for n in range(low, high + 1)]
    if low > 1:
        window.insert(0, "…")
    if high < pages:
        window.append("…")
    return (f'<nav class="pages" aria-label="pages">{link(1, "« First", "first")} '
            f'{link(number - 1, "‹ Previous", "prev")} {" ".join(window)} {link(number + 1, "Next ›", "next")} '
            f'{link(pages, "Last »", "last")} <span class="count">page {number:,} of {pages:,}</span></nav>\n')


def _anchor(row: int, tensor: int | str | None = None) -> str:
    """An image's anchor, one of its tensors' (by number) or its ``detections``'."""
    if tensor is None:
        return f"image-{row}"
    return f"image-{row}-{tensor}" if isinstance(tensor, str) else f"image-{row}-tensor-{tensor}"


def _text(text: str) -> str:
    """Text from a file, for HTML: control characters and lone surrogates escaped, then markup escaped."""
    return html.escape(printable(str(text)))


def _shape(shape) -> str:
    return json.dumps(shape).replace(" ", "")


def _shape_text(features, key: str, row: int) -> str:
    """A tensor's dtype and shape per image; a ragged key's shape for this row, and the largest."""
    largest = _shape(features.shape(key)[1:])
    if not features.ragged(key):
        return f"{features.dtype(key)}, {largest} per image"
    own = _shape(features.row_shape(key, row))
    if own == largest:
        return f"{features.dtype(key)}, {own} for this image (the largest of the file's, whose images may differ)"
    return f"{features.dtype(key)}, {own} for this image (images differ in shape; the largest is {largest})"


def _png(pixels: np.ndarray) -> str:
    from PIL import Image

    buffer = io.BytesIO()
    # zlib level 1, as grid writes: about half the time of the default for pictures some 7% larger.
    Image.fromarray(pixels).save(buffer, format="PNG", compress_level=1)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


_HEAD = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="{policy}">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}</title>
<style>{style}</style>
</head>
<body>
"""

_STYLE = """
body { font: 15px/1.45 system-ui, sans-serif; margin: 0 auto; max-width: 1200px; padding: 0 1.5em 2em;
       color: #1d1d1f; background: #fff; }
h1 { font-size: 1.5em; margin: 1em 0 .4em; overflow-wrap: anywhere; }
h2 { font-size: 1.25em; margin: 1.6em 0 .3em; border-bottom: 1px solid #ccc; overflow-wrap: anywhere; }
h3 { font-size: 1.05em; margin: 1.2em 0 .2em; overflow-wrap: anywhere; }
a { color: #0645ad; }
nav.pages { margin: .6em 0; display: flex; flex-wrap: wrap; gap: .5em; align-items: baseline; }
nav.pages .off { color: #999; }
nav.pages [aria-current] { font-weight: bold; }
nav.pages .count { margin-left: auto; color: #555; }
#contents ol { columns: 2 20em; }
#contents ol > li { break-inside: avoid; }
#contents ul { font-size: .9em; margin: .1em 0 .4em; }
.path, .shape { color: #555; margin: 0 0 .4em; overflow-wrap: anywhere; }
.tensor .body { display: flex; flex-wrap: wrap; gap: 1em; align-items: flex-start; }
.tensor img { max-width: 100%; height: auto; border: 1px solid #ddd; }
table { border-collapse: collapse; margin: .3em 0; }
th, td { border: 1px solid #ddd; padding: .15em .5em; text-align: left; vertical-align: top;
         overflow-wrap: anywhere; }
th { background: #f4f4f6; }
caption { text-align: left; font-weight: bold; padding: .2em 0; }
.stats td, .channels td, .targets td, .detections td { font-variant-numeric: tabular-nums; }
.inner { margin: 0; }
ol.inner { padding-left: 2.5em; }
.more { list-style: none; color: #555; }
.missing { color: #a00; }
footer { margin-top: 2em; color: #555; border-top: 1px solid #ccc; }
"""
