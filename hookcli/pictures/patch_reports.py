"""``hookcli report`` on a patching file: one page, ``index.html``.

The page sums the run up (pairs, layers, whether positions were patched one at a time), shows the pictures
``grid`` draws (:func:`~hookcli.pictures.patch_grids.patch_pictures`), then the pairs (the first ``--top``,
:data:`~hookcli.pictures.patch_grids.DEFAULT_PAIRS` when not given): each pair's source and target, the classes the
model gives them, m on each, and each layer's effect (its mean over the positions, where they were patched one at a
time). Like the other reports it stands alone and runs no script.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np

from hookcli.events import Advanced, Started, Wrote
from hookcli.files import format_bytes
from hookcli.options.grid import GridOptions
from hookcli.pictures.html import (
    escaped,
    facts_table,
    file_details,
    new_pages,
    one_page_index,
    picture_html,
    report_page,
)
from hookcli.pictures.patch_grids import DEFAULT_PAIRS, check_patch_options, patch_pictures
from hookcli.pictures.summary import describe_file
from hookcli.pictures.text import number
from hookcli.storage.patch_file import PatchFile, read_patch
from hookcli.storage.reader import FeatureReader
from hookcli.storage.recorded_run import lenient_json

__all__ = ["write_patch_report"]

_PATCH_STYLE = """
.pictures img { max-width: 100%; height: auto; border: 1px solid #ddd; margin-bottom: 1em; }
table.pairs td { font-variant-numeric: tabular-nums; white-space: nowrap; }
"""


def write_patch_report(
    features: FeatureReader,
    output: str | os.PathLike,
    options: GridOptions,
    *,
    page_size: int | None = None,
    force: bool = False,
    progress: Callable | None = None,
) -> Path:
    """Write the report of the patching file ``features`` (see the module) into folder ``output`` and return the
    path of its ``index.html``; refuses what grid refuses of a patching file, a ``page_size`` (the report is one
    page), and an existing page unless ``force``."""
    emit = progress or (lambda event: None)
    patched = read_patch(features)
    index = one_page_index(output, f"the patching file '{patched.name}'", page_size, force=force)
    folder = index.parent
    check_patch_options(patched, options)
    pictures = patch_pictures(patched, options)
    emit(Started(total=1))
    shown = "\n".join(picture_html(pixels, "effects of the patches") for pixels in pictures)
    with (
        new_pages(folder) as track,
        report_page(track(index), patched.name, f"{patched.name} · hookcli report", force=force,
                    style=_PATCH_STYLE) as page,
    ):  # fmt: skip
        page.write(_summary(patched))
        page.write(f'<section id="pictures" class="pictures">\n<h2>Effects</h2>\n{shown}\n</section>\n')
        page.write(_pairs_table(patched, options.top or DEFAULT_PAIRS))
        page.write(file_details(describe_file(patched.features, stats=False), set(patched.features.keys())))
    emit(Advanced(1))
    emit(Wrote(index))
    return index


def _summary(patched: PatchFile) -> str:
    positions = ", ".join(f"{key} {'×'.join(map(str, shape)) or 'whole'}" for key, shape in patched.positions.items())
    facts = [
        ("source", patched.name),
        ("pairs", f"{patched.pairs:,}"),
        ("layers patched (positions)", positions),
        ("measure", "m = z[source's class] − z[target's class]; effect = change of m ÷ (m(source) − m(target))"),
        ("size", format_bytes(patched.features.size)),
    ]
    return f'<section id="summary">\n<h2>Summary</h2>\n{facts_table(facts)}</section>\n'


def _pairs_table(patched: PatchFile, count: int) -> str:
    """The first ``count`` pairs, a row each: their inputs, classes, m, and each layer's (mean) effect."""
    inputs = lenient_json(patched.features.metadata.get("inputs"))
    names = [str(name) for name in inputs] if isinstance(inputs, list) else []
    categories = lenient_json(patched.features.metadata.get("categories"))
    classes = {field: patched.pair(field) for field in ("source_class", "target_class")}
    metrics = {field: patched.pair(field) for field in ("source_metric", "target_metric")}
    effects = {}
    for key in patched.keys:
        effect = patched.read(key, "effect")
        effects[key] = effect.reshape(len(effect), -1).mean(axis=1) if effect.ndim > 1 else effect
    head = "".join(
        f"<th>{escaped(text)}</th>"
        for text in ("pair", "source", "target", "classes", "m(source)", "m(target)", *patched.keys)
    )
    body = []
    for row in range(min(count, patched.pairs)):
        source = names[2 * row] if 2 * row + 1 < len(names) else ""
        target = names[2 * row + 1] if 2 * row + 1 < len(names) else ""
        pair_classes = " → ".join(_class(categories, int(classes[field][row])) for field in classes)
        cells = [
            str(row),
            escaped(Path(source).name),
            escaped(Path(target).name),
            escaped(pair_classes),
            number(float(metrics["source_metric"][row])),
            number(float(metrics["target_metric"][row])),
            *(_effect(float(effects[key][row])) for key in patched.keys),
        ]
        body.append("<tr>" + "".join(f"<td>{cell}</td>" for cell in cells) + "</tr>")
    shown = f"the first {count:,} of {patched.pairs:,}" if count < patched.pairs else f"all {patched.pairs:,}"
    return (
        f'<section id="pairs">\n<h2>Pairs</h2>\n<p>{escaped(shown)}; a layer patched position by position shows its '
        f'mean effect over the positions.</p>\n<table class="pairs"><thead><tr>{head}</tr></thead>\n<tbody>\n'
        + "\n".join(body)
        + "\n</tbody></table>\n</section>\n"
    )


def _class(categories: object, index: int) -> str:
    if isinstance(categories, list) and 0 <= index < len(categories):
        return f"{index} {json.dumps(categories[index])[1:-1]}"
    return str(index)


def _effect(value: float) -> str:
    return "—" if not np.isfinite(value) else number(value)
