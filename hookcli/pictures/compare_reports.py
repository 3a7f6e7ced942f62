"""``hookcli report`` on a comparison file: one page, ``index.html``.

The page sums the comparison up (method, what the rows and columns are of, inputs, undefined representations), shows
its heatmap as ``grid`` draws it (:func:`~hookcli.pictures.compare_grids.heatmap_picture`), then the matrix as a table
with each cell on its heatmap colour, the method's settings, and the file's tensors and metadata, collapsed. Like the
other reports it stands alone: the picture is inline, nothing is fetched, and there is no script
(:data:`~hookcli.pictures.html.CONTENT_SECURITY_POLICY`). ``-k`` and ``--cmap`` choose as in ``grid``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import numpy as np

from hookcli.events import Advanced, Started, Wrote
from hookcli.files import format_bytes
from hookcli.options.grid import GridOptions
from hookcli.pictures.compare_grids import (
    ChosenMatrix,
    choose_matrix,
    heatmap_picture,
    matrix_colours,
    method_name,
)
from hookcli.pictures.html import (
    escaped,
    facts_table,
    file_details,
    new_pages,
    one_page_index,
    picture_html,
    report_page,
    value_html,
)
from hookcli.pictures.reading import edits_facts
from hookcli.pictures.summary import describe_comparison
from hookcli.storage.compare_file import ComparisonFile, read_comparison
from hookcli.storage.reader import FeatureReader

__all__ = ["write_compare_report"]

#: Columns whose labels are longer than this many characters have them upright.
_UPRIGHT = 8

_COMPARE_STYLE = """
.matrix-wrap { max-height: 40em; max-width: 100%; width: fit-content; overflow: auto; border: 1px solid #ddd; }
table.matrix th, table.matrix td { white-space: nowrap; overflow-wrap: normal; }
table.matrix td { font-variant-numeric: tabular-nums; text-align: right; }
table.matrix.upright thead th { writing-mode: vertical-rl; transform: rotate(180deg); text-align: left; }
table.matrix td.dark { color: #fff; }
table.matrix td.undefined { color: #555; font-style: italic; background: #e0e0e0; }
table.matrix thead th { position: sticky; top: 0; }
table.matrix tbody th { position: sticky; left: 0; }
.heatmap img { max-width: 100%; height: auto; border: 1px solid #ddd; }
"""


def write_compare_report(
    features: FeatureReader,
    output: str | os.PathLike,
    options: GridOptions,
    *,
    page_size: int | None = None,
    force: bool = False,
    progress: Callable | None = None,
) -> Path:
    """Write the report of the comparison file ``features`` (see the module) into folder ``output`` and return the
    path of its ``index.html``. Refuses what grid refuses of a comparison file, a ``page_size`` (the report is one
    page), and an existing page unless ``force``; reports :class:`~hookcli.events.Started`,
    :class:`~hookcli.events.Advanced` and :class:`~hookcli.events.Wrote` (``index.html``) events to ``progress``."""
    emit = progress or (lambda event: None)
    comparison = read_comparison(features)
    index = one_page_index(output, f"the comparison file '{comparison.name}'", page_size, force=force)
    folder = index.parent
    chosen = choose_matrix(comparison, options)
    emit(Started(total=1))
    picture = picture_html(heatmap_picture(comparison, chosen, options), f"heatmap of {comparison.method}")
    title = f"{comparison.name} · hookcli report"
    with (
        new_pages(folder) as track,
        report_page(track(index), comparison.name, title, force=force, style=_COMPARE_STYLE) as page,
    ):
        page.write(_summary(comparison))
        page.write(f'<section id="heatmap" class="heatmap">\n<h2>Heatmap</h2>\n{picture}\n</section>\n')
        page.write(_matrix_table(comparison, chosen))
        page.write(_settings(comparison))
        page.write(file_details(describe_comparison(comparison, values=False), {comparison.method}))
    emit(Advanced(1))
    emit(Wrote(index))
    return index


def _summary(comparison: ComparisonFile) -> str:
    first, second = comparison.sources()
    count = f"{len(comparison.inputs):,}" + (f" ({comparison.skipped:,} skipped)" if comparison.skipped else "")
    facts = [
        ("source", comparison.name),
        ("method", f"{method_name(comparison)} ({comparison.method})"),
        ("rows", f"{len(comparison.rows):,} representations of {first}"),
        (
            "columns",
            "the same representations"
            if comparison.same
            else f"{len(comparison.columns):,} representations of {second}",
        ),
        ("inputs", count),
        ("undefined (no spread)", ", ".join(comparison.undefined) or "none"),
        ("size", format_bytes(comparison.features.size)),
        *edits_facts(comparison.metadata),
    ]
    return (
        f'<section id="summary">\n<h2>Summary</h2>\n{facts_table(facts)}'
        '<p><a href="#matrix">The matrix</a> and <a href="#settings">its settings</a> follow the heatmap; '
        '<a href="#file">the file\'s tensors and metadata</a> close the page.</p>\n</section>\n'
    )


#: The most cells the matrix's table shows: past them (a page of megabytes no browser opens) the heatmap alone does.
MOST_TABLE_CELLS = 16_384


def _matrix_table(comparison: ComparisonFile, chosen: ChosenMatrix) -> str:
    """The chosen rows and columns of the matrix, each cell its value on its heatmap colour (at most
    :data:`MOST_TABLE_CELLS` of them)."""
    if len(chosen.rows) * len(chosen.columns) > MOST_TABLE_CELLS:
        return (
            '<section id="matrix">\n<h2>Matrix</h2>\n'
            f"<p>Its {len(chosen.rows) * len(chosen.columns):,} pairs are more than a table here shows "
            f"({MOST_TABLE_CELLS:,}): the heatmap shows them, the file holds their values "
            "(<code>hookcli info --json</code>), and <code>-k</code> chooses fewer.</p>\n</section>\n"
        )
    values = comparison.matrix()[np.ix_(chosen.rows, chosen.columns)]
    colours = matrix_colours(values, comparison.method, chosen.cmap)
    dark = colours.astype(np.float64) @ np.array([0.299, 0.587, 0.114]) < 128
    heads = "".join(f'<th scope="col">{escaped(comparison.columns[j])}</th>' for j in chosen.columns)
    lines = []
    for n, i in enumerate(chosen.rows):
        cells = []
        for m, value in enumerate(values[n].tolist()):
            if np.isnan(value):
                cells.append('<td class="undefined" data-value="NaN">undefined</td>')
                continue
            colour = "#{:02x}{:02x}{:02x}".format(*colours[n, m].tolist())
            shade = ' class="dark"' if dark[n, m] else ""
            cells.append(f'<td{shade} style="background: {colour}" data-value="{value!r}">{value:.3f}</td>')
        lines.append(f'<tr><th scope="row">{escaped(comparison.rows[i])}</th>{"".join(cells)}</tr>')
    # Long labels over columns of short numbers read upwards, as in the heatmap.
    upright = " upright" if max(len(comparison.columns[j]) for j in chosen.columns) > _UPRIGHT else ""
    shown = len(chosen.rows) * len(chosen.columns)
    whole = len(comparison.rows) * len(comparison.columns)
    part = "" if shown == whole else f" ({shown:,} of its {whole:,} pairs, as -k chose)"
    return (
        f'<section id="matrix">\n<h2>Matrix</h2>\n<p>{escaped(method_name(comparison))} of each row\'s '
        f"representation with each column's{part}; undefined: a representation without spread.</p>\n"
        f'<div class="matrix-wrap"><table class="matrix{upright}"><thead><tr><th></th>{heads}</tr></thead>'
        f"<tbody>{''.join(lines)}</tbody></table></div>\n</section>\n"
    )


def _settings(comparison: ComparisonFile) -> str:
    rows = "".join(
        f"<tr><th>{escaped(name)}</th><td>{value_html(value)}</td></tr>" for name, value in comparison.settings.items()
    )
    table = f'<table class="facts">{rows}</table>' if rows else "<p>None recorded.</p>"
    return f'<section id="settings">\n<h2>Settings</h2>\n{table}\n</section>\n'
