"""Runs over features already saved, rather than a model: a file, a shard folder, stdin or features in memory,
read a batch at a time into the writer a model's run feeds (:class:`~hookcli.storage.gathering_writer.GatheringWriter`),
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
import dataclasses
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
from hookcli.options.interventions import read_beside
from hookcli.options.run import SAVED_STATS_OPTIONS, RunOptions, refuse_unknown, run_options
from hookcli.parsing import block_of
from hookcli.patterns import select_keys
from hookcli.run.commands import COMMANDS
from hookcli.run.execute import execute
from hookcli.run.launch import Part, detect_part
from hookcli.run.outputs import DEFAULT_OUTPUT, Output
from hookcli.run.settings import Batch
from hookcli.statistics.channel_stats import StatsGathering
from hookcli.statistics.layer import StatsChoice
from hookcli.statistics.units import width_of
from hookcli.storage.compare_format import is_comparison, second_names
from hookcli.storage.features import Features
from hookcli.storage.fileformat import RunRecord
from hookcli.storage.gathering import Gathering
from hookcli.storage.gathering_writer import GatheringWriter
from hookcli.storage.reader import FeatureReader
from hookcli.storage.recorded_run import RecordedRun, recorded_run
from hookcli.storage.shards import open_features
from hookcli.storage.stats_format import is_stats

__all__ = ["SavedFeatures", "open_saved", "run_saved", "saved_stats"]


def saved_stats(
    source,
    *,
    keys: Sequence[str] | str = (),
    output=None,
    progress: Callable[[Event], None] | None = None,
    **options,
) -> Features | Path:
    """Statistics of the tensors ``keys`` (globs; default: every key whose rows share one shape) of ``source`` (a
    path, ``-``, or a reader such as what :func:`hookcli.extract` returns), as :func:`hookcli.stats` gathers them
    during a forward. ``options``: :data:`~hookcli.options.SAVED_STATS_OPTIONS`."""
    refuse_unknown("stats", options, SAVED_STATS_OPTIONS)
    opts = run_options("stats", options)
    emit = progress or _ignore
    with contextlib.ExitStack() as stack:
        saved = open_saved(stack, source, keys, emit, incomplete=opts.incomplete)
        choice = StatsChoice.from_options(opts)
        gathering = StatsGathering(choice, prefix_tokens=saved.prefix_tokens, square=saved.square, widths=saved.widths)
        gathering.check_layers({key: gathering.layout(key, saved.reader.shape(key)[1:]).channels for key in saved.keys})
        entries = {"stats": json.dumps(choice.describe()), "stats_of": json.dumps(saved.describe())}
        return run_saved([saved], gathering, entries, "stats", output, opts, emit)


@dataclass(frozen=True)
class SavedFeatures:
    """One source of saved features, open: its reader, the keys chosen, its rows' names, how its rows' channels
    are read (``prefix_tokens``, ``square``) and the run that saved them (``recorded``)."""

    reader: FeatureReader
    keys: list[str]
    names: list[str]
    prefix_tokens: int | None
    square: bool
    recorded: RecordedRun

    @property
    def widths(self) -> dict[str, int | None]:
        """Each chosen key's channels, as the saving run's layer table says its module's output has them
        (``units``; a call's and a gradient's as its layer's); a file without them (older, or not hookcli's) tells
        its channels by their shape alone."""
        return {key: width_of(self.recorded.unit_widths, key) for key in self.keys}

    def describe(self) -> dict:
        """What a run over it records of it: the source, the keys, its stamp (a source changed between two runs is
        not continued), and of a shard folder taken incomplete (``--incomplete``), how many of its inputs it held."""
        source = self.reader.name if os.path.exists(self.reader.name) else None
        described: dict[str, object] = {
            "source": self.reader.name,
            "keys": self.keys,
            "stamp": source and file_stamp(source),
        }
        total = getattr(self.reader, "header", {}).get("inputs")
        if getattr(self.reader, "shortfall", None) is not None:
            described["incomplete"] = {"inputs": len(self.names), "of": total}
        return described


def open_saved(
    stack: contextlib.ExitStack,
    source,
    keys: Sequence[str] | str,
    emit: Callable[[Event], None],
    *,
    incomplete: bool = False,
):
    """``source`` opened (and closed with ``stack``), its tensors ``keys`` chosen (globs; default every one whose
    rows share a shape), and the run that saved them read from its metadata (every entry checked). A shard folder
    missing shards is refused unless ``incomplete``, which takes what it holds (and says so)."""
    reader = stack.enter_context(_opened(source))
    _refuse_other_kinds(reader)
    shortfall = getattr(reader, "shortfall", None)
    if shortfall is not None and not incomplete:
        raise UsageProblem(
            f"{shortfall}: what is gathered of it would leave the rest out",
            hint="run the same extract command again to complete it, or add --incomplete to take what it holds",
        )
    if shortfall is not None:
        emit(Note(f"{shortfall}: taking those (--incomplete)"))
    chosen = _chosen_keys(reader, [keys] if isinstance(keys, str) else list(keys), emit)
    rows = _rows(reader, chosen)
    recorded = recorded_run(reader.metadata, reader.name, keys=chosen, rows=rows)
    if recorded.listed and recorded.listed != rows:
        emit(
            Note(
                f"'{reader.name}' lists {recorded.listed:,} inputs for its {rows:,} rows: its rows are named by number"
            )
        )
    return SavedFeatures(
        reader,
        chosen,
        list(recorded.record.inputs),
        recorded.record.prefix_tokens,
        square_input(recorded.preprocess),
        recorded,
    )


def run_saved(
    sources: Sequence[SavedFeatures],
    gathering: Gathering,
    entries: Mapping[str, str],
    command: str,
    output,
    opts: RunOptions,
    emit: Callable[[Event], None],
) -> Features | Path:
    """Gather ``gathering`` over ``sources`` (the same rows in each; a second source's keys come under
    :func:`~hookcli.storage.compare_format.second_names`),
    into ``output`` as ``command`` writes it; ``entries`` are the command's own, recorded with the run."""
    first = sources[0]
    does = COMMANDS[command]
    kind, path = does.output(output, "", opts)  # refuses stdout and folders
    if output is DEFAULT_OUTPUT:
        kind, path = does.default_kind, _default_name(first.reader, command)
    part = _part(opts.part, in_memory=path is None)
    files = [Path(s.reader.name) for s in sources if os.path.isfile(s.reader.name)] + read_beside(opts)
    does.check_target(kind, path, files, opts.force or bool(part))
    record = dataclasses.replace(first.recorded.record, command=dict(entries), shard_size=opts.shard_size)
    result = execute(SavedRun(sources, gathering, record, Output(kind, path), opts, part), emit)
    assert result is not None, "a gathering run writes a file, or returns what it gathered"
    return result


