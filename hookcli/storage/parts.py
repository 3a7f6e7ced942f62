"""The parts of a gathering run's output, read back and merged (:func:`merged_parts`), and the output they make
(:func:`gathered_output`). A part is a file, and files are untrusted: whatever its state makes fail, it is named
as damaged."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import torch

from hookcli.errors import FeatureFileError, nothing_read, out_of_memory
from hookcli.storage import fileformat
from hookcli.storage.features import FeatureFile
from hookcli.storage.fileformat import SHARD_NAME, RunFacts, RunRecord
from hookcli.storage.gathering import GatheredShard, Gathering, Made, facts_entry
from hookcli.storage.shard_writer import ShardWriter
from hookcli.storage.stats_format import PART_ROWS, STATS_PART

__all__ = ["gathered_output", "merged_parts", "open_parts", "part_metadata", "part_of", "written_by_this_run"]


def open_parts(
    folder: str, record: RunRecord, inputs: int, size: int, *, force: bool, part: tuple[int, int], on_note
) -> ShardWriter:
    """The folder of parts of a run of ``record`` over ``inputs`` inputs in shards of ``size``, opened for writing
    (its header written, unless an earlier process of the run wrote it)."""
    parts = ShardWriter(
        folder, fileformat.identity(record), inputs, force=force, part=part, on_note=on_note, parts=True
    )
    if parts.header is None:
        run = fileformat.run_metadata(record, RunFacts(calls={}), keys=[])
        parts.start_writing(fileformat.index_header(record, run, size))
    else:
        parts.start_writing()
    return parts


def part_metadata(record: RunRecord, shard: GatheredShard) -> dict[str, str]:
    """The metadata of the part ``shard`` of a run of ``record``: a shard's, with what it gathered and learnt."""
    run = fileformat.run_metadata(record, shard.facts or RunFacts(calls={}), keys=[])
    metadata = fileformat.shard_metadata(run, shard.number, inputs=shard.inputs, skipped=shard.skipped)
    metadata["kind"] = STATS_PART
    metadata["gathered"] = json.dumps(shard.gathered.describe())
    metadata["facts"] = json.dumps(facts_entry(shard.facts))
    return metadata


def written_by_this_run(path: str, record: RunRecord) -> bool:
    """Whether the file at ``path`` is the output of the run of ``record`` (another of its processes merged it)."""
    mine = json.loads(json.dumps(fileformat.identity(record)))
    with contextlib.suppress(FeatureFileError, ValueError), FeatureFile(path) as found:
        theirs = json.loads(found.metadata.get("identity", "null"))
        return isinstance(theirs, dict) and not fileformat.identity_differences(theirs, mine)
    return False


def merge_device(device, gathering: Gathering) -> torch.device:
    """Where the parts of a run on ``device`` merge: a CUDA run's on its GPU where the gathering keeps its sums
    there (``merges_on_device``), as its shards merge in memory (the same arithmetic, so the same bytes whichever
    process merges them, and sorts and sums at GPU speed); anything else's (None: features read from files) on the
    CPU."""
    if device is not None and gathering.merges_on_device and torch.device(device).type == "cuda":
        if torch.cuda.is_available():
            return torch.device(device)
    return torch.device("cpu")


