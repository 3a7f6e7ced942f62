"""The batch pipeline every model-running command shares: inputs → decode → device → forward → rows.

:func:`iter_batches` is the one loop: images are decoded and preprocessed in
worker processes (``workers``) while the model runs on earlier batches, or,
with the preprocessing's ``decode="device"``, read there and decoded batched
on the device while it computes the batch before (:mod:`hookcli.inputs.decoding`);
batches go to the device (pinned memory and non-blocking copies on CUDA); a
forward strategy, chosen once per run, runs the model with the layers
captured; features are pooled and cast (``pool``, ``dtype``) on the device,
then moved to the CPU. Each :class:`Batch` carries its rows, the inputs that
could not be read, and the run's facts so far (:class:`~hookcli.storage.fileformat.RunFacts`).

Forward strategies (each a context manager called with a batch):

- :class:`EagerForward`: hooks on the model as written;
- :class:`FusedForward`: the same hooks on a fused copy of the model (CPU
  extraction, :mod:`hookcli.run.fusion`), falling back to the model as written
  should the fused forward fail on the first batch; by default only for runs
  of :data:`~hookcli.run.speed.FUSE_FROM` images or more, where tracing and
  folding pay back (:func:`hookcli.run.speed.choose_fuse`);
- :class:`CompiledForward`: a compiled graph cut after the last layer
  (:func:`hookcli.run.speed.compiled_extractor`), falling back to the eager path
  where hooks are needed;
- gradient and CAM strategies live in :mod:`hookcli.run.gradients`.

>>> from hookcli.models.loading import load_model
>>> photo = __import__("matplotlib.cbook").cbook.get_sample_data("grace_hopper.jpg", asfileobj=False)
>>> loaded = load_model("resnet18", "none")
>>> settings = RunSettings(preprocess=loaded.preprocess.replace(resize=64, crop=64))
>>> batch = next(iter_batches(loaded, {"layer3": "layer3"}, [photo], settings))
>>> batch.features["layer3"].shape, batch.facts.calls
(torch.Size([1, 256, 4, 4]), {'layer3': 1})

The library's front door is :func:`hookcli.extract`; this loop is what it
(and grad, cam, the benchmarks) runs.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from hookcli.run import speed
from hookcli.run.capture import CAPTURE_KINDS, FeatureCapture
from hookcli.errors import HookcliError, ImageError, VideoError, check_choice, check_whole, first_line
from hookcli.families import (
    batch_device,
    channels_last_output,
    family_traits,
    first_rows,
    map_batch,
    ragged_rows,
    rows_by_shape,
    square_input,
)
from hookcli.storage.fileformat import DETECTIONS, FLOW, RunFacts
from hookcli.models.loading import LoadedModel
from hookcli.inputs.preprocess import Preprocess

__all__ = [
    "DTYPES", "ON_ERROR", "POOLS", "Batch", "CompiledForward", "DetectionRows", "EagerForward", "FusedForward",
    "RunSettings",
    "default_workers", "extraction_forward", "image_loader", "iter_batches", "prepared_model", "reported_failures",
]

POOLS = ("avg", "max")
DTYPES = ("float32", "float16", "bfloat16")
ON_ERROR = ("fail", "skip")


@dataclass(frozen=True)
class RunSettings:
    """How to run: everything but the model, the layers and the inputs.

    Fields left to be decided (``preprocess=None``: the weights' own;
    ``device="auto"``; ``workers=None``; ``memory_format="auto"``;
    ``fuse=None``: by the number of inputs) are decided once by
    :meth:`resolved`. ``fuse`` (extraction on the CPU, see
    :mod:`hookcli.run.fusion`) is ignored by gradient runs and by ``compile``,
    which fuses in its own way.
    """

    preprocess: Preprocess | None = None
    capture: str = "output"
    device: object = "auto"
    batch_size: int = 16
    workers: int | None = None
    pool: str | None = None
    dtype: str = "float32"
    on_error: str = "fail"
    precision: str = "fp32"
    memory_format: str = "auto"
    compile: bool = False
    fuse: bool | None = None
    family: str = "classification"
    #: Store the model's final output too: the detections of a detection model, the flow of an optical-flow one.
    final_output: bool = False

    def __post_init__(self) -> None:
        check_choice("capture", self.capture, CAPTURE_KINDS)
        if self.pool is not None:
            check_choice("pool", self.pool, POOLS)
        check_choice("dtype", self.dtype, DTYPES)
        check_choice("on_error", self.on_error, ON_ERROR)
        check_choice("precision", self.precision, speed.PRECISIONS)
        check_choice("memory_format", self.memory_format, speed.MEMORY_FORMATS)
        check_whole("batch_size", self.batch_size, 1)
        check_whole("workers", self.workers, 0, MAX_WORKERS, optional=True)

    @property
    def fusing(self) -> bool:
        """Whether extraction may fuse: ``fuse`` asked for or chosen, and no ``compile`` (which fuses in its own way).

        False while ``fuse`` is still None: :meth:`resolved` decides it.
        """
        return bool(self.fuse) and not self.compile

    def resolved(self, loaded: LoadedModel, inputs: int) -> RunSettings:
        """These settings with nothing left to decide, for ``loaded`` on ``inputs`` images.

        The device becomes a ``torch.device`` that exists here (and can run
        the precision), preprocessing the weights' own where none is given,
        workers and memory format as ``auto`` picks them, and ``fuse=None``
        true from :data:`~hookcli.run.speed.FUSE_FROM` inputs on
        (:func:`~hookcli.run.speed.choose_fuse`). ``inputs`` counts the whole run,
        also when it resumes part-way, so a resumed run decides as the first
        one did. Resolved settings resolve to themselves.
        """
        from hookcli.run.device import resolve_device

        device = self.device if not isinstance(self.device, str) else resolve_device(self.device)
        speed.check_precision(self.precision, device)
        workers = self.workers if self.workers is not None else default_workers(device, inputs, self.batch_size)
        # Fusion, channels-last and compilation go where hookcli.families says a family takes them; the others run
        # as written (the metadata's "fused" says 0) in their tensors' own layout.
        traits = family_traits(loaded.family)
        memory_format = "contiguous" if not traits.channels_last and self.memory_format == "auto" \
            else self.memory_format
        return dataclasses.replace(
            self, device=device, preprocess=self.preprocess or loaded.preprocess, workers=workers,
            memory_format=speed.choose_memory_format(loaded.module, device, memory_format),
            fuse=speed.choose_fuse(self.fuse, inputs) if traits.fuses else False,
            compile=self.compile and traits.compiles, family=loaded.family)


@dataclass
class Batch:
    """Rows of one batch: input ``indices`` (in order), their features, and inputs that could not be read.

    ``targets`` (gradient runs only) describes, per row, the logits the
    gradients are of; ``facts`` is what the forward has learnt so far (None
    when no image of the batch could be read).
    """

    indices: list[int]
    features: dict
    failures: list[tuple[int, str]] = field(default_factory=list)
    targets: list | None = None
    facts: RunFacts | None = None


#: RAFT's correlation pyramid needs feature maps of 16 or more a side, at an eighth of the frame's.
_FLOW_MIN_SIDE = 128


class _Images:
    """A dataset of decoded, preprocessed images; a failure comes back as a value, never raised in a worker."""

    def __init__(self, paths: Sequence, preprocess: Preprocess) -> None:
        from hookcli.inputs.images import load_rgb

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
                raise VideoError(f"the frames of '{item.path}' are {width}x{height} as the model would see them, and "
                                 f"optical-flow models take sides of {_FLOW_MIN_SIDE} pixels or more",
                                 hint="give a larger --resize or --crop (a multiple of 8)")
            if height % 8 or width % 8:
                raise VideoError(f"the frames of '{item.path}' are {width}x{height} as the model would see them, and "
                                 "optical-flow models take sides divisible by 8",
                                 hint="give --crop (a multiple of 8), or --resize to a size that keeps both sides so")
            return index, pair, None
        except (ImageError, VideoError) as err:
            return index, None, (err.message, err.hint)


#: More decoding processes than this would only crowd the machine (each one holds a copy of the decoder's state).
MAX_WORKERS = 128


def default_workers(device, images: int, batch_size: int) -> int:
    """Decode processes to start when the user names none.

    None for a single batch. On a GPU, one per spare core (up to 8): decoding
    is what keeps it fed. On the CPU the model's own threads already use every
    core, so decoding in other processes only helps on larger machines.
    """
    cores = os.cpu_count() or 1
    if images <= batch_size:
        return 0
    if getattr(device, "type", str(device)) in ("cuda", "mps"):
        return max(1, min(8, cores - 1))
    return 0 if cores <= 4 else min(4, cores // 4)


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

    from hookcli.inputs import decoding

    on_device = settings.preprocess.decode == "device"
    return DataLoader(
        decoding.EncodedImages(paths, settings.preprocess) if on_device else _Images(paths, settings.preprocess),
        **({"batch_size": settings.batch_size} if order is None else {"batch_sampler": order}),
        num_workers=settings.workers,
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


#: ``forward(model, layers, settings, on_note)``: what makes a run's forward strategy.
ForwardFactory = Callable[..., "EagerForward"]


def iter_batches(
    loaded: LoadedModel,
    layers: Mapping[str, str],
    paths: Sequence[str | os.PathLike],
    settings: RunSettings | None = None,
    *,
    forward: ForwardFactory | None = None,
    order: Iterable[list[int]] | None = None,
    on_note: Callable[[str], None] | None = None,
) -> Iterator[Batch]:
    """Yield :class:`Batch` es of ``paths`` in input order, or the batches of input indices ``order`` gives.

    ``forward`` builds the run's forward strategy (default:
    :func:`extraction_forward` of the settings). With ``on_error="fail"`` an
    unreadable image raises :class:`ImageError`; with ``"skip"`` it is
    reported in ``Batch.failures`` and left out. ``on_note(text)`` hears why
    a strategy fell back to another (compile to eager, fused to unfused).
    """
    import torch

    settings = (settings or RunSettings()).resolved(loaded, len(paths))
    make_forward = forward or extraction_forward(settings)
    ragged = ragged_rows(settings.family, settings.preprocess)  # every key a list of rows, whatever the strategy
    square = square_input(settings.preprocess)
    cast = getattr(torch, settings.dtype)
    batches = _Decoded(image_loader(paths, settings, order=order), settings, on_note)
    unreadable = "videos" if any(hasattr(path, "frames") for path in paths[:1]) else "images"  # rows of clips
    with prepared_model(loaded, settings) as (model, to_device), \
            make_forward(model, layers, settings, on_note) as run, _videos_closed():
        for indices, batch, failures in batches:
            failures = reported_failures(failures, settings.on_error, unreadable)
            features, targets, facts = {}, None, None
            if batch is not None:
                captured, targets = run(to_device(batch))
                batches.prepare()  # while the device computes this batch
                features = {key: _stored(key, value, settings.pool, cast, ragged, square)
                            for key, value in captured.items()}
                facts = run.facts()
            yield Batch(indices, features, failures, targets, facts)


class _Decoded:
    """The loader's batches, decoded on the device where the preprocessing says so (:mod:`hookcli.inputs.decoding`).

    :meth:`prepare` decodes the next batch early: called once the device has the forward of a batch queued, the
    host's share of decoding (reading the bytes, nvJPEG's Huffman stage) overlaps the device's work.
    """

    def __init__(self, loader, settings: RunSettings, on_note) -> None:
        from hookcli.inputs.decoding import DeviceDecoder

        self.loader, self._batches = loader, None  # the workers start with the first batch asked for
        self.decode = DeviceDecoder(settings.preprocess, settings.device, on_note) \
            if settings.preprocess.decode == "device" else None
        self._next = None

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
def _videos_closed():
    """Closes the video file this process keeps open between clips once the run ends (workers exit anyway)."""
    try:
        yield
    finally:
        from hookcli.inputs.video import close_decoders

        close_decoders()


def extraction_forward(settings: RunSettings) -> ForwardFactory:
    """The forward strategy extraction uses with these settings: compiled, fused or as written."""
    if settings.compile:
        return CompiledForward
    return FusedForward if settings.fusing else EagerForward


@contextlib.contextmanager
def prepared_model(loaded: LoadedModel, settings: RunSettings):
    """The model on its device in the chosen memory format, with threads budgeted; yields ``(model, to_device)``.

    ``settings`` must be resolved. ``to_device(batch)`` moves a batch of
    images the same way (non-blocking, channels-last when the model is). The
    model goes back to the default memory format afterwards.
    """
    import torch

    device = torch.device(settings.device)
    memory_format = settings.memory_format
    model = speed.to_memory_format(loaded.module.to(device), memory_format)

    def to_device(batch):
        def moved(images):
            images = images.to(device, non_blocking=True)
            return speed.to_memory_format(images, memory_format) if images.dim() == 4 else images

        return map_batch(batch, moved)

    try:
        with speed.thread_budget(device, settings.workers):
            yield model, to_device
    finally:
        if memory_format == "channels_last":
            model.to(memory_format=torch.contiguous_format)


class EagerForward:
    """Forwards with hooks on the selected layers of the model as written; the hooks go on at the first batch.

    Called with a batch on the device, returns ``(features, None)``: the
    captured tensors (not yet pooled, cast or moved) and no targets.
    :meth:`facts` says what the forward has learnt.
    """

    def __init__(self, model, layers: Mapping[str, str], settings: RunSettings, on_note=None) -> None:
        self.layers, self.settings, self.on_note = layers, settings, on_note
        self._stack = contextlib.ExitStack()
        self._use(model)

    def _use(self, model) -> None:
        from hookcli.run.fusion import fused_convolutions

        self._stack.close()  # hooks of a model no longer used come off
        detecting = self.settings.family == "detection"
        self.capture = FeatureCapture(model, self.layers, capture=self.settings.capture,
                                      stop_early=not self.settings.final_output)
        self.rows = DetectionRows(model, self.settings.final_output) if detecting else None
        self.flow = _FinalOutput(model) if self.settings.family == "optical_flow" and self.settings.final_output \
            else None
        self.ragged = ragged_rows(self.settings.family, self.settings.preprocess)
        self._fused = fused_convolutions(model)
        self._entered = False

    def __enter__(self) -> EagerForward:
        return self

    def __exit__(self, *exc_info) -> None:
        self._stack.close()

    def __call__(self, batch) -> tuple[dict, None]:
        import torch

        if not self._entered:
            self._stack.enter_context(self.capture)
            for extra in (self.rows, self.flow):
                if extra is not None:
                    self._stack.enter_context(extra)
            self._entered = True
        with torch.inference_mode(), speed.compute_precision(self.settings.precision, batch_device(batch)):
            if self.rows is not None:  # a detection model takes a list of images and pads them itself
                return self.rows.cut(self.capture.run(list(batch))), None
            if not self.ragged:
                return self._run(batch), None
            return rows_by_shape(lambda group: (self._run(group), None), batch)[0], None

    def _run(self, batch) -> dict:
        found = self.capture.run(batch)
        if self.flow is not None:
            found[FLOW] = self.flow.take()[-1]  # RAFT returns each pass's field: the last is the finest
        return found

    def facts(self) -> RunFacts:
        return RunFacts(calls=dict(self.capture.calls or {}), omitted=tuple(sorted(self.capture.omitted)),
                        fused=self._fused)

    def _note(self, text: str) -> None:
        if self.on_note is not None:
            self.on_note(text)


class FusedForward(EagerForward):
    """:class:`EagerForward` on a fused copy of the model, or on the model as written should that fail at first.

    A detection model as a whole cannot be traced (its transform and heads
    hold control flow), but its backbone's convolution stack can: there the
    copy differs from the model only in its fused backbone.
    """

    def __init__(self, model, layers: Mapping[str, str], settings: RunSettings, on_note=None) -> None:
        from hookcli.run.fusion import fusion_attempt

        fuse = functools.partial(fusion_attempt, dtype=speed.compute_dtype(settings.precision),
                                 channels_last=settings.memory_format == "channels_last")
        attempt = _with_fused_backbone(model, layers, fuse, settings.final_output) \
            if settings.family == "detection" else fuse(model, layers)
        super().__init__(attempt.module, layers, settings, on_note)
        self.plain = model
        self.proven = attempt.module is model  # nothing to fall back to
        if not attempt.traced and settings.family != "detection":
            self._note(f"--fuse: {type(model).__name__} cannot be traced by torch.fx, so it runs unfused "
                       "(the values are the same)")

    def __call__(self, batch) -> tuple[dict, None]:
        try:
            result = super().__call__(batch)
        except HookcliError:
            raise
        except Exception as err:  # an unforeseen kernel or graph problem must not cost the user the run
            if self.proven:
                raise
            self._use(self.plain)
            result = super().__call__(batch)  # where the model itself fails, that is the error to report
            self._note(f"the fused forward failed ({type(err).__name__}: {first_line(err)[:120]}); "
                       "running the model unfused")
        self.proven = True
        return result


def _with_fused_backbone(model, layers: Mapping[str, str], fuse, detections: bool):
    """A copy of detection ``model`` whose backbone's convolution stack (``backbone.body``, or SSD's ``backbone``) is
    fused by ``fuse`` (:func:`~hookcli.run.fusion.fusion_attempt`), as a :class:`~hookcli.run.fusion.FusionAttempt`; ``model``
    itself where nothing fuses. The copy shares every other module.

    The stack is fused up to its last hooked layer when the forward ends there, whole when it goes on (a layer
    hooked after the stack, or the final detections asked for).
    """
    from hookcli.run.fusion import FusionAttempt

    path = "backbone.body" if hasattr(model.backbone, "body") else "backbone"
    keep = [layer[len(path) + 1:] for layer in layers if layer.startswith(path + ".")]
    goes_on = detections or len(keep) < len(layers)
    fused, count, traced = fuse(model.get_submodule(path), keep, whole_run=goes_on)
    if not count:
        return FusionAttempt(model, 0, traced)
    clone = copy.copy(model)
    clone._modules = dict(model._modules)
    backbone = clone.backbone
    if path == "backbone.body":
        backbone = copy.copy(backbone)
        backbone._modules = dict(backbone._modules)
        backbone.body = fused
        clone.backbone = backbone
    else:
        clone.backbone = fused
    return FusionAttempt(clone, count)


class CompiledForward(EagerForward):
    """A compiled graph of the model cut after the last layer; the eager path where that cannot be had.

    The hooks are on only for a one-image forward that learns how often each
    layer runs; the compiled graph must not contain them.
    """

    def __init__(self, model, layers: Mapping[str, str], settings: RunSettings, on_note=None) -> None:
        super().__init__(model, layers, settings, on_note)
        self.model = model
        self.compiled = None  # not tried yet; then the compiled function, or False for the eager path

    def __call__(self, batch) -> tuple[dict, None]:
        import torch

        if self.compiled is None:
            self.compiled = self._compile(batch)
        if self.compiled:
            try:
                with torch.inference_mode(), speed.compute_precision(self.settings.precision, batch_device(batch)):
                    return self.compiled(batch), None
            except Exception as err:  # compilation happens on first call; a missing compiler shows up here
                self._note(f"--compile failed ({type(err).__name__}: {first_line(err)[:120]}); running eagerly")
                self.compiled = False
        return super().__call__(batch)

    def _compile(self, batch):
        import torch

        with self.capture, torch.inference_mode(), \
                speed.compute_precision(self.settings.precision, batch_device(batch)):
            self.capture.run(first_rows(batch))
        function, reason = speed.compiled_extractor(self.model, self.layers, self.capture.calls,
                                                    self.settings.capture)
        if function is None:
            self._note(f"--compile: {reason}; running eagerly")
            return False
        return function


def _stored(key: str, value, pool: str | None, cast, ragged: bool, square: bool = False):
    """A captured batch (or list of rows) pooled, cast and on the CPU; detections and integers kept as they are.

    In a run whose rows may differ in shape (``ragged``) it is always a list of rows, so a key keeps one form.
    ``square``: the inputs are square, so a ``[N, H, W, C]`` output is told apart (see :func:`_pooled`).
    """
    if key.startswith(DETECTIONS + "#"):
        return [row.to("cpu") for row in value]

    def finish(tensor, *, row: bool):
        pooled = _pooled(tensor[None], pool)[0] if row else _pooled(tensor, pool, square)
        return (pooled.to(cast) if pooled.is_floating_point() else pooled).to("cpu")

    if isinstance(value, list):
        return [finish(row, row=True) for row in value]
    return list(finish(value, row=False)) if ragged else finish(value, row=False)


class DetectionRows:
    """Cuts a detection model's padded batch back to each image: layer outputs ``[N, C, H, W]`` to the part that
    covers the image (the model pads a batch to its largest image), and, when asked, its detections.

    The model resizes every image (``min_size``/``max_size``) inside its ``transform``; a hook there learns each
    image's size after resizing and the padded size, and the part of a map of height ``h`` that covers an image
    of height ``ih`` in a padding of ``ph`` is its first ``ceil(h * ih / ph)`` rows (columns alike).
    """

    def __init__(self, model, detections: bool) -> None:
        self.model = model
        self.output = _FinalOutput(model) if detections else None
        self._stack = contextlib.ExitStack()
        self.sizes: list = []
        self.padded = None

    def __enter__(self):
        self._stack.enter_context(self.model.transform.register_forward_hook(self._on_transform))
        if self.output is not None:
            self._stack.enter_context(self.output)
        return self

    def __exit__(self, *exc_info) -> None:
        self._stack.close()

    def _on_transform(self, module, inputs, output) -> None:
        images = output[0]
        self.sizes, self.padded = list(images.image_sizes), tuple(images.tensors.shape[-2:])

    def cut(self, features: dict) -> dict:
        rows = {}
        for key, value in features.items():
            if value.dim() == 4 and self.padded is not None:
                height, width = value.shape[-2:]
                rows[key] = [value[i, :, :-(-height * h // self.padded[0]), :-(-width * w // self.padded[1])]
                             for i, (h, w) in enumerate(self.sizes)]
            else:
                rows[key] = list(value)
        if self.output is not None:
            found = self.output.take()
            for name in ("boxes", "labels", "scores", "masks", "keypoints", "keypoints_scores"):
                if found and name in found[0]:
                    rows[f"{DETECTIONS}#{name}"] = [image[name].detach() for image in found]
        return rows




class _FinalOutput:
    """Keeps what the model returns (the final detections; the flow fields of RAFT's passes), for the block."""

    def __init__(self, model) -> None:
        self.model = model
        self._found = None
        self._handle = None

    def __enter__(self):
        self._handle = self.model.register_forward_hook(self._on_output)
        return self

    def __exit__(self, *exc_info) -> None:
        self._handle.remove()

    def _on_output(self, module, inputs, output) -> None:
        self._found = output

    def take(self):
        """The last forward's output, handed over once."""
        found, self._found = self._found, None
        return found


def _pooled(tensor, pool: str | None, square: bool = False):
    """Global pooling over the spatial axes: ``[N, C, H, W]`` → ``[N, C]``; tokens ``[N, T, D]`` → ``[N, D]``.

    With ``square`` inputs, an output laid out ``[N, H, W, C]`` (:func:`~hookcli.families.channels_last_output`)
    is pooled over H and W too.
    """
    if pool is None or tensor.dim() < 3:
        return tensor
    axes = tuple(range(2, tensor.dim())) if tensor.dim() >= 4 else (1,)
    if square and channels_last_output(tensor.shape):
        axes = (1, 2)
    if pool == "avg":
        return tensor.float().mean(dim=axes).to(tensor.dtype)
    return tensor.amax(dim=axes)
