"""A statistics file read back (:class:`StatsFile`), checked against its contract (:mod:`hookcli.storage.stats_format`)
before anything is drawn or printed from it.

:func:`read_stats` takes any reader (:class:`~hookcli.storage.reader.FeatureReader`) whose metadata says
``"kind": "stats"`` and refuses, with one :class:`~hookcli.errors.FeatureFileError` naming the tensor or metadata
entry and what is wrong, a file whose ``format`` is not 4, whose ``stats``, ``units`` or ``inputs`` metadata is
missing or malformed, that lacks a field a layer must have or holds one it must not, whose fields have another dtype
or shape than its units give, a negative count, examples that name rows outside ``inputs`` or positions outside the
maps, or quantiles that do not match their levels. Only the shapes in the header and the small index tensors
(``count``, ``top_rows``, ``top_at``) are read, a block of channels at a time, so a file of any size is checked in
bounded memory; values are read later, a field or a channel at a time.

>>> import numpy as np
>>> from hookcli.storage.features import Features
>>> units = {"fc": {"channels": 2, "spatial": [], "layout": "flat", "skip": 0, "row_shape": [2]}}
>>> metadata = {"format": "4", "kind": "stats", "inputs": '["a.jpg"]', "units": json.dumps(units),
...             "stats": '{"top": 1, "top_by": "max", "quantiles": [0.5], "pca": false}'}
>>> tensors = {"fc@count": np.array(1), "fc@top_values": np.ones((2, 1), "float32"),
...            "fc@top_rows": np.zeros((2, 1), "int64"), "fc@top_maps": np.ones((2, 1), "float32"),
...            "fc@quantiles": np.ones((2, 1)), **{f"fc@{n}": np.ones(2) for n in ("mean", "std", "min", "max")},
...            "fc@zeros": np.zeros(2)}
>>> stats = read_stats(Features(tensors, metadata))
>>> stats.layers["fc"].channels, stats.layers["fc"].examples, stats.levels
(2, 1, (0.5,))
>>> read_stats(Features({**tensors, "fc@top_rows": np.ones((2, 1), "int64")}, metadata))
Traceback (most recent call last):
...
hookcli.errors.FeatureFileError: 'memory' is a damaged statistics file: 'fc@top_rows' names row 1 (channel 0, \
example 0), and the file lists 1 input. Hint: write it again with hookcli stats
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from hookcli.errors import FeatureFileError
from hookcli.storage.fileformat import check_file_kind, json_entry
from hookcli.storage.reader import CheckedFile, FeatureReader
from hookcli.storage.stats_format import (
    FIELDS,
    MOST_CHANNELS,
    MOST_COVARIED,
    MOST_EXAMPLES,
    MOST_POSITIONS,
    STATS_FORMAT_VERSION,
    STATS_KIND,
    field_dtype,
    field_shape,
    layer_fields,
    stats_key,
)

__all__ = ["UNIT_LAYOUTS", "StatsFile", "StatsLayer", "read_stats"]

#: How a layer's rows were read as channels and positions (:class:`hookcli.statistics.units.UnitLayout`'s kinds).
UNIT_LAYOUTS = ("maps", "channels_last", "tokens", "flat")
#: The index tensors are checked in blocks of channels of about this many bytes.
_BLOCK_BYTES = 8 * 1024 * 1024
_REWRITE = "write it again with hookcli stats"


@dataclass(frozen=True)
class StatsLayer:
    """One layer key's statistics: ``channels`` channels over positions of shape ``spatial`` (none for a flat
    layer), read from rows of ``row_shape`` as ``layout`` says (``skip`` prefix tokens left out), ``count`` values a
    channel, ``examples`` examples kept a channel, and the covariance and components when ``pca``."""

    key: str
    channels: int
    spatial: tuple[int, ...]
    layout: str
    skip: int
    row_shape: tuple[int, ...]
    count: int
    examples: int
    pca: bool

    def tensor(self, field: str) -> str:
        """The key of this layer's ``field``."""
        return stats_key(self.key, field)


