"""The writer of runs that gather rather than store rows (``stats``, ``compare``): batches go into accumulators,
shard by shard, and the shards' states merge, in shard order, into one file.

What is gathered is a :class:`Gathering` (:class:`~hookcli.statistics.channel_stats.StatsGathering` for
``stats``): it makes each shard's empty :class:`Gathered`, reads one back from a part, and says what the file's
metadata holds.

The inputs are cut into shards as a shard folder's are (a shard is inputs
``[k·S, (k+1)·S)``, its batches the same whoever computes them), and each
shard's accumulators start afresh. Written to a file, each finished shard's
state goes into a folder of parts beside it, ``<output>.parts/``, a shard folder
(:class:`~hookcli.storage.shard_writer.ShardWriter`) that any number of
processes fill and that a run killed part-way continues; the process that
finishes the last part merges them all into the output and removes the
folder. Because the shards and their batches do not depend on who computed them,
and states merge in shard order, one process, ``--part`` and torchrun write the
same file, byte for byte. In memory the shards merge as they finish, to the same
values.

A part holds its accumulators' states and ``@rows``, the inputs it has rows of:
for ``stats``, about ``C × (3k + C)`` numbers a layer of ``C`` channels (the
sketch's ``k`` and the covariance), some 130 MiB for resnet50's ``layer3`` and
``layer4`` together.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import NamedTuple, Protocol

import torch

from hookcli.errors import FeatureFileError, ImageError, OutputExistsError, UsageProblem
from hookcli.files import check_writable, release_output, share_output, take_output
from hookcli.inputs.archives import file_stamp, input_files, input_name
from hookcli.storage import fileformat
from hookcli.storage.background import Background
from hookcli.storage.features import FeatureFile, Features
from hookcli.storage.fileformat import SHARD_NAME, RunFacts, RunRecord, parts_folder
from hookcli.storage.saving import write_safetensors
from hookcli.storage.shard_writer import ShardWriter, batches_in
from hookcli.storage.stats_format import PART_ROWS, STATS_PART

__all__ = ["Gathered", "Gathering", "GatheringWriter", "Made", "stats_shard_size"]

#: How many shards the inputs are cut into when no shard size is given...
AUTO_SHARDS = 8
#: ... unless that leaves shards of fewer inputs than this: each shard's state is written, read back and merged
#: (about 0.15 s a shard for resnet50's ``layer3`` and ``layer4``), which would cost a small run more than its
#: forward.
MIN_SHARD_INPUTS = 256


def stats_shard_size(inputs: int, batch_size: int, fewest: int = 1) -> int:
    """The shard size chosen when none is given: an eighth of the inputs, :data:`MIN_SHARD_INPUTS` at least, in
    whole batches, leaving no shard fewer than ``fewest`` rows. It never depends on how many processes share the
    run, so that any number of them give the same file.

    >>> stats_shard_size(200, 16), stats_shard_size(3000, 16), stats_shard_size(10**6, 64), stats_shard_size(600, 3)
    (256, 384, 125056, 258)
    """
    rows = max(-(-inputs // AUTO_SHARDS), MIN_SHARD_INPUTS)
    size = -(-rows // batch_size) * batch_size
    while size < inputs and (size < fewest or 0 < inputs % size < fewest):
        size += batch_size
    return size


class Gathered(Protocol):
    """What one shard (or several, merged) has gathered."""

    def update(self, features: Mapping, rows: torch.Tensor) -> None:
        """Add a batch: ``features`` by key, batch-first, from the inputs numbered ``rows``."""
        ...

    def merge(self, other) -> None:
        """Add what a later shard gathered."""
        ...

    def state(self) -> dict[str, torch.Tensor]:
        """Everything it holds, as named tensors (a part's)."""
        ...

    def describe(self) -> dict:
        """What a part's metadata says of it (JSON), to read its state back."""
        ...

    def seal(self) -> None:
        """The shard is complete: nothing more comes (what waits for more rows is gathered now)."""
        ...

    def result(self, positions: torch.Tensor) -> dict[str, torch.Tensor]:
        """The output's tensors; ``positions`` gives each input's row in the output's ``inputs``."""
        ...


class Made(NamedTuple):
    """What a gathering run's output is made of: its ``tensors``, the ``inputs`` they have rows of, those
    ``skipped``, and the run's ``identity``."""

    tensors: Mapping[str, torch.Tensor]
    inputs: list
    skipped: list
    identity: Mapping


class Gathering(Protocol):
    """What a run gathers: each shard's :class:`Gathered`, and the output's metadata. ``fewest``: the rows a shard
    needs at least."""

    @property
    def fewest(self) -> int: ...

    def start(self, number: int) -> Gathered:
        """Shard ``number``'s gathering, empty."""
        ...

    def read(self, state: Mapping[str, torch.Tensor], described: Mapping, rows: Sequence[int]) -> Gathered:
        """A part's gathering, from its state, what its metadata says of it and the inputs it has rows of; ValueError
        where the state is not what those rows could make (a part is a file, and files are untrusted)."""
        ...

    def metadata(self, run: Mapping[str, str], made: Made) -> dict[str, str]:
        """The metadata of the output ``made``, from the run's (:func:`~hookcli.storage.fileformat.run_metadata`)."""
        ...

    def notes(self, gathered, tensors: Mapping[str, torch.Tensor], *, inputs: int) -> list[str]:
        """What the output's ``tensors``, which ``gathered`` made of ``inputs`` inputs, call for saying (a
        ``Note:`` each)."""
        ...


class _Shard:
    """One shard's gathering, the inputs it has rows of (their numbers and names), those skipped, and what the
    forward learnt."""

    def __init__(self, number: int, gathered: Gathered) -> None:
        self.number, self.gathered = number, gathered
        self.rows: list[int] = []
        self.inputs: list[str] = []
        self.skipped: list[dict] = []
        self.facts: RunFacts | None = None

    @property
    def placed(self) -> int:
        return len(self.rows) + len(self.skipped)

    def state(self) -> dict[str, torch.Tensor]:
        tensors = {name: value.contiguous() for name, value in self.gathered.state().items()}
        tensors[PART_ROWS] = torch.tensor(self.rows, dtype=torch.int64)
        return tensors

    def merge(self, later: _Shard) -> None:
        """Add a later shard."""
        self.gathered.merge(later.gathered)
        self.rows += later.rows
        self.inputs += later.inputs
        self.skipped += later.skipped
        self.facts = self.facts or later.facts


class GatheringWriter:
    """The writer of a run that gathers (:mod:`hookcli.storage.writers` says what a writer does): ``path`` the
    output file, or None for the result in memory (:class:`~hookcli.storage.features.Features`).

    ``gathering`` is what to gather; ``part`` ``(index, count)`` which block of
    shards this process takes first. ``source_files``: the rows are read from
    these files (saved features), and ``paths`` are the names of the inputs
    they came from. ``team``: this process is one of torchrun's group, whose
    first process reports the file whoever wrote it (the others report what
    they wrote themselves).
    """

    def __init__(
        self,
        record: RunRecord,
        paths: Sequence,
        path: str | os.PathLike | None,
        gathering: Gathering,
        *,
        shard_size: int | None = None,
        force: bool = False,
        part: tuple[int, int] = (0, 1),
        on_note: Callable[[str], None] | None = None,
        source_files: Sequence[str] | None = None,
        team: bool = False,
    ) -> None:
        self.record, self.paths, self.gathering = record, paths, gathering
        self.source_files, self.team = source_files, team
        self.path = None if path is None else os.fspath(path)
        self.shard_size, self.force, self.part, self.on_note = shard_size, force, part, on_note
        self.open: dict[int, _Shard] = {}
        self._adding: Background | None = None  # the thread that gathers each batch
        self.merged: _Shard | None = None  # in memory: the shards so far, merged in order
        self.folder: ShardWriter | None = None
        self.written: list[str | Path] = []
        self.done = 0
        self.kept = None if self.path is None else f"{parts_folder(self.path)}/"  # the parts, until they merge
        self.complete = False
        self.finisher = False
        self._mark: int | None = None  # this process's share of the output's mark, while it uses the parts

    @property
    def inputs_done(self) -> int:
        return self.folder.inputs_done if self.folder is not None else len(self.paths)

    @property
    def has_rows(self) -> bool:
        return True  # whether any input had rows is known once the shards merge (finish says so)

    def begin(self, batch_size: int):
        size = self.shard_size or stats_shard_size(len(self.paths), batch_size, self.gathering.fewest)
        last = len(self.paths) % size
        if size < len(self.paths) and 0 < last < self.gathering.fewest:
            raise UsageProblem(
                f"--shard-size {size} leaves the last shard {last} of {len(self.paths)} inputs, and this run needs "
                f"{self.gathering.fewest} a shard at least",
                hint=f"give --shard-size {stats_shard_size(len(self.paths), batch_size, self.gathering.fewest)}, "
                "or leave it out",
            )
        if self.path is None:
            self.size = size
            return (
                batch
                for first in range(0, len(self.paths), size)
                for batch in batches_in(first, min(first + size, len(self.paths)), batch_size)
            )
        # Shared by every process of the run while it uses the parts folder: the one that merges the parts takes
        # it whole, so that the folder goes only once nobody is in it; a process starting once it holds it waits
        # for the merge. Without a folder of parts, whoever holds it whole writes the file some other way (an
        # extract): waiting would gain nothing.
        try:
            self._mark = share_output(self.path, on_wait=self.on_note, wait=parts_folder(self.path).exists())
        except OutputExistsError:
            if not self._written_by_another():  # unless merged, and the folder gone, in the meantime
                raise
        if self._mark is None or self._written_by_another():
            self._let_go()
            self.complete = True
            return None
        assert self.kept is not None, "a file's parts are kept in a folder"
        self.folder = ShardWriter(
            self.kept,
            fileformat.identity(self.record),
            len(self.paths),
            force=self.force,
            part=self.part,
            on_note=self.on_note,
            parts=True,
        )
        self.done = self.folder.done
        if self.folder.header is None:
            run = fileformat.run_metadata(self.record, RunFacts(calls={}), keys=[])
            self.folder.start_writing(fileformat.index_header(self.record, run, size))
        else:
            self.folder.start_writing()
        assert self.folder.shard_size is not None, "the header gives the shard size"
        self.size = self.folder.shard_size
        if self.folder.complete:
            self.finisher = True
            return None
        return self.folder.order(batch_size)

    def _written_by_another(self) -> bool:
        """Whether another process of this run (``part``) has merged the output already; any other file there is
        refused, unless ``force`` (as is any file at all for a run of one process: the command run again)."""
        assert self.path is not None, "a file's writer"
        if self.force or not os.path.lexists(self.path):
            return False
        if self.part[1] > 1:
            mine = json.loads(json.dumps(fileformat.identity(self.record)))
            with contextlib.suppress(FeatureFileError, ValueError), FeatureFile(self.path) as found:
                theirs = json.loads(found.metadata.get("identity", "null"))
                if isinstance(theirs, dict) and not fileformat.identity_differences(theirs, mine):
                    self._say_written_by_another()
                    return True
        check_writable(self.path, force=False)  # says that it exists
        return False

    def add(self, batch) -> None:
        """Gather ``batch`` on a thread of its own while the caller computes the next one (in order: the same
        result); a failure there is raised by a later call, or by :meth:`finish`."""
        if self._adding is None:
            self._adding = Background(self._add, name="hookcli-gather")
        self._adding.submit(batch)

    def _add(self, batch) -> None:
        events = [*batch.indices, *(index for index, _ in batch.failures)]
        if not events:
            return
        number = events[0] // self.size
        if number not in self.open:
            self.open[number] = _Shard(number, self.gathering.start(number))
        shard = self.open[number]
        for index, error in batch.failures:
            shard.skipped.append({"input": self._name(index), "error": error})
        if batch.indices:
            shard.gathered.update(batch.features, torch.tensor(batch.indices, dtype=torch.int64))
            shard.rows.extend(batch.indices)
            shard.inputs.extend(self._name(index) for index in batch.indices)
            shard.facts = batch.facts
        first, end = number * self.size, min((number + 1) * self.size, len(self.paths))
        if shard.placed == end - first:
            del self.open[number]
            self._finished(shard, first, end)

    def _name(self, index: int) -> str:
        return self.paths[index] if self.source_files is not None else input_name(self.paths[index])

    def _finished(self, shard: _Shard, first: int, end: int) -> None:
        shard.gathered.seal()
        if self.folder is None:
            if self.merged is None:
                self.merged = shard
            else:
                self.merged.merge(shard)
            return
        run = fileformat.run_metadata(self.record, shard.facts or RunFacts(calls={}), keys=[])
        metadata = fileformat.shard_metadata(run, shard.number, inputs=shard.inputs, skipped=shard.skipped)
        metadata["kind"] = STATS_PART
        metadata["gathered"] = json.dumps(shard.gathered.describe())
        metadata["facts"] = json.dumps(_facts(shard.facts))
        files = self.source_files or dict.fromkeys(path for row in self.paths[first:end] for path in input_files(row))
        stamps = {path: file_stamp(path) for path in files}
        self.folder.submit(shard.number, shard.state(), metadata, shard.inputs, shard.skipped, None, stamps)

    def finish(self):
        if self._adding is not None:
            self._adding.close()  # every batch gathered; raises what failed there
        if self.path is None:
            self.complete = self.finisher = True  # in memory: this process computed every shard
            merged = self.merged or _Shard(0, self.gathering.start(0))
            tensors, metadata = self._result(merged)
            return Features(tensors, metadata, facts=merged.facts)
        if self.folder is None:  # another process of the run wrote the output
            return Path(self.path)
        try:
            self.folder.close()
            self.complete = self.folder.complete
            self.finisher = self.finisher or self.folder.finisher
            if self.complete and self.finisher:
                self._write_output()
            elif self.complete and not self.team and self.on_note is not None:
                self.on_note(f"every part of '{self.path}' is done: the process that finished the last merges them")
        finally:
            self._let_go()
        if self.team:  # said once the whole group has finished, when the file is written
            self.written = [self.path]
        return Path(self.path)

    def _write_output(self) -> None:
        """Merge the parts into the output, once the other processes of the run have left their folder; unless
        one of them merged them first."""
        assert self.path is not None and self.folder is not None, "the output's parts are written"
        assert self._mark is not None, "the output's mark is shared"
        shared, self._mark = self._mark, None  # take_output's from here: let go of by it if it fails
        self._mark = take_output(self.path, shared, on_wait=self.on_note)
        parts = self.folder.folder.exists()
        if os.path.exists(self.path) and not (parts and self.force):
            self._say_written_by_another()
            return
        if not parts:
            raise FeatureFileError(
                f"the parts of '{self.path}' were removed before they were merged", hint="run the command again"
            )
        merged = self._read_parts()
        tensors, metadata = self._result(merged)
        write_safetensors(tensors, metadata, self.path, force=True)
        shutil.rmtree(self.folder.folder, ignore_errors=True)
        self.written = [self.path]

    def _say_written_by_another(self) -> None:
        if self.on_note is not None:
            self.on_note(f"'{self.path}' is complete: another process of this run wrote it")

    def _let_go(self) -> None:
        """Give up this process's mark on the output."""
        if self._mark is not None:
            assert self.path is not None, "a mark is on an output"
            release_output(self.path, self._mark)
            self._mark = None

    def _read_parts(self) -> _Shard:
        """Every part, merged in shard order."""
        assert self.folder is not None, "parts are read from their folder"
        merged: _Shard | None = None
        for number in range(self.folder.shards):
            name = self.folder.folder / SHARD_NAME.format(number)
            try:
                shard = self._read_part(name, number)
                if merged is None:
                    merged = shard
                else:
                    merged.merge(shard)  # ValueError where its layers are not the earlier parts'
            except (KeyError, ValueError, RuntimeError, IndexError, TypeError, AttributeError) as err:
                raise FeatureFileError(  # a part is untrusted: whatever its state makes fail, it is damaged
                    f"part '{name}' of '{self.path}' is damaged: {err}",
                    hint="run the same command with --force to compute it again",
                ) from None
            del shard  # not held while the next part is read
        assert merged is not None, "a run has one shard at least"
        return merged

    def _read_part(self, name: Path, number: int) -> _Shard:
        with FeatureFile(name) as part:
            metadata = part.metadata
            rows = torch.from_numpy(part.read(PART_ROWS)).tolist()
            first, end = number * self.size, min((number + 1) * self.size, len(self.paths))
            if rows != sorted(set(rows)) or any(not first <= row < end for row in rows):
                raise ValueError(f"its rows are not inputs of shard {number} ({first} to {end - 1}), each once")
            state = {key: torch.from_numpy(part.read(key)) for key in part.keys() if key != PART_ROWS}
            shard = _Shard(number, self.gathering.read(state, json.loads(metadata["gathered"]), rows))
            try:  # JSON of the wrong kinds: a part is untrusted
                shard.inputs = json.loads(metadata["inputs"])
                shard.skipped = json.loads(metadata.get("skipped", "[]"))
                facts = json.loads(metadata["facts"])
                shard.facts = RunFacts(facts["calls"], tuple(facts["omitted"]), facts["fused"]) if facts else None
            except (TypeError, AttributeError) as err:
                raise ValueError(f"its metadata is not what hookcli writes ({err})") from None
            shard.rows = rows
        if len(shard.rows) != len(shard.inputs):
            raise ValueError(f"it has {len(shard.rows)} rows and {len(shard.inputs)} inputs")
        return shard

    def _result(self, merged: _Shard) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
        """The output's tensors and metadata."""
        if not merged.rows:
            raise ImageError(
                "none of the input images could be read",
                hint="every input was skipped, each with its reason (on stderr; in Python, the Skipped events)",
            )
        positions = torch.full((len(self.paths),), -1, dtype=torch.int64)
        positions[torch.tensor(merged.rows)] = torch.arange(len(merged.rows))
        tensors = merged.gathered.result(positions)
        if self.on_note is not None:
            for text in self.gathering.notes(merged.gathered, tensors, inputs=len(merged.rows)):
                self.on_note(text)
        run = fileformat.run_metadata(self.record, merged.facts or RunFacts(calls={}), keys=list(tensors))
        metadata = self.gathering.metadata(
            run, Made(tensors, merged.inputs, merged.skipped, fileformat.identity(self.record))
        )
        return tensors, metadata

    def abort(self) -> None:
        if self._adding is not None:
            with contextlib.suppress(Exception):  # the failure that stopped the run is the one to report
                self._adding.close()
        if self.folder is not None:
            with contextlib.suppress(Exception):  # the failure that stopped the run is the one to report
                self.folder.close()
        self._let_go()


def _facts(facts: RunFacts | None) -> dict:
    if facts is None:
        return {}
    return {"calls": dict(facts.calls), "omitted": list(facts.omitted), "fused": facts.fused}
