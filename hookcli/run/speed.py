"""How a forward runs fast: memory format, compute precision, threads, compilation.

- Channels-last memory format for convolutional models on the CPU and CUDA
  (``memory_format="auto"``): exact to fp32 rounding, and faster there. The
  stored tensors are still plain row-major (captures are copied contiguous).
- ``precision="bf16"`` (CPU or GPU) or ``"fp16"`` (GPU): autocast compute,
  a trade of precision for speed; what is stored is chosen separately.
- Threads: when images decode in worker processes on the CPU, the model gets
  the cores they leave.
- Fusion (:mod:`hookcli.run.fusion`) has a one-off cost, tracing the model and
  folding its BatchNorms, that only a run of some size pays back: by default
  it is chosen from :data:`FUSE_FROM` inputs on (:func:`choose_fuse`).
- ``compile``: the network is cut after the last requested layer (an FX graph,
  torchvision's feature extractor), a copy is taken of each returned value
  right where it is computed (so later in-place ops cannot change it), and
  the graph goes through ``torch.compile``. Layers that run more than once,
  container outputs and input captures need hooks, so they run eagerly.

>>> import torch, torchvision
>>> choose_memory_format(torchvision.models.resnet18(), torch.device("cpu"), "auto")
'channels_last'
>>> choose_memory_format(torchvision.models.vit_b_16(), torch.device("cpu"), "auto")
'contiguous'
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
from collections.abc import Iterator, Mapping

import torch
import torch.nn as nn
from torchvision.models.feature_extraction import create_feature_extractor

from hookcli.errors import UsageProblem
from hookcli.families import family_traits
from hookcli.models.loaded import LoadedModel
from hookcli.options import MEMORY_FORMATS, PRECISIONS
from hookcli.run.device import resolve_device
from hookcli.run.settings import RunSettings, default_workers

__all__ = [
    "FUSE_FROM",
    "check_precision",
    "choose_fuse",
    "choose_memory_format",
    "compiled_extractor",
    "compute_dtype",
    "compute_precision",
    "resolve_settings",
    "thread_budget",
]

_MIN_CONVOLUTIONS = 5  # a ViT's single patch-embedding convolution does not make it a convolutional model
#: Runs of this many inputs or more fuse unless told not to; shorter ones run the model as written unless told to.
#: Tracing and folding resnet50 take about 0.1 s on a quiet 2-core CPU (several times that on a busy one), and
#: fusion saves it about 10 ms an image at 224x224 in fp32 (8 ms in bf16): it pays back from about 10 to 16 images.
FUSE_FROM = 16


def check_precision(precision: str, device) -> None:
    """Refuse compute precisions the device cannot run."""
    if precision not in PRECISIONS:
        raise UsageProblem(f"precision must be one of {', '.join(PRECISIONS)}, not '{precision}'")
    if precision == "fp16" and device.type == "cpu":
        raise UsageProblem("fp16 compute needs a GPU", hint="use --precision bf16 on the CPU (or fp32)")
    if precision == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise UsageProblem("this GPU cannot compute in bf16", hint="use --precision fp16 (or fp32)")


def compute_dtype(precision: str):
    """The torch dtype a compute precision computes in: ``fp32`` → ``torch.float32``, and so on."""
    return {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]


@contextlib.contextmanager
def compute_precision(precision: str, device) -> Iterator[None]:
    """Autocast for ``bf16``/``fp16``; nothing for ``fp32``."""
    if precision == "fp32":
        yield
        return
    with torch.autocast(device_type=device.type, dtype=compute_dtype(precision)):
        yield


def choose_fuse(choice: bool | None, inputs: int) -> bool:
    """Whether a run of ``inputs`` images fuses: ``True``/``False`` as asked, ``None`` from :data:`FUSE_FROM` on.

    ``inputs`` is the whole run, known before it starts (a list read from
    stdin included: it is read to its end first).

    >>> choose_fuse(None, 1), choose_fuse(None, FUSE_FROM), choose_fuse(True, 1), choose_fuse(False, 1000)
    (False, True, True, False)
    """
    return choice if choice is not None else inputs >= FUSE_FROM


def choose_memory_format(model, device, choice: str = "auto") -> str:
    """``channels_last`` or ``contiguous``: ``auto`` picks channels-last for convolutional models on CPU and CUDA."""
    if choice not in MEMORY_FORMATS:
        raise UsageProblem(f"memory format must be one of {', '.join(MEMORY_FORMATS)}, not '{choice}'")
    if choice != "auto":
        return choice
    convolutions = sum(isinstance(m, nn.Conv2d) for m in model.modules())
    return "channels_last" if device.type in ("cpu", "cuda") and convolutions >= _MIN_CONVOLUTIONS else "contiguous"


def to_memory_format(tensor_or_model, memory_format: str):
    if memory_format == "channels_last":
        return tensor_or_model.to(memory_format=torch.channels_last)
    return tensor_or_model


@contextlib.contextmanager
def thread_budget(device, workers: int | None) -> Iterator[None]:
    """On the CPU, leave the cores the decode workers use out of the model's threads."""
    if device.type != "cpu" or not workers:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(max(1, min(before, (os.cpu_count() or 1) - workers)))
    try:
        yield
    finally:
        torch.set_num_threads(before)


