"""``hookcli grid`` on a comparison file: one heatmap of its matrix, named after the file (:func:`picture_name`).

Each cell is a pair of representations, coloured on the method's fixed range
(:data:`VALUE_RANGES`: CKA from 0 to 1 on a sequential colormap, RSA's
correlations from -1 to 1 on a diverging one, :data:`DIVERGING`; ``--cmap``
chooses another), with its value printed in it when cells are large enough to
read. Rows and columns are labelled with the representations' labels, the
columns' turned upright when they are wider than a cell, every second (fifth,
…) one when cells are lower than a line. An undefined cell (NaN: a
representation without spread) is grey and hatched, and a legend under the
colour bar says so. The title names the method, the inputs and what was
compared.

``-k`` chooses representations (globs over the labels, of rows and columns
alike); the options that choose a features file's rows, channels or frames are
refused.

>>> import numpy as np
>>> matrix_colours(np.array([[1.0, np.nan]]), "linear-cka", "gray").tolist()
[[[255, 255, 255], [200, 200, 200]]]
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from hookcli.console import printable
from hookcli.errors import UsageProblem
from hookcli.events import Event
from hookcli.options.grid import GridOptions, refuse_given, refuse_scale
from hookcli.patterns import select_keys
from hookcli.pictures.file_names import file_stem
from hookcli.pictures.png import write_pictures
from hookcli.pictures.render import MAX_PIXELS, PAD_COLOR, add_colorbar, add_title, check_cmap, colorize, stacked
from hookcli.pictures.text import (
    caption_font,
    glyphs,
    ink,
    label_size,
    number,
    shortened,
    stamp,
    text_bitmap,
    text_width,
    tick_step,
)
from hookcli.storage.compare_file import ComparisonFile, read_comparison
from hookcli.storage.compare_format import is_debiased
from hookcli.storage.reader import FeatureReader

__all__ = [
    "DIVERGING",
    "METHOD_NAMES",
    "method_name",
    "UNDEFINED_COLOR",
    "VALUE_RANGES",
    "ChosenMatrix",
    "choose_matrix",
    "draw_compare_grids",
    "heatmap_picture",
    "labelled",
    "matrix_cells",
    "matrix_colours",
    "picture_name",
    "range_colours",
]

#: The range each method's similarities take, which the colours span.
VALUE_RANGES = {"linear-cka": (0.0, 1.0), "minibatch-cka": (0.0, 1.0), "rsa": (-1.0, 1.0)}
#: Each method in words.
METHOD_NAMES = {"linear-cka": "linear CKA", "minibatch-cka": "minibatch CKA", "rsa": "RSA"}


def method_name(comparison: ComparisonFile) -> str:
    """The comparison's method in words, debiased when it is."""
    debiased = " (debiased)" if is_debiased(comparison.settings) else ""
    return METHOD_NAMES[comparison.method] + debiased


#: RSA's colormap unless ``--cmap`` names another: its correlations run from -1 through 0 (white) to 1.
DIVERGING = "RdBu_r"
#: An undefined cell's colour, crossed by lines of :data:`_HATCH_COLOR`.
UNDEFINED_COLOR = (200, 200, 200)
_HATCH_COLOR = (128, 128, 128)
#: The matrix's longer side is about this many pixels, in cells of at most :data:`_MAX_CELL`.
_MATRIX_SIDE, _MAX_CELL = 480, 96
#: Cells at least this large are parted by a white line.
_PARTED = 12
#: The labels' type size, and the most characters of a label shown (longer ones lose their middle).
_LABEL_SIZE, _LABEL_CHARACTERS = 13, 40
#: Options of grid that choose what a features file has and a comparison file has not.
_REFUSED = ("images", "channels", "top", "frame", "overlay")


@dataclass(frozen=True)
class ChosenMatrix:
    """The rows and columns of a comparison's matrix to draw (indices, in order) and the colormap."""

    rows: list[int]
    columns: list[int]
    cmap: str


def picture_name(comparison: ComparisonFile) -> str:
    """The heatmap's file name: the comparison file's, ``.png`` for ``.safetensors`` (two comparisons drawn into one
    folder keep apart), its characters made safe as a feature picture's are; ``<method>.png`` for a comparison in
    memory or read from stdin."""
    return f"{file_stem(comparison.name, comparison.method)}.png"


