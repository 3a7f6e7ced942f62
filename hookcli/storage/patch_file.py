"""A patching file read back (:class:`PatchFile`), checked against its contract (:mod:`hookcli.storage.patch_format`)
before anything is drawn from it: its kind and format, its ``patch`` metadata, and the dtype and shape of every
tensor (from the header: nothing large is read to check it)."""

from __future__ import annotations

from typing import Any

import numpy as np

from hookcli.errors import FeatureFileError
from hookcli.storage.fileformat import check_file_kind
from hookcli.storage.patch_format import PAIR_KEYS, PATCH_FIELDS, PATCH_FORMAT_VERSION, PATCH_KIND, patch_key
from hookcli.storage.reader import CheckedFile, FeatureReader
from hookcli.storage.recorded_run import lenient_json

__all__ = ["MOST_PAIRS", "PatchFile", "read_patch"]

#: The most pairs and positions a file may declare.
MOST_PAIRS = 1 << 28
_REWRITE = "write it again with hookcli patch"


class PatchFile(CheckedFile):
    """A checked patching file: its layers' ``keys`` in order, the ``pairs`` it measured, each key's ``positions``
    (``()`` where the layer was patched whole), and ``patch``, what its metadata says was patched."""

    def __init__(
        self,
        features: FeatureReader,
        keys: list[str],
        pairs: int,
        positions: dict[str, tuple[int, ...]],
        patch: dict[str, Any],
    ) -> None:
        self.features, self.keys, self.pairs, self.positions, self.patch = features, keys, pairs, positions, patch

    def read(self, key: str, field: str) -> np.ndarray:
        """Layer ``key``'s ``field`` (:data:`~hookcli.storage.patch_format.PATCH_FIELDS`), whole."""
        return self.features.read(patch_key(key, field))

    def pair(self, field: str) -> np.ndarray:
        """A pair's measure: ``source_class``, ``target_class``, ``source_metric`` or ``target_metric``."""
        return self.features.read(f"pairs@{field}")


def read_patch(features: FeatureReader) -> PatchFile:
    """``features`` (whose metadata says ``"kind": "patch"``) as a :class:`PatchFile`; raises
    :class:`~hookcli.errors.FeatureFileError` naming the first thing that is not as the format says."""
    name = features.name
    check_file_kind(
        features.metadata,
        name,
        kind=PATCH_KIND,
        version=PATCH_FORMAT_VERSION,
        what="patching file",
        again="patch again with hookcli patch",
    )
    patch = lenient_json(features.metadata.get("patch"))
    keys = patch.get("keys") if isinstance(patch, dict) else None
    if not isinstance(keys, dict) or not keys or not all(isinstance(key, str) for key in keys.values()):
        raise _damaged(name, "its 'patch' metadata does not name the layers' keys")
    ordered = list(dict.fromkeys(keys.values()))
    expected = set(PAIR_KEYS) | {patch_key(key, field) for key in ordered for field in PATCH_FIELDS}
    if set(features.keys()) != expected:
        missing = sorted(expected - set(features.keys())) or sorted(set(features.keys()) - expected)
        raise _damaged(name, f"it does not hold the tensors its layers and pairs make ({missing[0]})")
    pairs = features.shape(PAIR_KEYS[0])
    if len(pairs) != 1 or not 0 < pairs[0] <= MOST_PAIRS:
        raise _damaged(name, f"'{PAIR_KEYS[0]}' is not one class a pair")
    for key in PAIR_KEYS:
        _checked(features, key, "I64" if key.endswith("_class") else "F64", pairs)
    inputs = lenient_json(features.metadata.get("inputs"))
    if not isinstance(inputs, list) or len(inputs) != 2 * pairs[0] or not all(isinstance(i, str) for i in inputs):
        raise _damaged(
            name, f"its 'inputs' metadata does not name a source and a target for each of its {pairs[0]} pairs"
        )
    positions = {}
    for key in ordered:
        shape = features.shape(patch_key(key, "change"))
        if not 1 <= len(shape) <= 4 or shape[0] != pairs[0] or any(n <= 0 or n > MOST_PAIRS for n in shape):
            raise _damaged(name, f"'{patch_key(key, 'change')}' is not a value (or a map) a pair")
        _checked(features, patch_key(key, "change"), "F64", shape)
        _checked(features, patch_key(key, "effect"), "F64", shape)
        _checked(features, patch_key(key, "mean_effect"), "F64", shape[1:])
        positions[key] = tuple(shape[1:])
    assert isinstance(patch, dict), "checked with its keys"
    return PatchFile(features, ordered, pairs[0], positions, patch)


def _checked(features: FeatureReader, name: str, dtype: str, shape: list[int]) -> None:
    if features.dtype(name) != dtype or features.shape(name) != list(shape):
        raise _damaged(features.name, f"'{name}' is {features.dtype(name)} {features.shape(name)}, not {dtype} {shape}")


def _damaged(name: str, what: str) -> FeatureFileError:
    return FeatureFileError(f"'{name}' is a damaged patching file: {what}", hint=_REWRITE)
