"""A static HTML report of saved features: pictures, statistics, targets and metadata, a page of rows at a time.

:func:`write_report` writes ``index.html`` (page 1, with a summary of the
file) and ``page-00002.html``, ``page-00003.html``, … into a folder. Every
page stands alone: pictures are embedded as ``data:`` URIs, the style sheet is
inline, and a Content-Security-Policy lets the page fetch nothing (no script,
font or network), so the report opens from ``file://`` anywhere.

For each selected row (input image) a page holds its section
(:class:`hookcli.pictures.sections.ImageSections`). It opens with an
overview: the photo as the model saw it, the highest outputs of a
classifier's logits named with the weights' class names, and the targets of
``grad`` and ``cam`` in the columns their task records (a class's logit, a
class mask's pixels, a detection's score and box). A detection file's final
detections follow, a picture of the image's boxes over its photo and a
table of them (label, score, box); then each tensor's picture, drawn as
:func:`hookcli.pictures.drawing.render_picture` draws it for ``grid`` (a CAM
over the photo the model saw, with the box of the detection it explains),
and that row's statistics: min, mean and max over finite values, the share
of zeros, the count of NaN and ±inf, and the five channels with the highest
mean (channels: axis 0 of a ``[C, H, W]`` row, the last axis of a ``[T, D]``
row, each value of a ``[D]`` row). A row of its own shape (a ragged key) is
drawn and measured in that shape, which its line of facts gives.

Rows are read one at a time, one read per tensor, and each page is streamed
to a temporary file that is renamed into place; ``index.html`` is written
last, so a complete report is one whose ``index.html`` exists. Everything
taken from the file (names, keys, metadata) is escaped.

>>> import tempfile
>>> import numpy as np
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

import dataclasses
import itertools
import math
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

from hookcli.errors import UsageProblem, check_whole
from hookcli.events import Advanced, Note, Started, Wrote
from hookcli.files import check_folder_output, format_bytes, refuse_existing
from hookcli.options.grid import GridOptions
from hookcli.pictures.ablation_reports import write_ablation_report
from hookcli.pictures.attention_reports import attention_blocks, block_links, block_page_name, write_block_pages
from hookcli.pictures.compare_reports import write_compare_report
from hookcli.pictures.grids import plan_grids
from hookcli.pictures.html import (
    CONTENT_SECURITY_POLICY,
    facts_table,
    file_details,
    new_pages,
    notes_html,
    page_name,
    pager,
    report_page,
)
from hookcli.pictures.patch_reports import write_patch_report
from hookcli.pictures.reading import edits_facts, input_names, select_rows
from hookcli.pictures.sections import ImageSections, ReportTensor, report_tensors
from hookcli.pictures.stats_reports import write_stats_report
from hookcli.pictures.summary import describe_file
from hookcli.storage.ablation_format import is_ablation
from hookcli.storage.compare_format import is_comparison
from hookcli.storage.fileformat import INDEX_NAME
from hookcli.storage.patch_format import is_patch
from hookcli.storage.reader import FeatureReader
from hookcli.storage.stats_format import is_stats

__all__ = [
    "CONTENT_SECURITY_POLICY",
    "DEFAULT_PAGE_SIZE",
    "default_report_folder",
    "MAX_PAGE_SIZE",
    "write_report",
]


DEFAULT_PAGE_SIZE = 20


#: The most images on one page: a page holds every picture of its images, and one of many thousands is more than a
#: browser shows.
MAX_PAGE_SIZE = 10_000


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

    ``options`` are grid's: which tensors (``keys``) and rows (``images``: an index, an input's file name, or a range
    ``A:B``), and how pictures are drawn. Rows show in file order, ``page_size`` (default :data:`DEFAULT_PAGE_SIZE`)
    to a page. Refuses what grid refuses, and existing pages unless ``force``. ``progress`` hears
    :class:`~hookcli.events.Started`, :class:`~hookcli.events.Advanced` (a row), :class:`~hookcli.events.Note` and
    :class:`~hookcli.events.Wrote` (``index.html``). A statistics file's report shows its layers' channels
    (:func:`~hookcli.pictures.stats_reports.write_stats_report`, ``page_size`` channels a page); a comparison file's is
    one page of its matrix (:func:`~hookcli.pictures.compare_reports.write_compare_report`); an ablation file's one page
    of its units (:func:`~hookcli.pictures.ablation_reports.write_ablation_report`); a patching file's one page of its
    effects (:func:`~hookcli.pictures.patch_reports.write_patch_report`).
    """
    if is_ablation(features.metadata):
        return write_ablation_report(features, output, options, page_size=page_size, force=force, progress=progress)
    if options.examples is not None:
        raise UsageProblem(
            f"--examples shows the dataset examples of an ablation file's units, and '{features.name}' is not one",
            hint="leave --examples out",
        )
    if is_stats(features.metadata):
        return write_stats_report(features, output, options, page_size=page_size, force=force, progress=progress)
    if is_comparison(features.metadata):
        return write_compare_report(features, output, options, page_size=page_size, force=force, progress=progress)
    if is_patch(features.metadata):
        return write_patch_report(features, output, options, page_size=page_size, force=force, progress=progress)
    emit = progress or (lambda event: None)
    page_size = DEFAULT_PAGE_SIZE if page_size is None else page_size
    check_whole("page_size", page_size, 1, MAX_PAGE_SIZE)
    folder = check_folder_output(output)
    plan = plan_grids(features, dataclasses.replace(options, images=()), None)
    tensors = report_tensors(features, plan)
    rows = _selected_rows(features, options, max(t.rows for t in tensors))
    total = sum(len(r) for r in rows)
    pages = math.ceil(total / page_size)
    index = folder / page_name(1)
    blocks = attention_blocks(features, tensors)
    refuse_existing((folder / page_name(n) for n in range(1, pages + 1)), force=force)
    refuse_existing((folder / block_page_name(n) for n in range(1, len(blocks) + 1)), force=force)
    notes = [*getattr(features, "reading_notes", ()), *plan.notes]
    for text in notes:
        emit(Note(text))
    emit(Started(total=total))
    with new_pages(folder) as track:
        pages_of_rows = _batches(itertools.chain.from_iterable(rows), page_size)
        sections = ImageSections(features, plan, tensors, options, emit)

        def write(number: int, page_rows: list[int], summary: tuple[str, str] = ("", "")) -> None:
            _write_page(
                track(folder / page_name(number)), sections, (number, pages), page_rows, summary, force=force, emit=emit
            )

        first = next(pages_of_rows)
        for number, page_rows in enumerate(pages_of_rows, start=2):
            write(number, page_rows)
        write_block_pages(sections, blocks, first, folder, track, force=force)
        summary = _summary(features, tensors, plan.detections, total, page_size, pages, notes)
        write(1, first, (summary[0] + (block_links(blocks) if blocks else ""), summary[1]))  # last: done
    emit(Wrote(index))
    return index


def _write_page(
    path: Path,
    sections: ImageSections,
    page: tuple[int, int],
    rows: Sequence[int],
    summary: tuple[str, str],
    *,
    force: bool,
    emit: Callable,
) -> None:
    """Page ``page`` (its number, of how many) of ``rows``' sections, streamed to a temporary file renamed into
    place; page 1 opens with the file's summary and ends with its tensors and metadata (``summary``)."""
    number, pages = page
    name = sections.features.name
    title = f"{name} · hookcli report · page {number} of {pages}"
    links = pager(number, pages)
    with report_page(path, name, title, force=force, header=links, footer=links) as out:
        out.write(summary[0])
        out.write(sections.contents(number, rows))
        for row in rows:
            out.write(sections.section(row))
            emit(Advanced(1))
        out.write(summary[1])


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


def _summary(
    features: FeatureReader,
    tensors: Sequence[ReportTensor],
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
    facts += edits_facts(features.metadata)
    top = (
        f'<section id="summary">\n<h2>Summary</h2>\n{facts_table(facts)}{notes_html(notes)}'
        '<p><a href="#file">The file\'s tensors and metadata</a> follow the pictures.</p>\n</section>\n'
    )
    return top, file_details(described, drawn)
