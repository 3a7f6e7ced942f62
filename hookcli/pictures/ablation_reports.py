"""``hookcli report`` on an ablation file: one page, ``index.html``.

The page sums the ablation up (layer, how units were ablated, inputs, the output measured), shows its heatmap as
``grid`` draws it (:func:`~hookcli.pictures.ablation_grids.heatmap_picture`), then the units ranked by effect (the
``--top`` first, :data:`~hookcli.pictures.ablation_grids.DEFAULT_UNITS` when not given): each unit's KL divergence,
top-class flips, changes of the predicted class's logit and probability, and the classes it lowers most. With
``--examples STATS``, a statistics file of the same model and layer, each unit's row shows its dataset examples
(:func:`~hookcli.pictures.examples.examples_picture`). Like the other reports it stands alone and runs no script.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import numpy as np

from hookcli.errors import UsageProblem
from hookcli.events import Advanced, Note, Started, Wrote
from hookcli.files import format_bytes
from hookcli.options.grid import GridOptions
from hookcli.pictures.ablation_grids import DEFAULT_UNITS, check_ablation_options, heatmap_picture, ranked_units
from hookcli.pictures.examples import ExamplePhotos, examples_picture
from hookcli.pictures.html import (
    escaped,
    facts_table,
    file_details,
    new_pages,
    one_page_index,
    picture_html,
    report_page,
)
from hookcli.pictures.summary import describe_file
from hookcli.storage.ablation_file import AblationFile, read_ablation
from hookcli.storage.reader import FeatureReader
from hookcli.storage.recorded_run import recorded_layers
from hookcli.storage.shards import open_features
from hookcli.storage.stats_file import StatsFile, StatsLayer, read_stats

__all__ = ["write_ablation_report"]

#: The classes a unit's row names, those whose logits its ablation lowers most.
_CLASSES_NAMED = 3
#: How large a unit's examples are drawn.
_EXAMPLE_SIDE = 96

_ABLATION_STYLE = """
.heatmap img { max-width: 100%; height: auto; border: 1px solid #ddd; }
table.units td { font-variant-numeric: tabular-nums; vertical-align: top; }
table.units td:nth-child(-n+5), table.units th:nth-child(-n+5) { white-space: nowrap; }
table.units img { max-width: 32em; height: auto; }
"""


def write_ablation_report(
    features: FeatureReader,
    output: str | os.PathLike,
    options: GridOptions,
    *,
    page_size: int | None = None,
    force: bool = False,
    progress: Callable | None = None,
) -> Path:
    """Write the report of the ablation file ``features`` (see the module) into folder ``output`` and return the
    path of its ``index.html``; refuses what grid refuses of an ablation file, a ``page_size`` (the report is one
    page), a statistics file of another model or layer, and an existing page unless ``force``."""
    emit = progress or (lambda event: None)
    ablation = read_ablation(features)
    check_ablation_options(ablation, options)
    index = one_page_index(output, f"the ablation file '{ablation.name}'", page_size, force=force)
    folder = index.parent
    rows = ranked_units(ablation.read("kl"), options.top or DEFAULT_UNITS)
    emit(Started(total=1))
    picture = picture_html(heatmap_picture(ablation, options), "heatmap of the units' effects on the classes")
    with (
        new_pages(folder) as track,
        report_page(track(index), ablation.name, f"{ablation.name} · hookcli report", force=force,
                    style=_ABLATION_STYLE) as page,
    ):  # fmt: skip
        page.write(_summary(ablation))
        page.write(f'<section id="heatmap" class="heatmap">\n<h2>Heatmap</h2>\n{picture}\n</section>\n')
        page.write(_units_table(ablation, rows, options, emit))
        page.write(file_details(describe_file(ablation.features, stats=False), set(ablation.features.keys())))
    emit(Advanced(1))
    emit(Wrote(index))
    return index


def _summary(ablation: AblationFile) -> str:
    how = ablation.ablate.get("how", "zero")
    measured = ablation.ablate.get("effect_on", ".")
    facts = [
        ("source", ablation.name),
        ("layer", f"{ablation.ablate.get('layer', ablation.key)} (key {ablation.key})"),
        ("units ablated, each alone", f"{len(ablation.units):,} ({how})"),
        ("inputs", f"{int(ablation.read('count')):,}"),
        ("effects measured on", "the model's output" if measured == "." else str(measured)),
        ("size", format_bytes(ablation.features.size)),
    ]
    return f'<section id="summary">\n<h2>Summary</h2>\n{facts_table(facts)}</section>\n'


def _units_table(ablation: AblationFile, rows: np.ndarray, options: GridOptions, emit: Callable) -> str:
    """The units of largest effect, one row each, with their examples when a statistics file is given."""
    values = {field: ablation.read(field) for field in ("kl", "flips", "logit_change", "logit_change_std")}
    values.update(prob=ablation.read("prob_change"), prob_std=ablation.read("prob_change_std"))
    effects = ablation.read("class_effect")
    examples = _Examples(ablation, options, emit) if options.examples else None
    body = []
    try:
        for row in rows:
            unit = int(ablation.units[row])
            lowered = np.argsort(effects[row], kind="stable")[:_CLASSES_NAMED]
            named = ", ".join(f"{escaped(_class_name(ablation, int(k)))} ({effects[row, k]:+.3g})" for k in lowered)
            cells = [
                f"<td>{unit}</td>",
                f"<td>{values['kl'][row]:.4g}</td>",
                f"<td>{values['flips'][row]:.1%}</td>",
                f"<td>{values['logit_change'][row]:+.4g} ± {values['logit_change_std'][row]:.3g}</td>",
                f"<td>{values['prob'][row]:+.3g} ± {values['prob_std'][row]:.3g}</td>",
                f"<td>{named}</td>",
            ]
            if examples is not None:
                cells.append(f"<td>{examples.html(unit)}</td>")
            body.append(f'<tr id="unit-{unit}">{"".join(cells)}</tr>')
    finally:
        if examples is not None:
            examples.close()
    header = ["unit", "KL", "top-1 flips", "Δ logit (predicted class)", "Δ probability", "classes lowered most"]
    header += ["dataset examples"] if examples is not None else []
    head = "".join(f"<th>{escaped(text)}</th>" for text in header)
    return (
        f'<section id="units">\n<h2>Units of largest effect</h2>\n<p>{len(rows):,} of {len(ablation.units):,} '
        "units, by the mean KL divergence of the output when each is ablated alone.</p>\n"
        f'<table class="units"><thead><tr>{head}</tr></thead><tbody>\n{"".join(body)}\n</tbody></table>\n</section>\n'
    )


def _class_name(ablation: AblationFile, index: int) -> str:
    return ablation.categories[index] if ablation.categories else f"output {index}"


class _Examples:
    """The dataset examples of the ablated layer's units, from the statistics file ``options.examples``."""

    def __init__(self, ablation: AblationFile, options: GridOptions, emit: Callable) -> None:
        path = str(options.examples)
        self.reader = open_features(path)
        try:
            self.stats: StatsFile = read_stats(self.reader)
            self.layer: StatsLayer = self._layer(ablation, path)
        except BaseException:
            self.reader.close()
            raise
        self.options, self.emit = options, emit
        self.photos = ExamplePhotos(self.stats, _EXAMPLE_SIDE)

    def _layer(self, ablation: AblationFile, path: str) -> StatsLayer:
        """The statistics file's layer that was ablated; refused when it is another model's or lacks the layer."""
        made, ablated = self.stats.metadata.get("model"), ablation.metadata.get("model")
        if made != ablated or self.stats.metadata.get("weights") != ablation.metadata.get("weights"):
            raise UsageProblem(
                f"--examples '{path}' holds the statistics of the model {made} "
                f"({self.stats.metadata.get('weights')}), and '{ablation.name}' ablates {ablated} "
                f"({ablation.metadata.get('weights')})",
                hint="give the stats file of the same model and layer",
            )
        path_of = str(ablation.ablate.get("layer"))
        key = recorded_layers(self.stats.metadata).get(path_of)
        if key not in self.stats.layers:
            raise UsageProblem(
                f"--examples '{path}' holds no statistics of {path_of}, the layer '{ablation.name}' ablates",
                hint="give the stats file of the same model and layer",
            )
        return self.stats.layers[key]

    def html(self, unit: int) -> str:
        if unit >= self.layer.channels:
            return "none: the statistics file's layer has fewer channels"
        drawn = examples_picture(self.stats, self.layer, unit, self.options, self.photos, title=False)
        for text in drawn.notes:
            self.emit(Note(text))
        return picture_html(drawn.pixels, f"dataset examples of unit {unit}", jpeg=True)

    def close(self) -> None:
        self.reader.close()
