"""The run that saved a file's features, read back from the file's metadata (:func:`recorded_run`), every entry
checked first: a file read from disk is untrusted, and ``stats`` and ``compare`` of saved features record this run
as their own. An entry a file does not have takes what a file hookcli did not write means (its rows numbered, its
model ``unknown``); an entry it has that is not what hookcli writes is refused with one
:class:`~hookcli.errors.FeatureFileError` naming it.

>>> metadata = {"model": "resnet18", "inputs": '["a.jpg", "b.jpg"]',
...             "layers": '{"layer4": {"key": "layer4", "type": "Sequential", "calls": 1, "keys": ["layer4"]}}'}
>>> found = recorded_run(metadata, "f.safetensors", keys=["layer4"], rows=2)
>>> found.record.model, found.record.inputs, found.facts.calls
('resnet18', ('a.jpg', 'b.jpg'), {'layer4': 1})
>>> recorded_run({**metadata, "inputs": "[1, 2]"}, "f.safetensors", keys=["layer4"], rows=2)
Traceback (most recent call last):
...
hookcli.errors.FeatureFileError: 'f.safetensors' has metadata hookcli cannot read: its 'inputs' metadata is not \
a list of input names. Hint: save the features again with hookcli extract, or remove the entry
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from hookcli.errors import FeatureFileError
from hookcli.inputs.preprocess import Preprocess
from hookcli.options.interventions import Intervention
from hookcli.storage.fileformat import RunFacts, RunRecord

__all__ = [
    "MOST_DEPTH",
    "RecordedRun",
    "bounded_json",
    "lenient_json",
    "listed_inputs",
    "listed_skipped",
    "recorded_edits",
    "recorded_layers",
    "recorded_run",
]

#: The deepest nesting of a metadata entry's JSON that is read (hookcli writes 3 at most).
MOST_DEPTH = 8
#: The most tokens before a vision transformer's patch tokens that a file may claim.
_MOST_PREFIX_TOKENS = 4096
_AGAIN = "save the features again with hookcli extract, or remove the entry"


@dataclass(frozen=True)
class RecordedRun:
    """What a file's metadata says of the run that saved it: the run (``record``; no command entries, no shard
    size), what its forward learnt (``facts``), its preprocessing (None when it records none) and how many inputs
    its metadata lists (``listed``: when not one a row, the rows are named by number). ``unit_widths``: the channels of
    each layer's output by its key, where the layer table says them (of every layer, chosen or not)."""

    record: RunRecord
    facts: RunFacts
    preprocess: Preprocess | None
    listed: int
    unit_widths: Mapping[str, int | None] = field(default_factory=dict)


def bounded_json(text: str, most_depth: int = MOST_DEPTH):
    """The value ``text`` holds as JSON; ValueError when it is not JSON, or nests deeper than ``most_depth``.

    >>> bounded_json('{"a": [1, 2]}')
    {'a': [1, 2]}
    >>> bounded_json("[[[1]]]", most_depth=2)
    Traceback (most recent call last):
    ...
    ValueError: it nests deeper than 2 levels
    """
    try:
        value = json.loads(text)
    except (ValueError, RecursionError, TypeError):
        raise ValueError("it is not JSON") from None
    level, depth = [value], 0
    while any(isinstance(item, dict | list) for item in level):
        depth += 1
        if depth > most_depth:
            raise ValueError(f"it nests deeper than {most_depth} levels")
        level = [
            inner
            for outer in level
            if isinstance(outer, dict | list)
            for inner in (outer.values() if isinstance(outer, dict) else outer)
        ]
    return value


def lenient_json(text: object) -> object:
    """The value metadata ``text`` holds as JSON (:func:`bounded_json`), or None where it holds none."""
    try:
        return bounded_json(text) if isinstance(text, str) else None
    except ValueError:
        return None


def recorded_layers(metadata: Mapping[str, str]) -> dict[str, str]:
    """The key a file's run recorded for each module path (its ``layers`` table); empty where the table is absent
    or not as hookcli writes it."""
    table = _layer_table(lenient_json(metadata.get("layers", "{}")))
    return {path: entry["key"] for path, entry in (table or {}).items()}


def listed_inputs(metadata: Mapping[str, str], name: str) -> list[str]:
    """The inputs a file's metadata lists, one a row (none when it lists none); FeatureFileError when its
    ``inputs`` entry is not a list of names."""
    return _entry(metadata, name, "inputs", _names, "a list of input names", [])


def listed_skipped(metadata: Mapping[str, str], name: str) -> list[dict]:
    """The inputs a file's metadata lists as skipped (``{"input", "error"}`` each); FeatureFileError when its
    ``skipped`` entry is not such a list."""
    return _entry(metadata, name, "skipped", _skipped, "a list of inputs skipped and why", [])


