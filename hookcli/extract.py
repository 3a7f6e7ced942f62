"""Run images through a model and collect what the selected layers produce.

:func:`iter_batches` is the pipeline: images are decoded and preprocessed in
worker processes (``workers``) while the model runs on earlier batches;
batches go to the device (pinned memory and non-blocking copies on CUDA); a
:class:`~hookcli.capture.FeatureCapture` records the layers, stopping the
forward once they have all run; features are optionally pooled and cast
(``pool``, ``dtype``) on the device, then moved to the CPU.
:func:`extract_features` gathers every row in memory (one output file);
:mod:`hookcli.shards` streams them into shards instead.

>>> loaded = load_model("resnet18", "none")                            # doctest: +SKIP
>>> layers = resolve_layers(loaded.module, ["layer3"])                 # doctest: +SKIP
>>> run = extract_features(loaded, layers, ["cat.jpg"])                # doctest: +SKIP
>>> run.tensors["layer3"].shape                                        # doctest: +SKIP
torch.Size([1, 256, 14, 14])
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from hookcli import speed
from hookcli.capture import FeatureCapture
from hookcli.errors import HookcliError, ImageError, MemoryLimitError, UsageProblem, first_line
from hookcli.images import load_rgb
from hookcli.models import LoadedModel
from hookcli.preprocess import Preprocess
from hookcli.store import FORMAT_VERSION, format_bytes

__all__ = [
    "Batch", "Extraction", "RunSettings", "build_metadata", "collect_rows", "default_workers", "extract_features",
    "image_loader", "iter_batches", "prepared_model", "reported_failures", "resolved_memory_format",
]

POOLS = ("avg", "max")
DTYPES = ("float32", "float16", "bfloat16")


@dataclass
class RunSettings:
    """How to run: everything but the model, the layers and the inputs.

    ``fuse`` (extraction on the CPU, see :mod:`hookcli.fusion`) is ignored by
    gradient runs and by ``compile``, which fuses in its own way.
    """

    preprocess: Preprocess | None = None
    capture: str = "output"
    device: object = None
    batch_size: int = 16
    workers: int = 0
    pool: str | None = None
    dtype: str = "float32"
    on_error: str = "fail"
    precision: str = "fp32"
    memory_format: str = "auto"
    compile: bool = False
    fuse: bool = True

    def __post_init__(self) -> None:
        if self.pool not in (None, *POOLS):
            raise UsageProblem(f"pool must be one of {', '.join(POOLS)}, not '{self.pool}'")
        if self.dtype not in DTYPES:
            raise UsageProblem(f"dtype must be one of {', '.join(DTYPES)}, not '{self.dtype}'")
        if self.on_error not in ("fail", "skip"):
            raise UsageProblem(f"on_error must be 'fail' or 'skip', not '{self.on_error}'")

    @property
    def fusing(self) -> bool:
        """Whether extraction may fuse: ``fuse`` asked for and no ``compile`` (which fuses in its own way)."""
        return self.fuse and not self.compile


@dataclass
class Batch:
    """Rows of one batch: input ``indices`` (in order) and their features; inputs that could not be read.

    ``targets`` (gradient runs only) describes, per row, the logits the gradients are of.
    """

    indices: list[int]
    features: dict
    failures: list[tuple[int, str]] = field(default_factory=list)
    targets: list | None = None


class _Images:
    """A dataset of decoded, preprocessed images; a failure comes back as a value, never raised in a worker."""

    def __init__(self, paths: Sequence, preprocess: Preprocess, first: int) -> None:
        self.paths, self.first = paths, first
        self.transform, self.decode_size = preprocess.to_transform(), preprocess.decode_size

    def __len__(self) -> int:
        return len(self.paths) - self.first

    def __getitem__(self, position: int):
        index = self.first + position
        try:
            return index, self.transform(load_rgb(self.paths[index], min_size=self.decode_size)), None
        except ImageError as err:
            return index, None, (err.message, err.hint)


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
    import torch

    good = [(i, t) for i, t, e in items if e is None]
    failures = [(i, e) for i, t, e in items if e is not None]
    batch = torch.stack([t for _, t in good]) if good else None
    return [i for i, _ in good], batch, failures


def _worker_init(worker_id: int) -> None:
    import torch

    torch.set_num_threads(1)
    # Decoding should use the cycles the model leaves idle, not preempt its threads.
    os.nice(5)


def image_loader(paths: Sequence, settings: RunSettings, preprocess: Preprocess, *, start: int = 0):
    """Batches ``(indices, stacked images or None, failures)`` of ``paths[start:]``, decoded by ``settings.workers``."""
    import torch
    from torch.utils.data import DataLoader

    return DataLoader(
        _Images(paths, preprocess, start),
        batch_size=settings.batch_size,
        num_workers=settings.workers,
        collate_fn=_collate,
        pin_memory=torch.device(settings.device or "cpu").type == "cuda",
        worker_init_fn=_worker_init if settings.workers else None,
        prefetch_factor=4 if settings.workers else None,
    )


def reported_failures(failures: list, settings: RunSettings) -> list[tuple[int, str]]:
    """Raise the first unreadable image in ``fail`` mode; in ``skip`` mode, ``(index, message)`` pairs."""
    if failures and settings.on_error == "fail":
        message, hint = failures[0][1]
        raise ImageError(message, hint=hint)
    return [(index, f"{message}. Hint: {hint}" if hint else message) for index, (message, hint) in failures]


def iter_batches(
    loaded: LoadedModel,
    layers: Mapping[str, str],
    paths: Sequence[str | os.PathLike],
    settings: RunSettings | None = None,
    *,
    start: int = 0,
    capture_hooks: list | None = None,
    on_note: Callable[[str], None] | None = None,
) -> Iterator[Batch]:
    """Yield :class:`Batch` es for ``paths[start:]`` in input order.

    With ``on_error="fail"`` an unreadable image raises :class:`ImageError`;
    with ``"skip"`` it is reported in ``Batch.failures`` and left out.
    ``capture_hooks``, when given a list, receives the :class:`FeatureCapture`
    (to read its ``calls`` and ``omitted`` afterwards). ``on_note(text)``
    hears why ``compile`` fell back to the eager path, or fusion to the
    unfused model, if either did.
    """
    import torch

    settings = settings or RunSettings()
    cast = getattr(torch, settings.dtype)
    loader = image_loader(paths, settings, settings.preprocess or loaded.preprocess, start=start)
    compiled = None  # not tried yet; then the compiled function, or False for the eager path
    # Grad mode is per thread: it must not stay switched while this generator is suspended at a yield.
    with prepared_model(loaded, settings) as (model, to_device), contextlib.ExitStack() as hooked:
        fused = _fused(model, loaded, layers, settings) if settings.fusing else model
        eager = _EagerForward(fused, model, layers, settings.capture, hooked, capture_hooks, on_note)
        for indices, batch, failures in loader:
            failures = reported_failures(failures, settings)
            features = {}
            if batch is not None:
                batch = to_device(batch)
                with torch.inference_mode(), speed.compute_precision(settings.precision, batch.device):
                    if settings.compile and compiled is None:
                        compiled = _compile_or_explain(model, layers, eager.hooks, batch, settings, on_note)
                    captured = _run_compiled(compiled, batch, on_note) if compiled else None
                    if captured is None:
                        compiled = False  # eager from now on, with the hooks on
                        captured = eager.run(batch)
                features = {key: _pooled(value, settings.pool).to(cast).to("cpu") for key, value in captured.items()}
            yield Batch(indices, features, failures)


class _EagerForward:
    """Forwards with the hooks on: through the fused model, or the model as written should that fail at first.

    The hooks go on ``stack`` at the first forward. ``capture_hooks`` (see
    :func:`iter_batches`) always holds the capture in use.
    """

    def __init__(self, fused, plain, layers, capture: str, stack, capture_hooks: list | None, on_note) -> None:
        self.plain, self.layers, self.capture = plain, layers, capture
        self.stack, self.capture_hooks, self.on_note = stack, capture_hooks, on_note
        self.hooks = FeatureCapture(fused, layers, capture=capture)
        if capture_hooks is not None:
            capture_hooks.append(self.hooks)
        self.entered = False
        self.proven = fused is plain  # nothing to fall back to

    def run(self, batch) -> dict:
        if not self.entered:
            self.stack.enter_context(self.hooks)
            self.entered = True
        try:
            captured = self.hooks.run(batch)
        except HookcliError:
            raise
        except Exception as err:  # an unforeseen kernel or graph problem must not cost the user the run
            if self.proven:
                raise
            self.stack.close()
            failed, self.hooks = self.hooks, FeatureCapture(self.plain, self.layers, capture=self.capture)
            if self.capture_hooks is not None:
                self.capture_hooks[self.capture_hooks.index(failed)] = self.hooks
            self.stack.enter_context(self.hooks)
            captured = self.hooks.run(batch)  # where the model itself fails, that is the error to report
            _note(self.on_note, f"the fused forward failed ({type(err).__name__}: {first_line(err)[:120]}); "
                                "running the model unfused")
        self.proven = True
        return captured


@contextlib.contextmanager
def prepared_model(loaded: LoadedModel, settings: RunSettings):
    """The model on its device in the chosen memory format, with threads budgeted; yields ``(model, to_device)``.

    ``to_device(batch)`` moves a batch of images the same way (non-blocking,
    channels-last when the model is). The model goes back to the default
    memory format afterwards.
    """
    import torch

    device = torch.device(settings.device or "cpu")
    speed.check_precision(settings.precision, device)
    memory_format = resolved_memory_format(loaded, settings)
    model = speed.to_memory_format(loaded.module.to(device), memory_format)

    def to_device(batch):
        return speed.to_memory_format(batch.to(device, non_blocking=True), memory_format)

    try:
        with speed.thread_budget(device, settings.workers):
            yield model, to_device
    finally:
        if memory_format == "channels_last":
            model.to(memory_format=torch.contiguous_format)


def _fused(model, loaded: LoadedModel, layers: Mapping[str, str], settings: RunSettings):
    """The model with conv/BatchNorm/activation chains outside the hooked layers fused (CPU inference only)."""
    from hookcli.fusion import fused_for_inference

    channels_last = resolved_memory_format(loaded, settings) == "channels_last"
    return fused_for_inference(model, layers, dtype=speed.compute_dtype(settings.precision),
                               channels_last=channels_last)[0]


def resolved_memory_format(loaded: LoadedModel, settings: RunSettings) -> str:
    """``channels_last`` or ``contiguous``, as the run uses it (``auto`` decided from the model and device)."""
    import torch

    return speed.choose_memory_format(loaded.module, torch.device(settings.device or "cpu"), settings.memory_format)


def _compile_or_explain(model, layers, hooks, batch, settings, on_note):
    """The compiled extractor, or False after a note saying why the eager path is used.

    The hooks are on only for a one-image forward that learns how often each
    layer runs; the compiled graph must not contain them.
    """
    with hooks:
        hooks.run(batch[:1])
    function, reason = speed.compiled_extractor(model, layers, hooks.calls, settings.capture)
    if function is None:
        _note(on_note, f"--compile: {reason}; running eagerly")
        return False
    return function


def _run_compiled(compiled, batch, on_note):
    """The compiled extractor's features, or None (after a note) when it fails and the eager path must take over."""
    try:
        return compiled(batch)
    except Exception as err:  # compilation happens on first call; a missing compiler shows up here
        _note(on_note, f"--compile failed ({type(err).__name__}: {first_line(err)[:120]}); running eagerly")
        return None


