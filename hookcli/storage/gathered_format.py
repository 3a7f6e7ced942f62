"""What every file a gathering run writes (a statistics, comparison or ablation file) holds in its metadata besides
its own entries: :func:`gathered_metadata`."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

__all__ = ["gathered_metadata"]


def gathered_metadata(
    run: Mapping[str, str],
    *,
    kind: str,
    version: str,
    inputs: Sequence[str],
    skipped: Sequence[dict] = (),
    identity: Mapping | None = None,
    **entries: str,
) -> dict[str, str]:
    """The metadata of a file a gathering run writes: the run's (less its rows' entries), its ``kind`` and format
    ``version``, its own ``entries``, the inputs its rows came from and those skipped, and the run's ``identity``
    (a process of a run that another completed knows the file for its own)."""
    metadata = {
        **{key: value for key, value in run.items() if key not in ("inputs", "skipped", "shard")},
        "format": version,
        "kind": kind,
        **entries,
        "inputs": json.dumps(list(inputs)),
    }
    if skipped:
        metadata["skipped"] = json.dumps(list(skipped))
    if identity is not None:
        metadata["identity"] = json.dumps(dict(identity))
    return metadata