def choose_matrix(comparison: ComparisonFile, options: GridOptions) -> ChosenMatrix:
    """The representations ``options.keys`` choose (globs over the labels; all without) and the colormap
    (``options.cmap``; when it is not given :data:`DIVERGING` for RSA, feature maps' otherwise). Refuses the
    options that choose rows, channels or frames of a features file, and a selection that leaves no row or no
    column."""
    what = f"a comparison file ('{comparison.name}' holds one matrix of similarities)"
    refuse_given(options, _REFUSED, what, "choose representations with -k, or leave it out")
    refuse_scale(options, what)
    rows, columns = list(range(len(comparison.rows))), list(range(len(comparison.columns)))
    if options.keys:
        labels = list(dict.fromkeys(comparison.rows + comparison.columns))
        chosen = select_keys(labels, options.keys, comparison.name, what="representation")
        rows = [i for i in rows if comparison.rows[i] in chosen]
        columns = [j for j in columns if comparison.columns[j] in chosen]
        if not rows or not columns:
            raise UsageProblem(
                f"-k chooses none of the {'rows' if not rows else 'columns'} of '{comparison.name}'",
                hint="choose representations of both sides",
            )
    diverging = comparison.method == "rsa" and options.cmap is None
    return ChosenMatrix(rows, columns, check_cmap(DIVERGING if diverging else options.maps_cmap))


def matrix_colours(values: np.ndarray, method: str, cmap: str) -> np.ndarray:
    """Similarities ``[A, B]`` coloured on the method's range (values beyond it take its ends), ``uint8
    [A, B, 3]``; an undefined (NaN) one is :data:`UNDEFINED_COLOR`."""
    return range_colours(values, *VALUE_RANGES[method], cmap)


def range_colours(values: np.ndarray, low: float, high: float, cmap: str) -> np.ndarray:
    """Values ``[A, B]`` coloured from ``low`` to ``high`` (values beyond take the ends), ``uint8 [A, B, 3]``; an
    undefined (NaN) one is :data:`UNDEFINED_COLOR`."""
    nan = np.isnan(values)
    with np.errstate(invalid="ignore"):
        scaled = np.clip((np.where(nan, low, values) - low) / (high - low), 0.0, 1.0)
    rgb = colorize(scaled, cmap)
    rgb[nan] = UNDEFINED_COLOR
    return rgb


