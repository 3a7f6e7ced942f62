"""``hookcli grid`` on an ablation file: one heatmap of the units × classes matrix ``LAYER@class_effect``.

Rows are the units ranked by their effect (the mean KL divergence of the output, largest first; ``--top N`` keeps
the first N, :data:`DEFAULT_UNITS` when not given), columns the classes whose logits those units move most (the
largest mean absolute change over the rows shown, at most :data:`MOST_CLASSES`), named by the weights' class
names where the file has them. Each cell is the mean change of that class's logit when that unit alone is
ablated, on a diverging colormap centred on 0 (``--cmap`` chooses another).

>>> import numpy as np
>>> ranked_units(np.array([0.1, 0.5, 0.3]), 2).tolist(), strongest_classes(np.array([[1.0, -3.0, 0.5]]), 2).tolist()
([1, 2], [1, 0])
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import numpy as np

from hookcli.console import printable
from hookcli.events import Event
from hookcli.options.grid import GridOptions, refuse_given, refuse_scale
from hookcli.pictures.compare_grids import DIVERGING, labelled, matrix_cells
from hookcli.pictures.file_names import file_stem
from hookcli.pictures.png import write_pictures
from hookcli.pictures.render import add_colorbar, add_title, check_cmap
from hookcli.pictures.text import number
from hookcli.storage.ablation_file import AblationFile, read_ablation
from hookcli.storage.reader import FeatureReader

__all__ = [
    "DEFAULT_UNITS",
    "MOST_CLASSES",
    "check_ablation_options",
    "draw_ablation_grids",
    "heatmap_picture",
    "ranked_units",
    "strongest_classes",
]

#: Units drawn when ``--top`` is not given, and the most classes a heatmap shows.
DEFAULT_UNITS = 32
MOST_CLASSES = 32
#: The heatmap's longer side is about this many pixels, in cells of at most :data:`_MAX_CELL`.
_SIDE, _MAX_CELL = 640, 48
#: Options of grid that choose what a features file has and an ablation file has not.
_REFUSED = ("keys", "images", "channels", "frame", "overlay")


def ranked_units(kl: np.ndarray, count: int) -> np.ndarray:
    """The rows of the ``count`` units of largest effect (``kl``), largest first; ties in unit order."""
    return np.argsort(-np.nan_to_num(kl, nan=-np.inf), kind="stable")[:count]


def strongest_classes(effects: np.ndarray, count: int) -> np.ndarray:
    """The ``count`` columns of ``effects`` ``[rows, classes]`` of largest mean absolute value, largest first."""
    return np.argsort(-np.nan_to_num(np.abs(effects).mean(axis=0)), kind="stable")[:count]


def draw_ablation_grids(
    features: FeatureReader,
    options: GridOptions,
    output: str | os.PathLike | None,
    *,
    force: bool = False,
    progress: Callable[[Event], None] | None = None,
) -> dict[str, np.ndarray] | list[Path]:
    """grid's picture of an ablation file, written under ``output`` (its path returned in a list) or, with
    ``output=None``, returned by file name as ``uint8 [H, W, 3]`` pixels."""
    ablation = read_ablation(features)
    check_ablation_options(ablation, options)
    return write_pictures(
        [_picture_name(ablation)], lambda: [heatmap_picture(ablation, options)], output, force=force, progress=progress
    )


def check_ablation_options(ablation: AblationFile, options: GridOptions) -> None:
    """Refuse the options that choose what a features file has and an ablation file has not."""
    what = f"an ablation file ('{ablation.name}' holds one matrix of units and classes)"
    refuse_given(options, _REFUSED, what, "choose how many units with --top, or leave it out")
    refuse_scale(options, what)


def _picture_name(ablation: AblationFile) -> str:
    return f"{file_stem(ablation.name, 'ablation')}.png"


def heatmap_picture(ablation: AblationFile, options: GridOptions) -> np.ndarray:
    """The heatmap ``grid`` draws of ``ablation`` (see the module), ``uint8 [H, W, 3]``."""
    rows = ranked_units(ablation.read("kl"), options.top or DEFAULT_UNITS)
    effects = ablation.read("class_effect")[rows]
    columns = strongest_classes(effects, MOST_CLASSES)
    values = effects[:, columns]
    limit = float(np.nanmax(np.abs(values))) if np.isfinite(values).any() else 1.0
    limit = limit or 1.0
    cmap = check_cmap(options.cmap or DIVERGING)
    cell = max(1, min(_MAX_CELL, _SIDE // max(len(rows), len(columns))))
    cells = matrix_cells(values / limit, (-1.0, 1.0), cmap, cell, numbers=False)
    if options.plain:
        return cells
    names = ablation.categories
    column_labels = [names[j] if names else f"{j}" for j in columns]
    row_labels = [f"unit {int(ablation.units[i])}" for i in rows]
    pixels = labelled(cells, cell, row_labels, column_labels)
    if options.title:
        pixels = add_title(pixels, _title(ablation, len(rows)))
    effect_on = ablation.ablate.get("effect_on", ".")
    changed = "the class's logit" if effect_on in (".", None) else f"{effect_on}'s value"  # --effect-on LAYER
    return add_colorbar(pixels, cmap, number(-limit), number(limit), f"mean change of {changed}")


def _title(ablation: AblationFile, shown: int) -> list[str]:
    how = printable(str(ablation.ablate.get("how", "zero")))
    count = int(ablation.read("count"))
    layer = printable(str(ablation.ablate.get("layer", ablation.key)))
    measured = printable(str(ablation.ablate.get("effect_on", ".")))
    output = "the model's output" if measured == "." else measured
    return [
        f"{layer}: each unit ablated alone ({how}), over {count:,} input{'s' if count != 1 else ''}",
        f"the {shown:,} of {len(ablation.units):,} units of largest effect (mean KL of {output}), first at the top",
    ]
