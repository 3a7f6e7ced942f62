"""The comparison file contract: what ``hookcli compare`` writes, described once (``docs/file-format.md``
documents it), and the checks a comparison file read from disk must pass.

A comparison file is a safetensors file whose metadata says ``"kind":
"compare"`` and ``"format": "5"``. It holds the matrix of similarities under
the method's name (:data:`METHODS`), float64 ``[A, B]``: row ``i`` is the
representation ``rows[i]`` of the first side, column ``j`` the representation
``columns[j]`` of the second. A ``linear-cka`` file also holds what the
matrix was made from (:data:`CKA_STATE`), so that files over disjoint inputs
merge into one; an ``rsa`` file may hold each representation's RDM,
``rdm@<label>``.

Nothing here imports torch or numpy.

>>> compare_metadata({"model": "resnet18"}, method="rsa", rows=["a"], columns=["b"], settings={"rows": 10},
...                  inputs=["x.jpg"])["columns"]
'["b"]'
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hookcli.options.compare import SIMILARITIES
from hookcli.storage.fileformat import json_entry
from hookcli.storage.gathered_format import gathered_metadata

__all__ = [
    "CKA_STATE",
    "DEBIASED_STATE",
    "COMPARE_FORMAT_VERSION",
    "COMPARE_KIND",
    "METHODS",
    "RDM",
    "MOST_COLUMNS",
    "MOST_LABELS",
    "SECOND_SIDE",
    "second_names",
    "Comparison",
    "check_comparison",
    "compare_metadata",
    "is_comparison",
    "is_debiased",
]

COMPARE_FORMAT_VERSION = "5"
COMPARE_KIND = "compare"
#: What ``--method`` computes; each names the file's matrix.
METHODS = SIMILARITIES
#: The tensors of a linear-cka file's state: rows seen, each representation's width, the means of every column of
#: every representation, one after the other (first side, then second unless one side is compared with itself),
#: and their co-moments ``[D, D]``.
CKA_STATE = ("linear-cka@count", "linear-cka@widths", "linear-cka@mean", "linear-cka@comoment")
#: What a debiased linear-cka file (``"estimator": "debiased"`` in its settings) keeps besides: about the column
#: means, each column's sum of its values times each representation's squared row norms ``[D, R]``, and each pair
#: of representations' sum of the products of their squared row norms ``[R, R]``.
DEBIASED_STATE = ("linear-cka@third", "linear-cka@fourth")
#: A representation's RDM in an ``rsa`` file: ``rdm@<label>``; a second side's label that is taken already (the
#: first side has it too) has ``2:`` in front, as many times as it takes to be a name of its own (:func:`second_names`).
RDM = "rdm@"
SECOND_SIDE = "2:"
#: The most representations a side of a comparison has: its matrix (float64) is read whole, 32 MiB at the most.
MOST_LABELS = 2048
#: The most values a row of every representation a linear-cka file's sums cover (16,384): their co-moments, a
#: float64 square of that side, are read whole (2 GiB at the most).
MOST_COLUMNS = 16_384
#: The tensors a file of each method holds, in words.
_HOLDS = {
    "linear-cka": "the matrix 'linear-cka' and its sums, linear-cka@count, @widths, @mean and @comoment",
    "minibatch-cka": "the matrix 'minibatch-cka'",
    "rsa": "the matrix 'rsa' and the RDMs of its labels, rdm@<label>",
}


def is_comparison(metadata: Mapping[str, str]) -> bool:
    """Whether a file's metadata describes a comparison file."""
    return metadata.get("kind") == COMPARE_KIND


def compare_metadata(
    run: Mapping[str, str],
    *,
    method: str,
    rows: Sequence[str],
    columns: Sequence[str],
    settings: Mapping,
    inputs: Sequence[str],
    skipped: Sequence[dict] = (),
    identity: Mapping | None = None,
    same: bool = False,
    undefined: Sequence[str] = (),
) -> dict[str, str]:
    """A comparison file's metadata: the run's (``run``), the ``method``, the labels of the ``rows`` and
    ``columns``, the method's ``settings`` (pooling, minibatch, RDM rows, distance and ranking), the inputs the
    rows came from and those skipped, the run's ``identity``, whether one side was compared with itself
    (``same``), and the representations whose similarities are ``undefined`` (no spread: NaN)."""
    return gathered_metadata(
        run,
        kind=COMPARE_KIND,
        version=COMPARE_FORMAT_VERSION,
        inputs=inputs,
        skipped=skipped,
        identity=identity,
        method=method,
        rows=json.dumps(list(rows)),
        columns=json.dumps(list(columns)),
        settings=json.dumps(dict(settings)),
        same=json.dumps(same),
        **({"undefined": json.dumps(list(undefined))} if undefined else {}),
    )


