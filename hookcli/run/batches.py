"""Inputs to batches: images (or clips, or pairs of frames) decoded and preprocessed by worker processes, in
input order or in the order a writer asks for, each failure kept as a value, never raised in a worker.

Workers start as the Python in use starts processes: ``fork`` (Linux before 3.14), ``forkserver`` (Linux from
3.14) or ``spawn`` (macOS); what they are handed pickles, and the files are the same bytes under all three. A
forked worker may leave hookcli's threads behind in the parent (a shard folder's claim heartbeat; the writing and
gathering threads start with the first batch, after the workers): it never touches what those threads lock (their
queues, events and the folder's lock, whose file the fork hooks of :mod:`hookcli.storage.claims` and
:mod:`hookcli.files` close in the child), and it only decodes files and hands rows back.
"""

from __future__ import annotations

import contextlib
import contextvars
import ctypes
import functools
import logging
import os
import signal
from collections.abc import Iterable, Iterator, Sequence
from typing import NamedTuple

import torch
from PIL import Image
from torch.utils.data import DataLoader
from torchvision.transforms.functional import pil_to_tensor

from hookcli.errors import ImageError, MemoryLimitError, VideoError
from hookcli.families import DEFAULT_CLIP_LENGTH, family_traits
from hookcli.inputs import decoding
from hookcli.inputs.clips import Clip, ImagePair
from hookcli.inputs.decoding import DeviceDecoder, NoSharedMemory, shared
from hookcli.inputs.images import PictureMaker, load_rgb, load_with_picture
from hookcli.inputs.preprocess import STILL_KINDS, Preprocess
from hookcli.inputs.transforms import to_tensor_steps, to_transform
from hookcli.inputs.video import close_decoders, read_row
from hookcli.run.settings import RunSettings

__all__ = [
    "Decoded",
    "Loaded",
    "batch_device",
    "batch_length",
    "call_model",
    "first_rows",
    "image_loader",
    "map_batch",
    "natural_input",
    "reported_failures",
    "rows_by_shape",
    "scaled_on_device",
    "videos_closed",
]


#: RAFT's correlation pyramid needs feature maps of 16 or more a side, at an eighth of the frame's.
_FLOW_MIN_SIDE = 128


class _Images:
    """A dataset of decoded, preprocessed images: items ``(index, row, failure, picture)``, a failure as a value,
    never raised in a worker, and ``picture`` what ``picture`` makes of a still image as it is decoded (None without
    one)."""

    def __init__(
        self, paths: Sequence, preprocess: Preprocess, picture: PictureMaker | None = None, *, uint8: bool = False
    ) -> None:
        self.paths, self.kind, self.picture = paths, preprocess.kind, picture
        self.transform, self.decode_size = to_transform(preprocess), preprocess.decode_size
        # With uint8, a still image leaves resized and cropped, to be scaled and normalised on the device (Decoded).
        self.geometry = to_tensor_steps(preprocess).geometry if uint8 else None

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int):
        item = self.paths[index]
        try:
            if not isinstance(item, Clip | ImagePair):
                made = None
                if self.picture is None:
                    image = load_rgb(item, min_size=self.decode_size)
                else:
                    image, made = load_with_picture(item, self.picture, min_size=self.decode_size)
                if self.geometry is not None:
                    return index, pil_to_tensor(self.geometry(image)), None, made
                return index, self.transform(image), None, made
            return index, self._frames(item), None, None
        except (ImageError, VideoError) as err:
            return index, None, (err.message, err.hint), None

    def _frames(self, item: Clip | ImagePair):
        """A clip's frames as the model takes them, or a pair's two frames."""
        frames = read_row(item)
        if self.kind == "video":
            return self.transform(frames)
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
        return pair