class StatsFile(CheckedFile):
    """A checked statistics file: its ``layers`` by key (in the file's order), the quantile ``levels``, the run's
    statistics ``options`` (``top``, ``top_by``, ``quantiles``, ``pca``), the ``inputs`` the examples' rows index
    and how many inputs were ``skipped``; :meth:`read` and :meth:`channel` read its values."""

    def __init__(
        self,
        features: FeatureReader,
        layers: Mapping[str, StatsLayer],
        options: Mapping,
        inputs: Sequence[str],
        skipped: int,
    ) -> None:
        self.features, self.layers, self.options = features, dict(layers), dict(options)
        self.inputs, self.skipped = list(inputs), skipped
        self.levels = tuple(float(level) for level in self.options["quantiles"])

    def read(self, key: str, field: str) -> np.ndarray:
        """Field ``field`` of layer ``key``, whole."""
        return self.features.read(stats_key(key, field))

    def channel(self, key: str, field: str, channel: int, first: int | slice | None = None) -> np.ndarray:
        """Channel ``channel``'s part of field ``field`` of layer ``key`` (its examples' maps, say); with ``first``,
        only its first ``first`` entries (examples) are read, or those of a slice."""
        entries = slice(0, first) if isinstance(first, int) else first
        return self.features.read(stats_key(key, field), channel, entries)


def read_stats(features: FeatureReader) -> StatsFile:
    """``features`` (whose metadata says ``"kind": "stats"``) as a :class:`StatsFile`, once every check of the
    module's description has passed; raises :class:`~hookcli.errors.FeatureFileError` naming the first that fails."""
    name = features.name
    check_file_kind(
        features.metadata,
        name,
        kind=STATS_KIND,
        version=STATS_FORMAT_VERSION,
        what="statistics file",
        again="compute the statistics again with hookcli stats",
    )
    options = _options(features)
    inputs = _json_entry(features, "inputs", list, "a list of input paths")
    if not all(isinstance(path, str) for path in inputs):
        raise _damaged(name, "its 'inputs' metadata is not a list of input paths")
    skipped = _json_entry(features, "skipped", list, "a list of skipped inputs", default=[])
    units = _json_entry(features, "units", dict, "an object of each layer key's units")
    if not units:
        raise _damaged(name, "its 'units' metadata names no layer")
    layers = {key: _layer_units(name, key, described) for key, described in units.items()}
    _check_tensors(features, layers, options["pca"])
    checked = {
        key: _checked_layer(features, key, described, len(options["quantiles"]), options["pca"], len(inputs))
        for key, described in layers.items()
    }
    return StatsFile(features, checked, options, inputs, len(skipped))


def _damaged(name: str, what: str) -> FeatureFileError:
    return FeatureFileError(f"'{name}' is a damaged statistics file: {what}", hint=_REWRITE)


def _json_entry(features: FeatureReader, entry: str, kind: type, what: str, *, default=None):
    """Metadata ``entry`` parsed from JSON, which must be of ``kind`` (``default`` when it is absent and may be)."""
    try:
        return json_entry(features.metadata, entry, kind, what, default=default)
    except ValueError as err:
        raise _damaged(features.name, str(err)) from None


def _whole(value, low: int = 0) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= low


def _options(features: FeatureReader) -> dict:
    """The ``stats`` metadata: the options the statistics were gathered with."""
    options = _json_entry(features, "stats", dict, "an object of the statistics' options")
    levels = options.get("quantiles")
    if not isinstance(levels, list) or not all(
        isinstance(q, int | float) and not isinstance(q, bool) and math.isfinite(q) and 0 <= q <= 1 for q in levels
    ):
        raise _damaged(features.name, "its 'stats' metadata gives no 'quantiles' levels between 0 and 1")
    if not isinstance(options.get("pca"), bool):
        raise _damaged(features.name, "its 'stats' metadata does not say whether it holds PCA ('pca': true or false)")
    if not _whole(options.get("top")) or not isinstance(options.get("top_by"), str):
        raise _damaged(features.name, "its 'stats' metadata does not say how many examples were kept ('top', 'top_by')")
    return options


