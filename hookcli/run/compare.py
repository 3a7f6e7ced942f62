"""``hookcli compare``: the similarity of every pair of representations, of saved features or of models run over
the same images in one pass, gathered shard by shard into one comparison file.

Saved features: one source (compared with itself) or two, checked to hold the
same rows in the same order. Models: one (its layers against themselves) or
two, each run as ``extract`` runs it over the same batches, nothing kept but the
accumulators. Either way the batches go into a
:class:`~hookcli.statistics.comparison.CompareGathering` through the writer
every gathering run shares (:class:`~hookcli.storage.gathering_writer.GatheringWriter`),
so a comparison resumes after a kill and any number of processes share it.

>>> photo = __import__("matplotlib.cbook").cbook.get_sample_data("grace_hopper.jpg", asfileobj=False)
>>> found = compare_models("resnet18", ["layer3", "layer4"], [photo] * 4, options={"weights": "none", "resize": 64})
>>> found["linear-cka"].shape, json.loads(found.metadata["rows"])
(torch.Size([2, 2]), ['layer3', 'layer4'])
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import itertools
import json
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from hookcli.errors import FeatureFileError, UsageProblem, first_line
from hookcli.events import Event, Note, Wrote
from hookcli.families import square_input
from hookcli.files import check_writable
from hookcli.models.catalog import as_model
from hookcli.models.loaded import LoadedModel
from hookcli.options.run import SAVED_RUN_OPTIONS, refuse_unknown, run_options
from hookcli.run.execute import execute
from hookcli.run.outputs import Output
from hookcli.run.pipeline import iter_batches
from hookcli.run.plan import RunPlan, plan_request
from hookcli.run.request import request
from hookcli.run.saved import SavedFeatures, open_saved, run_saved
from hookcli.run.settings import Batch
from hookcli.run.team import Team
from hookcli.statistics.comparison import (
    CompareChoice,
    CompareGathering,
    few_inputs_note,
    no_spread_note,
)
from hookcli.statistics.comparison_sums import LinearSums, Sides
from hookcli.statistics.similarity import undefined
from hookcli.statistics.units import layer_widths
from hookcli.storage.compare_format import (
    CKA_STATE,
    check_comparison,
    is_comparison,
    is_debiased,
    second_names,
)
from hookcli.storage.features import FeatureFile, Features
from hookcli.storage.fileformat import RunRecord, identity, identity_differences, inputs_digest
from hookcli.storage.gathering_writer import GatheringWriter
from hookcli.storage.recorded_run import listed_skipped
from hookcli.storage.saving import write_safetensors

__all__ = ["compare_models", "compare_saved", "merge_comparisons"]


def compare_saved(
    features,
    features2=None,
    *,
    keys: Sequence[str] | str = (),
    keys2: Sequence[str] | str = (),
    output=None,
    choice: CompareChoice | None = None,
    options: Mapping | None = None,
    progress: Callable[[Event], None] | None = None,
) -> Features | Path:
    """Compare the tensors ``keys`` of saved ``features`` with the tensors ``keys2`` of ``features2`` (None: with
    its own ``keys``, or ``keys2`` of the same source), each a path, ``-`` or a reader. ``options``: the batch
    size, ``force``, ``shard_size`` and ``part`` (:data:`~hookcli.options.SAVED_STATS_OPTIONS`' run options)."""
    given = dict(options or {})
    refuse_unknown("compare", given, SAVED_RUN_OPTIONS)
    opts = run_options("compare", given)
    choice = choice or CompareChoice()
    choice.check_batches(opts.batch_size)
    emit = progress or _ignore
    with contextlib.ExitStack() as stack:
        first = open_saved(stack, features, keys, emit, incomplete=opts.incomplete)
        choice.check_inputs(len(first.names))
        if features2 is None and not keys2:
            sources, second = [first], None
        else:
            other = open_saved(  # opened once
                stack, first.reader if features2 is None else features2, keys2, emit, incomplete=opts.incomplete
            )
            _check_same_rows(first, other)
            sources, second = [first, other], second_names(first.keys, other.keys, marked=True)
        widths = first.widths
        if second is not None:
            theirs = sources[-1].widths
            widths.update((name, theirs.get(key)) for name, key in zip(second, sources[-1].keys, strict=True))
        gathering = CompareGathering(
            choice,
            first=first.keys,
            second=second,
            labels=(first.keys, sources[-1].keys),
            prefix_tokens=(first.prefix_tokens, sources[-1].prefix_tokens),
            square=(first.square, sources[-1].square),
            widths=widths,
        )
        entries = {
            "compare": json.dumps(choice.identity()),
            "compare_of": json.dumps([saved.describe() for saved in sources]),
        }
        return run_saved(sources, gathering, entries, "compare", output, opts, emit)


def _check_same_rows(first: SavedFeatures, second: SavedFeatures) -> None:
    """Two sources are compared row by row: they must hold the same inputs in the same order."""
    names = tuple(
        reader.name if reader.name != "memory" else f"{side} (in memory)"
        for reader, side in ((first.reader, "features"), (second.reader, "features2"))
    )
    if len(first.names) != len(second.names):
        raise UsageProblem(
            f"'{names[0]}' holds {len(first.names)} rows and '{names[1]}' {len(second.names)}: a comparison "
            "needs the same rows in both",
            hint="extract both from the same inputs, in the same order",
        )
    differ = next((n for n, (a, b) in enumerate(zip(first.names, second.names)) if a != b), None)
    if differ is not None:
        raise UsageProblem(
            f"'{names[0]}' and '{names[1]}' hold different rows: row {differ} is '{first.names[differ]}' in one "
            f"and '{second.names[differ]}' in the other",
            hint="extract both from the same inputs, in the same order",
        )


def compare_models(
    model,
    layers,
    inputs,
    model2=None,
    layers2=None,
    *,
    second: Mapping | None = None,
    output=None,
    choice: CompareChoice | None = None,
    options: Mapping | None = None,
    progress: Callable[[Event], None] | None = None,
) -> Features | Path:
    """Compare ``layers`` of ``model`` with ``layers2`` of ``model2`` (None: with its own ``layers``, or
    ``layers2`` of the same model) over ``inputs``, both run in one pass. ``options``: the run options of
    ``extract`` that ``compare`` takes; ``second``: those the second side sets for itself (``weights``, ``seed``),
    which make a second side of the same model and layers if nothing else does."""
    choice = choice or CompareChoice()
    given = dict(options or {})
    second = dict(second or {})
    model, model2 = as_model(model), None if model2 is None else as_model(model2)
    if second and isinstance(model2 if model2 is not None else model, LoadedModel):
        raise UsageProblem(
            "weights2 and seed2 choose the weights of a second side that hookcli builds, and its model is built",
            hint="give model2 as a name, or as a model built with the weights wanted (and no weights2 or seed2)",
        )
    if "seed" in second and str(second.get("weights", given.get("weights", "DEFAULT"))).strip().lower() != "none":
        raise UsageProblem(
            "--seed2 only applies to a second side of random weights (pretrained and file weights are fixed)",
            hint="give --weights2 none, or leave --seed2 out",
        )
    asked = request("compare", model, layers, inputs, output=output, **given)
    choice.check_batches(asked.opts.batch_size)
    one = plan_request(asked)
    choice.check_inputs(len(one.inputs))
    two = None
    if model2 is not None or layers2 is not None or second:
        # The second model runs beside the first, over the first's rows; the first's part says who computes what.
        # The first's own: its share of the work, and its edits (the second side runs as it is).
        own = {name: value for name, value in given.items() if name not in _FIRST_SIDE_ONLY}
        own.update(second)
        if "seed" not in second and str(own.get("weights", "DEFAULT")).strip().lower() != "none":
            own.pop("seed", None)  # the first side's seed, for its random weights: none of the second's
        if isinstance(model2, LoadedModel):  # built with its own weights: the first side's are none of its
            own.pop("weights", None)
            own.pop("seed", None)
        try:
            other = model2 or model
            if isinstance(other, LoadedModel) and isinstance(model, LoadedModel) and _shared(model, other):
                # One module cannot run in both sides (each side its own hooks, the edits the first's alone): a
                # copy of the second side runs it.
                other = dataclasses.replace(other, module=_copied(other))
            two = plan_request(
                request("compare", other, layers2 or layers, inputs, output=None, rows=asked.rows, **own)
            )
        except BaseException:
            if one.team is not None:
                one.team.close()  # execute leaves it once the run has run
            raise
    result = execute(ComparedRun.of(one, two, choice), progress)
    assert result is not None, "a comparison writes a file, or returns what it gathered"
    return result


def _shared(one: LoadedModel, two: LoadedModel) -> bool:
    """Whether the two sides' modules have a module in common (one is the other, or holds it)."""
    return not {id(module) for module in one.module.modules()}.isdisjoint(map(id, two.module.modules()))


def _copied(loaded: LoadedModel):
    """A copy of ``loaded``'s module, to run the second side of a comparison with a model it shares modules with."""
    try:
        return copy.deepcopy(loaded.module)
    except Exception as err:  # a module that holds what cannot be copied (a lock, a non-leaf tensor, a session)
        raise UsageProblem(
            f"{loaded.name} shares modules with the first side of the comparison, and a copy of it cannot be made to "
            f"run the second ({first_line(err)})",
            hint="give model2 as a second instance of the model, with modules of its own",
        ) from None


#: The options of the first side of a comparison of models that the second does not take.
_FIRST_SIDE_ONLY = ("part", "shard_size", "intervene", "capture_edited")


@dataclass(frozen=True)
class ComparedRun:
    """A comparison of models run side by side (:class:`~hookcli.run.execute.Road`): the first's plan ``one`` and
    the second's ``two`` (None: the first's layers with each other), gathered as ``gathering`` says; the first's
    output, inputs, part and batches are the run's."""

    one: RunPlan
    two: RunPlan | None
    gathering: CompareGathering
    record: RunRecord
    inputs: tuple[os.PathLike[str], ...]
    output: Output
    notes: tuple[str, ...]
    batch_size: int
    team: Team | None
    force: bool
    writer: Callable[[Callable[[str], None]], GatheringWriter]  # the writer, given what to do with its notes
    grid: None = None

    @classmethod
    def of(cls, one: RunPlan, two: RunPlan | None, choice: CompareChoice) -> ComparedRun:
        first, other = list(one.layers.values()), two or one
        second = None if two is None else second_names(first, list(two.layers.values()), marked=True)
        gathering = CompareGathering(
            choice,
            first=first,
            second=second,
            labels=(first, list(other.layers.values())),
            prefix_tokens=(one.loaded.prefix_tokens, other.loaded.prefix_tokens),
            square=(square_input(one.settings.preprocess), square_input(other.settings.preprocess)),
            widths=_widths(one, two, second),
        )
        entries = {"compare": json.dumps(choice.identity())}
        if two is not None:
            # The second side's run but its inputs, which are the first side's.
            second_run = identity(two.record)
            entries["compare_with"] = json.dumps(
                {key: value for key, value in second_run.items() if key not in ("inputs", "inputs_sha256")}
            )
        record = dataclasses.replace(one.record, command={**one.record.command, **entries})
        return cls(
            one=one,
            two=two,
            gathering=gathering,
            record=record,
            inputs=one.inputs,
            output=one.output,
            notes=one.notes + (two.notes if two is not None else ()),
            batch_size=one.settings.batch_size,
            team=one.team,
            force=one.force,
            writer=functools.partial(GatheringWriter.of, one, gathering, record=record),
        )

    def batches(self, order: Iterable[list[int]], writer, note: Callable[[str], None]) -> Iterator[Batch]:
        one, two, second = self.one, self.two, self.gathering.second
        mine, theirs = itertools.tee(order) if two is not None else (order, ())
        firsts = iter_batches(one.loaded, one.layers, one.inputs, one.settings, forward=one.forward, order=mine,
                              on_note=note, rows_on_device=True)  # fmt: skip
        if two is None:
            yield from firsts
        else:
            assert second is not None, "a second side has its names"
            seconds = iter_batches(two.loaded, two.layers, two.inputs, two.settings, forward=two.forward,
                                   order=theirs, on_note=note, rows_on_device=True)  # fmt: skip
            try:
                yield from map(functools.partial(_together, names=dict(zip(two.layers.values(), second))), firsts,
                               seconds)  # fmt: skip
            finally:  # each side's model is given back as its batches end, here and now should the run stop
                firsts.close()
                seconds.close()


def _widths(one: RunPlan, two: RunPlan | None, second: Sequence[str] | None) -> dict[str, int | None]:
    """Each compared key's channels, where its module says them: the first side's keys, then the second's under
    the names the comparison gives them."""
    widths = layer_widths(one.loaded.module, one.layers)
    if two is not None and second is not None:
        theirs = layer_widths(two.loaded.module, two.layers)
        widths.update((name, theirs.get(key)) for name, key in zip(second, two.layers.values(), strict=True))
    return widths


def _renamed(key: str, names: Mapping[str, str]) -> str | None:
    """The second side's ``key`` under its name in the comparison: a layer's, or an element's of a layer's
    (``K#0``); None for another."""
    if key in names:
        return names[key]
    layer, mark, element = key.partition("#")
    return names[layer] + mark + element if mark and layer in names else None


def _together(first: Batch, second: Batch, names: Mapping[str, str]) -> Batch:
    """One batch of both models: the rows both could read, the second's keys under their ``names``."""
    both = [index for index in first.indices if index in set(second.indices)]
    failures = dict(first.failures)
    failures.update((index, error) for index, error in second.failures if index not in failures)
    features = {}
    for batch, named in ((first, None), (second, names)):
        keep = [batch.indices.index(index) for index in both]
        for key, value in batch.features.items():
            name = key if named is None else _renamed(key, named)
            if name is not None:
                features[name] = [value[n] for n in keep] if isinstance(value, list) else value[torch.tensor(keep)]
    damaged = first.damaged + [said for said in second.damaged if said[0] not in dict(first.damaged)]
    return Batch(both, features, sorted(failures.items()), None, first.facts, damaged=damaged)


def merge_comparisons(
    files: Sequence, output, *, force: bool = False, progress: Callable[[Event], None] | None = None
) -> Features | Path:
    """One linear-cka comparison of the inputs of ``files`` together: each file's running sums (over inputs no other
    file has) merged in the order given, as if one run had seen them all. The files must come from one command (its
    model, weights, layers, preprocessing, method and every other setting of the run identity) over other inputs.
    ``output``: a path, or None for the result in memory; never one of ``files``."""
    emit = progress or _ignore
    if len(files) < 2:
        raise UsageProblem(f"merging takes two comparison files or more, not {len(files)}", hint="name them all")
    if output is not None:
        check_writable(output, force=force)
        _refuse_merging_onto_an_input(files, output)
    inputs: list[str] = []
    seen: dict[str, str] = {}  # each input's real path, and its path as listed
    skipped: list = []
    first: Mapping[str, str] = {}
    first_identity: dict = {}  # what every file must share: the run identity of the first, but for its inputs
    widths: list[int] | None = None
    read: list[tuple[list, Sides, bool]] = []  # each file's inputs and how its sums read
    for file in files:  # every file checked by its metadata and widths before any file's sums are read
        with FeatureFile(file) as found:
            metadata = found.metadata
            labels = _mergeable(found, first)
            identity = _identity_of(found)
            if not read:
                first, first_identity = metadata, identity
            differ = identity_differences(first_identity, identity)
            if differ:
                raise UsageProblem(
                    f"'{file}' comes from another run than '{files[0]}' (it differs in: {', '.join(differ)})",
                    hint="merge comparisons made by one command over different inputs",
                )
            listed = json.loads(metadata["inputs"])
            # The same image reached by another path (a link to its folder) is the same input.
            resolved = {os.path.realpath(path): path for path in listed}
            overlap = sorted(resolved.keys() & seen.keys())
            if overlap:
                raise UsageProblem(
                    f"'{file}' has inputs an earlier file has too ('{resolved[overlap[0]]}'): merged runs must cover "
                    "disjoint inputs",
                    hint="merge files made over different inputs",
                )
            seen.update(resolved)
            inputs += listed
            skipped += listed_skipped(metadata, found.name)
            own = [int(n) for n in found.read("linear-cka@widths").tolist()]
            if widths is not None and own != widths:
                raise UsageProblem(
                    f"'{file}' holds representations of other widths than '{files[0]}' ({own} against {widths})",
                    hint="merge comparisons of the same layers of the same model",
                )
            widths = own
            same = json.loads(metadata["same"])
            sides = Sides((*labels[0], *([] if same else labels[1])), len(labels[0]), len(labels[1]), same, labels)
            read.append((listed, sides, is_debiased(json.loads(metadata["settings"]))))
    merged: LinearSums | None = None
    for file, (listed, sides, debiased) in zip(files, read, strict=True):
        with FeatureFile(file) as found:
            kept = [name for name in found.keys() if name.startswith("linear-cka@")]  # checked: the method's sums
            state = {name.partition("@")[2]: torch.from_numpy(found.read(name)) for name in kept}
            try:
                part = LinearSums.read(state, sides, debiased=debiased)
                part.check_part(len(listed))  # its sums count the inputs it lists
            except (KeyError, ValueError) as err:
                raise FeatureFileError(
                    f"'{file}' holds linear-cka sums that do not fit: {err}", hint="write it again with hookcli compare"
                ) from None
            if merged is None:
                merged = part
            else:
                merged.merge(part)
    assert merged is not None, "two files at least"
    tensors = merged.tensors()
    result = tensors["linear-cka"]
    metadata = {key: value for key, value in first.items() if key not in ("undefined", "skipped")}
    # What one run over every input would record: merged again, the file is one more part of that run.
    every = [*inputs, *(str(entry["input"]) for entry in skipped)]
    whole = {**json.loads(first["identity"]), "inputs": len(every), "inputs_sha256": inputs_digest(every)}
    metadata.update(inputs=json.dumps(inputs), merged_from=json.dumps([str(f) for f in files]),
                    identity=json.dumps(whole))  # fmt: skip
    if skipped:
        metadata["skipped"] = json.dumps(skipped)
    rows, columns = json.loads(first["rows"]), json.loads(first["columns"])
    gone = undefined(result, rows, columns)
    if gone:
        metadata["undefined"] = json.dumps(gone)
    for label in gone:
        emit(Note(no_spread_note(label)))
    few = few_inputs_note(merged.sums.count, merged.widest())
    if few:
        emit(Note(few))
    if output is None:
        return Features(tensors, metadata)
    write_safetensors(tensors, metadata, output, force=force)
    emit(Wrote(str(output)))
    return Path(output)


def _refuse_merging_onto_an_input(files: Sequence, output) -> None:
    """A merge must not write over one of the files it reads (``--force`` or not)."""
    with contextlib.suppress(OSError):
        target = os.stat(output)
        for file in files:
            with contextlib.suppress(OSError):
                if os.path.samestat(target, os.stat(file)):
                    raise UsageProblem(
                        f"'{output}' is one of the files to merge: merging would write over it",
                        hint="give another -o",
                    )


#: Identity fields in which merged runs differ: their inputs, and so how they were cut into shards and whether
#: their forwards fused (chosen from the number of inputs; the values are the same to float32 rounding).
_MERGE_FREE = ("inputs", "inputs_sha256", "shard_size", "fuse")


def _identity_of(found: FeatureFile) -> dict:
    """The run identity a comparison file records, but for what merged runs differ in (:data:`_MERGE_FREE`); a file
    that records none is refused: what made it cannot be checked."""
    text = found.metadata.get("identity")
    if text is None:
        raise FeatureFileError(
            f"'{found.name}' records no run identity, so the run that made it cannot be checked against the others",
            hint="merge the files it was made from (its merged_from), or compute it again with hookcli compare",
        )
    try:
        identity = json.loads(text)
    except (ValueError, RecursionError):
        identity = None
    if not isinstance(identity, dict):
        raise FeatureFileError(
            f"'{found.name}' records a run identity that is not a JSON object",
            hint="compute the comparison again with hookcli compare",
        )
    kept = {key: value for key, value in identity.items() if key not in _MERGE_FREE}
    with contextlib.suppress(KeyError, ValueError, TypeError, RecursionError):  # a second model's run, as JSON text
        second = json.loads(kept["compare_with"])
        kept["compare_with"] = {key: value for key, value in second.items() if key not in _MERGE_FREE}
    with contextlib.suppress(KeyError, ValueError, TypeError, RecursionError, AttributeError):
        # Saved features compared: files of other inputs are other files; what they compare is their keys.
        kept["compare_of"] = [source["keys"] for source in json.loads(kept["compare_of"])]
    return kept


def _mergeable(found: FeatureFile, first: Mapping[str, str]) -> tuple[list[str], list[str]]:
    """``(rows, columns)`` of a linear-cka comparison file that can merge with ``first`` (the first file's
    metadata; empty for the first)."""
    metadata = found.metadata
    if not is_comparison(metadata) or metadata.get("method") != "linear-cka":
        raise FeatureFileError(
            f"'{found.name}' is not a linear-cka comparison file", hint="only linear-cka files keep sums that merge"
        )
    try:
        checked = check_comparison(
            metadata, {key: (found.dtype(key), found.shape(key)) for key in found.keys()}, found.read
        )
    except ValueError as err:
        raise FeatureFileError(
            f"'{found.name}' is not a comparison file hookcli can read: {err}",
            hint="read it with the hookcli that wrote it, or compare again with hookcli compare",
        ) from None
    missing = [name for name in CKA_STATE if name not in found.keys()]
    if missing:
        raise FeatureFileError(
            f"'{found.name}' has no {missing[0]}: its sums were not kept (a run over no input?)",
            hint="compare its inputs again with hookcli compare",
        )
    for entry in ("rows", "columns", "same", "settings"):
        if first and metadata.get(entry) != first.get(entry):
            raise UsageProblem(
                f"'{found.name}' compares other representations than the first file (its {entry} differ)",
                hint="merge comparisons of the same layers, made with the same options",
            )
    return checked.rows, checked.columns


def _ignore(event: Event) -> None:
    pass
