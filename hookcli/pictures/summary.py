"""Describe a saved features file: keys, shapes, dtypes, sizes, metadata and value statistics.

Statistics are computed a row at a time, so a file of any size is summarised
in the memory of one row. A statistics file (``hookcli stats``) holds no rows:
it is checked (:func:`~hookcli.storage.stats_file.read_stats`) and described by
its layers, their units and a summary of each layer's channels instead; a
comparison file (``hookcli compare``) is checked
(:func:`~hookcli.storage.compare_file.read_comparison`) and described by what it
compares, how, and its matrix.

>>> import numpy as np
>>> from hookcli.storage.features import Features
>>> features = Features({"x": np.array([[0.0, 1.0, 2.0, np.nan]], dtype="float32")}, {})
>>> describe_file(features)["tensors"][0]["stats"]
{'min': 0.0, 'mean': 1.0, 'max': 2.0, 'zeros': 0.25, 'nonfinite': 1}

:mod:`hookcli.cli.printing` prints what this describes.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable

import numpy as np

from hookcli.storage.compare_file import ComparisonFile, read_comparison
from hookcli.storage.compare_format import is_comparison
from hookcli.storage.reader import FeatureReader
from hookcli.storage.stats_file import StatsFile, StatsLayer, read_stats
from hookcli.storage.stats_format import is_stats

__all__ = [
    "describe_comparison",
    "describe_file",
    "describe_stats",
    "tensor_stats",
    "values_stats",
]

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
    with np.errstate(over="ignore"):
        total = float(values.sum())
    return total / values.size if math.isfinite(total) else float((values / values.size).sum())


def describe_file(features: FeatureReader, *, stats: bool = True) -> dict:
    """Everything ``hookcli info`` shows, as JSON-able data (metadata JSON strings are parsed); a statistics file
    as :func:`describe_stats` describes it, a comparison file as :func:`describe_comparison` does."""
    if is_stats(features.metadata):
        return describe_stats(read_stats(features), values=stats)
    if is_comparison(features.metadata):
        return describe_comparison(read_comparison(features), values=stats)
    tensors = []
    for key in features.keys():
        row = {"key": key, "dtype": features.dtype(key), "shape": features.shape(key), "bytes": features.nbytes(key)}
        if _is_ragged(features, key):
            row["varies"] = _varying_axes(features, key)
        if stats:
            row["stats"] = tensor_stats(features, key)
        tensors.append(row)
    return {"file": features.name, "bytes": features.size, "metadata": _parsed(features.metadata), "tensors": tensors}


def describe_stats(found: StatsFile, *, values: bool = True) -> dict:
    """A statistics file as ``hookcli info`` shows it: its options, inputs and layers (units, values a channel,
    examples kept), its tensors and metadata, and with ``values`` a summary of each layer's channels (the lowest,
    mean and highest value, the share of zeros, how many channels are zero everywhere, how many principal
    components explain 90% of the variance, and what share the first 1, 5 and 10 explain)."""
    features = found.features
    layers = []
    for layer in found.layers.values():
        row = {
            "key": layer.key,
            "layout": layer.layout,
            "channels": layer.channels,
            "spatial": list(layer.spatial),
            "skip": layer.skip,
            "row_shape": list(layer.row_shape),
            "count": layer.count,
            "examples": layer.examples,
            "pca": layer.pca,
        }
        if values:
            row["values"] = _layer_values(found, layer)
        layers.append(row)
    tensors = [
        {"key": key, "dtype": features.dtype(key), "shape": features.shape(key), "bytes": features.nbytes(key)}
        for key in features.keys()
    ]
    return {
        "file": features.name,
        "bytes": features.size,
        "kind": "stats",
        "inputs": len(found.inputs),
        "skipped": found.skipped,
        "options": found.options,
        "layers": layers,
        "tensors": tensors,
        "metadata": _parsed(features.metadata),
    }


def describe_comparison(found: ComparisonFile, *, values: bool = True) -> dict:
    """A comparison file as ``hookcli info`` shows it: the method, the labels of its rows and columns and what they
    are of (``sources``), the inputs, the settings, the undefined labels, its tensors and metadata, and with
    ``values`` its ``matrix``: the similarities (NaN where undefined), their lowest, mean and highest, the count of
    undefined cells, and each row's closest column (another than itself when one side was compared with itself)."""
    features = found.features
    first, second = found.sources()
    described = {
        "file": features.name,
        "bytes": features.size,
        "kind": "compare",
        "method": found.method,
        "rows": found.rows,
        "columns": found.columns,
        "same": found.same,
        "sources": {"rows": first, "columns": second},
        "inputs": len(found.inputs),
        "skipped": found.skipped,
        "settings": found.settings,
        "undefined": found.undefined,
    }
    if values:
        described["matrix"] = _matrix_values(found)
    described["tensors"] = [
        {"key": key, "dtype": features.dtype(key), "shape": features.shape(key), "bytes": features.nbytes(key)}
        for key in features.keys()
    ]
    described["metadata"] = _parsed(features.metadata)
    return described