def _layer_units(name: str, key: str, described) -> dict:
    """A ``units`` entry, checked: whole numbers where they belong, a known layout, and a row shape that holds the
    channels and positions as the layout reads them."""
    wrong = f"its 'units' entry of '{key}'"
    if not isinstance(described, dict):
        raise _damaged(name, f"{wrong} is not an object")
    for entry in ("channels", "spatial", "layout", "skip", "row_shape"):
        if entry not in described:
            raise _damaged(name, f"{wrong} has no '{entry}'")
    channels, spatial, layout, skip, row = (
        described[k] for k in ("channels", "spatial", "layout", "skip", "row_shape")
    )
    if not _whole(channels, 1) or not _whole(skip):
        raise _damaged(name, f"{wrong} gives 'channels' or 'skip' that is not a whole number (channels at least 1)")
    if channels > MOST_CHANNELS:
        raise _damaged(name, f"{wrong} gives {channels:,} channels, more than a layer has ({MOST_CHANNELS:,} at most)")
    if not all(isinstance(axes, list) and all(_whole(n, 1) for n in axes) for axes in (spatial, row)):
        raise _damaged(name, f"{wrong} gives 'spatial' or 'row_shape' that is not a list of sizes of 1 or more")
    if math.prod(spatial) > MOST_POSITIONS:
        raise _damaged(name, f"{wrong} gives positions {spatial}, more than a map has ({MOST_POSITIONS:,} at most)")
    if layout not in UNIT_LAYOUTS:
        raise _damaged(name, f"{wrong} has layout {json.dumps(layout)}, not one of {', '.join(UNIT_LAYOUTS)}")
    expected = {
        "maps": [channels, *spatial],
        "channels_last": [*spatial, channels],
        "tokens": [spatial[0] + skip, channels] if len(spatial) == 1 else None,
        "flat": [channels] if not spatial else None,
    }[layout]
    if (layout == "maps" and not 1 <= len(spatial) <= 3) or (layout == "channels_last" and len(spatial) != 2):
        expected = None
    if expected != row or (skip and layout != "tokens"):
        raise _damaged(
            name,
            f"{wrong} does not add up: {channels} channels over positions {spatial} (skip {skip}) laid out as "
            f"{layout} are not rows of {row}",
        )
    return {"channels": channels, "spatial": tuple(spatial), "layout": layout, "skip": skip, "row_shape": tuple(row)}


def _check_tensors(features: FeatureReader, layers: Mapping[str, dict], pca: bool) -> None:
    """Every tensor is a field of a layer of ``units``, and every layer has each field it must have."""
    present = set(features.keys())
    for tensor in features.keys():
        if features.ragged(tensor):
            raise _damaged(features.name, f"'{tensor}' has rows of their own shapes, and no statistic has")
        key, _, field = tensor.rpartition("@")
        if key not in layers:
            raise _damaged(features.name, f"'{tensor}' is not a field of a layer its 'units' metadata describes")
        allowed = layer_fields(pca=pca, spatial=layers[key]["spatial"])
        if field not in allowed:
            raise _damaged(
                features.name, f"'{tensor}' is not one of the fields of layer '{key}' ({', '.join(allowed)})"
            )
    for key, units in layers.items():
        for field in layer_fields(pca=pca, spatial=units["spatial"]):
            if stats_key(key, field) not in present:
                raise _damaged(features.name, f"'{stats_key(key, field)}' is missing")


