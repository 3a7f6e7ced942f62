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
from collections.abc import Mapping, Sequence

from hookcli.compare_options import SIMILARITIES

__all__ = [
    "CKA_STATE",
    "COMPARE_FORMAT_VERSION",
    "COMPARE_KIND",
    "METHODS",
    "RDM",
    "check_comparison",
    "compare_metadata",
    "is_comparison",
]

COMPARE_FORMAT_VERSION = "5"
COMPARE_KIND = "compare"
#: What ``--method`` computes; each names the file's matrix.
METHODS = SIMILARITIES
#: The tensors of a linear-cka file's state: rows seen, each representation's width, the means of every column of
#: every representation, one after the other (first side, then second unless one side is compared with itself),
#: and their co-moments ``[D, D]``.
CKA_STATE = ("linear-cka@count", "linear-cka@widths", "linear-cka@mean", "linear-cka@comoment")
#: A representation's RDM in an ``rsa`` file: ``rdm@<label>``.
RDM = "rdm@"


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
    metadata = {
        **{key: value for key, value in run.items() if key not in ("inputs", "skipped", "shard")},
        "format": COMPARE_FORMAT_VERSION,
        "kind": COMPARE_KIND,
        "method": method,
        "rows": json.dumps(list(rows)),
        "columns": json.dumps(list(columns)),
        "settings": json.dumps(dict(settings)),
        "same": json.dumps(same),
        "inputs": json.dumps(list(inputs)),
    }
    if skipped:
        metadata["skipped"] = json.dumps(list(skipped))
    if undefined:
        metadata["undefined"] = json.dumps(list(undefined))
    if identity is not None:
        metadata["identity"] = json.dumps(dict(identity))
    return metadata


def check_comparison(metadata: Mapping[str, str], shapes: Mapping[str, tuple[str, list[int]]]) -> tuple[list, list]:
    """``(rows, columns)`` of a comparison file read from disk, whose ``shapes`` map each key to its dtype and
    shape; ValueError saying what is wrong (a crafted or damaged file)."""
    if metadata.get("format") != COMPARE_FORMAT_VERSION:
        raise ValueError(f"its format is {metadata.get('format')!r}, not {COMPARE_FORMAT_VERSION}")
    method = metadata.get("method")
    if method not in METHODS:
        raise ValueError(f"its method {method!r} is not one of {', '.join(METHODS)}")
    try:
        rows, columns = json.loads(metadata["rows"]), json.loads(metadata["columns"])
    except (KeyError, ValueError, RecursionError):
        raise ValueError("its rows or columns metadata is missing or not JSON") from None
    for name, labels in (("rows", rows), ("columns", columns)):
        if not isinstance(labels, list) or not labels or not all(isinstance(label, str) for label in labels):
            raise ValueError(f"its {name} are not a list of labels")
    if shapes.get(method) != ("F64", [len(rows), len(columns)]):
        raise ValueError(f"its '{method}' is {shapes.get(method)}, not F64 {[len(rows), len(columns)]}")
    return rows, columns