def _note(on_note, text: str) -> None:
    if on_note is not None:
        on_note(text)


def _pooled(tensor, pool: str | None):
    """Global pooling over the spatial axes: ``[N, C, H, W]`` → ``[N, C]``; tokens ``[N, T, D]`` → ``[N, D]``."""
    if pool is None or tensor.dim() < 3:
        return tensor
    axes = tuple(range(2, tensor.dim())) if tensor.dim() == 4 else (1,)
    if pool == "avg":
        return tensor.float().mean(dim=axes).to(tensor.dtype)
    return tensor.amax(dim=axes)


@dataclass
class Extraction:
    """All rows of a run: ``tensors`` by key, ``inputs`` in row order, what ran, what was left out.

    ``targets`` (gradient runs) holds each row's target logits.
    """

    tensors: dict
    inputs: list
    calls: dict[str, int]
    omitted: list[str]
    skipped: list[dict] = field(default_factory=list)
    targets: list = field(default_factory=list)
    fused: int = 0  #: convolutions that ran fused (see :mod:`hookcli.fusion`)


def extract_features(
    loaded: LoadedModel,
    layers: Mapping[str, str],
    paths: Sequence[str | os.PathLike],
    settings: RunSettings | None = None,
    *,
    on_batch: Callable[[Batch], None] | None = None,
) -> Extraction:
    """Run :func:`iter_batches` to the end and gather every row in memory (see :func:`collect_rows`)."""
    hooks: list = []
    return collect_rows(iter_batches(loaded, layers, paths, settings, capture_hooks=hooks), paths, hooks, on_batch)


