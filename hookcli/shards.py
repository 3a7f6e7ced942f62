"""Stream features into a folder of shards with an index; resume an interrupted run.

A folder output holds:

- ``features-00000.safetensors``, ``features-00001.safetensors``, …: shard *k*
  covers inputs ``[k·S, (k+1)·S)`` (S = the shard size in rows) and is a
  complete hookcli file on its own: same keys, same metadata, its own
  ``inputs`` (and ``skipped``);
- ``index.jsonl``: line 1 describes the run (its metadata, what must match to
  resume, the shard size, the number of inputs); then one line per finished
  shard: ``{"shard", "file", "first", "count", "inputs", "skipped"}``, which
  maps every input to its shard and row.

A shard is written to a temporary name and renamed, and only then is its line
appended to the index (and flushed to disk). After a crash, even ``kill -9``,
the index lists exactly the shards that are complete; running the same
command again continues with the next shard. A torn last line is ignored.

>>> with open_features("feats/") as features:            # doctest: +SKIP
...     features.shape("layer3"), features.read("layer3", 12345).shape
([1000000, 1024, 14, 14], (1024, 14, 14))
"""

from __future__ import annotations

import bisect
import hashlib
import json
import os
import queue
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from hookcli.errors import FeatureFileError, OutputExistsError, UsageProblem
from hookcli.store import FeatureFile, write_safetensors

__all__ = [
    "INDEX_NAME", "ShardWriter", "ShardedFeatures", "check_folder_target", "extract_to_folder", "finished_shards",
    "inputs_digest", "open_features", "read_index",
]

INDEX_NAME = "index.jsonl"
SHARD_NAME = "features-{:05d}.safetensors"
_SHARD_FILE = re.compile(r"^\.?features-\d{5}\.safetensors(\..*\.part)?$")
INDEX_VERSION = 1


def inputs_digest(paths: Sequence) -> str:
    """A fingerprint of the input list (absolute paths, in order)."""
    digest = hashlib.sha256()
    for path in paths:
        digest.update(os.path.abspath(path).encode("utf-8", "surrogateescape") + b"\n")
    return digest.hexdigest()


def read_index(folder: str | os.PathLike) -> tuple[dict | None, list[dict]]:
    """The run header and the finished shards' lines (ignoring a torn last line), or ``(None, [])``."""
    path = Path(folder) / INDEX_NAME
    if not path.exists():
        return None, []
    lines = path.read_bytes().split(b"\n")
    entries = []
    for number, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            entries.append(json.loads(line))
        except ValueError:
            if number >= len(lines) - 2:  # the last line, cut short by a crash
                break
            raise FeatureFileError(f"index '{path}' is damaged at line {number + 1}",
                                   hint="run the extraction again with --force") from None
    if not entries or entries[0].get("hookcli_index") != INDEX_VERSION:
        raise FeatureFileError(f"'{path}' is not a hookcli index", hint="give a folder written by hookcli extract")
    return entries[0], entries[1:]


def finished_shards(folder: str | os.PathLike, shards: list[dict]) -> list[dict]:
    """The index lines that count: shards 0, 1, 2, … in order with their files on disk, up to the first gap.

    Lines after a gap (a shard file deleted by hand, say) describe work that
    will be done again, so readers ignore them and a resumed run drops them.
    """
    finished = []
    for expected, entry in enumerate(shards):
        if entry.get("shard") != expected or not (Path(folder) / entry["file"]).exists():
            break
        finished.append(entry)
    return finished


