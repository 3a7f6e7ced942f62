"""``hookcli report`` on a statistics file: an index page, then each layer's pages, ``page_size`` channels a page.

``index.html``, written last, sums the file up with a table of its layers and links to each layer's first page,
``layer-<layer>.html``; further pages are ``layer-<layer>-00002.html`` and on (the layer part as in PNG names,
:func:`~hookcli.pictures.file_names.file_stems`). A layer's first page holds its principal components' scree plot, if
any, and a sortable table of its channels; every page shows each channel's values between its quantiles
(:func:`~hookcli.pictures.charts.quantiles_svg`) and its dataset examples, drawn as ``grid`` draws them. Nothing is
fetched; the one script, which sorts tables, is allowed by its hash in the Content-Security-Policy. Layers and
channels are chosen as by ``grid`` (:func:`~hookcli.pictures.stats_grids.choose_units`), every channel by default.
"""

from __future__ import annotations

import base64
import hashlib
import math
import os
import urllib.parse
from collections.abc import Callable, Sequence
from pathlib import Path

from hookcli.errors import check_whole
from hookcli.events import Advanced, Note, Started, Wrote
from hookcli.files import check_folder_output, format_bytes, refuse_existing
from hookcli.options.grid import GridOptions
from hookcli.pictures.charts import quantiles_svg, scree_svg
from hookcli.pictures.examples import ExamplePhotos, examples_picture, unit_word
from hookcli.pictures.html import (
    escaped,
    facts_table,
    file_details,
    new_pages,
    notes_html,
    number_cell,
    page_name,
    pager,
    picture_html,
    report_page,
    shape_html,
)
from hookcli.pictures.reading import edits_facts
from hookcli.pictures.render import check_cmap
from hookcli.pictures.stats_grids import ChosenUnits, choose_units
from hookcli.pictures.summary import FIRST_COMPONENTS, describe_stats, explained, explaining
from hookcli.storage.reader import FeatureReader
from hookcli.storage.stats_file import StatsFile, StatsLayer, read_stats
from hookcli.storage.stats_format import FIELDS

__all__ = [
    "CHANNELS_A_PAGE",
    "MAX_CHANNELS_A_PAGE",
    "REPORT_EXAMPLE_SIDE",
    "STATS_CONTENT_SECURITY_POLICY",
    "layer_page_name",
    "write_stats_report",
]

#: Channels a layer's page holds unless told otherwise, and at most.
CHANNELS_A_PAGE, MAX_CHANNELS_A_PAGE = 64, 1024
#: The longer side of an example's thumbnail on a page.
REPORT_EXAMPLE_SIDE = 112

#: Sorts a table of class ``sortable`` by the column whose header button is clicked (highest first, then lowest
#: first), by each cell's ``data-value``; values that are not numbers go last either way.
_SORT_SCRIPT = """
for (const table of document.querySelectorAll("table.sortable")) {
  const body = table.tBodies[0];
  for (const button of table.tHead.querySelectorAll("button")) {
    button.addEventListener("click", () => {
      const header = button.closest("th");
      const down = header.getAttribute("aria-sort") !== "descending";
      const value = (row) => parseFloat(row.cells[header.cellIndex].dataset.value);
      const rows = [...body.rows].sort((a, b) => {
        const x = value(a), y = value(b);
        if (Number.isNaN(x) || Number.isNaN(y)) return Number.isNaN(x) - Number.isNaN(y);
        return down ? y - x : x - y;
      });
      for (const other of table.tHead.querySelectorAll("th")) other.removeAttribute("aria-sort");
      header.setAttribute("aria-sort", down ? "descending" : "ascending");
      body.append(...rows);
    });
  }
}
"""

#: The pages load nothing; their style is inline, and the one script they run is the one of that hash.
STATS_CONTENT_SECURITY_POLICY = (
    "default-src 'none'; img-src data:; style-src 'unsafe-inline'; "
    f"script-src 'sha256-{base64.b64encode(hashlib.sha256(_SORT_SCRIPT.encode()).digest()).decode()}'"
)

_STATS_STYLE = """
table.units th button { font: inherit; font-weight: bold; border: 0; background: none; padding: 0; cursor: pointer;
                        color: #0645ad; }
table.units th[aria-sort=descending] button::after { content: " ▼"; }
table.units th[aria-sort=ascending] button::after { content: " ▲"; }
table.units td, table.layers td, table.channel td { font-variant-numeric: tabular-nums; text-align: right; }
table.units :is(th, td), table.layers :is(th, td), table.channel :is(th, td) { overflow-wrap: normal; }
.units-wrap { max-height: 32em; overflow: auto; border: 1px solid #ddd; }
section.channel .body { display: flex; flex-wrap: wrap; gap: 1em; align-items: flex-start; }
section.channel img { max-width: 100%; height: auto; border: 1px solid #ddd; }
"""