def _collate(items):
    """``(indices, batch, failures, pictures)``: rows of one shape stacked, rows of several (or images for
    detection) a list; pairs of frames a tuple of two such batches; pictures by input index."""
    good = [(i, t) for i, t, e, _ in items if e is None]
    failures = [(i, e) for i, t, e, _ in items if e is not None]
    rows = [t for _, t in good]
    if not rows:
        batch = None
    elif isinstance(rows[0], tuple):
        batch = tuple(_stacked(list(parts)) for parts in zip(*rows))
    else:
        batch = _stacked(rows)
    return [i for i, _ in good], shared(batch), failures, {i: made for i, _, _, made in items if made is not None}


def _stacked(rows: list):
    return torch.stack(rows) if all(row.shape == rows[0].shape for row in rows) else rows


def _worker_init(run_pid: int, worker_id: int) -> None:
    _die_with_run(run_pid)
    torch.set_num_threads(1)
    # Decoding should use the cycles the model leaves idle, not preempt its threads.
    os.nice(5)


def _die_with_run(run_pid: int) -> None:
    """On Linux, end this decode worker when its parent dies, and at once if the run's process ``run_pid`` is gone
    already (a kill -9 leaves workers that would otherwise wait forever, holding the files the run had open).

    The parent is the run's process under ``fork`` and ``spawn``, and the fork server under ``forkserver`` (the
    default from Python 3.14), which ends when the run's process does: either way the worker goes with the run.
    """
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: the workers end as torch's watchdog sees the parent gone
        return
    try:
        os.kill(run_pid, 0)
    except ProcessLookupError:  # the run died before the call
        os._exit(1)
    except PermissionError:  # alive, under another user's name (a reused pid): nothing to tell
        pass


def image_loader(
    paths: Sequence,
    settings: RunSettings,
    *,
    order: Iterable[list[int]] | None = None,
    picture: PictureMaker | None = None,
):
    """Batches ``(indices, stacked images or None, failures, pictures)`` of ``paths`` in ``settings.batch_size`` (or
    the batches of input indices ``order`` gives, read as they are needed), decoded by ``settings.workers``; with
    ``decode="device"``, ``(indices, Encoded, failures, pictures)`` for
    :class:`hookcli.inputs.decoding.DeviceDecoder` to finish. ``pictures`` holds, by input index, what ``picture``
    made of each image the workers decoded (empty without one).

    ``settings`` must be resolved (:func:`hookcli.run.speed.resolve_settings`).
    """
    preprocess, workers = settings.preprocess, settings.workers
    assert preprocess is not None and workers is not None, "resolved settings decide both"
    on_device = preprocess.decode == "device"
    images = _Images(paths, preprocess, picture, uint8=scaled_on_device(settings))
    return DataLoader(
        # Map-style datasets (__len__ and __getitem__), which torch annotates as subclasses of its Dataset.
        decoding.EncodedImages(paths, preprocess, picture) if on_device else images,  # type: ignore[arg-type]
        **({"batch_size": settings.batch_size} if order is None else {"batch_sampler": order}),
        num_workers=workers,
        collate_fn=decoding.collate if on_device else _collate,
        # Pinned rows copy to a GPU while it computes; JPEG bytes are read on the host by the device's decoder, so
        # pinning them would only copy each batch once more, in a thread of this process.
        pin_memory=torch.device(settings.device).type == "cuda" and not on_device,
        worker_init_fn=functools.partial(_worker_init, os.getpid()) if settings.workers else None,
        # A batch of JPEG bytes may be far larger than the same batch preprocessed: fewer of them wait.
        prefetch_factor=(2 if on_device else 4) if settings.workers else None,
        # Its seeds its own: the caller's random state is left as it was (on the device its tensors are made on).
        generator=torch.Generator(device=torch.get_default_device()),
    )


def scaled_on_device(settings: RunSettings) -> bool:
    """Whether the decode workers hand still images over as uint8, for the device to scale and normalise: when the
    device is not the CPU (on the CPU the workers do it, in their own processes and caches, as before)."""
    preprocess = settings.preprocess
    assert preprocess is not None, "resolved settings decide it"
    return preprocess.decode == "cpu" and preprocess.kind in STILL_KINDS and torch.device(settings.device).type != "cpu"