class ShardWriter:
    """Writes shards of a run into ``folder`` on a background thread and keeps the index.

    ``identity`` holds what must be equal to continue an earlier run there
    (model, weights, layers, preprocessing, inputs…). Opening a folder whose
    index describes another run raises :class:`OutputExistsError` naming what
    differs, unless ``force`` (which deletes that run's shards and index).
    :attr:`start` is the first input still to extract (0 for a new run).
    """

    def __init__(self, folder: str | os.PathLike, identity: Mapping, total: int, *, force: bool = False) -> None:
        check_folder_target(folder)
        self.folder = Path(folder)
        self.identity = dict(identity)
        self.total = total
        self.folder.mkdir(parents=True, exist_ok=True)
        header, shards = read_index(self.folder)
        if header is not None and header["identity"] != self.identity:
            if not force:
                differ = sorted(k for k in {*header["identity"], *self.identity}
                                if header["identity"].get(k) != self.identity.get(k))
                raise OutputExistsError(
                    f"'{folder}' holds a different run (it differs in: {', '.join(differ)})",
                    hint="run the same command to continue it, add --force to replace it, or use another folder",
                )
            header, shards = None, []
        if header is None:
            self._remove_old_run()
        self._clear_partial_files()
        self.header = header
        self.shard_size: int | None = header["shard_size"] if header else None
        self.finished = finished_shards(self.folder, shards)
        if header is not None and len(self.finished) < len(shards):
            self._rewrite_index()
        self.start = min(total, len(self.finished) * self.shard_size) if self.shard_size else 0
        self._queue: queue.Queue = queue.Queue(maxsize=1)
        self._failure: BaseException | None = None
        self._thread: threading.Thread | None = None

    @property
    def index_path(self) -> Path:
        return self.folder / INDEX_NAME

    def _rewrite_index(self) -> None:
        """Keep only the header and the finished shards' lines, so new lines never follow stale ones."""
        from hookcli.store import atomic_path

        with atomic_path(self.index_path, force=True) as temporary:
            temporary.write_text("".join(json.dumps(line) + "\n" for line in [self.header, *self.finished]))

    def _remove_old_run(self) -> None:
        for child in self.folder.iterdir():
            if child.name == INDEX_NAME or _SHARD_FILE.match(child.name):
                child.unlink()

    def _clear_partial_files(self) -> None:
        for child in self.folder.iterdir():
            if child.name.startswith(".") and _SHARD_FILE.match(child.name):
                child.unlink()  # a temporary file left by a killed run

    def begin(self, metadata: Mapping[str, str], shard_size: int) -> None:
        """Record the run in a new index (no-op when continuing) and start the writer thread."""
        if self.header is None:
            self.shard_size = shard_size
            self.header = {
                "hookcli_index": INDEX_VERSION, "identity": self.identity, "shard_size": shard_size,
                "inputs": self.total, "shard_name": SHARD_NAME, "metadata": dict(metadata),
            }
            self._rewrite_index()
        self._thread = threading.Thread(target=self._write_loop, name="hookcli-shard-writer", daemon=True)
        self._thread.start()

    def shard_range(self, number: int) -> tuple[int, int]:
        """Inputs ``[first, end)`` covered by shard ``number``."""
        first = number * self.shard_size
        return first, min(first + self.shard_size, self.total)

    def submit(self, number: int, tensors: Mapping, metadata: Mapping[str, str], inputs: Sequence[str],
               skipped: Sequence[dict]) -> None:
        """Queue a finished shard; blocks while the previous one is still being written."""
        self._raise_failure()
        self._queue.put((number, tensors, metadata, list(inputs), list(skipped)))

    def close(self) -> None:
        """Wait for queued shards to be on disk; re-raise a writer failure."""
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()
            self._thread = None
        self._raise_failure()

    def _raise_failure(self) -> None:
        if self._failure is not None:
            failure, self._failure = self._failure, None
            raise failure

    def _write_loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            if self._failure is not None:
                continue  # drain: one failure stops the writing
            try:
                self._write(*item)
            except BaseException as err:  # handed to the main thread
                self._failure = err

    def _write(self, number, tensors, metadata, inputs, skipped) -> None:
        name = SHARD_NAME.format(number)
        write_safetensors(tensors, metadata, self.folder / name, force=True)
        first, end = self.shard_range(number)
        line = {"shard": number, "file": name, "first": first, "count": end - first,
                "inputs": inputs, "skipped": skipped}
        with open(self.index_path, "a", encoding="utf-8") as index:
            index.write(json.dumps(line) + "\n")
            index.flush()
            os.fsync(index.fileno())


