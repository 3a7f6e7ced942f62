"""The pieces of a report's pages: escaped text, tables of statistics, targets, channels and detections,
pictures embedded as ``data:`` URIs, the pager, and the page's head and style sheet.

>>> escaped("<b>&"), shape_html([2, 3])
('&lt;b&gt;&amp;', '[2,3]')
"""

from __future__ import annotations

import base64
import contextlib
import html
import io
import json
import os
from collections.abc import Callable, Container, Iterator, Sequence
from pathlib import Path
from typing import Any, TextIO

import numpy as np
from PIL import Image

from hookcli.console import printable
from hookcli.errors import UsageProblem
from hookcli.files import atomic_path, check_folder_output, format_bytes, refuse_existing
from hookcli.pictures.reading import Detections, target_box
from hookcli.pictures.summary import values_stats
from hookcli.storage.fileformat import metadata_order
from hookcli.storage.reader import FeatureReader
from hookcli.version import __version__

__all__ = [
    "CONTENT_SECURITY_POLICY",
    "DEPTH_SHOWN",
    "PAGE_WINDOW",
    "TEXT_SHOWN",
    "row_anchor",
    "channels_table",
    "detections_table",
    "facts_table",
    "file_details",
    "new_pages",
    "notes_html",
    "number_cell",
    "HEAD",
    "page_name",
    "one_page_index",
    "pager",
    "jpeg_uri",
    "picture_html",
    "report_page",
    "png_uri",
    "predictions_table",
    "shape_html",
    "row_shape_html",
    "stats_table",
    "STYLE",
    "target_kind",
    "target_name",
    "targets_table",
    "escaped",
    "value_html",
]

#: Page links on each side of the current page (plus first, previous, next and last).
PAGE_WINDOW = 3
#: Longer text in the metadata table is cut; structure nested deeper is shown as JSON text.
TEXT_SHOWN, DEPTH_SHOWN = 4000, 6


#: Lists in the metadata table longer than this show their first and last items.
_LIST_SHOWN = 10


def page_name(number: int) -> str:
    """The file of page ``number`` (from 1): ``index.html``, then ``page-00002.html``, …"""
    return "index.html" if number == 1 else f"page-{number:05d}.html"


def one_page_index(output: str | os.PathLike, what: str, page_size: int | None, *, force: bool) -> Path:
    """The ``index.html`` of a report that is one page, of ``what`` (``the ablation file 'a.safetensors'``): refused
    when ``page_size`` is given, when ``output`` cannot be a folder, or when the page exists, unless ``force``."""
    if page_size is not None:
        raise UsageProblem(
            f"--page-size pages images or channels, and the report of {what} is one page",
            hint="leave --page-size out",
        )
    index = check_folder_output(output) / page_name(1)
    refuse_existing([index], force=force)
    return index


def value_html(value, depth: int = 0) -> str:
    """A metadata value, readable: text as it is; objects as tables and lists as numbered lists, nested; short
    lists of plain values on one line; long lists (a run's inputs) by their first and last items."""
    if isinstance(value, str):
        return escaped(_capped(value))
    if not value or depth >= DEPTH_SHOWN or not isinstance(value, dict | list):
        return escaped(_capped(_plain(value)))
    if isinstance(value, dict):
        cells = "".join(f"<tr><th>{escaped(k)}</th><td>{value_html(v, depth + 1)}</td></tr>" for k, v in value.items())
        return f'<table class="inner">{cells}</table>'
    if len(value) <= _LIST_SHOWN and not any(isinstance(item, dict | list | str) for item in value):
        return escaped(", ".join(map(_plain, value)))
    shown: list[tuple[int | None, Any]] = list(enumerate(value))
    if len(value) > _LIST_SHOWN:
        shown = [*shown[:5], (None, f"… {len(value) - 7:,} more …"), *shown[-2:]]
    items = "".join(
        f'<li value="{n}">{value_html(item, depth + 1)}</li>'
        if n is not None
        else f'<li class="more">{escaped(item)}</li>'
        for n, item in shown
    )
    return f'<ol class="inner" start="0">{items}</ol>'


def _plain(value) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _capped(text: str) -> str:
    return text if len(text) <= TEXT_SHOWN else f"{text[:TEXT_SHOWN]}… ({len(text):,} characters)"