@dataclass(frozen=True)
class Comparison:
    """What a comparison file's metadata says, checked (:func:`check_comparison`): the ``method``, the labels of
    the matrix's ``rows`` and ``columns``, whether one side was compared with itself (``same``), the method's
    ``settings``, the ``undefined`` labels, the ``inputs`` and how many were ``skipped``, and whether a linear-cka
    file keeps the sums it was made of (``state``)."""

    method: str
    rows: list[str]
    columns: list[str]
    same: bool
    settings: dict
    undefined: list[str]
    inputs: list[str]
    skipped: int
    state: bool


def check_comparison(
    metadata: Mapping[str, str],
    shapes: Mapping[str, tuple[str, list[int]]],
    read: Callable[[str], Any],
) -> Comparison:
    """A comparison file read from disk, checked against this module's description: ``shapes`` map each of its
    keys to its dtype and shape, and ``read`` reads a tensor, which is asked only for the two small tensors of a
    linear-cka file's state (``@count`` and ``@widths``, once their shapes are checked). ValueError saying what is
    wrong (a crafted or damaged file).

    >>> metadata = compare_metadata({}, method="rsa", rows=["a"], columns=["b"], settings={}, inputs=["x.jpg"])
    >>> check_comparison(metadata, {"rsa": ("F64", [1, 1])}, read=None).columns
    ['b']
    >>> check_comparison(metadata, {"rsa": ("F64", [1, 2])}, read=None)
    Traceback (most recent call last):
    ...
    ValueError: 'rsa' is F64 [1, 2], not F64 [1, 1] (1 row, 1 column)
    """
    if metadata.get("format") != COMPARE_FORMAT_VERSION:
        raise ValueError(f"its format is {metadata.get('format')!r}, not {COMPARE_FORMAT_VERSION}")
    method = metadata.get("method")
    if method not in METHODS:
        raise ValueError(f"its method {json.dumps(method)} is not one of {', '.join(METHODS)}")
    rows, columns = _labels(metadata, "rows"), _labels(metadata, "columns")
    same = json_entry(metadata, "same", bool, "true or false")
    if same and rows != columns:
        raise ValueError("it compares one side with itself ('same'), and its rows and columns differ")
    settings = json_entry(metadata, "settings", dict, "an object of the method's settings")
    inputs = json_entry(metadata, "inputs", list, "a list of input paths")
    if not all(isinstance(path, str) for path in inputs):
        raise ValueError("its 'inputs' metadata is not a list of input paths")
    skipped = json_entry(metadata, "skipped", list, "a list of skipped inputs", default=[])
    json_entry(metadata, "identity", dict, "an object of the run's identity", default={})
    undefined = json_entry(metadata, "undefined", list, "a list of labels", default=[])
    named, column_set = {*rows, *columns}, set(columns)
    for label in undefined:
        if label not in named:
            raise ValueError(f"its 'undefined' metadata names {json.dumps(label)}, which is neither a row nor a column")
    _check_shape(shapes, method, "F64", [len(rows), len(columns)], _counted(len(rows), len(columns)))
    for key, (dtype, shape) in shapes.items():
        label = key.removeprefix(RDM)
        second = not same and _second_label(label, column_set)
        if method == "rsa" and key.startswith(RDM) and (label in named or second):
            if dtype != "F32" or len(shape) != 2 or shape[0] != shape[1]:
                square = "a square F32 matrix (an RDM: an input a row and a column)"
                raise ValueError(f"'{key}' is {dtype} {list(shape)}, not {square}")
        elif key != method and not (method == "linear-cka" and key in _kept(settings)):
            raise ValueError(f"'{key}' is not a tensor that {method} keeps ({_HOLDS[method]})")
    state = method == "linear-cka" and any(key in shapes for key in CKA_STATE)
    if state:
        _check_state(shapes, read, len(rows) if same else len(rows) + len(columns), debiased=is_debiased(settings))
    return Comparison(method, rows, columns, same, settings, undefined, inputs, len(skipped), state)