def heatmap_picture(comparison: ComparisonFile, chosen: ChosenMatrix, options: GridOptions) -> np.ndarray:
    """The heatmap of the chosen rows and columns, ``uint8 [H, W, 3]``: labelled, titled (unless
    ``options.title`` is off) and with its colour bar; ``options.plain``: the cells alone."""
    count_rows, count_columns = len(chosen.rows), len(chosen.columns)
    cell = max(1, min(_MAX_CELL, _MATRIX_SIDE // max(count_rows, count_columns)))
    if count_rows * count_columns * cell * cell > MAX_PIXELS:  # known before the matrix is read
        raise UsageProblem(
            f"'{comparison.name}' compares {count_rows:,} representations with {count_columns:,}: more cells than "
            f"a picture holds ({MAX_PIXELS:,} pixels)",
            hint="choose some of them with -k",
        )
    values = comparison.matrix()[np.ix_(chosen.rows, chosen.columns)]
    cells = matrix_cells(values, VALUE_RANGES[comparison.method], chosen.cmap, cell, numbers=not options.plain)
    if options.plain:
        return cells
    pixels = labelled(
        cells,
        cell,
        [comparison.rows[i] for i in chosen.rows],
        [comparison.columns[j] for j in chosen.columns],
    )
    if options.title:
        pixels = add_title(pixels, _title(comparison))
    low, high = VALUE_RANGES[comparison.method]
    pixels = add_colorbar(pixels, chosen.cmap, number(low), number(high), _scale_text(comparison))
    if np.isnan(values).any():
        pixels = stacked(pixels, _undefined_legend(pixels.shape[1]))
    return pixels


def matrix_cells(
    values: np.ndarray, value_range: tuple[float, float], cmap: str, cell: int, *, numbers: bool
) -> np.ndarray:
    """A matrix's cells coloured over ``value_range``, ``cell`` pixels a side, undefined ones hatched, each value
    printed in its cell when it fits (with ``numbers``)."""
    rgb = range_colours(values, *value_range, cmap)
    pixels = np.ascontiguousarray(rgb.repeat(cell, axis=0).repeat(cell, axis=1))
    _hatch(pixels, np.isnan(values).repeat(cell, axis=0).repeat(cell, axis=1))
    if cell >= _PARTED:
        pixels[cell - 1 :: cell] = PAD_COLOR
        pixels[:, cell - 1 :: cell] = PAD_COLOR
    size = label_size(cell)
    height = glyphs(size)[1]
    if not numbers or text_width("-0.00", size) + 4 > cell or height + 4 > cell:
        return pixels
    # Dark cells take white figures; luminance as Rec. 601 weighs it.
    dark = rgb.astype(np.float64) @ np.array([0.299, 0.587, 0.114]) < 128
    for (i, j), value in np.ndenumerate(values):
        if not np.isnan(value):
            text = f"{value:.2f}"
            top, left = i * cell + (cell - height) // 2, j * cell + (cell - text_width(text, size)) // 2
            stamp(pixels, text, size, top, left, light=bool(dark[i, j]))
    return pixels


def _hatch(pixels: np.ndarray, mask: np.ndarray) -> None:
    """Paint the pixels of ``mask`` as undefined: :data:`UNDEFINED_COLOR` crossed by diagonal lines."""
    rows, columns = np.indices(mask.shape)
    pixels[mask] = UNDEFINED_COLOR
    pixels[mask & ((rows + columns) % 6 == 0)] = _HATCH_COLOR


def _shortened(label: str) -> str:
    """A label as a picture shows it: control characters escaped, and its middle left out when it is long."""
    return shortened(printable(shortened(label, 4 * _LABEL_CHARACTERS)), _LABEL_CHARACTERS)


def labelled(cells: np.ndarray, cell: int, rows: list[str], columns: list[str]) -> np.ndarray:
    """The cells with the rows' labels left of them and the columns' above, upright when wider than their
    column; every ``step``-th label where cells are lower than a line."""
    row_marks = [text_bitmap(_shortened(label), _LABEL_SIZE) for label in rows]
    column_marks = [text_bitmap(_shortened(label), _LABEL_SIZE) for label in columns]
    line = row_marks[0].shape[0]
    step = tick_step(math.ceil((line + 2) / cell))
    upright = max(mark.shape[1] for mark in column_marks) + 4 > cell * step
    header = (max(mark.shape[1] for mark in column_marks) if upright else line) + 6
    margin = max(mark.shape[1] for mark in row_marks) + 10
    canvas = np.full((header + cells.shape[0] + 6, margin + cells.shape[1] + 6, 3), PAD_COLOR, dtype=np.uint8)
    canvas[header : header + cells.shape[0], margin : margin + cells.shape[1]] = cells
    for i in range(0, len(rows), step):
        mark = row_marks[i]
        ink(canvas, mark, header + i * cell + (cell - line) // 2, margin - 6 - mark.shape[1])
    for j in range(0, len(columns), step):
        mark = np.rot90(column_marks[j]) if upright else column_marks[j]
        ink(canvas, mark, header - 4 - mark.shape[0], margin + j * cell + (cell - mark.shape[1]) // 2)
    return canvas


def _title(comparison: ComparisonFile) -> list[str]:
    """The method, the inputs and what was compared with what."""
    inputs = f"{len(comparison.inputs):,} input{'s' if len(comparison.inputs) != 1 else ''}"
    if comparison.skipped:
        inputs += f" ({comparison.skipped:,} skipped)"
    first, second = (printable(source) for source in comparison.sources())
    if comparison.same:
        sides = [f"{first} against itself"]
    else:
        sides = [f"rows: {first}", f"columns: {second}"]
    pool = comparison.settings.get("pool")
    pooled = [f"pool {printable(str(pool))}"] if pool is not None else []
    return [method_name(comparison), inputs, *sides, *pooled]


def _scale_text(comparison: ComparisonFile) -> str:
    """What the colour bar's range means."""
    if comparison.method == "rsa":
        ranking = printable(str(comparison.settings.get("ranking", "rank"))).capitalize()
        return f"{ranking} correlation of the RDMs"
    return "CKA: 1 alike, 0 unrelated"


def _undefined_legend(width: int) -> np.ndarray:
    """A hatched swatch and what it means, for a picture ``width`` wide."""
    font = caption_font(width)
    side = font.getbbox("Ag")[3]
    text = "undefined: a representation without spread (NaN)"
    strip = Image.new("RGB", (max(width, side + 18 + round(font.getlength(text))), side + 8), (255, 255, 255))
    ImageDraw.Draw(strip).text((side + 12, 2), text, fill=(60, 60, 60), font=font)
    pixels = np.array(strip)
    _hatch(pixels[2 : 2 + side, 6 : 6 + side], np.ones((side, side), dtype=bool))
    return pixels


def draw_compare_grids(
    features: FeatureReader,
    options: GridOptions,
    output: str | os.PathLike | None,
    *,
    force: bool = False,
    progress: Callable[[Event], None] | None = None,
) -> dict[str, np.ndarray] | list[Path]:
    """grid's picture of a comparison file (see the module), written under ``output`` (its path returned in a
    list) or, with ``output=None``, returned by file name as ``uint8 [H, W, 3]`` pixels."""
    comparison = read_comparison(features)
    chosen = choose_matrix(comparison, options)
    return write_pictures(
        [picture_name(comparison)],
        lambda: [heatmap_picture(comparison, chosen, options)],
        output,
        force=force,
        progress=progress,
    )