def target_kind(targets: Sequence[dict]) -> str:
    """What a row's targets score, told by the fields ``grad`` and ``cam`` record: ``detection`` (a detection's
    score: ``detection``, ``box``), ``segmentation`` (a class mask's: ``pixels``) or ``classification`` (a logit)."""
    if any("detection" in t or "box" in t for t in targets):
        return "detection"
    return "segmentation" if any("pixels" in t for t in targets) else "classification"


def _box_cells(target: dict) -> str:
    box = target_box(target)
    corners = box[0].tolist() if box is not None else [None] * 4
    return "".join(f"<td>{_number(value, '.1f')}</td>" for value in corners)


def _region_cell(target: dict) -> str:
    region = target.get("region")
    if not isinstance(region, list) or not all(isinstance(v, int | float) for v in region):
        return "<td>-</td>"
    return f"<td>{escaped(','.join(f'{v:g}' for v in region))}</td>"


def _class_cell(target: dict) -> str:
    label = target.get("class")
    return f"<td>{'-' if label is None else escaped(_plain(label))}</td>"


#: The columns of each kind of target (:func:`target_kind`): headings (split at spaces) and a row's cells, from what
#: was recorded.
_TARGET_COLUMNS: dict[str, tuple[tuple[str, Callable[[dict], str]], ...]] = {
    "classification": (
        ("class", _class_cell),
        ("name", lambda t: f"<td>{escaped(_name(t))}</td>"),
        ("logit", lambda t: f"<td>{_number(t.get('logit'), '.2f')}</td>"),
        ("probability", lambda t: f"<td>{_number(t.get('probability'), '.1%')}</td>"),
    ),
    "segmentation": (
        ("class", _class_cell),
        ("name", lambda t: f"<td>{escaped(_name(t))}</td>"),
        ("pixels", lambda t: f"<td>{_number(t.get('pixels'), ',')}</td>"),
        ("share", lambda t: f"<td>{_number(t.get('share'), '.1%')}</td>"),
        ("score", lambda t: f"<td>{_number(t.get('score'), '.4g')}</td>"),
    ),
    "detection": (
        ("detection", lambda t: f"<td>{_detection_place(t)}</td>"),
        ("label", _class_cell),
        ("name", lambda t: f"<td>{escaped(_name(t))}</td>"),
        ("score", lambda t: f"<td>{_number(t.get('score'), '.3f')}</td>"),
        ("x1 y1 x2 y2", _box_cells),
    ),
}


_TARGET_CAPTIONS = {
    "classification": "Targets: logits",
    "segmentation": "Targets: class masks (score: logits summed over the mask)",
    "detection": "Targets: detections (boxes in pixels of the image the model was given)",
}


def targets_table(targets: list[dict]) -> str:
    """The row's targets, with the columns that fit what they score (:func:`target_kind`); a segmentation's
    ``--region`` as a column of its own."""
    kind = target_kind(targets)
    columns = _TARGET_COLUMNS[kind]
    if kind == "segmentation" and any("region" in t for t in targets):
        columns = (*columns, ("region", _region_cell))
    header = "".join(f"<th>{name}</th>" for names, _ in columns for name in names.split())
    rows = "".join(f"<tr><td>{k + 1}</td>{''.join(cell(t) for _, cell in columns)}</tr>" for k, t in enumerate(targets))
    return (
        f'<table class="targets {kind}"><caption>{_TARGET_CAPTIONS[kind]}</caption><tr><th>target</th>{header}</tr>'
        f"{rows}</table>\n"
    )


def _name(target: dict) -> str:
    return target["name"] if isinstance(target.get("name"), str) else "-"


def _detection_place(target: dict) -> str:
    """A detection target's place in the model's output, as ``--target '#N'`` names it; ``none`` when the image has
    no such detection."""
    place = target.get("detection")
    return f"#{place}" if isinstance(place, int) and not isinstance(place, bool) else "none"


def target_name(target: dict) -> str:
    """A target in a few words: its class (and name), and the detection it is, or that there is none."""
    label = target.get("class")
    number = f"class {_plain(label)}"
    named = f"{target['name']} ({number})" if isinstance(target.get("name"), str) else number
    if "detection" not in target:
        return named
    place = _detection_place(target)
    if place == "none":
        return "no such detection" + (f" of {named}" if label is not None else "")
    return f"detection {place}, {named}"