def reported_failures(failures: list, on_error: str, inputs: str = "images") -> list[tuple[int, str]]:
    """Raise the first unreadable input in ``fail`` mode; in ``skip`` mode, ``(index, message)`` pairs. ``inputs``
    names what the rows are read from in the hint (images, videos)."""
    if failures and on_error == "fail":
        message, hint = failures[0][1]
        skip = (
            f"add --on-error skip to leave unreadable {inputs} out"
            if inputs == "images"
            else f"add --on-error skip to leave out the {inputs} that fail so"  # a clip too short, frames too small
        )
        raise ImageError(message, hint=f"{hint}; or {skip}" if hint else skip)
    return [(index, f"{message}. Hint: {hint}" if hint else message) for index, (message, hint) in failures]


class Loaded(NamedTuple):
    """A batch of inputs ready for the model: input ``indices``, the ``batch`` (None when none could be read),
    ``failures`` ``(index, (message, hint))``, ``pictures`` by input index (see :func:`image_loader`), and ``damaged``
    ``(index, what the decoder said)`` for each image decoded though its decoder found it damaged."""

    indices: list[int]
    batch: object
    failures: list
    pictures: dict
    damaged: list[tuple[int, str]]


class Decoded:
    """The loader's batches as :class:`Loaded` ones: decoded on the device where the preprocessing says so
    (:mod:`hookcli.inputs.decoding`); else, for a GPU (:func:`scaled_on_device`), still images come from the workers
    as uint8, resized and cropped (a quarter of the bytes of floats, to share with this process and to copy to the
    GPU), and are scaled and normalised there with the arithmetic of torchvision's presets (the same floats).

    :meth:`prepare` decodes the next batch early: called once the device has the forward of a batch queued, the
    host's share of decoding (reading the bytes, nvJPEG's Huffman stage) overlaps the device's work.
    """

    def __init__(self, loader, settings: RunSettings, on_note) -> None:
        self.loader = loader
        self._batches: Iterator | None = None  # the workers start with the first batch asked for
        preprocess = settings.preprocess
        assert preprocess is not None, "resolved settings decide it"
        self.decode = DeviceDecoder(preprocess, settings.device, on_note) if preprocess.decode == "device" else None
        self.scaled = to_tensor_steps(preprocess).scaled if scaled_on_device(settings) else None
        self.device = settings.device
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
            if found is None:
                return
            indices, batch, failures, pictures = found
            if isinstance(batch, NoSharedMemory):
                raise MemoryLimitError(
                    f"a decode worker could not hand a batch over: shared memory is full ({batch.reason})",
                    hint="give fewer --workers or a smaller --batch-size, or /dev/shm more room (a container's "
                    "--shm-size)",
                )
            damaged: list[tuple[int, str]] = []
            if self.decode is not None:
                indices, batch, failures, damaged = self.decode(indices, batch, failures)
            elif self.scaled is not None and batch is not None:
                batch = map_batch(batch, self._scaled)
            self._next = Loaded(indices, batch, failures, pictures, damaged)

    def _scaled(self, images):
        assert self.scaled is not None, "called only where the device scales"
        return self.scaled(images.to(self.device, non_blocking=True))


@contextlib.contextmanager
def videos_closed():
    """Closes the video file this process keeps open between clips once the run ends (workers exit anyway)."""
    try:
        yield
    finally:
        close_decoders()


def natural_input(family: str, *, size: int | None = None, preprocess=None, frames: int | None = None):
    """One input of batch 1, all zeros, as a model of ``family`` takes it: the argument tuple of a forward.

    ``size`` is the side of the square image (default: the preprocessing's
    crop, else its resize, else 320); ``frames`` a clip's length (video).
    """
    height, width = (size, size) if size is not None else _natural_size(preprocess)
    traits = family_traits(family)
    if traits.output == "detections":  # a list of images, each of its own size
        return ([torch.zeros(3, height, width)],)
    if traits.row == "clip":
        return (torch.zeros(1, 3, frames or DEFAULT_CLIP_LENGTH, height, width),)
    if traits.row == "pair":
        return torch.zeros(1, 3, height, width), torch.zeros(1, 3, height, width)
    return (torch.zeros(1, 3, height, width),)