def collect_rows(batches, paths: Sequence, hooks: list, on_batch: Callable[[Batch], None] | None = None) -> Extraction:
    """Write the rows of ``batches`` into tensors allocated once, for all ``paths``.

    ``hooks`` is the list the batch source put its capture in. ``on_batch(batch)``
    is called after each batch (for progress bars and skipped inputs).
    """
    import torch

    from hookcli.fusion import fused_convolutions

    tensors: dict = {}
    kept, skipped, targets = [], [], []
    for batch in batches:
        row = len(kept)
        if not tensors and batch.features:
            _check_fits_in_memory(batch.features, len(paths))
        for key, value in batch.features.items():
            if key not in tensors:
                tensors[key] = torch.empty((len(paths), *value.shape[1:]), dtype=value.dtype)
            tensors[key][row:row + len(value)] = value
        kept.extend(paths[i] for i in batch.indices)
        targets.extend(batch.targets or [])
        skipped.extend({"input": os.path.abspath(paths[i]), "error": e} for i, e in batch.failures)
        if on_batch is not None:
            on_batch(batch)
    tensors = {key: value[: len(kept)] for key, value in tensors.items()}
    hook = hooks[0]
    return Extraction(tensors, kept, dict(hook.calls or {}), sorted(hook.omitted), skipped, targets,
                      fused_convolutions(hook.model))