class ShardedFeatures:
    """A shard folder (or its ``index.jsonl``) read as one file: rows run on across shards.

    Offers :class:`~hookcli.store.FeatureFile`'s reading interface, so
    ``grid`` and ``info`` treat both alike. ``metadata["inputs"]`` lists the
    rows' inputs over all shards.
    """

    def __init__(self, source: str | os.PathLike) -> None:
        path = Path(source)
        self.folder = path.parent if path.name == INDEX_NAME else path
        self.name = str(source)
        header, shards = read_index(self.folder)
        if header is None:
            raise FeatureFileError(f"no {INDEX_NAME} in folder '{source}'",
                                   hint="give a folder written by hookcli extract -o DIR/")
        shards = finished_shards(self.folder, shards)
        if not shards:
            raise FeatureFileError(f"'{source}' holds no finished shard yet",
                                   hint="run the extraction (again) to write some")
        self.header, self.shards = header, shards
        self._starts, rows = [], 0
        for entry in shards:
            self._starts.append(rows)
            rows += len(entry["inputs"])
        self.rows = rows
        self._open: tuple[int, FeatureFile] | None = None
        self._with_rows = next((n for n, entry in enumerate(shards) if entry["inputs"]), 0)
        first = self._shard(self._with_rows)  # a shard whose inputs all failed may hold no tensors
        self._keys = first.keys()
        self._info = {k: (first.dtype(k), first.shape(k)[1:]) for k in self._keys}
        self.size = sum((self.folder / entry["file"]).stat().st_size for entry in shards)
        self.metadata = dict(header["metadata"])
        self.metadata["inputs"] = json.dumps([p for entry in shards for p in entry["inputs"]])
        skipped = [s for entry in shards for s in entry["skipped"]]
        if skipped:
            self.metadata["skipped"] = json.dumps(skipped)
        done = sum(entry["count"] for entry in shards)
        self.metadata["shards"] = json.dumps({"count": len(shards), "inputs_done": done, "inputs": header["inputs"],
                                              "complete": done == header["inputs"]})

    def _shard(self, number: int) -> FeatureFile:
        if self._open is None or self._open[0] != number:
            if self._open is not None:
                self._open[1].close()
            self._open = (number, FeatureFile(self.folder / self.shards[number]["file"]))
        return self._open[1]

    def __enter__(self) -> ShardedFeatures:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def close(self) -> None:
        if self._open is not None:
            self._open[1].close()
            self._open = None

    def keys(self) -> list[str]:
        return list(self._keys)

    def dtype(self, key: str) -> str:
        return self._info[key][0]

    def shape(self, key: str) -> list[int]:
        return [self.rows, *self._info[key][1]]

    def nbytes(self, key: str) -> int:
        per_row = FeatureFile.row_bytes(*self._info[key])
        return per_row * self.rows

    def read(self, key: str, index: int | None = None, part: slice | None = None):
        if index is None:
            return self.read_rows(key, 0, self.rows)
        if not -self.rows <= index < self.rows:
            raise IndexError(f"row {index} out of range for '{key}' with {self.rows} rows")
        index %= self.rows
        number = bisect.bisect_right(self._starts, index) - 1
        return self._shard(number).read(key, index - self._starts[number], part)

    def read_rows(self, key: str, start: int, stop: int):
        """Rows ``start:stop`` across shards (clipped as a slice is): one read per shard they fall in."""
        import numpy as np

        start, stop, _ = slice(start, stop).indices(self.rows)
        pieces = []
        for number, entry in enumerate(self.shards):
            first = self._starts[number]
            low, high = max(start, first), min(stop, first + len(entry["inputs"]))
            if low < high:
                pieces.append(self._shard(number).read_rows(key, low - first, high - first))
        if not pieces:
            return self._shard(self._with_rows).read_rows(key, 0, 0)
        return pieces[0] if len(pieces) == 1 else np.concatenate(pieces)


def open_features(source: str | os.PathLike):
    """A :class:`~hookcli.store.FeatureFile` for a file or ``-``, a :class:`ShardedFeatures` for a shard folder."""
    path = Path(source)
    if str(source) != "-" and (path.is_dir() or path.name == INDEX_NAME):
        return ShardedFeatures(path)
    return FeatureFile(source)


def check_folder_target(folder: str | os.PathLike) -> None:
    """Refuse a folder output whose path is an existing file (called before any work, and again on open)."""
    if Path(folder).exists() and not Path(folder).is_dir():
        raise UsageProblem(f"output '{folder}' is a file, not a folder", hint="drop the trailing / to write one file")


#: Shard size chosen when none is given: about this many bytes of features per shard.
AUTO_SHARD_BYTES = 128 * 1024 * 1024
MAX_AUTO_SHARD_ROWS = 10_000


