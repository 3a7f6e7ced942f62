"""The writer of runs that gather rather than store rows (``stats``, ``compare``): shard states merged in shard order.

A :class:`~hookcli.storage.gathering.Gathering` makes each shard's empty :class:`~hookcli.storage.gathering.Gathered`,
reads one back from a part and says what the metadata holds. Shards are cut as a shard folder's are (inputs
``[k·S, (k+1)·S)``), each with fresh accumulators. Written to a file, each finished shard's state is a part in
``<output>.parts/``, a shard folder (:class:`~hookcli.storage.shard_writer.ShardWriter`) that many processes fill and a
killed run continues; whoever finishes the last part merges them all, in shard order, into the output and deletes the
folder, so one process, ``--part`` and torchrun write the same bytes. For ``stats`` a part holds about ``C × (3k + C)``
numbers a layer of ``C`` channels and sketch size ``k``: some 130 MiB for resnet50's ``layer3`` and ``layer4``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from hookcli.errors import FeatureFileError, OutputExistsError
from hookcli.files import check_writable, release_output, share_output, take_output
from hookcli.inputs.archives import file_stamp, input_files, input_name
from hookcli.parsing import block_of
from hookcli.storage.background import Background
from hookcli.storage.features import Features
from hookcli.storage.fileformat import RunRecord, parts_folder
from hookcli.storage.gathering import GatheredShard, Gathering, checked_shard_size
from hookcli.storage.parts import (
    gathered_output,
    merge_device,
    merged_parts,
    open_parts,
    part_metadata,
    part_of,
    written_by_this_run,
)
from hookcli.storage.rows_writer import GatheringRun
from hookcli.storage.saving import write_safetensors
from hookcli.storage.shard_writer import ShardWriter, batches_in

__all__ = ["GatheringWriter", "room_to_fold"]


def room_to_fold(state: dict, device: torch.device) -> bool:
    """Whether a run's parts of ``state``'s size may merge in memory on ``device`` while the run goes on: on a GPU,
    where reading them back costs the run's end most, when the merged state and a part's copy take a quarter of its
    free memory at most (the model's needs come first); on the CPU never, where the merged state held through the
    run would add to its peak memory (1.15x at 640 photos, where reading back keeps 1.07x: ``bench/stats_bench.py``)."""
    if device.type != "cuda":
        return False
    size = sum(value.numel() * value.element_size() for value in state.values())
    free, _ = torch.cuda.mem_get_info(device)
    return 2 * size <= free // 4


class GatheringWriter:
    """The writer (:mod:`hookcli.storage.writers`) of a run that gathers ``gathering`` into the file ``path``, or
    into :class:`~hookcli.storage.features.Features` (``path`` None). ``part`` ``(index, count)``: the block of
    shards this process takes first; ``source_files``: the saved features the rows are read from (``paths`` naming
    their inputs); ``team``: one of torchrun's group, whose first process reports the file; ``device``: the run's,
    where its parts merge (:func:`~hookcli.storage.parts.merge_device`)."""

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
        device: Any = None,
    ) -> None:
        self.record, self.paths, self.gathering = record, paths, gathering
        self.source_files, self.team, self.device = source_files, team, device
        self.path = None if path is None else os.fspath(path)
        self.shard_size, self.force, self.part, self.on_note = shard_size, force, part, on_note
        self.open: dict[int, GatheredShard] = {}
        self._adding: Background | None = None  # the thread that gathers each batch
        self.merged: GatheredShard | None = None  # the shards so far, merged in order (to a file: _fold)
        # The parts merged into it, or -1 where some are not this process's (_fold): from the start where other
        # processes share the run.
        self.folded = -1 if team or part[1] > 1 else 0
        self.folder: ShardWriter | None = None
        self.written: list[str | Path] = []
        self.done = 0
        self.kept = None if self.path is None else f"{parts_folder(self.path)}/"  # the parts, until they merge
        self.complete = False
        self.finisher = False
        self._mark: int | None = None  # this process's share of the output's mark, while it uses the parts

    @classmethod
    def of(
        cls, run: GatheringRun, gathering: Gathering, note: Callable[[str], None], record: RunRecord | None = None
    ) -> GatheringWriter:
        """The writer that gathers ``gathering`` over a planned ``run``'s inputs into its output (its record unless
        ``record`` says otherwise)."""
        return cls(record or run.record, run.inputs, run.output.path, gathering, shard_size=run.shard_size,
                   force=run.force, part=block_of(run.part), on_note=note, team=run.team is not None,
                   device=run.settings.device)  # fmt: skip

    @property
    def inputs_done(self) -> int:
        return self.folder.inputs_done if self.folder is not None else len(self.paths)

    @property
    def has_rows(self) -> bool:
        return True  # whether any input had rows is known once the shards merge (finish says so)

    def begin(self, batch_size: int):
        size = checked_shard_size(self.shard_size, len(self.paths), batch_size, self.gathering.fewest)
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
        self.folder = open_parts(self.kept, self.record, len(self.paths), size, force=self.force, part=self.part,
                                 on_note=self.on_note)  # fmt: skip
        self.done = self.folder.done
        assert self.folder.shard_size is not None, "the header gives the shard size"
        self.size = self.folder.shard_size
        if self.folder.complete:
            self.finisher = True
            return None
        return self.folder.order(batch_size)

    def _written_by_another(self) -> bool:
        """Whether another process of this run (``part``) has merged the output already, ``force`` or not (a late
        task of an array of them finds the file its run wrote); any other file there is refused, unless ``force``
        (as is any file at all for a run of one process: the command run again)."""
        assert self.path is not None, "a file's writer"
        if not os.path.lexists(self.path):
            return False
        if self.part[1] > 1 and written_by_this_run(self.path, self.record):
            self._say_written_by_another()
            return True
        if self.force:
            return False
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
            self.open[number] = GatheredShard(number, self.gathering.start(number))
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

    def _finished(self, shard: GatheredShard, first: int, end: int) -> None:
        shard.gathered.seal()
        if self.folder is None:
            if self.merged is None:
                self.merged = shard
            else:
                self.merged.merge(shard)
            return
        metadata, state = part_metadata(self.record, shard), shard.state()
        files = self.source_files or dict.fromkeys(path for row in self.paths[first:end] for path in input_files(row))
        stamps = {path: file_stamp(path) for path in files}
        self.folder.submit(shard.number, state, metadata, shard.inputs, shard.skipped, None, stamps)
        self._fold(shard.number, state, metadata, list(shard.rows))

    def _fold(self, number: int, state: dict, metadata: dict, rows: list[int]) -> None:
        """Merge this process's part ``number`` into :attr:`merged` as its file would merge, while this process has
        made every part so far, in order, and no other process shares the run: then the parts need not be read back
        (:meth:`_write_output`)."""
        device = merge_device(self.device, self.gathering)
        if number != self.folded or (self.merged is None and not room_to_fold(state, device)):
            self.merged, self.folded = None, -1  # another process's or an earlier run's parts come between
            return
        try:
            copied = {key: value.to(device, copy=True) for key, value in state.items()}  # the file's are written
            part = part_of(number, copied, metadata, rows, self.gathering, device)
            if self.merged is None:
                self.merged = part
            else:
                self.merged.merge(part)
        except torch.cuda.OutOfMemoryError:
            self.merged, self.folded = None, -1  # the parts are read back and merged at the end instead
            return
        self.folded += 1

    def finish(self):
        if self._adding is not None:
            self._adding.close()  # every batch gathered; raises what failed there
        if self.path is None:
            self.complete = self.finisher = True  # in memory: this process computed every shard
            merged = self.merged or GatheredShard(0, self.gathering.start(0))
            tensors, metadata = gathered_output(merged, self.gathering, self.record, self.paths, self.on_note)
            return Features(tensors, metadata, facts=merged.facts)
        if self.folder is None:  # another process of the run wrote the output
            if self.team:  # before this one began: its first process still says what was written
                self.written = [self.path]
            return Path(self.path)
        try:
            self.folder.close()
            self.complete = self.folder.complete
            self.finisher = self.finisher or self.folder.finisher
            if self.complete and self.finisher:
                self._write_output()
            elif self.complete and not self.team and self.on_note is not None:
                self.on_note(
                    f"every part of '{self.path}' is done: the process that finished the last merges them (should it "
                    "stop first, run the same command again to merge them)"
                )
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
        device = merge_device(self.device, self.gathering)
        if self.folded == self.folder.shards and self.merged is not None:
            merged: GatheredShard | None = self.merged  # every part was this process's, merged as it was written
        else:
            merged = self._merged_parts(device)
        if merged is None:
            torch.cuda.empty_cache()
            if self.on_note is not None:
                self.on_note(f"{device} ran out of memory merging the parts of '{self.path}': they merged on the CPU")
            merged = merged_parts(self.folder.folder, self.folder.shards, self.size, len(self.paths), self.gathering,
                                  self.path)  # fmt: skip
        tensors, metadata = gathered_output(merged, self.gathering, self.record, self.paths, self.on_note)
        write_safetensors(tensors, metadata, self.path, force=True)
        shutil.rmtree(self.folder.folder, ignore_errors=True)
        self.written = [self.path]

    def _merged_parts(self, device) -> GatheredShard | None:
        """Every part read back and merged on ``device``; None where it ran out of memory."""
        assert self.path is not None and self.folder is not None, "the output's parts are written"
        try:
            return merged_parts(self.folder.folder, self.folder.shards, self.size, len(self.paths), self.gathering,
                                  self.path, device=device)  # fmt: skip
        except torch.cuda.OutOfMemoryError:
            return None  # the parts are whole: they merge on the CPU instead, once out of this handler, whose
            # traceback holds the GPU's tensors

    def _say_written_by_another(self) -> None:
        if self.on_note is not None:
            again = " (--force redoes none of it: delete the file to compute it again)" if self.force else ""
            self.on_note(f"'{self.path}' is complete: another process of this run wrote it{again}")

    def _let_go(self) -> None:
        """Give up this process's mark on the output."""
        if self._mark is not None:
            assert self.path is not None, "a mark is on an output"
            release_output(self.path, self._mark)
            self._mark = None

    def abort(self) -> None:
        if self._adding is not None:
            with contextlib.suppress(Exception):  # the failure that stopped the run is the one to report
                self._adding.close()
        if self.folder is not None:
            with contextlib.suppress(Exception):  # the failure that stopped the run is the one to report
                self.folder.close()
            alone = self.part == (0, 1) and not self.team  # no other process of the run may be writing it
            if alone and self.kept is not None and self.folder.inputs_done == 0:
                # Nothing done to continue: a folder that records this run would only refuse the corrected one.
                with contextlib.suppress(OSError):
                    shutil.rmtree(self.kept)
                self.kept = None
        else:
            self.kept = None  # this run kept nothing: a folder there is another run's
        self._let_go()
