"""Describe a saved features file: keys, shapes, dtypes, sizes, metadata and value statistics.

Statistics are computed a row at a time, so a file of any size is summarised
in the memory of one row.

>>> import numpy as np
>>> from hookcli.storage.features import Features
>>> features = Features({"x": np.array([[0.0, 1.0, 2.0, np.nan]], dtype="float32")}, {})
>>> describe_file(features)["tensors"][0]["stats"]
{'min': 0.0, 'mean': 1.0, 'max': 2.0, 'zeros': 0.25, 'nonfinite': 1}

Text is printed through :func:`hookcli.console.printable`, so names and
metadata from a file cannot move the cursor, colour the terminal or break a
line. numpy loads only when statistics are computed.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Container, Iterable, Sequence
from typing import TYPE_CHECKING

from hookcli.console import printable
from hookcli.files import format_bytes
from hookcli.storage.reader import FeatureReader

if TYPE_CHECKING:
    import numpy as np

__all__ = ["describe_file", "info_json", "info_lines", "table_lines", "metadata_order", "tensor_stats", "values_stats"]

_WHOLE_TENSOR_BYTES = 64 * 1024 * 1024


def tensor_stats(features: FeatureReader, key: str) -> dict:
    """min / mean / max over finite values, the share of exact zeros and the count of NaN and ±inf.

    Computed in float64, so values beyond float32's range (F64 tensors) stay finite, and so does their mean.
    """
    shape = features.shape(key)
    if _is_ragged(features, key):  # each row's own values, not the padding
        return values_stats(features.read(key, index) for index in range(shape[0]))
    pieces: Iterable[np.ndarray]
    if not shape or features.nbytes(key) <= _WHOLE_TENSOR_BYTES:
        pieces = [features.read(key)]
    else:  # rows in pieces of about _WHOLE_TENSOR_BYTES, one read each
        step = max(1, _WHOLE_TENSOR_BYTES * shape[0] // features.nbytes(key))
        pieces = (features.read_rows(key, start, start + step) for start in range(0, shape[0], step))
    return values_stats(pieces)


def values_stats(pieces: Iterable[np.ndarray]) -> dict:
    """:func:`tensor_stats` of the values of ``pieces`` (arrays of any shape), taken together.

    >>> import numpy as np
    >>> values_stats([np.array([[0.0, 3.0]]), np.array([np.inf])])
    {'min': 0.0, 'mean': 1.5, 'max': 3.0, 'zeros': 0.3333333333333333, 'nonfinite': 1}
    """
    import numpy as np

    low, high, mean, finite_count, zeros, count = np.inf, -np.inf, 0.0, 0, 0, 0
    for piece in pieces:
        values = np.asarray(piece, dtype=np.float64).ravel()
        finite = values[np.isfinite(values)]
        count += values.size
        zeros += int(np.count_nonzero(values == 0))
        if finite.size:
            finite_count += finite.size
            low, high = min(low, float(finite.min())), max(high, float(finite.max()))
            share = finite.size / finite_count  # pieces' means weighted, never a running sum that could overflow
            mean = mean * (1 - share) + _mean(finite) * share
    if not finite_count:
        return {"min": None, "mean": None, "max": None, "zeros": zeros / count if count else None, "nonfinite": count}
    return {"min": low, "mean": mean, "max": high, "zeros": zeros / count, "nonfinite": count - finite_count}


def _mean(values) -> float:
    """The mean of finite float64 ``values``, also where their sum overflows (values near float64's limit)."""
    import numpy as np

    with np.errstate(over="ignore"):
        total = float(values.sum())
    return total / values.size if math.isfinite(total) else float((values / values.size).sum())


def describe_file(features: FeatureReader, *, stats: bool = True) -> dict:
    """Everything ``hookcli info`` shows, as JSON-able data (metadata JSON strings are parsed)."""
    tensors = []
    for key in features.keys():
        row = {"key": key, "dtype": features.dtype(key), "shape": features.shape(key), "bytes": features.nbytes(key)}
        if _is_ragged(features, key):
            row["varies"] = _varying_axes(features, key)
        if stats:
            row["stats"] = tensor_stats(features, key)
        tensors.append(row)
    return {"file": features.name, "bytes": features.size, "metadata": _parsed(features.metadata), "tensors": tensors}


def _is_ragged(features: FeatureReader, key: str) -> bool:
    return getattr(features, "ragged", None) is not None and features.ragged(key)


#: Rows whose shapes :func:`_varying_axes` compares: enough to see which axes vary, bounded for huge files.
_SHAPES_LOOKED_AT = 10_000


def _varying_axes(features: FeatureReader, key: str) -> list[int]:
    """The axes (of the stored tensor) along which the rows of a ragged key differ in length."""
    shapes = [features.row_shape(key, i) for i in range(min(features.shape(key)[0], _SHAPES_LOOKED_AT))]
    return [axis + 1 for axis, sizes in enumerate(zip(*shapes)) if len(set(sizes)) > 1]


def _shape_text(row: dict) -> str:
    """``[2,16,≤213,≤224]``: the stored shape, axes whose rows differ marked as the largest of them."""
    varies = set(row.get("varies", ()))
    return "[" + ",".join(f"≤{n}" if axis in varies else str(n) for axis, n in enumerate(row["shape"])) + "]"


def _parsed(metadata) -> dict:
    parsed = {}
    for key, value in metadata.items():
        try:
            decoded = json.loads(value)
        except (TypeError, ValueError, RecursionError):
            decoded = value
        structured = isinstance(decoded, dict | list) and _shallow(decoded)
        parsed[key] = decoded if structured else value
    return parsed


def _shallow(value, limit: int = 64) -> bool:
    """Whether ``value`` nests at most ``limit`` deep (deeper JSON from a file is shown as the text it is)."""
    level = [value]
    for _ in range(limit + 1):
        level = [
            item
            for outer in level
            if isinstance(outer, dict | list)
            for item in (outer.values() if isinstance(outer, dict) else outer)
        ]
        if not level:
            return True
    return False


_METADATA_ORDER = ("format", "producer", "model", "weights", "layers", "capture", "preprocess", "device", "versions")


def metadata_order(metadata) -> list[str]:
    """The metadata's keys as info shows them: hookcli's main entries in a fixed order, then the others by name."""
    return sorted(metadata, key=lambda k: (_METADATA_ORDER.index(k) if k in _METADATA_ORDER else 99, k))


def info_lines(described: dict, *, stats: bool = True) -> list[str]:
    """:func:`describe_file`'s result as ``hookcli info`` prints it: a title, a table of tensors, the metadata."""
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
            lines.extend(f"    {k}: {json.dumps(v)}" for k, v in value.items())
        elif isinstance(value, list):
            shown = [*value[:5], f"... {len(value) - 7} more", *value[-2:]] if len(value) > 10 else value
            lines.append(f"  {key}: ({len(value)})")
            lines.extend(f"    {item if isinstance(item, str) else json.dumps(item)}" for item in shown)
        else:
            lines.append(f"  {key}: {value if isinstance(value, str) else json.dumps(value)}")
    return lines