def second_names(first: Sequence[str], second: Sequence[str], *, marked: bool = False) -> list[str]:
    """Names for the second side's ``second`` that none of ``first`` nor each other share: each one itself (with
    ``marked``, ``2:`` and itself) unless taken, then with ``2:`` in front until it is not.

    >>> second_names(["y", "2:y"], ["y", "x"]), second_names(["2:y"], ["y"], marked=True)
    (['2:2:y', 'x'], ['2:2:y'])
    """
    taken, names = set(first), []
    for label in second:
        name = f"{SECOND_SIDE}{label}" if marked else label
        while name in taken:
            name = f"{SECOND_SIDE}{name}"
        taken.add(name)
        names.append(name)
    return names


def _second_label(name: str, columns: set[str]) -> bool:
    """Whether ``name`` is a column's label with ``2:`` in front, once or more (:func:`second_names`)."""
    while name.startswith(SECOND_SIDE):
        name = name.removeprefix(SECOND_SIDE)
        if name in columns:
            return True
    return False


def _labels(metadata: Mapping[str, str], entry: str) -> list[str]:
    labels = json_entry(metadata, entry, list, "a list of labels")
    if not labels or not all(isinstance(label, str) for label in labels):
        raise ValueError(f"its '{entry}' metadata is not a list of labels")
    if len(labels) > MOST_LABELS:
        raise ValueError(f"its '{entry}' metadata lists {len(labels):,} labels, more than a side has ({MOST_LABELS:,})")
    seen: set[str] = set()
    for label in labels:
        if label in seen:
            raise ValueError(f"its '{entry}' metadata names {json.dumps(label)} twice")
        seen.add(label)
    return labels


def _counted(rows: int, columns: int) -> str:
    return f"{rows} row{'s' if rows != 1 else ''}, {columns} column{'s' if columns != 1 else ''}"


def _check_shape(shapes: Mapping[str, tuple[str, list[int]]], key: str, dtype: str, shape: list[int], why: str):
    found = shapes.get(key)
    if found is None:
        raise ValueError(f"'{key}' is missing")
    if (found[0], list(found[1])) != (dtype, shape):
        raise ValueError(f"'{key}' is {found[0]} {list(found[1])}, not {dtype} {shape} ({why})")


def is_debiased(settings: Mapping) -> bool:
    """Whether a linear-cka file's settings say its CKA is debiased (and it keeps :data:`DEBIASED_STATE`)."""
    return settings.get("estimator") == "debiased"


def _kept(settings: Mapping) -> tuple[str, ...]:
    """The sums a linear-cka file of these settings keeps."""
    return (*CKA_STATE, *DEBIASED_STATE) if is_debiased(settings) else CKA_STATE


def _check_state(
    shapes: Mapping[str, tuple[str, list[int]]], read: Callable[[str], Any], representations: int, *, debiased: bool
):
    """A linear-cka file's sums: all of them, of the shapes the representations' widths give, and a count that is
    not negative."""
    count, widths, mean, comoment = CKA_STATE
    _check_shape(shapes, count, "I64", [], "the rows seen")
    _check_shape(shapes, widths, "I64", [representations], f"the width of each of {representations} representations")
    if mean not in shapes:
        raise ValueError(f"'{mean}' is missing")
    dtype, shape = shapes[mean]
    if (dtype, len(shape)) != ("F64", 1):
        raise ValueError(f"'{mean}' is {dtype} {list(shape)}, not F64 [D] (every column's mean, one after the other)")
    total = shape[0]
    if total > MOST_COLUMNS:
        raise ValueError(f"'{mean}' has {total:,} columns, more than linear CKA keeps sums of ({MOST_COLUMNS:,})")
    _check_shape(shapes, comoment, "F64", [total, total], f"the co-moments of the {total} columns of '{mean}'")
    rows_seen = int(read(count))
    if rows_seen < 0:
        raise ValueError(f"'{count}' is {rows_seen}, and a count is never negative")
    sizes = [int(width) for width in read(widths).tolist()]
    if any(width < 0 for width in sizes) or sum(sizes) != total:
        raise ValueError(f"'{widths}' gives widths {sizes}, which do not add up to the {total} means of '{mean}'")
    if debiased:
        third, fourth = DEBIASED_STATE
        why = "about the column means, for each representation"
        _check_shape(shapes, third, "F64", [total, representations], f"each column's sums {why}")
        _check_shape(shapes, fourth, "F64", [representations] * 2, f"each pair's sums {why}")
