"""An ablation file read back (:class:`AblationFile`), checked against its contract
(:mod:`hookcli.storage.ablation_format`) before anything is drawn from it: its kind and format, its ``ablate``
metadata, and the dtype and shape of every tensor (from the header: nothing large is read to check it).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from hookcli.errors import FeatureFileError
from hookcli.storage.ablation_format import (
    ABLATION_FIELDS,
    ABLATION_FORMAT_VERSION,
    ABLATION_KIND,
    ablation_key,
)
from hookcli.storage.fileformat import check_file_kind
from hookcli.storage.reader import CheckedFile, FeatureReader
from hookcli.storage.recorded_run import lenient_json

__all__ = ["MOST_CLASSES", "MOST_UNITS", "AblationFile", "read_ablation"]

#: The most units and output values a file may declare (far beyond any layer or classifier).
MOST_UNITS = 1 << 20
MOST_CLASSES = 1 << 20
_REWRITE = "write it again with hookcli ablate"


class AblationFile(CheckedFile):
    """A checked ablation file: the layer's ``key``, its ``units`` (as the layer counts them), the number of
    output values (``classes``) and their ``categories`` (names, or None), the inputs ``count``ed, and ``ablate``,
    what was ablated and measured."""

    def __init__(
        self,
        features: FeatureReader,
        key: str,
        units: np.ndarray,
        classes: int,
        categories: list[str] | None,
        ablate: dict[str, Any],
    ) -> None:
        self.features, self.key, self.units, self.classes = features, key, units, classes
        self.categories, self.ablate = categories, ablate

    def read(self, field: str) -> np.ndarray:
        """The layer's ``field`` (:data:`~hookcli.storage.ablation_format.ABLATION_FIELDS`), whole."""
        return self.features.read(ablation_key(self.key, field))


def read_ablation(features: FeatureReader) -> AblationFile:
    """``features`` (whose metadata says ``"kind": "ablate"``) as an :class:`AblationFile`; raises
    :class:`~hookcli.errors.FeatureFileError` naming the first thing that is not as the format says."""
    name = features.name
    check_file_kind(
        features.metadata,
        name,
        kind=ABLATION_KIND,
        version=ABLATION_FORMAT_VERSION,
        what="ablation file",
        again="ablate again with hookcli ablate",
    )
    ablate = lenient_json(features.metadata.get("ablate"))
    if not isinstance(ablate, dict) or not isinstance(ablate.get("key"), str):
        raise _damaged(name, "its 'ablate' metadata does not name the layer's key")
    key = ablate["key"]
    expected = {ablation_key(key, field) for field in ABLATION_FIELDS}
    if set(features.keys()) != expected:
        missing = sorted(expected - set(features.keys())) or sorted(set(features.keys()) - expected)
        raise _damaged(name, f"it does not hold the tensors of layer '{key}' ({missing[0]})")
    units = _checked(features, key, "units", "I64", None)[0]
    classes = features.shape(ablation_key(key, "class_effect"))
    if len(classes) != 2 or classes[0] != units or not 0 < classes[1] <= MOST_CLASSES or not 0 < units <= MOST_UNITS:
        raise _damaged(name, f"'{ablation_key(key, 'class_effect')}' is not [units, classes]")
    _checked(features, key, "count", "I64", [])
    for field in ABLATION_FIELDS[2:-1]:
        _checked(features, key, field, "F64", [units])
    _checked(features, key, "class_effect", "F64", [units, classes[1]])
    read_units = features.read(ablation_key(key, "units"))
    if (read_units < 0).any() or len(np.unique(read_units)) != units:
        raise _damaged(name, f"'{ablation_key(key, 'units')}' does not list each unit once, counted from 0")
    listed = lenient_json(features.metadata.get("categories"))
    # None: an output without class names (an embedding, a layer's), or names of another output.
    categories = listed if isinstance(listed, list) and len(listed) == classes[1] else None
    if categories is not None and not all(isinstance(name, str) for name in categories):
        categories = None
    return AblationFile(features, key, read_units, classes[1], categories, ablate)


def _checked(features: FeatureReader, key: str, field: str, dtype: str, shape: list[int] | None) -> list[int]:
    """The shape of the field's tensor, refused when its dtype or shape is not the format's."""
    name = ablation_key(key, field)
    found = features.shape(name)
    if features.dtype(name) != dtype or (shape is not None and found != shape) or (shape is None and len(found) != 1):
        raise _damaged(features.name, f"'{name}' is {features.dtype(name)} {found}, not {dtype} {shape or '[units]'}")
    return found


def _damaged(name: str, what: str) -> FeatureFileError:
    return FeatureFileError(f"'{name}' is a damaged ablation file: {what}", hint=_REWRITE)
