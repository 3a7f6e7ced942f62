"""Text the command line prints: aligned tables, and ``hookcli info``'s lines and strict JSON.

Cells go through :func:`hookcli.console.printable`, so names and metadata
from a file cannot move the cursor, colour the terminal or break a line.

>>> table_lines([("model", "family"), ("resnet18", "classification")])
['model     family', 'resnet18  classification']
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Container, Sequence

from hookcli.console import printable
from hookcli.files import format_bytes
from hookcli.storage.fileformat import metadata_order, opened_entry

__all__ = [
    "info_json",
    "info_lines",
    "table_lines",
]


def _shape_text(row: dict) -> str:
    """``[2,16,≤213,≤224]``: the stored shape, axes whose rows differ marked as the largest of them."""
    varies = set(row.get("varies", ()))
    return "[" + ",".join(f"≤{n}" if axis in varies else str(n) for axis, n in enumerate(row["shape"])) + "]"


def info_lines(described: dict, *, stats: bool = True) -> list[str]:
    """:func:`describe_file`'s result as ``hookcli info`` prints it: a title, a table of tensors, the metadata (a
    statistics file's as :func:`_stats_lines` prints it, a comparison file's as :func:`_compare_lines` does)."""
    if described.get("kind") == "stats":
        return _stats_lines(described, values=stats)
    if described.get("kind") == "compare":
        return _compare_lines(described)
    count = len(described["tensors"])
    size = format_bytes(described["bytes"])
    lines = [f"{printable(described['file'])}  {size}  {count} tensor{'s' if count != 1 else ''}"]
    header = ("key", "dtype", "shape", "size") + (("min", "mean", "max", "zeros", "nan/inf") if stats else ())
    table = [header]
    for t in described["tensors"]:
        row: tuple[str, ...] = (t["key"], t["dtype"], _shape_text(t), format_bytes(t["bytes"]))
        if stats:
            st = t["stats"]
            row += (
                *(_number(st[k]) for k in ("min", "mean", "max")),
                "-" if st["zeros"] is None else f"{st['zeros']:.1%}",
                str(st["nonfinite"]),
            )
        table.append(row)
    lines += table_lines(table, right=range(2, len(header)))
    if described["metadata"]:
        lines += ["metadata:", *map(printable, _metadata_lines(described["metadata"]))]
    return lines


def _firsts(shares: dict | None) -> str:
    """The shares of the variance the first principal components explain, as ``42/71/88%`` (``-`` without
    them)."""
    found = [share for share in (shares or {}).values() if share is not None]
    return "/".join(f"{100 * share:.0f}" for share in found) + "%" if found else "-"


def _stats_lines(described: dict, *, values: bool) -> list[str]:
    """A statistics file: what it covers and how, a table of its layers (with ``values``, their channels summed
    up), a table of its tensors, the metadata."""
    layers, inputs, skipped = described["layers"], described["inputs"], described["skipped"]
    options = described["options"]
    lines = [
        f"{printable(described['file'])}  {format_bytes(described['bytes'])}  statistics of {len(layers)} "
        f"layer{'s' if len(layers) != 1 else ''} over {inputs:,} input{'s' if inputs != 1 else ''}"
        + (f" ({skipped:,} skipped)" if skipped else ""),
        f"top {options['top']} examples a channel by {printable(str(options['top_by']))}"
        + (f" (all {inputs:,} there are)" if inputs < options["top"] else "")
        + "; quantiles "
        f"{', '.join(f'{level:g}' for level in options['quantiles']) or 'none'}; "
        + ("covariance and principal components" if options["pca"] else "no principal components"),
    ]
    header: tuple[str, ...] = ("layer", "layout", "channels", "positions", "count", "examples")
    if values:
        header += ("min", "mean", "max", "zeros", "all-zero", "pca 90%", "first 1/5/10")
    table = [header]
    for layer in layers:
        row: tuple[str, ...] = (
            layer["key"],
            layer["layout"] + (f" (skip {layer['skip']})" if layer["skip"] else ""),
            f"{layer['channels']:,}",
            _shape_text({"shape": layer["spatial"]}) if layer["spatial"] else "-",
            f"{layer['count']:,}",
            str(layer["examples"]),
        )
        if values:
            found = layer["values"]
            explained = found.get("components_90")
            row += (
                *(_number(found[k]) for k in ("min", "mean", "max")),
                "-" if found["zeros"] is None else f"{found['zeros']:.1%}",
                f"{found['dead']:,}",
                "-" if explained is None else f"{explained:,}",
                _firsts(found.get("explained")),
            )
        table.append(row)
    lines += table_lines(table, right=range(2, len(header)))
    return lines + _tensors_and_metadata(described)


def _tensors_and_metadata(described: dict) -> list[str]:
    """A file's tensors as a table (no statistics) and its metadata."""
    tensors = [("key", "dtype", "shape", "size")]
    tensors += [(t["key"], t["dtype"], _shape_text(t), format_bytes(t["bytes"])) for t in described["tensors"]]
    lines = ["tensors:", *("  " + line for line in table_lines(tensors, right=range(2, 4)))]
    if described["metadata"]:
        lines += ["metadata:", *map(printable, _metadata_lines(described["metadata"]))]
    return lines