def _natural_size(preprocess) -> tuple[int, int]:
    """The height and width of what the preprocessing makes: its crop, else its resize (an image squashed to
    ``[height, width]``, say), else :data:`FREE_SIZE`."""
    if preprocess is not None and preprocess.crop is not None:
        return preprocess.crop, preprocess.crop
    if preprocess is not None and isinstance(preprocess.resize, int):
        return preprocess.resize, preprocess.resize
    if preprocess is not None and isinstance(preprocess.resize, tuple) and preprocess.kind == "classification":
        return preprocess.resize
    return FREE_SIZE, FREE_SIZE


def call_model(model, batch):
    """``model`` called with a batch: a tensor, a list of images (detection), or a tuple of arguments (flow)."""
    with quiet_meta_failures():
        return model(*batch) if isinstance(batch, tuple) else model(batch)


@contextlib.contextmanager
def quiet_meta_failures() -> Iterator[None]:
    """Inside (in this thread or task), torch.compile's log of an operator that failed on fake tensors is dropped:
    the error it logs is then raised, and hookcli says it (or refuses the run) in one line."""
    token = _QUIET.set(True)
    try:
        yield
    finally:
        _QUIET.reset(token)


class _MetaFailures(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno < logging.ERROR or not _QUIET.get()


#: Whether the calling thread or task is inside :func:`quiet_meta_failures`.
_QUIET: contextvars.ContextVar[bool] = contextvars.ContextVar("quiet_meta_failures", default=False)
# put once, for good: it drops nothing outside those blocks
logging.getLogger("torch._subclasses.fake_tensor").addFilter(_MetaFailures())


def batch_length(batch) -> int:
    """How many rows a batch holds, whatever form it takes (see :func:`call_model`)."""
    return len(batch[0]) if isinstance(batch, tuple) else len(batch)


def first_rows(batch):
    """The first row of a batch, as a batch of one in the batch's own form."""
    return tuple(part[:1] for part in batch) if isinstance(batch, tuple) else batch[:1]


def map_batch(batch, function):
    """``function`` applied to every tensor of a batch (a tensor, a list of images, a tuple of either)."""
    if isinstance(batch, tuple):
        return tuple(map_batch(part, function) for part in batch)
    if isinstance(batch, list):
        return [function(image) for image in batch]
    return function(batch)


def batch_device(batch):
    """The device a batch's tensors are on."""
    while isinstance(batch, tuple | list):
        batch = batch[0]
    return batch.device


def rows_by_shape(run, batch) -> tuple[dict, list | None]:
    """``run`` on each group of same-shape rows of ``batch``, every result back in input order.

    ``batch`` is stacked, or (images of several shapes) a list, or a tuple of
    either for pairs of frames. ``run(group)`` returns ``(features, about)``:
    batch-first tensors and a list with an entry a row (or None). Every
    feature comes back as a list of its rows, ``about`` as one list.
    """
    first = batch[0] if isinstance(batch, tuple) else batch
    if not isinstance(first, list):
        features, about = run(batch)
        return {key: list(value) for key, value in features.items()}, about
    sizes = [tuple(image.shape) for image in first]
    features, about = {}, [None] * len(sizes)
    for size in dict.fromkeys(sizes):
        picked = [i for i, s in enumerate(sizes) if s == size]
        group = (
            tuple(torch.stack([part[i] for i in picked]) for part in batch)
            if isinstance(batch, tuple)
            else torch.stack([batch[i] for i in picked])
        )
        found, told = run(group)
        for key, value in found.items():
            rows = features.setdefault(key, [None] * len(sizes))
            for position, i in enumerate(picked):
                rows[i] = value[position]
        for position, i in enumerate(picked):
            about[i] = told[position] if told is not None else None
    return features, about


#: Side of the square input :func:`natural_input` uses when the weights' preprocessing names no size.
FREE_SIZE = 320
