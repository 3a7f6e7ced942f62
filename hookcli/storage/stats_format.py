"""The statistics file contract: what ``hookcli stats`` writes, described once (``docs/file-format.md`` documents
it), and the checks a statistics file read from disk must pass.

A statistics file is a safetensors file whose metadata says ``"kind":
"stats"`` and ``"format": "4"``. For each layer key ``K`` of ``C``
channels it holds the tensors of :data:`FIELDS`, named ``K@<field>``: the
count, mean, std, min, max and share of zeros of every value of each channel,
its quantiles at the levels of the ``stats`` metadata, its top examples (values,
rows into ``inputs``, positions, maps), and, unless the run left it out, the
pooled channels' covariance and principal components. The metadata's ``units``
says for each key how its rows were read as channels and positions
(:class:`hookcli.statistics.units.UnitLayout`); the rest is the run's metadata
(:mod:`hookcli.storage.fileformat`), with the ``inputs`` the rows came from and
those ``skipped``.

Nothing here imports torch or numpy.

>>> stats_key("layer3", "top_maps"), field_shape("top_maps", channels=8, top=3, spatial=[7, 7], levels=2)
('layer3@top_maps', [8, 3, 7, 7])
>>> layer_fields(pca=False, spatial=[])[-3:]
['top_values', 'top_rows', 'top_maps']
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from hookcli.storage.gathered_format import gathered_metadata

__all__ = [
    "COMPONENTS",
    "MOST_CHANNELS",
    "MOST_COVARIED",
    "MOST_EXAMPLES",
    "MOST_POSITIONS",
    "FIELDS",
    "PART_ROWS",
    "component_key",
    "STATS_PART",
    "STATS_FORMAT_VERSION",
    "STATS_KIND",
    "field_dtype",
    "field_shape",
    "is_component_key",
    "is_stats",
    "layer_fields",
    "stats_key",
    "stats_metadata",
]

STATS_FORMAT_VERSION = "4"
#: The most channels a layer of a statistics file has (1,048,576, forty times a flattened vgg16 map): a layer's
#: per-channel fields are read whole (8 MiB each at the most), so a file declaring more is refused rather than read.
MOST_CHANNELS = 1 << 20
#: The most positions a channel's map has (4,194,304: a 2048 x 2048 map), and the most examples a channel keeps:
#: a channel's examples' maps are read whole.
MOST_POSITIONS, MOST_EXAMPLES = 1 << 22, 1000
#: The widest layer whose covariance and principal components are kept (8,192 channels: 512 MiB a matrix).
MOST_COVARIED = 8192
STATS_KIND = "stats"
#: The ``kind`` of a part of a statistics file still being computed (a shard of ``<output>.parts/``): its tensors
#: are accumulators' states, and :data:`PART_ROWS` lists the inputs it has rows of.
STATS_PART = "stats-part"
PART_ROWS = "@rows"

#: Each field: its safetensors dtype, and its shape in terms of the channels ``C``, the examples kept ``K``, the
#: quantile levels ``Q`` and the positions' shape ``S`` (``*S``: its axes; ``len(S)``: their number).
FIELDS: dict[str, tuple[str, tuple[str, ...]]] = {
    "count": ("I64", ()),
    "mean": ("F64", ("C",)),
    "std": ("F64", ("C",)),
    "min": ("F64", ("C",)),
    "max": ("F64", ("C",)),
    "zeros": ("F64", ("C",)),
    "quantiles": ("F64", ("C", "Q")),
    "top_values": ("F32", ("C", "K")),
    "top_rows": ("I64", ("C", "K")),
    "top_at": ("I64", ("C", "K", "len(S)")),
    "top_maps": ("F32", ("C", "K", "*S")),
    "cov": ("F64", ("C", "C")),
    "pca_values": ("F64", ("C",)),
    "pca_vectors": ("F64", ("C", "C")),
}
#: The fields a run without ``--pca`` leaves out, and the one a layer without positions has no use for.
PCA_FIELDS = ("cov", "pca_values", "pca_vectors")
POSITION_FIELDS = ("top_at",)


#: What the key of a layer of principal components (``stats --components``) adds to its layer's key.
COMPONENTS = "#pc"


def component_key(key: str) -> str:
    """The key of layer ``key``'s principal components, gathered as a layer of their own."""
    return f"{key}{COMPONENTS}"


def is_component_key(key: str) -> bool:
    return key.endswith(COMPONENTS)


def stats_key(key: str, field: str) -> str:
    """The tensor that holds ``field`` of layer key ``key``."""
    return f"{key}@{field}"


def layer_fields(*, pca: bool, spatial: Sequence[int]) -> list[str]:
    """The fields a layer's statistics hold: every one of :data:`FIELDS` but the covariance and components
    without ``pca``, and the positions of the examples for a layer without any."""
    return [name for name in FIELDS if (pca or name not in PCA_FIELDS) and (spatial or name not in POSITION_FIELDS)]


def field_dtype(field: str) -> str:
    return FIELDS[field][0]


def field_shape(field: str, *, channels: int, top: int, spatial: Sequence[int], levels: int) -> list[int]:
    """The shape ``field`` has for a layer of ``channels`` channels with ``top`` examples kept, positions of shape
    ``spatial`` and ``levels`` quantile levels."""
    sizes = {"C": [channels], "K": [top], "Q": [levels], "len(S)": [len(spatial)], "*S": list(spatial)}
    return [n for axis in FIELDS[field][1] for n in sizes[axis]]


def is_stats(metadata: Mapping[str, str]) -> bool:
    """Whether a file's metadata describes a statistics file."""
    return metadata.get("kind") == STATS_KIND


def stats_metadata(
    run: Mapping[str, str],
    *,
    options: Mapping,
    units: Mapping[str, Mapping],
    inputs: Sequence[str],
    skipped: Sequence[dict] = (),
    identity: Mapping | None = None,
) -> dict[str, str]:
    """A statistics file's metadata: the run's (``run``, as :func:`hookcli.storage.fileformat.run_metadata` makes
    it), the statistics' ``options`` (``top``, ``top_by``, ``quantiles``, ``pca``), each key's ``units``
    (``channels``, ``spatial``, ``layout``, ``skip``, ``row_shape``), the inputs the rows came from and those
    skipped, and the run's ``identity`` (:func:`hookcli.storage.fileformat.identity`: a process of a run that
    another process completed knows the file for its own)."""
    return gathered_metadata(
        run,
        kind=STATS_KIND,
        version=STATS_FORMAT_VERSION,
        inputs=inputs,
        skipped=skipped,
        identity=identity,
        stats=json.dumps(dict(options)),
        units=json.dumps({key: dict(value) for key, value in units.items()}),
    )
