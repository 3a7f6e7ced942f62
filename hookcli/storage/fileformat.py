"""The file contract: what hookcli writes, described once.

Everything a reader of hookcli's files relies on is built here and nowhere else (docs/file-format.md says it):

- :data:`FORMAT_VERSION`, the ``format`` entry of every file;
- :class:`RunRecord`, the description of a run, and where each of its fields goes: into every file's metadata, into
  the *identity* that a shard folder is resumed by, or both. :func:`run_metadata` and :func:`identity` read the same
  fields, so an option added to the record reaches both or is left out of one on purpose, never by accident;
- a single file's metadata (:func:`file_metadata`), a shard's (:func:`shard_metadata`), the index's header and lines
  (:func:`index_header`, :func:`index_line`), and a folder's index read back as a file's (:func:`folder_metadata`).

Nothing here imports torch.

>>> record = RunRecord(model="resnet18", weights={"source": "none", "seed": 0}, layers={"layer1": "layer1"},
...                    layer_types={"layer1": "Sequential"}, capture="output", preprocess={"resize": 64},
...                    pool="none", dtype="float32", precision="fp32", memory_format="channels_last", fuse=True,
...                    device="cpu", on_error="fail", shard_size=None, inputs=("/data/a.jpg",), command={})
>>> sorted(identity(record))[:4]
['capture', 'dtype', 'fuse', 'inputs']
>>> identity(record)["shard_size"], identity(record)["inputs"]
('auto', 1)
>>> meta = run_metadata(record, RunFacts(calls={"layer1": 1}, omitted=(), fused=5), keys=["layer1"])
>>> meta["format"], meta["fused"], json.loads(meta["layers"])["layer1"]["keys"]
('1', '5', ['layer1'])
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from hookcli.errors import FeatureFileError
from hookcli.version import __version__

__all__ = [
    "DETECTIONS",
    "FLOW",
    "FORMAT_VERSION",
    "FREE_ON_RESUME",
    "INDEX_NAME",
    "INDEX_VERSION",
    "PARTS_SUFFIX",
    "PRODUCER",
    "RAGGED_FORMAT_VERSION",
    "FLAT_FORMAT_VERSION",
    "ROW_DETAILS",
    "NEWEST_FORMAT",
    "ROW_SHAPE",
    "RunFacts",
    "RunRecord",
    "SHARD_LISTS",
    "SHARD_NAME",
    "STORED_DTYPES",
    "check_file_kind",
    "check_format",
    "check_index_header",
    "check_index_line",
    "file_metadata",
    "folder_metadata",
    "identity",
    "identity_differences",
    "index_header",
    "index_line",
    "inputs_digest",
    "json_entry",
    "keys_of_layer",
    "metadata_order",
    "opened_entry",
    "parts_folder",
    "run_metadata",
    "shard_count",
    "shard_metadata",
]

FORMAT_VERSION = "1"
#: The ``format`` of ragged keys (rows with shapes of their own) held padded: each key ``[N, *largest]``, zeros
#: beyond a row's own shape. What results in memory hold, and what files held before :data:`FLAT_FORMAT_VERSION`.
RAGGED_FORMAT_VERSION = "2"
#: The ``format`` of a file holding ragged keys without padding: each key a 1-D tensor of its rows' values one
#: after the other (each row in C order), its ``@shape`` companion giving each row's shape (older readers misread).
FLAT_FORMAT_VERSION = "3"
#: The newest ``format`` of any kind of file this hookcli writes (patching files': ``hookcli.storage.patch_format``).
NEWEST_FORMAT = 7
#: A ragged key's companion: ``<key>@shape``, int64 ``[N, ndim]``, each row's own shape.
ROW_SHAPE = "@shape"
#: The dtypes hookcli stores, by the name torch and numpy give each, and the name safetensors writes for it.
STORED_DTYPES = {
    "float64": "F64",
    "float32": "F32",
    "float16": "F16",
    "bfloat16": "BF16",
    "int64": "I64",
    "int32": "I32",
    "int16": "I16",
    "int8": "I8",
    "uint64": "U64",
    "uint32": "U32",
    "uint16": "U16",
    "uint8": "U8",
    "bool": "BOOL",
}
PRODUCER = "hookcli"
INDEX_NAME = "index.jsonl"
INDEX_VERSION = 1
SHARD_NAME = "features-{:05d}.safetensors"
#: Shard files, and the temporary files they are written through.
#: The key final detections are stored under (``detections#boxes``, ``#labels``, ``#scores``, ``#masks``, ...).
DETECTIONS = "detections"
#: The key an optical-flow model's final flow field is stored under, ``[N, 2, H, W]`` in pixels.
FLOW = "flow"
SHARD_FILE = re.compile(r"^\.?features-\d{5,}\.safetensors(\..*\.part)?$")

_METADATA, _IDENTITY = "metadata", "identity"


def _goes(*where: str):
    return field(metadata={"goes": where})


@dataclass(frozen=True)
class RunRecord:
    """What a run is, as its files record it. Each field says where it goes (metadata, identity or both).

    ``layers`` maps module paths to keys; ``layer_types`` gives each module's class name (for the metadata's layer
    table). ``inputs`` are the keys of the whole run's inputs (:func:`hookcli.inputs.archives.input_key`: the
    absolute path, or an archive member's row name); the identity keeps their count and a fingerprint. ``command``
    holds the command's own entries, e.g. ``{"target": "top1"}`` for grad; they go where the run's options go.
    """

    model: str = _goes(_METADATA, _IDENTITY)
    weights: dict = _goes(_METADATA, _IDENTITY)
    layers: dict = _goes(_METADATA, _IDENTITY)
    layer_types: dict = _goes()
    capture: str = _goes(_METADATA, _IDENTITY)
    preprocess: dict = _goes(_METADATA, _IDENTITY)
    pool: str = _goes(_METADATA, _IDENTITY)
    dtype: str = _goes(_METADATA, _IDENTITY)
    precision: str = _goes(_METADATA, _IDENTITY)
    memory_format: str = _goes(_METADATA, _IDENTITY)
    fuse: bool = _goes(_IDENTITY)  # the metadata has the fact instead: how many convolutions ran fused
    device: str = _goes(_METADATA)
    on_error: str = _goes(_IDENTITY)
    shard_size: int | None = _goes(_IDENTITY)
    inputs: tuple = _goes(_IDENTITY)
    command: dict = _goes(_METADATA, _IDENTITY)
    #: The model's family (:data:`hookcli.families.FAMILIES`); the model's name already fixes it for the identity.
    family: str = field(default="classification", metadata={"goes": (_METADATA,)})
    #: Tokens a vision transformer puts before its patch tokens (class, registers): pictures fold the rest into a
    #: square. None (left out of the metadata) for other models; the model's name fixes it for the identity.
    prefix_tokens: int | None = field(default=None, metadata={"goes": (_METADATA,)})
    #: The class names of the weights, in logit order (None, left out of the metadata, for weights without them):
    #: what names a classifier's outputs in pictures and reports. The weights fix them for the identity.
    categories: tuple[str, ...] | None = field(default=None, metadata={"goes": (_METADATA,)})
    #: Each module's output channels where its weights say them: the layer table's ``units`` (a Conv1d's ``[C, L]``).
    layer_units: dict = field(default_factory=dict, metadata={"goes": ()})


@dataclass(frozen=True)
class RunFacts:
    """What a forward learnt: how often each layer ran, container elements that held no tensor, fused convolutions."""

    calls: Mapping[str, int]
    omitted: tuple[str, ...] = ()
    fused: int = 0


def _fields(where: str):
    return [f for f in dataclasses.fields(RunRecord) if where in f.metadata["goes"]]


def identity(record: RunRecord) -> dict:
    """What must be equal for a run to continue a shard folder (the index header keeps it)."""
    found: dict = {}
    for f in _fields(_IDENTITY):
        value = getattr(record, f.name)
        if f.name == "inputs":
            found.update(inputs=len(value), inputs_sha256=inputs_digest(value))
        elif f.name == "command":
            found.update(value)
        elif f.name == "shard_size":
            found[f.name] = value or "auto"
        else:
            found[f.name] = dict(value) if isinstance(value, Mapping) else value
    return found


#: Identity fields a run may change when it continues a folder, changing no stored row (``--on-error skip``).
FREE_ON_RESUME = ("on_error",)


def identity_differences(one: Mapping, other: Mapping, sides: tuple[str, str] | None = None) -> list[str]:
    """The fields in which two run identities differ, sorted (empty when the runs are the same, and a run with the
    one identity continues a folder of the other). A field that holds several (``preprocess``) names the ones that
    differ; :data:`FREE_ON_RESUME` may differ. With ``sides`` (what to call ``one`` and ``other``), each says whose
    value is which.

    >>> identity_differences({"model": "resnet18", "pool": "avg"}, {"model": "resnet18", "pool": "max", "x": 1})
    ['pool', 'x']
    >>> before = {"preprocess": {"crop": 224}, "on_error": "fail", "layers": {"fc": "fc"}}
    >>> after = {"preprocess": {"crop": 112, "decode": "device"}, "on_error": "skip", "layers": {"fc": "fc", "x": "x"}}
    >>> identity_differences(before, after)
    ['layers (x)', 'preprocess (crop, decode)']
    >>> for line in identity_differences(before, after, ("the folder's", "this command's")):
    ...     print(line)
    layers (this command's alone: x)
    preprocess (crop: the folder's 224, this command's 112; this command's alone: decode device)
    >>> identity_differences({"stats": '{"top": 9, "pca": true}'}, {"stats": '{"top": 9, "pca": false}'})
    ['stats (pca)']
    """
    differ = []
    for key in sorted({*one, *other} - set(FREE_ON_RESUME)):
        mine, theirs = opened_entry(one.get(key)), opened_entry(other.get(key))
        if mine == theirs:
            continue
        if isinstance(mine, Mapping) and isinstance(theirs, Mapping):
            inner = sorted(k for k in {*mine, *theirs} if mine.get(k) != theirs.get(k))
            words = _whose(inner, mine, theirs, sides) if sides else list(map(str, inner))
            key = f"{key} ({(', ' if not sides else '; ').join(words)})"
        elif sides and key in one and key in other and not key.endswith("sha256"):
            key = f"{key} ({sides[0]} {_shown(mine, theirs)}, {sides[1]} {_shown(theirs, mine)})"
        differ.append(key)
    return differ


def opened_entry(value):
    """A command's entry kept as JSON text (``stats``, ``compare``) as the object it holds; any other value as it is."""
    try:
        found = json.loads(value) if isinstance(value, str) and value.startswith("{") else None
    except (ValueError, RecursionError):
        found = None
    return found if isinstance(found, dict) else value


def _whose(keys: list, mine: Mapping, theirs: Mapping, sides: tuple[str, str]) -> list[str]:
    """The entries of a field that differ, saying whose each is: both sides' values, then each side's alone."""
    both = [k for k in keys if k in mine and k in theirs]
    words = [f"{k}: {sides[0]} {_shown(mine[k], theirs[k])}, {sides[1]} {_shown(theirs[k], mine[k])}" for k in both]
    for side, held, other in ((sides[0], mine, theirs), (sides[1], theirs, mine)):
        alone = [k if held[k] == k else f"{k} {_shown(held[k])}" for k in keys if k not in other]  # a layer: its name
        words += [f"{side} alone: {', '.join(alone)}"] if alone else []
    return words


def _shown(value, other=None) -> str:
    """A value of an identity as a message shows it: a name as it is, anything else as JSON, at most 40 characters,
    from a little before where it first differs from ``other`` (the other side's)."""
    text, against = (found if isinstance(found, str) else json.dumps(found) for found in (value, other))
    start = max(0, next((n for n, (a, b) in enumerate(zip(text, against)) if a != b), len(text)) - 12)
    text = f"…{text[start:]}" if start > 0 and len(text) > 40 else text
    return text if len(text) <= 40 else f"{text[:39]}…"


def inputs_digest(keys: Sequence[str]) -> str:
    """A fingerprint of the input list: each input's key (:func:`hookcli.inputs.archives.input_key`), in order."""
    digest = hashlib.sha256()
    for key in keys:
        digest.update(key.encode("utf-8", "surrogateescape") + b"\n")
    return digest.hexdigest()


def keys_of_layer(key: str, keys: Sequence[str]) -> list[str]:
    """The stored keys that belong to the layer stored under ``key`` (its calls, inputs, elements, gradients)."""
    return [k for k in keys if k == key or (k.startswith(key) and k[len(key)] in ":@#")]


def run_metadata(record: RunRecord, facts: RunFacts, *, keys: Sequence[str], flat: bool = True) -> dict[str, str]:
    """The metadata every file of the run shares (a shard folder's index keeps it once): strings, JSON for structure.
    ``flat``: ragged keys are stored without padding (files); else padded (results in memory)."""
    ragged = any(key.endswith(ROW_SHAPE) for key in keys)
    version = (FLAT_FORMAT_VERSION if flat else RAGGED_FORMAT_VERSION) if ragged else FORMAT_VERSION
    metadata = {"format": version, "producer": PRODUCER}
    for f in _fields(_METADATA):
        value = getattr(record, f.name)
        if f.name == "layers":
            metadata["layers"] = json.dumps(
                {
                    path or ".": {
                        "key": key,
                        "type": record.layer_types[path],
                        "calls": facts.calls.get(path, 0),
                        "keys": [k for k in keys_of_layer(key, keys) if not k.endswith(ROW_SHAPE)],
                        **({} if record.layer_units.get(path) is None else {"units": record.layer_units[path]}),
                    }
                    for path, key in value.items()
                }
            )
        elif f.name == "command" or value is None and f.name in ("prefix_tokens", "categories"):
            continue  # the command's own entries come last; a model without tokens or class names says nothing
        else:
            metadata[f.name] = value if isinstance(value, str) else json.dumps(value)
        if f.name == "memory_format":
            metadata["fused"] = str(facts.fused)
    metadata["versions"] = json.dumps(_versions(record.model))
    if facts.omitted:
        metadata["omitted"] = json.dumps(list(facts.omitted))
    metadata.update(record.command)
    return metadata


#: What a row says about its input besides its path, in file metadata and index lines (one entry a row):
#: ``frames``, the frame numbers of a clip or pair cut from a video; ``second_inputs``, the second image of a pair
#: given as two image lists (optical flow).
ROW_DETAILS = ("frames", "second_inputs")
#: What an index line lists besides its inputs (each row's details, the inputs skipped), joined over the shards.
SHARD_LISTS = (*ROW_DETAILS, "skipped")


def _rows_metadata(
    inputs: Sequence[str], skipped: Sequence[dict], targets: Sequence, details: Mapping[str, Sequence]
) -> dict[str, str]:
    metadata = {"inputs": json.dumps(list(inputs))}
    for name in ROW_DETAILS:
        if details.get(name):
            metadata[name] = json.dumps(list(details[name]))
    if skipped:
        metadata["skipped"] = json.dumps(list(skipped))
    if targets:
        metadata["targets"] = json.dumps(list(targets))
    return metadata


def file_metadata(
    run: Mapping[str, str],
    *,
    inputs: Sequence,
    skipped: Sequence[dict] = (),
    targets: Sequence = (),
    details: Mapping[str, Sequence] | None = None,
) -> dict[str, str]:
    """A single file's metadata: the run's, plus its rows' inputs (for rows cut from videos, the video) and
    :data:`ROW_DETAILS`, the skipped inputs and (grad, cam) the targets."""
    return {**run, **_rows_metadata(inputs, skipped, targets, details or {})}


def shard_metadata(
    run: Mapping[str, str],
    number: int,
    *,
    inputs: Sequence,
    skipped: Sequence[dict] = (),
    targets: Sequence = (),
    details: Mapping[str, Sequence] | None = None,
) -> dict[str, str]:
    """Shard ``number``'s metadata: a complete file's, plus its ``shard`` number."""
    return {
        **file_metadata(run, inputs=inputs, skipped=skipped, targets=targets, details=details),
        "shard": str(number),
    }


def index_header(record: RunRecord, run: Mapping[str, str], shard_size: int) -> dict:
    """Line 1 of ``index.jsonl``: the run's identity, its shard size and input count, and its metadata."""
    return {
        "hookcli_index": INDEX_VERSION,
        "identity": identity(record),
        "shard_size": shard_size,
        "inputs": len(record.inputs),
        "shard_name": SHARD_NAME,
        "metadata": dict(run),
    }


def index_line(
    number: int,
    shard_size: int,
    total: int,
    inputs: Sequence[str],
    skipped: Sequence[dict],
    details: Mapping[str, Sequence] | None = None,
    stamps: Mapping[str, list[int] | None] | None = None,
) -> dict:
    """The index line of finished shard ``number``: its file, the inputs it covers, its rows, what was skipped, the
    rows' :data:`ROW_DETAILS`, and the ``stamps`` (``[size, modification time in ns]``) of the files its inputs
    were read from, by path."""
    first = number * shard_size
    line = {
        "shard": number,
        "file": SHARD_NAME.format(number),
        "first": first,
        "count": min(first + shard_size, total) - first,
        "inputs": list(inputs),
        "skipped": list(skipped),
    }
    line.update({name: list(values) for name, values in (details or {}).items() if values and name in ROW_DETAILS})
    if stamps:
        line["stamps"] = dict(stamps)
    return line


def check_index_header(header) -> None:
    """Raise ValueError saying what is wrong with an index's first line, read from disk (so untrusted)."""
    if not isinstance(header, dict) or header.get("hookcli_index") != INDEX_VERSION:
        raise ValueError("it is not a hookcli index")
    identity = header.get("identity")
    if not isinstance(identity, dict):
        raise ValueError("its run identity is missing")
    if not _whole(header.get("shard_size"), 1) or not _whole(header.get("inputs"), 0):
        raise ValueError("its shard size or input count is not a whole number")
    if identity.get("inputs") != header["inputs"] or identity.get("shard_size") not in ("auto", header["shard_size"]):
        raise ValueError("its input count or shard size is not its run identity's")
    metadata = header.get("metadata")
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise ValueError("its metadata is not a map of strings")


def shard_count(header: Mapping) -> int:
    """How many shards ``header``'s run has: its inputs in shards of its shard size."""
    return -(-header["inputs"] // header["shard_size"])


def check_index_line(entry, header: Mapping) -> None:
    """Raise ValueError unless ``entry`` is the line :func:`index_line` writes for one shard of ``header``'s run.

    Lines may come in any order (processes finish shards in any order). In
    particular a line's ``file`` must be its shard's own plain name, so a
    reader never follows a path out of the folder.
    """
    if not isinstance(entry, dict):
        raise ValueError("it is not a JSON object")
    if not all(_whole(entry.get(name), 0) for name in ("shard", "first", "count")):
        raise ValueError("its shard, first and count are not whole numbers")
    number = entry["shard"]
    if number >= shard_count(header):
        raise ValueError(f"it describes shard {number}, and the run has {shard_count(header)}")
    if entry.get("file") != SHARD_NAME.format(number):
        raise ValueError(f"it does not describe shard {number} ({SHARD_NAME.format(number)})")
    first = number * header["shard_size"]
    count = min(first + header["shard_size"], header["inputs"]) - first
    if entry.get("first") != first or entry.get("count") != count or count <= 0:
        raise ValueError(f"its rows are not inputs {first} to {first + count - 1}")
    inputs, skipped = entry.get("inputs"), entry.get("skipped")
    if not isinstance(inputs, list) or not all(isinstance(p, str) for p in inputs):
        raise ValueError("its inputs are not a list of paths")
    if not isinstance(skipped, list) or not all(isinstance(s, dict) for s in skipped):
        raise ValueError("its skipped inputs are not a list of objects")
    if len(inputs) + len(skipped) != count:
        raise ValueError(f"it accounts for {len(inputs) + len(skipped)} inputs, not {count}")
    frames = entry.get("frames", [])
    if (
        not isinstance(frames, list)
        or (frames and len(frames) != len(inputs))
        or not all(isinstance(f, list) and all(_whole(n, 0) for n in f) for f in frames)
    ):
        raise ValueError("its frames are not a list of frame numbers for each row")
    stamps = entry.get("stamps", {})
    if not isinstance(stamps, dict) or not all(
        stamp is None or isinstance(stamp, list) and len(stamp) == 2 and all(_whole(n, 0) for n in stamp)
        for stamp in stamps.values()
    ):
        raise ValueError("its stamps are not a map of paths to a size and a time")
    seconds = entry.get("second_inputs", [])
    if (
        not isinstance(seconds, list)
        or (seconds and len(seconds) != len(inputs))
        or not all(isinstance(p, str) for p in seconds)
    ):
        raise ValueError("its second_inputs are not a list of paths for each row")


def _whole(value, low: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= low


def folder_metadata(
    header: Mapping, lines: Callable[[], Iterable[Mapping]], *, shards: int, done: int, listed: Collection[str]
) -> Mapping[str, str]:
    """A shard folder read as one file: the run's metadata with every shard's inputs (and skipped) in row order.

    ``lines`` gives the ``shards`` index lines read, in shard order, covering ``done`` of the run's inputs;
    ``listed`` names the lists of :data:`SHARD_LISTS` that some of them hold. The entries that list every row
    (``inputs``, ``skipped``, the :data:`ROW_DETAILS`) are made from the lines when first asked for: a folder of a
    million inputs opens without reading a million names.
    """
    return _FolderMetadata(header, lines, shards, done, listed)


class _FolderMetadata(Mapping[str, str]):
    def __init__(
        self, header: Mapping, lines: Callable[[], Iterable[Mapping]], shards: int, done: int, listed: Collection[str]
    ) -> None:
        self._lines = lines
        self._made = dict(header["metadata"])
        self._later = ["inputs", *(name for name in SHARD_LISTS if name in listed)]
        self._made["shards"] = json.dumps(
            {"count": shards, "inputs_done": done, "inputs": header["inputs"], "complete": done == header["inputs"]}
        )
        self._keys = [*header["metadata"], *self._later, "shards"]

    def __getitem__(self, key: str) -> str:
        if key not in self._made and key in self._later:
            self._made[key] = json.dumps([value for entry in self._lines() for value in entry.get(key, [])])
        return self._made[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._keys)


#: The package that builds a model of each source named by a prefix (its version goes into the metadata).
_SOURCE_PACKAGES = {"timm": "timm", "hf": "transformers", "open_clip": "open_clip_torch"}


def _versions(model: str = "") -> dict[str, str]:
    source = _SOURCE_PACKAGES.get(model.partition(":")[0])
    found = {"hookcli": __version__}  # the running code's, also when it runs from a source tree uninstalled
    for package in ("torch", "torchvision", "safetensors", "pillow", *([source] if source else [])):
        try:
            found[package] = version(package)
        except PackageNotFoundError:
            found[package] = "unknown"
    return found


#: The keys hookcli writes, in the order ``info`` shows them.
_METADATA_ORDER = ("format", "producer", "model", "weights", "layers", "capture", "preprocess", "device", "versions")


def metadata_order(metadata) -> list[str]:
    """The metadata's keys as info shows them: hookcli's main entries in a fixed order, then the others by name."""
    return sorted(metadata, key=lambda k: (_METADATA_ORDER.index(k) if k in _METADATA_ORDER else 99, k))


def json_entry(metadata: Mapping[str, str], entry: str, kind: type, what: str, *, default=None):
    """Metadata ``entry`` of a file read from disk, parsed from JSON, which must be of ``kind``: ``default`` when it
    is absent and may be; ValueError saying what is wrong (``what`` the value should be).

    >>> json_entry({"same": "true"}, "same", bool, "true or false"), json_entry({}, "skipped", list, "", default=[])
    (True, [])
    >>> json_entry({"rows": "[1"}, "rows", list, "a list of labels")
    Traceback (most recent call last):
    ...
    ValueError: its 'rows' metadata is not a list of labels
    """
    text = metadata.get(entry)
    if text is None and default is not None:
        return default
    if text is None:
        raise ValueError(f"it has no '{entry}' metadata")
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        value = None
    if not isinstance(value, kind):
        raise ValueError(f"its '{entry}' metadata is not {what}")
    return value


def check_file_kind(metadata: Mapping[str, str], name: str, *, kind: str, version: str, what: str, again: str) -> None:
    """Refuse file ``name`` as a ``what`` (``"statistics file"``) unless its metadata says ``"kind": kind`` (the
    command that writes it) and ``"format": version``; ``again`` says how to make it anew (``"compare again with
    hookcli compare"``).

    >>> check_file_kind({"kind": "compare", "format": "4"}, "c.safetensors", kind="compare", version="5",
    ...                 what="comparison file", again="compare again")
    Traceback (most recent call last):
    ...
    hookcli.errors.FeatureFileError: 'c.safetensors' is a comparison file that is of format "4", and this hookcli \
reads format 5. Hint: read it with the hookcli that wrote it, or compare again
    """
    a = "an" if what[:1] in "aeiou" else "a"
    if metadata.get("kind") != kind:
        raise FeatureFileError(f"'{name}' is not {a} {what}", hint=f"hookcli {kind} writes them")
    found = metadata.get("format")
    if found != version:
        said = "gives no format" if found is None else f"is of format {json.dumps(found)}"
        raise FeatureFileError(
            f"'{name}' is {a} {what} that {said}, and this hookcli reads format {version}",
            hint=f"read it with the hookcli that wrote it, or {again}",
        )


def check_format(metadata: Mapping[str, str], name: str) -> None:
    """Refuse file or folder ``name`` whose ``format`` is a version above :data:`NEWEST_FORMAT` (a later hookcli's),
    whatever its ``kind``; other tools' (``"pt"``…), none, or a known one without a kind, are rows."""
    found = metadata.get("format")
    if not (isinstance(found, str) and found.isascii() and found.isdigit() and int(found) > NEWEST_FORMAT):
        return
    raise FeatureFileError(
        f"'{name}' is of format {json.dumps(found)}, and this hookcli reads formats 1 to {NEWEST_FORMAT}",
        hint="read it with the hookcli that wrote it, or make it again",
    )


#: The folder of a statistics file's parts, while it is being computed: ``<output>.parts``.
PARTS_SUFFIX = ".parts"


def parts_folder(output: str | os.PathLike) -> Path:
    """Where the parts of statistics file ``output`` are kept until it is written."""
    return Path(f"{os.fspath(output)}{PARTS_SUFFIX}")