def extract_to_folder(
    loaded, layers: Mapping[str, str], paths: Sequence, settings, folder: str | os.PathLike, *,
    shard_size: int | None = None, force: bool = False, on_batch: Callable | None = None,
    on_start: Callable[[int], None] | None = None, batches: Callable | None = None,
    identity_extra: Mapping | None = None, extra_metadata: Mapping[str, str] | None = None,
) -> ShardWriter:
    """Extract ``paths`` into shards in ``folder``, continuing an earlier run of the same command there.

    ``batches(start, capture_hooks)`` gives the batch source (default: plain
    extraction, :func:`~hookcli.extract.iter_batches`); ``identity_extra`` is
    added to what must match to continue, ``extra_metadata`` to the metadata.
    ``on_start(n)`` is told how many inputs an earlier run already finished;
    ``on_batch(batch)`` sees every :class:`~hookcli.extract.Batch` (for
    progress and skipped inputs). Returns the writer (``index_path`` is where
    the index is).
    """
    from hookcli.extract import build_metadata, iter_batches, resolved_memory_format
    from hookcli.fusion import fused_convolutions

    preprocess = settings.preprocess or loaded.preprocess
    identity = {
        "model": loaded.name, "weights": loaded.weights, "layers": dict(layers), "capture": settings.capture,
        "preprocess": json.loads(preprocess.to_json()), "pool": settings.pool or "none", "dtype": settings.dtype,
        "precision": settings.precision, "memory_format": resolved_memory_format(loaded, settings),
        "fuse": settings.fusing, "on_error": settings.on_error, "shard_size": shard_size or "auto",
        "inputs": len(paths), "inputs_sha256": inputs_digest(paths), **(identity_extra or {}),
    }
    if batches is None:
        def batches(start, capture_hooks):
            return iter_batches(loaded, layers, paths, settings, start=start, capture_hooks=capture_hooks)

    writer = ShardWriter(folder, identity, len(paths), force=force)
    if on_start is not None:
        on_start(writer.start)
    if writer.header is not None and writer.start >= len(paths):
        return writer
    hooks: list = []
    run_metadata: dict | None = None
    shard: _ShardBuffer | None = None
    held: list = []  # failures seen before the first readable image fixes the shard size
    try:
        for batch in batches(writer.start, hooks):
            if run_metadata is None and batch.features:
                run_metadata = build_metadata(loaded, layers, settings, keys=list(batch.features),
                                              calls=hooks[0].calls, omitted=sorted(hooks[0].omitted),
                                              fused=fused_convolutions(hooks[0].model), extra=extra_metadata)
                row_bytes = sum(v[0].numel() * v.element_size() for v in batch.features.values())
                size = shard_size or max(1, min(MAX_AUTO_SHARD_ROWS, AUTO_SHARD_BYTES // max(1, row_bytes)))
                writer.begin(run_metadata, size)
            events = [(index, "row", row) for row, index in enumerate(batch.indices)]
            events += [(index, "error", error) for index, error in batch.failures]
            if writer.shard_size is None:
                held.extend(events)
            else:
                shard = _feed(writer, shard, sorted(held + events), batch, paths, run_metadata)
                held = []
            if on_batch is not None:
                on_batch(batch)
        if writer.shard_size is None:
            from hookcli.errors import ImageError

            raise ImageError("none of the input images could be read", hint="see the skipped inputs above")
    finally:
        writer.close()
    return writer


class _ShardBuffer:
    """Rows of one shard being filled, allocated once at the shard's size."""

    def __init__(self, number: int, first: int, end: int) -> None:
        self.number, self.first, self.end = number, first, end
        self.tensors: dict = {}
        self.inputs: list[str] = []
        self.skipped: list[dict] = []
        self.targets: list = []

    def add_row(self, batch, row: int, path: str) -> None:
        import torch

        for key, value in batch.features.items():
            if key not in self.tensors:
                self.tensors[key] = torch.empty((self.end - self.first, *value.shape[1:]), dtype=value.dtype)
            self.tensors[key][len(self.inputs)] = value[row]
        self.inputs.append(path)
        if batch.targets:
            self.targets.append(batch.targets[row])

    def submit(self, writer: ShardWriter, run_metadata: dict) -> None:
        tensors = {key: value[: len(self.inputs)] for key, value in self.tensors.items()}
        metadata = {**run_metadata, "inputs": json.dumps(self.inputs), "shard": str(self.number)}
        if self.skipped:
            metadata["skipped"] = json.dumps(self.skipped)
        if self.targets:
            metadata["targets"] = json.dumps(self.targets)
        writer.submit(self.number, tensors, metadata, self.inputs, self.skipped)


def _feed(writer: ShardWriter, shard, events, batch, paths, run_metadata):
    """Place rows and failures, in input order, into shards; submit each shard once its last input is placed."""
    for index, kind, item in events:
        if shard is None:
            number = index // writer.shard_size
            shard = _ShardBuffer(number, *writer.shard_range(number))
        path = os.path.abspath(paths[index])
        if kind == "row":
            shard.add_row(batch, item, path)
        else:
            shard.skipped.append({"input": path, "error": item})
        if index + 1 >= shard.end:
            shard.submit(writer, run_metadata)
            shard = None
    return shard