def _matrix_values(found: ComparisonFile) -> dict:
    matrix = found.matrix()
    summary = values_stats([matrix])
    closest = []
    for i, label in enumerate(found.rows):
        row = np.where(np.isnan(matrix[i]), -np.inf, matrix[i])
        if found.same:
            row[i] = -np.inf
        j = int(np.argmax(row))
        if np.isfinite(row[j]):
            closest.append({"row": label, "column": found.columns[j], "value": float(row[j])})
    return {
        "values": matrix.tolist(),
        "min": summary["min"],
        "mean": summary["mean"],
        "max": summary["max"],
        "undefined": int(np.isnan(matrix).sum()),
        "closest": closest,
    }


def _layer_values(found: StatsFile, layer: StatsLayer) -> dict:
    """One layer's channels summed up: every value of the layer is in one channel, and every channel has as many."""
    with np.errstate(invalid="ignore"):
        lows, highs = found.read(layer.key, "min"), found.read(layer.key, "max")
        means, zeros = found.read(layer.key, "mean"), found.read(layer.key, "zeros")
        summary: dict[str, object] = {
            "min": _finite(np.min(lows, initial=np.inf, where=np.isfinite(lows))),
            "mean": _finite(np.mean(means)),
            "max": _finite(np.max(highs, initial=-np.inf, where=np.isfinite(highs))),
            "zeros": _finite(np.mean(zeros)),
            "dead": int(np.count_nonzero(zeros == 1)),
        }
    if layer.pca:
        variances = found.read(layer.key, "pca_values")
        summary["components_90"] = explaining(variances, 0.9)
        summary["explained"] = {str(count): explained(variances, count) for count in FIRST_COMPONENTS}
    return summary


def _finite(value) -> float | None:
    return float(value) if np.isfinite(value) else None


#: The numbers of leading principal components whose share of the variance ``info`` and the report give.
FIRST_COMPONENTS = (1, 5, 10)


def explained(variances: np.ndarray, count: int) -> float | None:
    """The share of the variance the first ``count`` principal components (their ``variances``, highest first)
    explain; None when there is no variance to explain. Variances below zero (rounding) count as zero.

    >>> explained(np.array([6.0, 3.0, 1.0]), 1), explained(np.array([6.0, 3.0, 1.0]), 5), explained(np.zeros(3), 1)
    (0.6, 1.0, None)
    """
    kept = np.clip(np.nan_to_num(np.asarray(variances, dtype=np.float64), nan=0.0, posinf=0.0), 0.0, None)
    total = kept.sum()
    if not total > 0 or not np.isfinite(total):
        return None
    return float(min(1.0, kept[:count].sum() / total))


def explaining(variances: np.ndarray, share: float) -> int | None:
    """How many of the principal components (their ``variances``, highest first) explain ``share`` of the variance;
    None when there is no variance to explain. Variances below zero (rounding) count as zero.

    >>> explaining(np.array([6.0, 3.0, 1.0, -1e-12]), 0.9), explaining(np.zeros(3), 0.9)
    (2, None)
    """
    kept = np.clip(np.nan_to_num(np.asarray(variances, dtype=np.float64), nan=0.0, posinf=0.0), 0.0, None)
    total = kept.sum()
    if not total > 0 or not np.isfinite(total):
        return None
    return int(np.searchsorted(np.cumsum(kept) / total, share - 1e-12) + 1)


def _is_ragged(features: FeatureReader, key: str) -> bool:
    return getattr(features, "ragged", None) is not None and features.ragged(key)


#: Rows whose shapes :func:`_varying_axes` compares: enough to see which axes vary, bounded for huge files.
_SHAPES_LOOKED_AT = 10_000


def _varying_axes(features: FeatureReader, key: str) -> list[int]:
    """The axes (of the stored tensor) along which the rows of a ragged key differ in length."""
    shapes = [features.row_shape(key, i) for i in range(min(features.shape(key)[0], _SHAPES_LOOKED_AT))]
    return [axis + 1 for axis, sizes in enumerate(zip(*shapes)) if len(set(sizes)) > 1]


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