def _check_fits_in_memory(features: Mapping, rows: int) -> None:
    """Refuse, before allocating, a single-file result larger than half of this machine's memory."""
    row_bytes = sum(value[0].numel() * value.element_size() for value in features.values())
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return
    if row_bytes * rows > memory // 2:
        raise MemoryLimitError(
            f"{rows} images x {format_bytes(row_bytes)} of features = {format_bytes(row_bytes * rows)}, more than "
            f"half of this machine's {format_bytes(memory)}, and one output file is built in memory",
            hint="write shards with -o DIR/ (memory stays flat), or use --pool / --dtype to store less",
        )


def build_metadata(
    loaded: LoadedModel,
    layers: Mapping[str, str],
    settings: RunSettings,
    *,
    keys: Sequence[str],
    calls: Mapping[str, int],
    omitted: Sequence[str] = (),
    inputs: Sequence[str | os.PathLike] | None = None,
    skipped: Sequence[dict] = (),
    targets: Sequence | None = None,
    fused: int = 0,
    extra: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The file's ``__metadata__``: strings, JSON for structured values (see the README).

    Without ``inputs`` the result describes the run only (the shards' index
    keeps it once; each shard adds its own inputs). ``targets`` lists each
    row's target logits (gradient runs); ``fused`` is how many convolutions ran
    fused; ``extra`` adds entries as they are.
    """
    modules = dict(loaded.module.named_modules())
    described = {}
    for path, key in layers.items():
        described[path] = {
            "key": key,
            "type": type(modules[path]).__name__,
            "calls": calls.get(path, 0),
            "keys": [k for k in keys if k == key or (k.startswith(key) and k[len(key)] in ":@#")],
        }
    metadata = {
        "format": FORMAT_VERSION,
        "producer": "hookcli",
        "model": loaded.name,
        "weights": loaded.weights_json(),
        "layers": json.dumps(described),
        "capture": settings.capture,
        "preprocess": (settings.preprocess or loaded.preprocess).to_json(),
        "pool": settings.pool or "none",
        "dtype": settings.dtype,
        "precision": settings.precision,
        "memory_format": resolved_memory_format(loaded, settings),
        "fused": str(fused),
        "device": str(settings.device or "cpu"),
        "versions": json.dumps(_versions()),
    }
    if omitted:
        metadata["omitted"] = json.dumps(list(omitted))
    if inputs is not None:
        metadata["inputs"] = json.dumps([os.path.abspath(p) for p in inputs])
    if skipped:
        metadata["skipped"] = json.dumps(list(skipped))
    if targets:
        metadata["targets"] = json.dumps(list(targets))
    metadata.update(extra or {})
    return metadata


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for package in ("hookcli", "torch", "torchvision", "safetensors", "pillow"):
        try:
            found[package] = version(package)
        except PackageNotFoundError:
            found[package] = "unknown"
    return found


def default_output_name(model_name: str, layers: Mapping[str, str], *, folder: bool = False, kind: str = "") -> Path:
    """``<model>-<key>`` for one layer, ``<model>-<n>layers`` for more; then ``<kind>.safetensors`` unless a folder."""
    keys = list(layers.values())
    label = keys[0] if len(keys) == 1 else f"{len(keys)}layers"
    name = f"{model_name}-{label.replace(os.sep, '_')}"
    return Path(name) if folder else Path(f"{name}{kind}.safetensors")