def stats_table(values: np.ndarray) -> str:
    stats = values_stats([values])
    cells = [
        ("min", stats["min"], ".4g"),
        ("mean", stats["mean"], ".4g"),
        ("max", stats["max"], ".4g"),
        ("zeros", stats["zeros"], ".1%"),
    ]
    if stats["nonfinite"]:
        cells.append(("NaN/inf", stats["nonfinite"], "d"))
    header = "".join(f"<th>{name}</th>" for name, _, _ in cells)
    body = "".join(number_cell(value, spec) for _, value, spec in cells)
    return f'<table class="stats"><tr>{header}</tr><tr>{body}</tr></table>'


def detections_table(found: Detections) -> str:
    """One row a detection: its label (a class index), score and box, in the file's order (by score, from
    torchvision's models); a line saying there are none when there are none."""
    count = len(found.boxes)
    if count == 0:
        return '<p class="none">No detections.</p>'
    columns = [
        (name, values, spec)
        for name, values, spec in (("label", found.labels, ""), ("score", found.scores, ".3f"))
        if values is not None
    ]
    header = "".join(f"<th>{name}</th>" for name, _, _ in columns)
    rows = []
    for k, box in enumerate(found.boxes.tolist()):
        cells = "".join(number_cell(values[k].item(), spec) for _, values, spec in columns)
        corners = "".join(number_cell(value, ".1f") for value in box)
        rows.append(f"<tr><td>#{k}</td>{cells}{corners}</tr>")  # numbered as --target '#N' names them
    plural = "s" if count != 1 else ""
    return (
        f'<table class="detections"><caption>{count} detection{plural}: label (class index), score, and box '
        f"corners in pixels of the image the model was given</caption><tr><th>detection</th>{header}<th>x1</th>"
        f"<th>y1</th><th>x2</th><th>y2</th></tr>{''.join(rows)}</table>"
    )


def predictions_table(key: str, outputs: Sequence[tuple[int, float, float]], names: Sequence[str]) -> str:
    """A classifier's highest outputs (``(class, logit, probability)``, from the logits stored under ``key``), named
    with the weights' class ``names``."""
    rows = "".join(
        f"<tr><td>{label}</td><td>{escaped(names[label])}</td>{number_cell(logit, '.2f')}"
        f"{number_cell(probability, '.1%')}</tr>"
        for label, logit, probability in outputs
    )
    return (
        f'<table class="predictions"><caption>Predictions: the highest outputs of {escaped(key)}</caption>'
        f"<tr><th>class</th><th>name</th><th>logit</th><th>probability</th></tr>{rows}</table>"
    )


def channels_table(channels: list[tuple[int, float]], names: Sequence[str] | None = None) -> str:
    """The most active channels and their means; ``names`` (a classifier's class names, for a tensor of one value a
    class, such as a gradient with respect to the logits) name them."""
    if len(channels) < 2:
        return ""
    named = names is not None and all(index < len(names) for index, _ in channels)
    rows = "".join(
        f"<tr><td>{index}</td>{f'<td>{escaped(names[index])}</td>' if named else ''}"  # type: ignore[index]
        f"{number_cell(mean, '.4g')}</tr>"
        for index, mean in channels
    )
    return (
        '<table class="channels"><caption>Most active channels</caption>'
        f"<tr><th>channel</th>{'<th>class</th>' if named else ''}<th>mean</th></tr>{rows}</table>"
    )


def number_cell(value, spec: str) -> str:
    """A table cell of a number, rounded as ``spec`` says, with its exact value for scripts (and tests)."""
    return f"<td{_data(value)}>{_number(value, spec)}</td>"


def _data(value) -> str:
    """The exact value, for scripts (and tests), beside the rounded one shown."""
    return f' data-value="{value!r}"' if isinstance(value, float | int) else ""


def _number(value, spec: str) -> str:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return "-" if value is None else escaped(str(value))
    return f"{value:{spec}}"


