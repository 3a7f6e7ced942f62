"""Describe a saved features file: keys, shapes, dtypes, sizes, metadata and value statistics.

Statistics are computed a row at a time, so a file of any size is summarised
in the memory of one row.

>>> from hookcli.store import Features
>>> features = Features({"x": np.array([[0.0, 1.0, 2.0, np.nan]], dtype="float32")}, {})
>>> describe_file(features)["tensors"][0]["stats"]
{'min': 0.0, 'mean': 1.0, 'max': 2.0, 'zeros': 0.25, 'nonfinite': 1}
"""

from __future__ import annotations

import json

import numpy as np

__all__ = ["describe_file", "tensor_stats"]

_WHOLE_TENSOR_BYTES = 64 * 1024 * 1024


def tensor_stats(features, key: str) -> dict:
    """min / mean / max over finite values, the share of exact zeros and the count of NaN and ±inf."""
    shape = features.shape(key)
    if not shape or features.nbytes(key) <= _WHOLE_TENSOR_BYTES:
        pieces = [features.read(key)]
    else:  # rows in pieces of about _WHOLE_TENSOR_BYTES, one read each
        step = max(1, _WHOLE_TENSOR_BYTES * shape[0] // features.nbytes(key))
        pieces = (features.read_rows(key, start, start + step) for start in range(0, shape[0], step))
    low, high, total, finite_count, zeros, count = np.inf, -np.inf, 0.0, 0, 0, 0
    for piece in pieces:
        values = np.asarray(piece, dtype=np.float64).ravel()
        finite = values[np.isfinite(values)]
        count += values.size
        zeros += int(np.count_nonzero(values == 0))
        finite_count += finite.size
        if finite.size:
            low, high = min(low, float(finite.min())), max(high, float(finite.max()))
            total += float(finite.sum())
    if not finite_count:
        return {"min": None, "mean": None, "max": None, "zeros": zeros / count if count else None,
                "nonfinite": count}
    return {"min": low, "mean": total / finite_count, "max": high, "zeros": zeros / count,
            "nonfinite": count - finite_count}


def describe_file(features, *, stats: bool = True) -> dict:
    """Everything ``hookcli info`` shows, as JSON-able data (metadata JSON strings are parsed)."""
    tensors = []
    for key in features.keys():
        row = {"key": key, "dtype": features.dtype(key), "shape": features.shape(key), "bytes": features.nbytes(key)}
        if stats:
            row["stats"] = tensor_stats(features, key)
        tensors.append(row)
    return {"file": features.name, "bytes": features.size, "metadata": _parsed(features.metadata), "tensors": tensors}


def _parsed(metadata) -> dict:
    parsed = {}
    for key, value in metadata.items():
        try:
            decoded = json.loads(value)
        except (TypeError, ValueError):
            decoded = value
        parsed[key] = decoded if isinstance(decoded, dict | list) else value
    return parsed