def compiled_extractor(model, layers: Mapping[str, str], calls: Mapping[str, int], capture: str):
    """``(function, None)``: batch → ``{key: tensor}`` through a truncated, compiled graph; or ``(None, reason)``."""
    if capture != "output":
        return None, "input captures need hooks"
    if "" in layers:
        return None, "the model's own output ('.') is caught by a hook, which a compiled graph does not keep"
    repeated = [path for path, count in calls.items() if count != 1]
    if repeated:
        return None, f"{repeated[0]} runs {calls[repeated[0]]} times per forward, which needs hooks"
    try:
        graph_module = create_feature_extractor(model, return_nodes=dict(layers))
    except Exception as err:  # tracing fails on some models' Python control flow
        return None, f"the model cannot be traced ({type(err).__name__})"
    _copy_outputs_where_computed(graph_module)
    compiled = torch.compile(graph_module, dynamic=False)

    def run(batch):
        with _quiet_compiler_logs():
            outputs = compiled(batch)
        if not all(isinstance(value, torch.Tensor) for value in outputs.values()):
            raise _NotTensors("a requested layer returns a container")
        return dict(outputs)

    return run, None


@contextlib.contextmanager
def _quiet_compiler_logs() -> Iterator[None]:
    """torch's C++ build step warns about a missing CUDA runtime on CPU-only machines; that is no news here."""
    logger = logging.getLogger("torch.utils.cpp_extension")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


class _NotTensors(Exception):
    """A returned node is a container: the compiled path does not flatten those."""


def _copy_outputs_where_computed(graph_module) -> None:
    """Insert ``clone`` right after each returned node, so in-place ops later in the graph leave the result alone."""
    graph = graph_module.graph
    output = next(node for node in graph.nodes if node.op == "output")
    returned = output.args[0]
    copies = {}
    for key, node in returned.items():
        with graph.inserting_after(node):
            copies[key] = graph.call_method("clone", (node,), {"memory_format": torch.contiguous_format})
    output.args = (copies,)
    graph.lint()
    graph_module.recompile()


def resolve_settings(settings: RunSettings, loaded: LoadedModel, inputs: int) -> RunSettings:
    """``settings`` with nothing left to decide, for ``loaded`` on ``inputs`` images.

    A device named by a string becomes a ``torch.device`` that exists here
    and can run the precision (a ``torch.device`` is one resolved already:
    the plan checks the precision before the model loads); preprocessing
    becomes the weights' own where none is given, workers and memory format
    as ``auto`` picks them, and ``fuse=None`` true from
    :data:`~hookcli.run.speed.FUSE_FROM` inputs on
    (:func:`~hookcli.run.speed.choose_fuse`). ``inputs`` counts the whole run,
    also when it resumes part-way, so a resumed run decides as the first
    one did. Resolved settings resolve to themselves.
    """
    device = settings.device
    if isinstance(device, str):  # a torch.device is a resolved one, its precision checked as it was resolved
        device = resolve_device(device)
        check_precision(settings.precision, device)
    workers = settings.workers if settings.workers is not None else default_workers(device, inputs, settings.batch_size)
    # Fusion, channels-last and compilation go where hookcli.families says a family takes them; the others run
    # as written (the metadata's "fused" says 0) in their tensors' own layout.
    traits = family_traits(loaded.family)
    memory_format = (
        "contiguous" if not traits.channels_last and settings.memory_format == "auto" else settings.memory_format
    )
    return dataclasses.replace(
        settings,
        device=device,
        preprocess=settings.preprocess or loaded.preprocess,
        workers=workers,
        memory_format=choose_memory_format(loaded.module, device, memory_format),
        fuse=choose_fuse(settings.fuse, inputs) if traits.fuses else False,
        compile=settings.compile and traits.compiles,
        family=loaded.family,
    )
