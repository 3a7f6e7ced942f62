"""The file ``hookcli patch`` writes, format 7: how far patching each layer (or each of its positions) of a pair's
target with its source's activations moves the target's output toward the source's.

For ``P`` pairs (a source input, then its target: the file's ``inputs`` hold them in that order) and each patched
layer's key ``K``:

- ``pairs@source_class``, ``pairs@target_class`` I64 ``[P]``: the classes y_s and y_t the model predicts for the
  source and for the target;
- ``pairs@source_metric``, ``pairs@target_metric`` F64 ``[P]``: the measure m = z[y_s] − z[y_t] (the logit of the
  source's class less the target's) on the source and on the target;
- ``K@change`` F64 ``[P]``, or ``[P, *positions]`` with positions (a map's ``[H, W]``, a sequence's ``[T]``, every
  token): m of the target patched less m of the target, the two measured in one call;
- ``K@effect`` F64, the shape of ``K@change``: the change over m(source) − m(target), the normalised logit
  difference: 0 where the patch does nothing, 1 where it moves m as far as the source's; NaN where m(source) =
  m(target) (a pair the model gives one class);
- ``K@mean_effect`` F64 ``[]`` or ``[*positions]``: the mean effect over the pairs where it is defined (NaN where
  none is).

Metadata: the run's (model, weights, layers, preprocessing…), ``"kind": "patch"``, ``"format": "7"``, ``patch``
(JSON: the layers and their keys, whether positions were patched one at a time, each key's positions), ``inputs``
and ``identity`` (``skipped`` is never written: a pair is never split).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from hookcli.storage.gathered_format import gathered_metadata

__all__ = [
    "PAIR_FIELDS",
    "PAIR_KEYS",
    "PATCH_FIELDS",
    "PATCH_FORMAT_VERSION",
    "PATCH_KIND",
    "is_patch",
    "patch_key",
    "patch_metadata",
]

PATCH_FORMAT_VERSION = "7"
PATCH_KIND = "patch"
#: What is measured of each pair, whatever was patched: the classes predicted for the source and the target, and m
#: on each; the file's tensors of them (``pairs@source_class``…).
PAIR_FIELDS = ("source_class", "target_class", "source_metric", "target_metric")
PAIR_KEYS = tuple(f"pairs@{field}" for field in PAIR_FIELDS)
#: The tensors of a patched layer, after its key and ``@``.
PATCH_FIELDS = ("change", "effect", "mean_effect")


def is_patch(metadata: Mapping[str, str]) -> bool:
    """Whether a file's metadata says ``hookcli patch`` wrote it."""
    return metadata.get("kind") == PATCH_KIND


def patch_key(key: str, field: str) -> str:
    """The tensor of ``field`` of layer ``key`` (``layer3@effect``)."""
    return f"{key}@{field}"


def patch_metadata(
    run: Mapping[str, str],
    *,
    patch: Mapping[str, Any],
    inputs: Sequence[str],
    skipped: Sequence[dict[str, Any]] = (),
    identity: Mapping[str, Any] | None = None,
) -> dict[str, str]:
    """A patching file's metadata: the run's (``run``), what was patched (``patch``), the inputs in pairs and those
    skipped, and the run's ``identity``."""
    return gathered_metadata(
        run,
        kind=PATCH_KIND,
        version=PATCH_FORMAT_VERSION,
        inputs=inputs,
        skipped=skipped,
        identity=identity,
        patch=json.dumps(dict(patch)),
    )
