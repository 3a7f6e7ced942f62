"""Inputs to batches: images (or clips, or pairs of frames) decoded and preprocessed by worker processes, in
input order or in the order a writer asks for, each failure kept as a value, never raised in a worker.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator, Sequence

from hookcli.errors import ImageError, VideoError
from hookcli.inputs import decoding
from hookcli.inputs.decoding import DeviceDecoder
from hookcli.inputs.images import load_rgb
from hookcli.inputs.preprocess import Preprocess
from hookcli.inputs.video import close_decoders
from hookcli.run.settings import RunSettings

__all__ = ["Decoded", "image_loader", "reported_failures", "videos_closed"]


#: RAFT's correlation pyramid needs feature maps of 16 or more a side, at an eighth of the frame's.
_FLOW_MIN_SIDE = 128


class _Images:
    """A dataset of decoded, preprocessed images; a failure comes back as a value, never raised in a worker."""

    def __init__(self, paths: Sequence, preprocess: Preprocess) -> None:
        self.paths, self.load, self.kind = paths, load_rgb, preprocess.kind
        self.transform, self.decode_size = preprocess.to_transform(), preprocess.decode_size

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int):
        item = self.paths[index]
        try:
            if not hasattr(item, "read"):
                return index, self.transform(self.load(item, min_size=self.decode_size)), None
            frames = item.read()  # a clip or a pair of frames: hookcli.inputs.video's Clip or ImagePair
            if self.kind == "video":
                return index, self.transform(frames), None
            from PIL import Image

            pair = tuple(self.transform(Image.fromarray(frame)) for frame in frames)
            height, width = pair[0].shape[-2:]
            if min(height, width) < _FLOW_MIN_SIDE:
                raise VideoError(
                    f"the frames of '{item.path}' are {width}x{height} as the model would see them, and "
                    f"optical-flow models take sides of {_FLOW_MIN_SIDE} pixels or more",
                    hint="give a larger --resize or --crop (a multiple of 8)",
                )
            if height % 8 or width % 8:
                raise VideoError(
                    f"the frames of '{item.path}' are {width}x{height} as the model would see them, and "
                    "optical-flow models take sides divisible by 8",
                    hint="give --crop (a multiple of 8), or --resize to a size that keeps both sides so",
                )
            return index, pair, None
        except (ImageError, VideoError) as err:
            return index, None, (err.message, err.hint)


def _collate(items):
    """``(indices, batch, failures)``: rows of one shape stacked, rows of several (or images for detection) a list;
    pairs of frames a tuple of two such batches."""
    good = [(i, t) for i, t, e in items if e is None]
    failures = [(i, e) for i, t, e in items if e is not None]
    rows = [t for _, t in good]
    if not rows:
        batch = None
    elif isinstance(rows[0], tuple):
        batch = tuple(_stacked(list(parts)) for parts in zip(*rows))
    else:
        batch = _stacked(rows)
    return [i for i, _ in good], batch, failures


def _stacked(rows: list):
    import torch

    return torch.stack(rows) if all(row.shape == rows[0].shape for row in rows) else rows


def _worker_init(worker_id: int) -> None:
    import torch

    _die_with_parent()
    torch.set_num_threads(1)
    # Decoding should use the cycles the model leaves idle, not preempt its threads.
    os.nice(5)


def _die_with_parent() -> None:
    """On Linux, end this decode worker when the process that started it dies (a kill -9 leaves workers that
    would otherwise wait forever, holding the files the run had open)."""
    import ctypes
    import multiprocessing
    import signal

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: the workers end as torch's watchdog sees the parent gone
        return
    parent = multiprocessing.parent_process()
    if parent is not None and os.getppid() != parent.pid:  # the parent died before the call
        os._exit(1)


def image_loader(paths: Sequence, settings: RunSettings, *, order: Iterable[list[int]] | None = None):
    """Batches ``(indices, stacked images or None, failures)`` of ``paths`` in ``settings.batch_size`` (or the
    batches of input indices ``order`` gives, read as they are needed), decoded by ``settings.workers``; with
    ``decode="device"``, ``(indices, Encoded, failures)`` for :class:`hookcli.inputs.decoding.DeviceDecoder` to finish.

    ``settings`` must be resolved (:meth:`RunSettings.resolved`).
    """
    import torch
    from torch.utils.data import DataLoader

    preprocess, workers = settings.preprocess, settings.workers
    assert preprocess is not None and workers is not None, "resolved settings decide both"
    on_device = preprocess.decode == "device"
    return DataLoader(
        # Map-style datasets (__len__ and __getitem__), which torch annotates as subclasses of its Dataset.
        decoding.EncodedImages(paths, preprocess) if on_device else _Images(paths, preprocess),  # type: ignore[arg-type]
        **({"batch_size": settings.batch_size} if order is None else {"batch_sampler": order}),
        num_workers=workers,
        collate_fn=decoding.collate if on_device else _collate,
        pin_memory=torch.device(settings.device).type == "cuda",
        worker_init_fn=_worker_init if settings.workers else None,
        # A batch of JPEG bytes may be far larger than the same batch preprocessed: fewer of them wait.
        prefetch_factor=(2 if on_device else 4) if settings.workers else None,
    )


def reported_failures(failures: list, on_error: str, inputs: str = "images") -> list[tuple[int, str]]:
    """Raise the first unreadable input in ``fail`` mode; in ``skip`` mode, ``(index, message)`` pairs. ``inputs``
    names what the rows are read from in the hint (images, videos)."""
    if failures and on_error == "fail":
        message, hint = failures[0][1]
        skip = f"add --on-error skip to leave unreadable {inputs} out"
        raise ImageError(message, hint=f"{hint}; or {skip}" if hint else skip)
    return [(index, f"{message}. Hint: {hint}" if hint else message) for index, (message, hint) in failures]


class Decoded:
    """The loader's batches, decoded on the device where the preprocessing says so (:mod:`hookcli.inputs.decoding`).

    :meth:`prepare` decodes the next batch early: called once the device has the forward of a batch queued, the
    host's share of decoding (reading the bytes, nvJPEG's Huffman stage) overlaps the device's work.
    """

    def __init__(self, loader, settings: RunSettings, on_note) -> None:
        self.loader = loader
        self._batches: Iterator | None = None  # the workers start with the first batch asked for
        preprocess = settings.preprocess
        assert preprocess is not None, "resolved settings decide it"
        self.decode = DeviceDecoder(preprocess, settings.device, on_note) if preprocess.decode == "device" else None
        self._next: tuple | None = None

    def __iter__(self):
        return self

    def __next__(self):
        self.prepare()
        found, self._next = self._next, None
        if found is None:
            raise StopIteration
        return found

    def prepare(self) -> None:
        if self._next is None:
            if self._batches is None:
                self._batches = iter(self.loader)
            found = next(self._batches, None)
            self._next = self.decode(*found) if found is not None and self.decode is not None else found


@contextlib.contextmanager
def videos_closed():
    """Closes the video file this process keeps open between clips once the run ends (workers exit anyway)."""
    try:
        yield
    finally:
        close_decoders()