def _checked_layer(features: FeatureReader, key: str, units: dict, levels: int, pca: bool, inputs: int) -> StatsLayer:
    """Layer ``key``'s fields checked against its units (dtypes, shapes), and its count and examples' rows and
    positions read and checked."""
    channels, spatial = units["channels"], units["spatial"]
    top_shape = list(features.shape(stats_key(key, "top_values")))
    if len(top_shape) != 2:
        raise _damaged(
            features.name,
            f"'{stats_key(key, 'top_values')}' has shape {top_shape}, not [{channels}, K] ({channels} channels, "
            "K examples each)",
        )
    examples = top_shape[1]
    if examples > MOST_EXAMPLES:
        raise _damaged(
            features.name,
            f"'{stats_key(key, 'top_values')}' keeps {examples:,} examples a channel, more than --top keeps "
            f"({MOST_EXAMPLES:,} at most)",
        )
    if pca and channels > MOST_COVARIED:
        raise _damaged(
            features.name,
            f"layer '{key}' has {channels:,} channels and their covariance, which is kept of {MOST_COVARIED:,} "
            "channels at most",
        )
    sizes = {"C": f"{channels} channels", "K": f"{examples} examples", "Q": f"{levels} quantile levels"}
    for field in layer_fields(pca=pca, spatial=spatial):
        tensor = stats_key(key, field)
        if features.dtype(tensor) != field_dtype(field):
            raise _damaged(features.name, f"'{tensor}' holds {features.dtype(tensor)} values, not {field_dtype(field)}")
        expected = field_shape(field, channels=channels, top=examples, spatial=spatial, levels=levels)
        shape = list(features.shape(tensor))
        if shape != expected:
            if field == "quantiles" and shape[:1] == [channels] and len(shape) == 2:
                what = f"has {shape[1]} quantiles a channel, and its 'stats' metadata lists {levels} levels"
            else:
                axes = [sizes.get(axis, f"positions {list(spatial)}") for axis in FIELDS[field][1]]
                what = f"has shape {shape}, not {expected}" + (f" ({', '.join(dict.fromkeys(axes))})" if axes else "")
            raise _damaged(features.name, f"'{tensor}' {what}")
    count = int(features.read(stats_key(key, "count")))
    if count < 0:
        raise _damaged(features.name, f"'{stats_key(key, 'count')}' is {count}, and a count is never negative")
    _check_examples(features, key, channels, examples, spatial, inputs)
    return StatsLayer(key, channels, spatial, units["layout"], units["skip"], units["row_shape"], count, examples, pca)


def _check_examples(
    features: FeatureReader, key: str, channels: int, examples: int, spatial: tuple[int, ...], inputs: int
) -> None:
    """Each example's row is one of the ``inputs`` and its position one of the maps', read a block at a time."""
    step = max(1, _BLOCK_BYTES // max(1, examples * 8 * (1 + len(spatial))))
    rows_key, at_key = stats_key(key, "top_rows"), stats_key(key, "top_at")
    for start in range(0, channels if examples else 0, step):
        rows = features.read_rows(rows_key, start, start + step)
        wrong = np.argwhere((rows < 0) | (rows >= inputs))
        if len(wrong):
            channel, example = (int(n) for n in wrong[0])
            plural = "s" if inputs != 1 else ""
            raise _damaged(
                features.name,
                f"'{rows_key}' names row {int(rows[channel, example])} (channel {start + channel}, example "
                f"{example}), and the file lists {inputs} input{plural}",
            )
        if not spatial:
            continue
        at = features.read_rows(at_key, start, start + step)
        wrong = np.argwhere(((at < 0) | (at >= np.asarray(spatial))).any(axis=2))
        if len(wrong):
            channel, example = (int(n) for n in wrong[0])
            raise _damaged(
                features.name,
                f"'{at_key}' puts example {example} of channel {start + channel} at "
                f"{at[channel, example].tolist()}, outside its positions {list(spatial)}",
            )
