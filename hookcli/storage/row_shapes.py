"""The ``@shape`` companions of ragged keys (rows of their own shapes), checked as untrusted input: a companion must
fit its key, and each row's shape must lie within what the key stores.

>>> entries = {"x": ("F32", [2, 3, 4]), "x@shape": ("I64", [2, 2])}
>>> companions(entries, entries.get, "'f' is damaged")
{'x': 'x@shape'}
"""

from __future__ import annotations

import json

import numpy as np

from hookcli.errors import FeatureFileError
from hookcli.storage.fileformat import ROW_SHAPE

__all__ = [
    "checked_row_shapes",
    "companions",
    "short",
]


def short(value) -> str:
    text = json.dumps(value)
    return text if len(text) <= 80 else text[:77] + "..."


def companions(entries, dtype_and_shape, damaged: str, *, flat: bool = False) -> dict[str, str]:
    """``{key: its @shape companion}`` for the ragged keys among ``entries``, each checked to fit its key (``flat``:
    a key of format 3, its rows' values one after the other)."""
    found = {}
    for companion in entries:
        key = companion.removesuffix(ROW_SHAPE)
        if companion == key or key not in entries:
            continue
        dtype, shape = dtype_and_shape(companion)
        rows = list(dtype_and_shape(key)[1])
        if flat:
            wrong = _flat_row_shapes_problem(dtype, list(shape), key, rows)
        else:
            wrong = _row_shapes_problem(dtype, list(shape), rows)
        if wrong:
            raise FeatureFileError(
                f"{damaged}: '{companion}' is not the row shapes of '{key}' {rows}",
                hint=f"{wrong}; write the file again",
            )
        found[key] = companion
    return found


def _flat_row_shapes_problem(dtype: str, shape: list[int], key: str, stored: list[int]) -> str:
    """What keeps a tensor of ``dtype`` and ``shape`` from being the row shapes of flat ragged ``key`` (stored as
    ``stored``), or "": a 1-D key, and ``[rows, dimensions]`` whole numbers (whether they account for every value
    is checked when they are read)."""
    if len(stored) != 1:
        return f"'{key}' is {short(stored)}, where rows stored one after the other make one axis"
    if len(shape) != 2 or shape[1] < 1:
        return f"its shape is {short(shape)}, where row shapes are [rows, dimensions]"
    return _row_shapes_problem(dtype, shape, [shape[0], *([0] * shape[1])])


def _row_shapes_problem(dtype: str, shape: list[int], rows: list[int]) -> str:
    """What keeps a tensor of ``dtype`` and ``shape`` from being the row shapes of a key shaped ``rows``, or ""."""
    if len(rows) < 2:
        return f"a key of shape {rows} has no row shapes to give"
    if dtype not in ("I64", "I32"):
        return f"it holds {dtype[:20]}, where row shapes are whole numbers (I64 or I32)"
    wanted = [rows[0], len(rows) - 1]
    if shape != wanted:
        return f"its shape is {short(shape)}, where {rows[0]} rows of {len(rows) - 1} dimensions need {wanted}"
    return ""


def checked_row_shapes(features, key: str, table):
    """Every row's own shape of ragged ``key`` (its ``@shape`` companion, ``[N, ndim]``), each within the padding."""
    table, padded = np.asarray(table, dtype=np.int64), features.shape(key)[1:]
    outside = np.flatnonzero(((table < 0) | (table > np.array(padded, dtype=np.int64))).any(axis=1))
    if outside.size:
        index = int(outside[0])
        raise FeatureFileError(
            f"'{features.name}' is damaged: row {index} of '{key}' claims shape "
            f"{table[index].tolist()}, outside the stored {padded}",
            hint=f"each row's shape in '{key}{ROW_SHAPE}' runs from 0 to the stored {padded}; write the file again",
        )
    return table
