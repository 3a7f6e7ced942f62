"""Runs over features already saved, rather than a model: a file, a shard folder, stdin or features in memory,
read a batch at a time into the writer a model's run feeds (:class:`~hookcli.statistics.writer.GatheringWriter`),
so that what is gathered from a saved folder is what a forward would have gathered (with the same batch and
shard sizes, the same to the bit). :func:`saved_stats` is ``hookcli stats`` of saved features;
``hookcli compare`` reads one or two sources the same way (:mod:`hookcli.run.compare`).

>>> photo = __import__("matplotlib.cbook").cbook.get_sample_data("grace_hopper.jpg", asfileobj=False)
>>> from hookcli.api import extract
>>> features = extract("resnet18", "layer4", [photo, photo], weights="none", resize=64, crop=64)
>>> found = saved_stats(features, top=1, pca=False)
>>> found["layer4@top_rows"].shape, found.metadata["model"]
(torch.Size([512, 1]), 'resnet18')
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from hookcli.errors import CaptureError, UsageProblem
from hookcli.events import Event, Note
from hookcli.families import square_input
from hookcli.inputs.archives import file_stamp
from hookcli.inputs.preprocess import Preprocess
from hookcli.options import SAVED_STATS_OPTIONS
from hookcli.patterns import select_keys
from hookcli.run.execute import carry_out
from hookcli.run.launch import Part, block_of, detect_part
from hookcli.run.options import RunOptions, refuse_unknown, run_options
from hookcli.run.outputs import check_target, output_kind
from hookcli.run.settings import Batch
from hookcli.statistics.channel_stats import StatsGathering
from hookcli.statistics.layer import StatsChoice
from hookcli.statistics.writer import Gathering, GatheringWriter
from hookcli.storage.fileformat import RunFacts, RunRecord
from hookcli.storage.reader import FeatureReader
from hookcli.storage.shards import open_features

__all__ = ["SavedFeatures", "open_saved", "run_saved", "saved_stats"]


def saved_stats(
    source,
    *,
    keys: Sequence[str] | str = (),
    output=None,
    progress: Callable[[Event], None] | None = None,
    **options,
):
    """Statistics of the tensors ``keys`` (globs; default: every key whose rows share one shape) of ``source`` (a
    path, ``-``, or a reader such as what :func:`hookcli.extract` returns), as :func:`hookcli.stats` gathers them
    during a forward. ``options``: :data:`~hookcli.options.SAVED_STATS_OPTIONS`."""
    refuse_unknown("stats", options, SAVED_STATS_OPTIONS)
    opts = run_options("stats", options)
    emit = progress or _ignore
    with contextlib.ExitStack() as stack:
        saved = open_saved(stack, source, keys, emit)
        choice = StatsChoice.from_options(opts)
        gathering = StatsGathering(choice, prefix_tokens=saved.prefix_tokens, square=saved.square)
        entries = {"stats": json.dumps(choice.describe()), "stats_of": json.dumps(saved.describe())}
        return run_saved([saved], gathering, entries, "stats", output, opts, emit)


@dataclass(frozen=True)
class SavedFeatures:
    """One source of saved features, open: its reader, the keys chosen, its rows' names, how its rows' channels
    are read (``prefix_tokens``, ``square``) and what the forward that saved them learnt (``facts``)."""

    reader: FeatureReader
    keys: list[str]
    names: list[str]
    prefix_tokens: int | None
    square: bool

    def describe(self) -> dict:
        """What a run over it records of it: the source, the keys, and its stamp (a source changed between two
        runs is not continued)."""
        source = self.reader.name if os.path.exists(self.reader.name) else None
        return {"source": self.reader.name, "keys": self.keys, "stamp": source and file_stamp(source)}


def open_saved(stack: contextlib.ExitStack, source, keys: Sequence[str] | str, emit: Callable[[Event], None]):
    """``source`` opened (and closed with ``stack``), its tensors ``keys`` chosen (globs; default every one whose
    rows share a shape)."""
    reader = stack.enter_context(_opened(source))
    chosen = _chosen_keys(reader, [keys] if isinstance(keys, str) else list(keys), emit)
    rows = reader.shape(chosen[0])[0]
    names = list(reader.inputs)
    if len(names) != rows:  # a file hookcli did not write: its rows are named by number
        names = [f"row {number}" for number in range(rows)]
    metadata = reader.metadata
    prefix = metadata.get("prefix_tokens")
    return SavedFeatures(
        reader,
        chosen,
        names,
        int(prefix) if prefix and prefix.isdigit() else None,
        square_input(Preprocess.from_metadata(metadata.get("preprocess"))),
    )


def run_saved(
    sources: Sequence[SavedFeatures],
    gathering: Gathering,
    entries: Mapping[str, str],
    command: str,
    output,
    opts: RunOptions,
    emit: Callable[[Event], None],
):
    """Gather ``gathering`` over ``sources`` (the same rows in each; a second source's keys come as ``2:<key>``),
    into ``output`` as ``command`` writes it; ``entries`` are the command's own, recorded with the run."""
    first = sources[0]
    kind, path = output_kind(command, output, "")
    if kind == "default":
        kind, path = command, _default_name(first.reader, command)
    part = _part(opts.part, kind)
    if path is not None:
        files = [Path(s.reader.name) for s in sources if os.path.isfile(s.reader.name)]
        check_target(command, path, files, opts.force or bool(part))
    record = _record(first, entries, opts.shard_size)
    writer = GatheringWriter(
        record,
        first.names,
        path,
        gathering,
        shard_size=opts.shard_size,
        force=opts.force,
        part=block_of(part),
        on_note=lambda text: emit(Note(text)),
        source_files=[s.reader.name for s in sources if os.path.exists(s.reader.name)],
    )
    facts = _facts(first.reader.metadata, record)

    def batches(order: Iterable[list[int]]) -> Iterator[Batch]:
        for indices in order:
            start, stop = indices[0], indices[-1] + 1
            read: dict[tuple, torch.Tensor] = {}  # a tensor both sources name (one reader, compared with itself): once
            rows = {}
            for number, saved in enumerate(sources):
                for key in saved.keys:
                    found = (id(saved.reader), key)
                    if found not in read:
                        read[found] = torch.from_numpy(saved.reader.read_rows(key, start, stop))
                    rows[f"{number + 1}:{key}" if number else key] = read[found]
            yield Batch(indices, rows, [], None, facts)

    result, _ = carry_out(
        writer, batches, first.names, path, emit, lambda text: emit(Note(text)), batch_size=opts.batch_size
    )
    return result


def _ignore(event: Event) -> None:
    pass


def _opened(source):
    if isinstance(source, str | os.PathLike):
        return open_features(source)
    return contextlib.nullcontext(source)


def _default_name(reader: FeatureReader, command: str) -> str:
    """``<the source's stem>.<command>.safetensors``, beside where the command runs."""
    name = reader.name
    if not os.path.exists(name):  # stdin, or features in memory
        return f"{command}.safetensors"
    path = Path(name)
    stem = path.parent.name if path.name == "index.jsonl" else path.name.removesuffix(".safetensors")
    return f"{stem or 'features'}.{command}.safetensors"


def _part(given: Part | None, kind: str) -> Part | None:
    if kind == "memory":
        if given is not None:
            raise UsageProblem("--part applies to a file many processes write", hint="give -o FILE")
        return None
    return given if given is not None else detect_part()


def _chosen_keys(reader: FeatureReader, patterns: list[str], emit: Callable[[Event], None]) -> list[str]:
    """The keys asked for; by default every key whose rows share one shape (said of the others)."""
    chosen = select_keys(reader.keys(), patterns, reader.name)
    ragged = [key for key in chosen if reader.ragged(key)]
    if ragged and patterns:
        raise CaptureError(
            f"'{ragged[0]}' has rows of their own shapes: statistics need every row of a tensor in one shape",
            hint="choose other keys with -k ('hookcli info' lists them)",
        )
    if ragged:
        emit(Note(f"left out {', '.join(ragged)}: rows of their own shapes have no channels in common"))
        chosen = [key for key in chosen if key not in ragged]
    if not chosen:
        raise CaptureError(
            f"'{reader.name}' holds no tensor whose rows share one shape", hint="statistics need channels of one shape"
        )
    return chosen


def _record(saved: SavedFeatures, entries: Mapping[str, str], shard_size: int | None) -> RunRecord:
    """The run that wrote ``saved``'s features, as its metadata says, with this run's own ``entries``."""
    metadata = saved.reader.metadata
    described = _json(metadata.get("layers"), {})
    layers = {
        path: entry["key"]
        for path, entry in described.items()
        if isinstance(entry, Mapping) and entry.get("key") in saved.keys
    }
    layers.update({key: key for key in saved.keys if key not in layers.values()})
    types = {path: str(described.get(path, {}).get("type", "?")) for path in layers}
    categories = _json(metadata.get("categories"), None)
    return RunRecord(
        model=metadata.get("model", "unknown"),
        weights=_json(metadata.get("weights"), {}),
        layers=layers,
        layer_types=types,
        capture=metadata.get("capture", "output"),
        preprocess=_json(metadata.get("preprocess"), {}),
        pool=metadata.get("pool", "none"),
        dtype=metadata.get("dtype", "float32"),
        precision=metadata.get("precision", "fp32"),
        memory_format=metadata.get("memory_format", "contiguous"),
        fuse=metadata.get("fused", "0") != "0",
        device=metadata.get("device", "cpu"),
        on_error="fail",
        shard_size=shard_size,
        inputs=tuple(saved.names),
        command=dict(entries),
        family=metadata.get("family", "classification"),
        prefix_tokens=saved.prefix_tokens,
        categories=tuple(categories) if isinstance(categories, list) else None,
    )


def _facts(metadata: Mapping[str, str], record: RunRecord) -> RunFacts:
    """What the forward that saved the features learnt, as their metadata says: how often each layer ran, and how
    many convolutions ran fused."""
    described = _json(metadata.get("layers"), {})
    calls = {path: int(described.get(path, {}).get("calls", 0) or 0) for path in record.layers}
    fused = metadata.get("fused", "0")
    return RunFacts(calls=calls, fused=int(fused) if fused.isdigit() else 0)


def _json(text: str | None, default):
    try:
        return json.loads(text) if text else default
    except ValueError:
        return default