def pager(number: int, pages: int, name: Callable[[int], str] = page_name) -> str:
    """Links to the first, previous, next and last pages and to :data:`PAGE_WINDOW` pages on each side; ``name``
    gives each page's file."""
    if pages == 1:
        return ""

    def link(target: int, text: str, rel: str = "") -> str:
        if target == number or not 1 <= target <= pages:
            return f'<span class="off">{text}</span>'
        attribute = f' rel="{rel}"' if rel else ""
        return f'<a href="{name(target)}"{attribute}>{text}</a>'

    low, high = max(1, number - PAGE_WINDOW), min(pages, number + PAGE_WINDOW)
    window = [
        f'<span aria-current="page">{n:,}</span>' if n == number else link(n, f"{n:,}") for n in range(low, high + 1)
    ]
    if low > 1:
        window.insert(0, "…")
    if high < pages:
        window.append("…")
    return (
        f'<nav class="pages" aria-label="pages">{link(1, "« First", "first")} '
        f"{link(number - 1, '‹ Previous', 'prev')} {' '.join(window)} {link(number + 1, 'Next ›', 'next')} "
        f'{link(pages, "Last »", "last")} <span class="count">page {number:,} of {pages:,}</span></nav>\n'
    )


def facts_table(facts: Sequence[tuple[str, str]]) -> str:
    """A table of facts, a name and its value a line."""
    rows = "".join(f"<tr><th>{escaped(name)}</th><td>{escaped(value)}</td></tr>" for name, value in facts)
    return f'<table class="facts">{rows}</table>\n'


def notes_html(notes: Sequence[str]) -> str:
    """The notes of a report's making (left out when there are none)."""
    if not notes:
        return ""
    return '<h3>Notes</h3>\n<ul class="notes">' + "".join(f"<li>{escaped(n)}</li>" for n in notes) + "</ul>\n"


def file_details(described: dict, shown: Container[str]) -> str:
    """The file's tensors (``shown``: those the report shows) and metadata, as
    :func:`~hookcli.pictures.summary.describe_file` describes them, in a collapsed section."""
    parts = [
        # The link's target is inside the collapsed section, so that following it opens the section: browsers
        # reveal a fragment's target hidden in a closed <details> (the HTML standard's ancestor revealing), with no
        # script.
        '<details class="about">\n<summary>The file: its tensors and metadata</summary>\n<div id="file">\n'
        '<h3>Tensors</h3>\n<table class="tensors"><tr><th>key</th><th>dtype</th><th>shape</th>'
        "<th>size</th><th>in the report</th></tr>",
    ]
    for t in described["tensors"]:
        parts.append(
            f"<tr><td>{escaped(t['key'])}</td><td>{escaped(t['dtype'])}</td><td>{escaped(shape_html(t['shape']))}"
            f"</td><td>{format_bytes(t['bytes'])}</td><td>{'yes' if t['key'] in shown else 'no'}</td></tr>"
        )
    parts.append("</table>\n")
    if described["metadata"]:
        parts.append('<h3>Metadata</h3>\n<table class="metadata">')
        metadata = described["metadata"]
        parts.extend(
            f"<tr><th>{escaped(key)}</th><td>{value_html(metadata[key])}</td></tr>" for key in metadata_order(metadata)
        )
        parts.append("</table>\n")
    parts.append("</div>\n</details>\n")
    return "".join(parts)


@contextlib.contextmanager
def new_pages(folder: Path) -> Iterator[Callable[[Path], Path]]:
    """Pages about to be written into ``folder`` (made if need be): each new path the callable it yields is given
    (and returns) is removed again, with the folder if it was made here, should writing fail part-way (a damaged
    shard, Ctrl-C)."""
    made = not folder.exists()
    folder.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []

    def track(path: Path) -> Path:
        if not path.exists():
            written.append(path)
        return path

    try:
        yield track
    except BaseException:
        for path in written:
            path.unlink(missing_ok=True)
        if made:
            with contextlib.suppress(OSError):
                folder.rmdir()
        raise


def row_anchor(row: int, tensor: int | str | None = None) -> str:
    """An image's anchor, one of its tensors' (by number) or its ``detections``'."""
    if tensor is None:
        return f"image-{row}"
    return f"image-{row}-{tensor}" if isinstance(tensor, str) else f"image-{row}-tensor-{tensor}"


def escaped(text: str) -> str:
    """Text from a file, for HTML: control characters and lone surrogates escaped, then markup escaped."""
    return html.escape(printable(str(text)))


def shape_html(shape) -> str:
    return json.dumps(shape).replace(" ", "")


def row_shape_html(features: FeatureReader, key: str, row: int) -> str:
    """A tensor's dtype and shape per image; a ragged key's shape for this row, and the largest."""
    largest = shape_html(features.shape(key)[1:])
    if not features.ragged(key):
        return f"{features.dtype(key)}, {largest} per image"
    own = shape_html(features.row_shape(key, row))
    if own == largest:
        return f"{features.dtype(key)}, {own} for this image (the largest of the file's, whose images may differ)"
    return f"{features.dtype(key)}, {own} for this image (images differ in shape; the largest is {largest})"