def recorded_run(metadata: Mapping[str, str], name: str, *, keys: Sequence[str], rows: int) -> RecordedRun:
    """The run that saved tensors ``keys`` (``rows`` rows each) of file ``name``, as its ``metadata`` says.

    A file that names no input for each row (one hookcli did not write) has
    its rows named by number. Layers the metadata does not describe are
    recorded under their keys.
    """
    inputs = listed = listed_inputs(metadata, name)
    if len(inputs) != rows:
        inputs = [f"row {number}" for number in range(rows)]
    layers = _entry(metadata, name, "layers", _layer_table, "a table of layers (key, type, calls, keys, units)", {})
    chosen = {path: entry for path, entry in layers.items() if entry["key"] in keys}
    paths = {path: entry["key"] for path, entry in chosen.items()}
    paths.update({key: key for key in keys if key not in paths.values()})
    categories = _entry(metadata, name, "categories", _names, "a list of class names", None)
    preprocess = _preprocess(metadata, name)
    fused = _entry(metadata, name, "fused", _count, "a count of convolutions", 0)
    record = RunRecord(
        model=metadata.get("model", "unknown"),
        weights=_entry(metadata, name, "weights", _object, "a JSON object", {}),
        layers=paths,
        layer_types={path: chosen[path]["type"] if path in chosen else "?" for path in paths},
        capture=metadata.get("capture", "output"),
        preprocess=_entry(metadata, name, "preprocess", _object, "a JSON object", {}),
        pool=metadata.get("pool", "none"),
        dtype=metadata.get("dtype", "float32"),
        precision=metadata.get("precision", "fp32"),
        memory_format=metadata.get("memory_format", "contiguous"),
        fuse=fused > 0,
        device=metadata.get("device", "cpu"),
        on_error="fail",
        shard_size=None,
        inputs=tuple(inputs),
        command={},
        family=metadata.get("family", "classification"),
        prefix_tokens=_entry(metadata, name, "prefix_tokens", _prefix_tokens, "a count of tokens", None),
        categories=tuple(categories) if categories is not None else None,
        layer_units={path: chosen[path].get("units") for path in paths if path in chosen},
    )
    units = {entry["key"]: entry.get("units") for entry in layers.values()}
    calls = {path: chosen[path]["calls"] if path in chosen else 0 for path in paths}
    return RecordedRun(record, RunFacts(calls=calls, fused=fused), preprocess, len(listed), units)


def _entry(metadata: Mapping[str, str], name: str, entry: str, read, what: str, default):
    """Metadata ``entry`` as ``read`` makes it from its JSON (None when it is not ``what``); ``default`` when the
    file has none."""
    text = metadata.get(entry)
    if text is None:
        return default
    try:
        value = read(bounded_json(text))
    except ValueError:
        value = None
    if value is None:
        raise _unreadable(name, f"its '{entry}' metadata is not {what}")
    return value


def _unreadable(name: str, what: str) -> FeatureFileError:
    return FeatureFileError(f"'{name}' has metadata hookcli cannot read: {what}", hint=_AGAIN)


def _names(value) -> list[str] | None:
    return value if isinstance(value, list) and all(isinstance(item, str) for item in value) else None


def _skipped(value) -> list[dict] | None:
    fine = isinstance(value, list) and all(
        isinstance(item, dict) and isinstance(item.get("input"), str) and isinstance(item.get("error"), str)
        for item in value
    )
    return value if fine else None


def _object(value) -> dict | None:
    return value if isinstance(value, dict) else None


def _whole(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _count(value) -> int | None:
    return value if _whole(value) else None


def _prefix_tokens(value) -> int | None:
    return value if _whole(value) and value <= _MOST_PREFIX_TOKENS else None


def _layer_table(value) -> dict | None:
    """The metadata's layer table, when every layer is described as hookcli writes it."""
    if not isinstance(value, dict):
        return None
    for entry in value.values():
        if (
            not isinstance(entry, dict)
            or not isinstance(entry.get("key"), str)
            or not isinstance(entry.get("type", "?"), str)
            or not _whole(entry.get("calls", 0))
            or _names(entry.get("keys", [])) is None
            or not (entry.get("units") is None or _whole(entry["units"]))
        ):
            return None
    return {path: {"type": "?", "calls": 0, **entry} for path, entry in value.items()}


def _preprocess(metadata: Mapping[str, str], name: str) -> Preprocess | None:
    try:
        return Preprocess.from_metadata(metadata.get("preprocess"))
    except ValueError as err:
        raise _unreadable(name, f"its 'preprocess' metadata is not what hookcli writes ({err})") from None


def recorded_edits(metadata) -> list[str]:
    """The ``--intervene`` specs of the edits a file's ``interventions`` metadata records, written back in order;
    none when it records none, or records them otherwise than the format says (the metadata is untrusted)."""
    found = lenient_json(metadata.get("interventions"))
    edits = found.get("edits") if isinstance(found, dict) else None
    specs: list[str] = []
    for edit in edits if isinstance(edits, list) else []:
        try:
            units = edit.get("units")
            specs.append(
                Intervention(
                    layer=str(edit["layer"]),
                    units=None if units is None else tuple(int(unit) for unit in units),
                    edit=str(edit["edit"]),
                    numbers=tuple(float(number) for number in edit.get("numbers", ())),
                    file=None if edit.get("file") is None else str(edit["file"]),
                    key=None if edit.get("key") is None else str(edit["key"]),
                    row=None if edit.get("row") is None else int(edit["row"]),
                ).text
            )
        except (AttributeError, KeyError, TypeError, ValueError, OverflowError):
            return []
    return specs