@dataclass(frozen=True)
class SavedRun:
    """A run over saved features (:class:`~hookcli.run.execute.Road`): ``gathering`` over ``sources``' rows, read
    a batch at a time (the same rows in each; a second source's keys come under
    :func:`~hookcli.storage.compare_format.second_names`), into ``output``."""

    sources: Sequence[SavedFeatures]
    gathering: Gathering
    record: RunRecord
    output: Output
    opts: RunOptions
    part: Part | None
    notes: tuple[str, ...] = ()
    team: None = None
    grid: None = None

    @property
    def inputs(self) -> list[str]:
        return self.sources[0].names

    @property
    def batch_size(self) -> int:
        return self.opts.batch_size

    @property
    def force(self) -> bool:
        return self.opts.force

    def writer(self, note: Callable[[str], None]) -> GatheringWriter:
        return GatheringWriter(
            self.record,
            self.inputs,
            self.output.path,
            self.gathering,
            shard_size=self.opts.shard_size,
            force=self.opts.force,
            part=block_of(self.part),
            on_note=note,
            source_files=[s.reader.name for s in self.sources if os.path.exists(s.reader.name)],
        )

    def batches(self, order: Iterable[list[int]], writer, note: Callable[[str], None]) -> Iterator[Batch]:
        first, facts = self.sources[0], self.sources[0].recorded.facts
        names = [first.keys, *(second_names(first.keys, saved.keys, marked=True) for saved in self.sources[1:])]
        for indices in order:
            start, stop = indices[0], indices[-1] + 1
            read: dict[tuple, torch.Tensor] = {}  # a tensor both sources name (a source with itself): once
            rows = {}
            for saved, named in zip(self.sources, names):
                for key, name in zip(saved.keys, named):
                    found = (id(saved.reader), key)
                    if found not in read:
                        read[found] = torch.from_numpy(saved.reader.read_rows(key, start, stop))
                    rows[name] = read[found]
            yield Batch(indices, rows, [], None, facts)


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


def _part(given: Part | None, *, in_memory: bool) -> Part | None:
    if in_memory:
        if given is not None:
            raise UsageProblem("--part applies to a file many processes write", hint="give -o FILE")
        return None
    return given if given is not None else detect_part()


def _refuse_other_kinds(reader: FeatureReader) -> None:
    """Refuse a statistics or comparison file given as saved features."""
    for kind, what in ((is_stats, "a statistics file"), (is_comparison, "a comparison file")):
        if kind(reader.metadata):
            raise CaptureError(
                f"'{reader.name}' is {what}, not saved features",
                hint="give what hookcli extract saves; grid, report and info read this file",
            )


def _unfit(reader: FeatureReader, key: str) -> str:
    """Why tensor ``key`` has no channels in common across its rows ('' when it has)."""
    if not reader.shape(key):
        return "is one number, with no rows"
    return "has rows of their own shapes" if reader.ragged(key) else ""


def _rows(reader: FeatureReader, keys: Sequence[str]) -> int:
    """The rows every one of ``keys`` has (one count for all, one row at least)."""
    counts = {key: reader.shape(key)[0] for key in keys}
    rows = counts[keys[0]]
    other = next((key for key, count in counts.items() if count != rows), None)
    if other is not None:
        raise CaptureError(
            f"'{keys[0]}' has {rows:,} rows and '{other}' {counts[other]:,} in '{reader.name}': a run's tensors have "
            "one row an input",
            hint="choose tensors of one run with -k",
        )
    if not rows:
        raise CaptureError(f"'{reader.name}' holds no rows: its tensors have no input", hint="extract some first")
    return rows


def _chosen_keys(reader: FeatureReader, patterns: list[str], emit: Callable[[Event], None]) -> list[str]:
    """The keys asked for; by default every key whose rows share one shape (said of the others)."""
    chosen = select_keys(reader.keys(), patterns, reader.name)
    unfit = {key: _unfit(reader, key) for key in chosen}
    unfit = {key: why for key, why in unfit.items() if why}
    if unfit and patterns:
        key, why = next(iter(unfit.items()))
        raise CaptureError(
            f"'{key}' {why}: statistics need every row of a tensor in one shape",
            hint="choose other keys with -k ('hookcli info' lists them)",
        )
    if unfit:
        emit(Note(f"left out {', '.join(unfit)}: only tensors of rows of one shape have channels in common"))
        chosen = [key for key in chosen if key not in unfit]
    if not chosen:
        raise CaptureError(
            f"'{reader.name}' holds no tensor whose rows share one shape", hint="statistics need channels of one shape"
        )
    return chosen