def picture_html(pixels: np.ndarray, alt: str, *, jpeg: bool = False) -> str:
    """``uint8 [H, W, 3]`` pixels as an ``<img>`` of their own size, embedded (the page fetches nothing): a PNG, or
    with ``jpeg`` a JPEG (:func:`jpeg_uri`, for pictures of photos)."""
    height, width = pixels.shape[:2]
    source = f"data:image/jpeg;base64,{jpeg_uri(pixels)}" if jpeg else f"data:image/png;base64,{png_uri(pixels)}"
    return f'<img src="{source}" width="{width}" height="{height}" alt="{escaped(alt)}">'


def png_uri(pixels: np.ndarray) -> str:
    # zlib level 1, as grid writes: about half the time of the default for pictures some 7% larger.
    return _encoded(pixels, format="PNG", compress_level=1)


def jpeg_uri(pixels: np.ndarray) -> str:
    """Pixels as base64 JPEG, for a ``data:image/jpeg`` URI: photos take about a quarter of their PNG's bytes."""
    return _encoded(pixels, format="JPEG", quality=90)


def _encoded(pixels: np.ndarray, **how) -> str:
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, **how)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


#: What the pages may load: nothing but their own inline style and embedded pictures.
CONTENT_SECURITY_POLICY = "default-src 'none'; img-src data:; style-src 'unsafe-inline'"


@contextlib.contextmanager
def report_page(
    path: str | os.PathLike,
    name: str,
    title: str,
    *,
    force: bool,
    style: str = "",
    policy: str = CONTENT_SECURITY_POLICY,
    header: str = "",
    footer: str = "",
    script: str = "",
) -> Iterator[TextIO]:
    """One page of the report of file ``name``, written whole or not at all to ``path`` (an existing one is
    replaced only with ``force``): the caller writes the ``<main>`` part to the stream given; the frame around it
    is every report's. ``title`` is the browser's; ``style`` is added to :data:`STYLE`, ``header`` and ``footer``
    (the pager) follow the heading and precede the version, ``script`` ends the page.

    >>> import os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "index.html")
    >>> with report_page(path, "a.safetensors", "a · hookcli report", force=False) as page:
    ...     _ = page.write("<p>hello</p>")
    >>> "<h1>hookcli report: a.safetensors</h1>" in open(path).read()
    True
    """
    with atomic_path(path, force=force) as temporary, open(temporary, "w", encoding="utf-8") as page:
        page.write(HEAD.format(policy=policy, title=escaped(title), style=STYLE + style))
        page.write(f"<header><h1>hookcli report: {escaped(name)}</h1>\n{header}</header>\n<main>\n")
        yield page
        page.write(f"</main>\n<footer>{footer}<p>Written by hookcli {escaped(__version__)}.</p></footer>\n")
        page.write(f"<script>{script}</script>\n" if script else "")
        page.write("</body>\n</html>\n")


HEAD = """<!DOCTYPE html>
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


STYLE = """
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
.overview { display: flex; flex-wrap: wrap; gap: .5em 2em; align-items: flex-start; margin: .3em 0 .6em; }
.thumbnail { margin: .3em 0; }
.thumbnail img { display: block; border: 1px solid #ddd; }
.thumbnail figcaption { color: #555; font-size: .85em; }
.tensor .body { display: flex; flex-wrap: wrap; gap: 1em; align-items: flex-start; }
.tensor img { max-width: 100%; height: auto; border: 1px solid #ddd; }
table { border-collapse: collapse; margin: .3em 0; }
th, td { border: 1px solid #ddd; padding: .15em .5em; text-align: left; vertical-align: top;
         overflow-wrap: anywhere; }
th { background: #f4f4f6; }
caption { text-align: left; font-weight: bold; padding: .2em 0; }
table.metadata > tbody > tr > th { overflow-wrap: break-word; }
.stats td, .channels td, .predictions td, .targets td, .detections td { font-variant-numeric: tabular-nums; }
.inner { margin: 0; }
ol.inner { padding-left: 2.5em; }
.more { list-style: none; color: #555; }
.missing { color: #a00; }
#file { scroll-margin-top: 4em; }
footer { margin-top: 2em; color: #555; border-top: 1px solid #ccc; }
"""