def layer_page_name(stem: str, number: int) -> str:
    """The file of page ``number`` (from 1) of the layer whose part of file names is ``stem``."""
    return f"layer-{stem}.html" if number == 1 else f"layer-{stem}-{number:05d}.html"


def _link(name: str) -> str:
    """A page's file name as a link to it: a ``#`` (a tuple element's key, ``blocks#0``) would start a fragment."""
    return urllib.parse.quote(name)


#: The most channels of a layer a report gives a picture when neither --channels nor --top chooses them (a crafted
#: file may claim millions).
MOST_REPORTED = 4096


def write_stats_report(
    features: FeatureReader,
    output: str | os.PathLike,
    options: GridOptions,
    *,
    page_size: int | None = None,
    force: bool = False,
    progress: Callable | None = None,
) -> Path:
    """Write the report of the statistics file ``features`` (see the module) into folder ``output``, ``page_size``
    channels a page (default :data:`CHANNELS_A_PAGE`), and return the path of its ``index.html``. Refuses what grid
    refuses of a statistics file, and existing pages unless ``force``; reports
    :class:`~hookcli.events.Started`, :class:`~hookcli.events.Advanced` (a channel),
    :class:`~hookcli.events.Note` and :class:`~hookcli.events.Wrote` (``index.html``) events to ``progress``."""
    emit = progress or (lambda event: None)
    page_size = CHANNELS_A_PAGE if page_size is None else page_size
    check_whole("page_size", page_size, 1, MAX_CHANNELS_A_PAGE)
    stats = read_stats(features)
    check_cmap(options.overlay_cmap)
    folder = check_folder_output(output)
    units, notes = choose_units(stats, options, limit=MOST_REPORTED)
    pages = {unit.layer.key: math.ceil(len(unit.channels) / page_size) for unit in units}
    names = [layer_page_name(unit.stem, n) for unit in units for n in range(1, pages[unit.layer.key] + 1)]
    refuse_existing((folder / name for name in [*names, page_name(1)]), force=force)
    for text in notes:
        emit(Note(text))
    emit(Started(total=sum(len(unit.channels) for unit in units)))
    report = _StatsReport(stats, units, options, pages, page_size, emit)
    with new_pages(folder) as track:
        for unit in units:
            for number in range(1, pages[unit.layer.key] + 1):
                report.write(track(folder / layer_page_name(unit.stem, number)), unit, number, force=force)
        report.write_index(track(folder / page_name(1)), notes, force=force)
    emit(Wrote(folder / page_name(1)))
    return folder / page_name(1)