def merged_parts(
    folder: Path, shards: int, size: int, inputs: int, gathering: Gathering, output: str, device=None
) -> GatheredShard:
    """Every part of ``output`` in ``folder`` (``shards`` of them, of ``size`` of the run's ``inputs`` inputs
    each), merged in shard order on ``device`` (:func:`merge_device`; the CPU by default)."""
    merged: GatheredShard | None = None
    for number in range(shards):
        name = folder / SHARD_NAME.format(number)
        try:
            shard = _read_part(name, number, size, inputs, gathering, torch.device(device or "cpu"))
        except (KeyError, ValueError, RuntimeError, IndexError, TypeError, AttributeError) as err:
            if isinstance(err, RuntimeError) and _not_its_content(err):
                raise  # no damage (a GPU's memory: the caller merges on the CPU instead)
            removed = True
            try:  # its line left listing no file, the next run computes it again
                name.unlink()
            except OSError:
                removed = False
            raise FeatureFileError(  # a part is untrusted: whatever its state makes fail, it is damaged
                f"part '{name}' of '{output}' is damaged: {err}",
                hint="it is removed: run the same command again to compute it"
                if removed
                else "remove it, then run the same command again to compute it",
            ) from None
        if merged is None:
            merged = shard
        else:
            try:
                merged.merge(shard)
            except (KeyError, ValueError, IndexError, TypeError) as err:  # the parts disagree: whose fault is unknown
                raise FeatureFileError(
                    f"the parts of '{output}' do not merge: part {number}: {err}",
                    hint=f"remove '{folder}' and run the same command again to compute them all",
                ) from None
        del shard  # not held while the next part is read
    assert merged is not None, "a run has one shard at least"
    return merged


def _not_its_content(err: RuntimeError) -> bool:
    """Whether torch failed for want of memory or of its device, not for what a part holds."""
    return out_of_memory(err) or "CUDA" in str(err)


def _read_part(name: Path, number: int, size: int, inputs: int, gathering: Gathering, device) -> GatheredShard:
    with FeatureFile(name) as part:
        rows = torch.from_numpy(part.read(PART_ROWS)).tolist()
        first, end = number * size, min((number + 1) * size, inputs)
        if rows != sorted(set(rows)) or any(not first <= row < end for row in rows):
            raise ValueError(f"its rows are not inputs of shard {number} ({first} to {end - 1}), each once")
        state = {key: torch.from_numpy(part.read(key)) for key in part.keys() if key != PART_ROWS}
        return part_of(number, state, part.metadata, rows, gathering, device)


def part_of(
    number: int, state: Mapping[str, torch.Tensor], metadata: Mapping[str, str], rows: list[int], gathering: Gathering,
    device,
) -> GatheredShard:  # fmt: skip
    """Part ``number`` as a shard, from the tensors and metadata a part's file holds (:func:`part_metadata`) and its
    ``rows``, its tensors moved to ``device``: read from a file, or a copy of a part this process has just made,
    which then merges with the arithmetic of the file's."""
    state = {key: value.to(device) for key, value in state.items() if key != PART_ROWS}
    shard = GatheredShard(number, gathering.read(state, json.loads(metadata["gathered"]), rows))
    try:  # JSON of the wrong kinds: a part is untrusted
        shard.inputs = json.loads(metadata["inputs"])
        shard.skipped = json.loads(metadata.get("skipped", "[]"))
        facts = json.loads(metadata["facts"])
        shard.facts = RunFacts(facts["calls"], tuple(facts["omitted"]), facts["fused"]) if facts else None
    except (TypeError, AttributeError) as err:
        raise ValueError(f"its metadata is not what hookcli writes ({err})") from None
    shard.rows = list(rows)
    if len(shard.rows) != len(shard.inputs):
        raise ValueError(f"it has {len(shard.rows)} rows and {len(shard.inputs)} inputs")
    return shard


def gathered_output(
    merged: GatheredShard,
    gathering: Gathering,
    record: RunRecord,
    paths: Sequence,
    on_note: Callable[[str], None] | None,
) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """The output's tensors and metadata, from every shard ``merged``; its notes go to ``on_note``."""
    if not merged.rows:
        raise nothing_read(paths)
    positions = torch.full((len(paths),), -1, dtype=torch.int64)
    positions[torch.tensor(merged.rows)] = torch.arange(len(merged.rows))
    tensors = merged.gathered.result(positions)
    if on_note is not None:
        for text in gathering.notes(merged.gathered, tensors, inputs=len(merged.rows)):
            on_note(text)
    run = fileformat.run_metadata(record, merged.facts or RunFacts(calls={}), keys=list(tensors))
    return tensors, gathering.metadata(run, Made(tensors, merged.inputs, merged.skipped, fileformat.identity(record)))
