"""A comparison file read back (:class:`ComparisonFile`), checked against its contract
(:func:`hookcli.storage.compare_format.check_comparison`) before anything is drawn or printed from it.

:func:`read_comparison` takes any reader (:class:`~hookcli.storage.reader.FeatureReader`) whose metadata says
``"kind": "compare"`` and refuses, with one :class:`~hookcli.errors.FeatureFileError` naming the tensor or
metadata entry and what is wrong, a file of another format or a damaged one. Only the header is read for this,
and of a linear-cka file's sums the count and the widths (one number a representation); the matrix is read
when asked for (:meth:`ComparisonFile.matrix`).

>>> import numpy as np
>>> from hookcli.storage.compare_format import compare_metadata
>>> from hookcli.storage.features import Features
>>> metadata = compare_metadata({"model": "resnet18"}, method="rsa", rows=["a", "b"], columns=["a", "b"],
...                             settings={"pool": "avg"}, inputs=["x.jpg", "y.jpg", "z.jpg"], same=True)
>>> found = read_comparison(Features({"rsa": np.eye(2)}, metadata))
>>> found.rows, found.matrix().tolist(), found.sources()
(['a', 'b'], [[1.0, 0.0], [0.0, 1.0]], ('resnet18', 'resnet18'))
>>> read_comparison(Features({"rsa": np.eye(2, dtype="float32")}, metadata))
Traceback (most recent call last):
...
hookcli.errors.FeatureFileError: 'memory' is a damaged comparison file: 'rsa' is F32 [2, 2], not F64 [2, 2] \
(2 rows, 2 columns). Hint: write it again with hookcli compare
"""

from __future__ import annotations

import json
from pathlib import PurePath

import numpy as np

from hookcli.errors import FeatureFileError
from hookcli.storage.compare_format import COMPARE_FORMAT_VERSION, COMPARE_KIND, Comparison, check_comparison
from hookcli.storage.fileformat import check_file_kind
from hookcli.storage.reader import CheckedFile, FeatureReader

__all__ = ["ComparisonFile", "read_comparison"]

_REWRITE = "write it again with hookcli compare"
#: Methods whose values are not bounded by 1 (a mean of unbiased estimates may pass it a little).
_UNBOUNDED = ("minibatch-cka",)
#: How far past 1 rounding takes a similarity that is at most 1.
_ROUNDING = 1e-6


class ComparisonFile(CheckedFile):
    """A checked comparison file: the ``method``, the labels of the matrix's ``rows`` and ``columns``, whether one
    side was compared with itself (``same``), the method's ``settings``, the ``undefined`` labels (no spread), the
    ``inputs`` and how many were ``skipped``; :meth:`matrix` reads the similarities."""

    def __init__(self, features: FeatureReader, checked: Comparison) -> None:
        self.features = features
        self.method, self.rows, self.columns, self.same = checked.method, checked.rows, checked.columns, checked.same
        self.settings, self.undefined = checked.settings, checked.undefined
        self.inputs, self.skipped = checked.inputs, checked.skipped

    def matrix(self) -> np.ndarray:
        """The similarities, float64 ``[rows, columns]``: NaN where undefined. A value no method gives (infinite,
        or beyond 1 in size where the method's values are bounded by 1) is refused."""
        values = self.features.read(self.method)
        bound = np.inf if self.method in _UNBOUNDED else 1 + _ROUNDING
        wrong = np.argwhere(~np.isnan(values) & ~(np.abs(values) <= bound))
        if len(wrong):
            i, j = wrong[0]
            said = "finite" if bound == np.inf else "between -1 and 1"
            raise _damaged(
                self.name,
                f"'{self.method}' holds {float(values[i, j])} at row '{self.rows[i]}', column '{self.columns[j]}' "
                f"({len(wrong):,} such), and its similarities are {said}",
            )
        return values

    def sources(self) -> tuple[str, str]:
        """What the rows' and the columns' representations are of: the models run, or the saved features read (as
        the run recorded them; ``?`` where the metadata does not say); one model run with two sets of weights is told
        apart by a few words on each side's weights, and a side ``--intervene`` edited says so."""
        saved = _parsed(self.metadata.get("compare_of"))
        if isinstance(saved, list) and saved and all(isinstance(source, dict) for source in saved):
            names = [str(source.get("source", "?")) for source in saved]
            return names[0], names[-1]
        first = str(self.metadata.get("model", "?"))
        other = _parsed(self.metadata.get("compare_with"))
        other = other if isinstance(other, dict) else {}
        second = str(other.get("model", first))
        edits = _parsed(self.metadata.get("interventions"))
        edited = " (edited)" if isinstance(edits, dict) and edits.get("edits") else ""  # the first side's alone
        tags = _weights_tag(_parsed(self.metadata.get("weights"))), _weights_tag(other.get("weights"))
        if second != first or None in tags or tags[0] == tags[1]:
            return first + edited, second
        return f"{first}{edited} ({tags[0]})", f"{second} ({tags[1]})"


def read_comparison(features: FeatureReader) -> ComparisonFile:
    """``features`` (whose metadata says ``"kind": "compare"``) as a :class:`ComparisonFile`, once every check of
    :func:`~hookcli.storage.compare_format.check_comparison` has passed; raises
    :class:`~hookcli.errors.FeatureFileError` naming the first that fails."""
    name = features.name
    check_file_kind(
        features.metadata,
        name,
        kind=COMPARE_KIND,
        version=COMPARE_FORMAT_VERSION,
        what="comparison file",
        again="compare again with hookcli compare",
    )
    ragged = next((key for key in features.keys() if features.ragged(key)), None)
    if ragged is not None:
        raise _damaged(name, f"'{ragged}' has rows of their own shapes, and a comparison's tensors have none")
    shapes = {key: (features.dtype(key), features.shape(key)) for key in features.keys()}
    try:
        checked = check_comparison(features.metadata, shapes, features.read)
    except ValueError as err:
        raise _damaged(name, str(err)) from None
    return ComparisonFile(features, checked)


def _damaged(name: str, what: str) -> FeatureFileError:
    return FeatureFileError(f"'{name}' is a damaged comparison file: {what}", hint=_REWRITE)


def _weights_tag(weights) -> str | None:
    """A few words telling one side's weights (a run's ``weights`` entry) from the other's when both sides are the
    same model: ``random, seed 1``, a file's name, a pretrained set's name; None when the entry says nothing."""
    if not isinstance(weights, dict):
        return None
    source = weights.get("source")
    if source == "none":
        return f"random, seed {weights.get('seed', '?')}"
    if source in ("file", "folder") and isinstance(weights.get("path"), str):
        return PurePath(weights["path"]).name
    if source == "module" and isinstance(weights.get("sha256"), str):
        return f"weights {weights['sha256'][:12]}"
    for entry in ("name", "repo"):
        if isinstance(weights.get(entry), str):
            return str(weights[entry]).rsplit(".", 1)[-1] if source == "torchvision" else str(weights[entry])
    return None


def _parsed(text: str | None):
    """A metadata entry's JSON, or None when it is absent or not JSON."""
    try:
        return None if text is None else json.loads(text)
    except (ValueError, RecursionError):
        return None