class _StatsReport:
    """Writes the pages: each layer's, then the index."""

    def __init__(
        self,
        stats: StatsFile,
        units: Sequence[ChosenUnits],
        options: GridOptions,
        pages: dict[str, int],
        page_size: int,
        emit: Callable,
    ) -> None:
        self.stats, self.units, self.options, self.pages, self.page_size = stats, units, options, pages, page_size
        self.emit = emit
        self.photos = ExamplePhotos(stats, REPORT_EXAMPLE_SIDE)
        self.said: set[str] = set()
        if self.photos.unusable is not None and any(unit.layer.spatial for unit in units):
            self.said.add(self.photos.unusable)
            emit(Note(f"the maps are drawn without their photos: {self.photos.unusable}"))

    def _page(self, path: Path, title: str, header: str, body: Callable, footer: str, *, force: bool) -> None:
        look = {"style": _STATS_STYLE, "policy": STATS_CONTENT_SECURITY_POLICY, "script": _SORT_SCRIPT}
        with report_page(path, self.stats.name, title, force=force, header=header, footer=footer, **look) as page:
            body(page)

    def write(self, path: Path, unit: ChosenUnits, number: int, *, force: bool) -> None:
        layer, pages = unit.layer, self.pages[unit.layer.key]
        channels = unit.channels[(number - 1) * self.page_size : number * self.page_size]
        links = pager(number, pages, lambda n: _link(layer_page_name(unit.stem, n)))
        title = f"{self.stats.name} · hookcli report · {layer.key} · page {number} of {pages}"

        def body(page) -> None:
            page.write(f'<nav class="layers"><a href="{page_name(1)}">Summary and layers</a>: ')
            page.write(" · ".join(self._layer_link(other) for other in self.units) + "</nav>\n")
            page.write(f'<h2 id="layer">Layer {escaped(layer.key)}</h2>\n<p class="shape">{_units_text(layer)}')
            page.write(f" · channels {_channels_text(channels)} on this page</p>\n")
            if number == 1:
                page.write(self._components(layer))
                page.write(self._units_table(unit))
            else:
                first = _link(layer_page_name(unit.stem, 1))
                page.write(f'<p><a href="{first}#units">The table of all its channels</a> is on its first page.</p>\n')
            for channel in channels:
                page.write(self._channel(layer, channel))
                self.emit(Advanced(1))

        self._page(path, title, links, body, links, force=force)

    def _layer_link(self, unit: ChosenUnits) -> str:
        return f'<a href="{_link(layer_page_name(unit.stem, 1))}">{escaped(unit.layer.key)}</a>'

    def _components(self, layer: StatsLayer) -> str:
        """The scree plot of the layer's principal components, when the file has them."""
        if not layer.pca:
            return ""
        variances = self.stats.read(layer.key, "pca_values")
        counts = [(share, explaining(variances, share)) for share in (0.5, 0.9, 0.99)]
        said = ", ".join(f"{count:,} for {share:.0%}" for share, count in counts if count is not None)
        firsts = [(count, explained(variances, count)) for count in FIRST_COMPONENTS if count <= len(variances)]
        shares = ", ".join(f"{share:.1%}" for _, share in firsts if share is not None)
        if said and shares:
            numbers = ", ".join(str(count) for count, _ in firsts)
            said += f"; the first {numbers} explain {shares}"
        said = f"the components needed to explain the variance: {said}" if said else "the channels do not vary"
        return (
            '<section id="pca">\n<h3>Principal components</h3>\n<p>Of the covariance of its channels, each averaged '
            f"over an input's positions; {said}.</p>\n"
            f"{scree_svg(variances)}\n</section>\n"
        )

    def _units_table(self, unit: ChosenUnits) -> str:
        """Every chosen channel of the layer, a row each, linked to its section; sortable by each column."""
        layer, levels = unit.layer, self.stats.levels
        fields = {field: self.stats.read(layer.key, field).tolist() for field in ("mean", "std", "zeros", "max")}
        quantiles = self.stats.read(layer.key, "quantiles").tolist()
        tops = self.stats.read(layer.key, "top_values")[:, :1].tolist()
        word = unit_word(layer.key)
        header = [word, "mean", "std", "zeros", *(f"q{level:g}" for level in levels), "max", "top example"]
        heads = "".join(f'<th><button type="button">{escaped(name)}</button></th>' for name in header)
        rows = []
        for position, channel in enumerate(unit.channels):
            page = _link(layer_page_name(unit.stem, position // self.page_size + 1))
            cells = [
                number_cell(fields["mean"][channel], ".4g"),
                number_cell(fields["std"][channel], ".4g"),
                number_cell(fields["zeros"][channel], ".1%"),
                *(number_cell(q, ".4g") for q in quantiles[channel]),
                number_cell(fields["max"][channel], ".4g"),
                number_cell(tops[channel][0] if layer.examples else None, ".4g"),
            ]
            rows.append(
                f'<tr><td data-value="{channel}"><a href="{page}#channel-{channel}">{channel}</a></td>'
                f"{''.join(cells)}</tr>"
            )
        return (
            f'<section id="units">\n<h3>{word.capitalize()}s</h3>\n<p>{len(unit.channels):,} {word}s; click a '
            "column's name to "
            "sort by it (highest first, then lowest first). zeros: the share of values that are exactly 0; "
            f'q: quantiles.</p>\n<div class="units-wrap"><table class="units sortable"><thead><tr>{heads}</tr>'
            f"</thead><tbody>{''.join(rows)}</tbody></table></div>\n</section>\n"
        )

    def _channel(self, layer: StatsLayer, channel: int) -> str:
        stats = self.stats
        values = {field: float(stats.channel(layer.key, field, channel)) for field in ("mean", "std", "min", "max")}
        zeros = float(stats.channel(layer.key, "zeros", channel))
        quantiles = stats.channel(layer.key, "quantiles", channel).tolist()
        names = ["mean", "std", "min", "max", "zeros", *(f"q{level:g}" for level in stats.levels)]
        cells = [
            *(number_cell(values[name], ".4g") for name in ("mean", "std", "min", "max")),
            number_cell(zeros, ".1%"),
            *(number_cell(q, ".4g") for q in quantiles),
        ]
        table = (
            '<table class="channel"><tr>'
            + "".join(f"<th>{escaped(name)}</th>" for name in names)
            + f"</tr><tr>{''.join(cells)}</tr></table>"
        )
        chart = quantiles_svg(values["min"], stats.levels, quantiles, values["max"], mean=values["mean"])
        picture = examples_picture(stats, layer, channel, self.options, self.photos, title=False)
        for text in picture.notes:
            if text not in self.said:
                self.said.add(text)
                self.emit(Note(text))
        word = unit_word(layer.key)
        examples = picture_html(picture.pixels, f"dataset examples of {word} {channel}", jpeg=True)
        return (
            f'<section class="channel" id="channel-{channel}">\n<h3>{word.capitalize()} {channel}</h3>\n'
            '<div class="body">'
            f'<div>{table}<p class="chart">Values between quantiles (bar area: share of values; dark spike: '
            "many values alike, as high as their share; red: the mean)</p>"
            f"{chart}</div>{examples}</div>\n</section>\n"
        )

    def write_index(self, path: Path, notes: Sequence[str], *, force: bool) -> None:
        stats = self.stats
        described = describe_stats(stats)
        options = stats.options
        facts = [
            ("source", stats.name),
            ("model", stats.metadata.get("model", "-")),
            ("inputs", f"{len(stats.inputs):,}" + (f" ({stats.skipped:,} skipped)" if stats.skipped else "")),
            (
                "examples kept",
                f"the top {options['top']} inputs of each channel by {options['top_by']}"
                + (f" (all {len(stats.inputs):,} there are)" if len(stats.inputs) < options["top"] else ""),
            ),
            ("quantile levels", ", ".join(f"{level:g}" for level in stats.levels) or "none"),
            ("principal components", "yes" if options["pca"] else "no"),
            ("size", format_bytes(described["bytes"])),
            *edits_facts(stats.metadata),
        ]
        summaries = {row["key"]: row["values"] for row in described["layers"]}

        def body(page) -> None:
            page.write(f'<section id="summary">\n<h2>Summary</h2>\n{facts_table(facts)}{notes_html(notes)}')
            page.write("<h3>Layers</h3>\n" + self._layers_table(summaries) + "</section>\n")
            shown = {layer.tensor(field) for unit in self.units for layer in [unit.layer] for field in FIELDS}
            page.write(file_details(described, shown))

        self._page(path, f"{stats.name} · hookcli report", "", body, "", force=force)

    def _layers_table(self, summaries: dict) -> str:
        header = ["layer", "layout", "channels", "positions", "values a channel", "shown", "pages", "min", "mean"]
        header += ["max", "zeros", "all-zero channels", "components for 90%"]
        rows = []
        for unit in self.units:
            layer, found = unit.layer, summaries[unit.layer.key]
            cells = [
                f"<td>{escaped(layer.layout)}</td>",
                number_cell(layer.channels, ","),
                f"<td>{shape_html(list(layer.spatial)) if layer.spatial else '-'}</td>",
                number_cell(layer.count, ","),
                number_cell(len(unit.channels), ","),
                number_cell(self.pages[layer.key], ","),
                *(number_cell(found[name], ".4g") for name in ("min", "mean", "max")),
                number_cell(found["zeros"], ".1%"),
                number_cell(found["dead"], ","),
                number_cell(found.get("components_90"), ","),
            ]
            rows.append(f"<tr><td>{self._layer_link(unit)}</td>{''.join(cells)}</tr>")
        heads = "".join(f"<th>{escaped(name)}</th>" for name in header)
        return f'<table class="layers"><tr>{heads}</tr>{"".join(rows)}</table>\n'


def _units_text(layer: StatsLayer) -> str:
    """What a layer's units are, in words."""
    positions = (
        f"over positions {shape_html(list(layer.spatial))}" if layer.spatial else "one value an input (no positions)"
    )
    skipped = {0: "", 1: ", the first token left out"}.get(layer.skip, f", the first {layer.skip} tokens left out")
    return escaped(
        f"{layer.channels:,} channels {positions}, read from rows of {shape_html(list(layer.row_shape))} "
        f"({layer.layout}{skipped}); {layer.count:,} values a channel; {layer.examples} examples kept a channel"
    )


def _channels_text(channels: Sequence[int]) -> str:
    if len(channels) > 1 and list(channels) == list(range(channels[0], channels[-1] + 1)):
        return f"{channels[0]}-{channels[-1]}"
    return ", ".join(str(c) for c in channels[:8]) + (f" and {len(channels) - 8} more" if len(channels) > 8 else "")
