"""The file ``hookcli ablate`` writes, format 6: each unit's effect on the model's output when it alone is ablated.

For the ablated layer's key ``K`` and ``U`` units (of ``C``) measured over ``n`` inputs, on an output of ``classes``
values a row:

- ``K@units`` int64 ``[U]``: the units, as the layer counts them;
- ``K@count`` int64 ``[]``: the inputs measured;
- ``K@logit_change``, ``K@logit_change_std`` F64 ``[U]``: the mean and standard deviation over the inputs of the
  change of the predicted class's logit (the class the model as it is predicts for that input);
- ``K@prob_change``, ``K@prob_change_std`` F64 ``[U]``: the same for its softmax probability;
- ``K@flips`` F64 ``[U]``: the share of inputs whose top class changes;
- ``K@kl`` F64 ``[U]``: the mean KL divergence of the ablated output's distribution from the model's;
- ``K@class_effect`` F64 ``[U, classes]``: the mean change of each class's logit.

Metadata: the run's (model, weights, layers, preprocessing…), ``"kind": "ablate"``, ``"format": "6"``, ``ablate``
(JSON: the layer, its key, how units are ablated and what that read, the output measured), ``inputs``, ``skipped``
and ``identity``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from hookcli.storage.gathered_format import gathered_metadata

__all__ = [
    "ABLATION_FIELDS",
    "ABLATION_FORMAT_VERSION",
    "ABLATION_KIND",
    "ablation_key",
    "ablation_metadata",
    "is_ablation",
]

ABLATION_FORMAT_VERSION = "6"
ABLATION_KIND = "ablate"
#: The tensors of an ablated layer, after its key and ``@``.
ABLATION_FIELDS = (
    "units",
    "count",
    "logit_change",
    "logit_change_std",
    "prob_change",
    "prob_change_std",
    "flips",
    "kl",
    "class_effect",
)


def is_ablation(metadata: Mapping[str, str]) -> bool:
    """Whether a file's metadata says ``hookcli ablate`` wrote it."""
    return metadata.get("kind") == ABLATION_KIND


def ablation_key(key: str, field: str) -> str:
    """The tensor of ``field`` of layer ``key`` (``layer4@flips``)."""
    return f"{key}@{field}"


def ablation_metadata(
    run: Mapping[str, str],
    *,
    ablate: Mapping[str, Any],
    inputs: Sequence[str],
    skipped: Sequence[dict[str, Any]] = (),
    identity: Mapping[str, Any] | None = None,
) -> dict[str, str]:
    """An ablation file's metadata: the run's (``run``), what was ablated and measured (``ablate``), the inputs and
    those skipped, and the run's ``identity``."""
    return gathered_metadata(
        run,
        kind=ABLATION_KIND,
        version=ABLATION_FORMAT_VERSION,
        inputs=inputs,
        skipped=skipped,
        identity=identity,
        ablate=json.dumps(dict(ablate)),
    )