#: A comparison's matrix is printed whole up to this many columns; a wider one by each row's closest column.
_MATRIX_COLUMNS = 12


def _compare_lines(described: dict) -> list[str]:
    """A comparison file: what it compares and how, its matrix (when read) and its tensors and metadata."""
    rows, columns, inputs, skipped = described["rows"], described["columns"], described["inputs"], described["skipped"]
    sources, settings = described["sources"], described["settings"]
    compared = (
        f"rows and columns: the same representations of {printable(sources['rows'])}"
        if described["same"]
        else f"rows: {printable(sources['rows'])}; columns: {printable(sources['columns'])}"
    )
    lines = [
        f"{printable(described['file'])}  {format_bytes(described['bytes'])}  {printable(described['method'])} "
        f"comparison of {len(rows)} row{'s' if len(rows) != 1 else ''} with {len(columns)} "
        f"column{'s' if len(columns) != 1 else ''} over {inputs:,} input{'s' if inputs != 1 else ''}"
        + (f" ({skipped:,} skipped)" if skipped else ""),
        compared,
        "settings: "
        + printable(
            ", ".join(f"{k} {v if isinstance(v, str) else json.dumps(v)}" for k, v in settings.items()) or "none"
        ),
    ]
    if described["undefined"]:
        lines.append("undefined (no spread): " + printable(", ".join(described["undefined"])))
    matrix = described.get("matrix")
    if matrix is not None:
        lines.append(
            f"matrix: min {_number(matrix['min'])}, mean {_number(matrix['mean'])}, max {_number(matrix['max'])}"
            + (f", {matrix['undefined']:,} cells undefined" if matrix["undefined"] else "")
        )
        if len(columns) <= _MATRIX_COLUMNS:
            table = [("", *columns)]
            table += [(label, *map(_similarity, values)) for label, values in zip(rows, matrix["values"])]
            lines += ["  " + line for line in table_lines(table, right=range(1, len(columns) + 1))]
        else:
            lines.append("closest column of each row:")
            table = [(found["row"], found["column"], _similarity(found["value"])) for found in matrix["closest"]]
            lines += ["  " + line for line in table_lines(table, right=(2,))] if table else []
    lines += _tensors_and_metadata(described)
    return lines


def _similarity(value: float) -> str:
    return "undefined" if math.isnan(value) else f"{value:.3f}"


def info_json(described: dict) -> str:
    """:func:`describe_file`'s result as ``hookcli info --json`` prints it: strict JSON.

    JSON has no NaN or infinity (metadata may hold them): they become the strings ``"NaN"``, ``"Infinity"``
    and ``"-Infinity"``.

    >>> print(info_json({"metadata": {"scores": [1.5, float("nan"), float("-inf")]}}))
    {
      "metadata": {
        "scores": [
          1.5,
          "NaN",
          "-Infinity"
        ]
      }
    }
    """
    return json.dumps(_strict(described), indent=2, allow_nan=False)


_SURROGATE = re.compile("[\ud800-\udfff]")


def _strict(value):
    if isinstance(value, str):
        return _SURROGATE.sub(lambda match: f"\\u{ord(match[0]):04x}", value)  # shown as text, as in the table
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else "Infinity" if value > 0 else "-Infinity"
    if isinstance(value, dict):
        return {_strict(key): _strict(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_strict(item) for item in value]
    return value


def table_lines(table: Sequence[tuple[str, ...]], *, right: Container[int] = ()) -> list[str]:
    """Rows of cells as aligned text, control characters escaped; columns whose index is in ``right`` align right."""
    table = [tuple(map(printable, row)) for row in table]
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]

    def cell(i: int, text: str) -> str:
        return text.rjust(widths[i]) if i in right else text.ljust(widths[i])

    return ["  ".join(cell(i, text) for i, text in enumerate(row)).rstrip() for row in table]


def _number(value) -> str:
    return "-" if value is None else f"{value:.4g}"


def _metadata_lines(metadata: dict) -> list[str]:
    """hookcli's keys first in a fixed order; objects one entry per line; long lists shortened (--json has all)."""
    lines = []
    for key in metadata_order(metadata):
        value = metadata[key]
        if isinstance(value, dict) and any(isinstance(v, dict | list) for v in value.values()):
            lines.append(f"  {key}:")
            lines.extend(f"    {k}: {json.dumps(opened_entry(v))}" for k, v in value.items())
        elif isinstance(value, list):
            shown = [*value[:5], f"... {len(value) - 7} more", *value[-2:]] if len(value) > 10 else value
            lines.append(f"  {key}: ({len(value)})")
            lines.extend(f"    {item if isinstance(item, str) else json.dumps(item)}" for item in shown)
        else:
            lines.append(f"  {key}: {value if isinstance(value, str) else json.dumps(value)}")
    return lines
