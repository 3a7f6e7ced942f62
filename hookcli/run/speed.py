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
import re
import warnings
from collections.abc import Iterator, Mapping

import torch
import torch.nn as nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torchvision.models.feature_extraction import create_feature_extractor

from hookcli.console import TF32_LEFT_OFF
from hookcli.errors import CaptureError, UsageProblem, check_choice, compiler_error, first_line, size_refusal
from hookcli.families import family_traits
from hookcli.models.loaded import LoadedModel
from hookcli.options.run import MEMORY_FORMATS, PRECISIONS
from hookcli.run.batches import quiet_meta_failures
from hookcli.run.device import resolve_device
from hookcli.run.launch import Part, cpu_threads, usable_cores
from hookcli.run.settings import RunSettings, default_workers
from hookcli.run.team import local_device

__all__ = [
    "FUSE_FROM",
    "check_precision",
    "choose_fuse",
    "choose_memory_format",
    "compiled_extractor",
    "compute_dtype",
    "compute_precision",
    "float32_math",
    "model_refusal",
    "resolve_settings",
    "run_device",
    "thread_budget",
]

_MIN_CONVOLUTIONS = 5  # a ViT's single patch-embedding convolution does not make it a convolutional model
#: Runs of this many inputs or more fuse unless told not to; shorter ones run the model as written unless told to.
#: Tracing and folding resnet50 take about 0.1 s on a quiet 2-core CPU (several times that on a busy one), and
#: fusion saves it about 10 ms an image at 224x224 in fp32 (8 ms in bf16): it pays back from about 10 to 16 images.
FUSE_FROM = 16


def run_device(part: Part | None, device: str, precision: str, decode: str | None, module=None) -> torch.device:
    """The device of this process's run (with ``auto``, where a caller's ``module`` sits if not on the CPU); on a CPU
    shared by several processes, this one's threads. Refuses a ``precision`` or ``decode`` the device cannot do."""
    chosen = resolve_device(local_device(part, device), module)
    threads = cpu_threads(part)
    if chosen.type == "cpu" and threads:
        torch.set_num_threads(threads)  # the processes on this machine share its cores
    check_precision(precision, chosen)
    if decode == "device" and chosen.type not in ("cuda", "cpu"):
        raise UsageProblem(
            f"--decode device decodes on CUDA GPUs (nvJPEG), not on {chosen.type}",
            hint="leave out --decode device: the decode workers feed it",
        )
    return chosen


#: How torch says a layer got values of another dtype than its parameters (a convolution's "Input type (float) and
#: bias type (double) should be the same", a matrix product's "must have the same dtype", "expected scalar type").
_DTYPE_WORDS = re.compile(r"dtype|scalar type|input type \(", re.IGNORECASE)


def model_refusal(err: BaseException, module: nn.Module, precision: str, name: str) -> CaptureError | None:
    """The refusal of a model that cannot run as the run asks, where ``err`` (raised by its first forward) is torch
    saying why: its parameters are of another dtype than the values fed, or were made under inference mode (tensors
    torch runs hooked layers and gradients with no more), or it was compiled by torch.compile and its graph cannot
    run; None for any other failure."""
    if compiler_error(err) and size_refusal(err) is None:  # not the model refusing an input's size, in its words
        return CaptureError(
            f"{name} was compiled by torch.compile, and its compiled graph cannot run here ({first_line(err)[:200]})",
            hint="hand in the module before it was compiled (its _orig_mod), or compile it without fullgraph=True",
        )
    if isinstance(err, RuntimeError) and "inference tensor" in first_line(err).lower():
        return CaptureError(
            f"{name}'s parameters were made under torch.inference_mode(), and torch runs them here no more "
            f"({first_line(err).rstrip('.')})",
            hint="build or load the model outside torch.inference_mode()",
        )
    fed = {"bf16": "bfloat16", "fp16": "float16"}.get(precision, "float32")  # what autocast computes in
    others = sorted(
        {str(p.dtype).removeprefix("torch.") for p in module.parameters() if p.is_floating_point()} - {"float32", fed}
    )
    if not others or not isinstance(err, RuntimeError) or not _DTYPE_WORDS.search(first_line(err)):
        return None
    return CaptureError(
        f"{name} has {' and '.join(others)} parameters, which a run in {precision} does not feed "
        f"({first_line(err).rstrip('.')})",
        hint="give it float32 parameters (module.float()); a bfloat16 or float16 model runs with --precision bf16 "
        "(or fp16 on a GPU)",
    )


def check_precision(precision: str, device) -> None:
    """Refuse compute precisions the device cannot run."""
    check_choice("precision", precision, PRECISIONS)
    if precision == "fp16" and device.type == "cpu":
        raise UsageProblem("fp16 compute needs a GPU", hint="use --precision bf16 on the CPU (or fp32)")
    if precision == "tf32" and device.type != "cuda":
        raise UsageProblem(
            f"tf32 is the tensor cores' float32 of NVIDIA GPUs, and this run computes on {device.type}",
            hint="use --precision fp32 (exact) or bf16",
        )
    if precision == "tf32" and torch.cuda.get_device_capability(device) < (8, 0):
        raise UsageProblem(
            f"this GPU ({torch.cuda.get_device_name(device)}) has no TF32 tensor cores (they came with Ampere)",
            hint="use --precision fp32, or fp16",
        )
    if precision == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise UsageProblem("this GPU cannot compute in bf16", hint="use --precision fp16 (or fp32)")


def compute_dtype(precision: str):
    """The torch dtype a compute precision computes in: ``fp32`` and ``tf32`` → ``torch.float32``, and so on."""
    return {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]


@contextlib.contextmanager
def compute_precision(precision: str, device, *, backward: bool = False) -> Iterator[None]:
    """The math of ``precision`` for a forward (and with ``backward``, the backward its graph makes) inside: autocast
    for ``bf16``/``fp16``, and float32 as :func:`float32_math` sets it for ``fp32`` and ``tf32``. Entered around each
    call of the model, never across a ``yield`` that a caller may leave unfinished: torch's settings are the
    process's own."""
    if precision in ("fp32", "tf32"):
        with float32_math(precision, device, backward=backward):
            yield
        return
    with torch.autocast(device_type=device.type, dtype=compute_dtype(precision)):
        yield


#: Where torch 2.9 and later keep the precision of float32 convolutions and matrix products, parents before their
#: children: "ieee" is float32, "tf32" lets NVIDIA's tensor cores round the inputs to 10 bits of mantissa, "none"
#: inherits.
_FLOAT32_PRECISIONS = (
    "",
    "cuda.matmul",
    "cudnn",
    "cudnn.conv",
    "cudnn.rnn",
    "mkldnn",
    "mkldnn.matmul",
    "mkldnn.conv",
    "mkldnn.rnn",
)


@contextlib.contextmanager
def float32_math(precision: str, device, *, backward: bool = False) -> Iterator[None]:
    """Inside, float32 math is what ``precision`` promises; torch's settings are restored afterwards.

    ``fp32``: true float32 on every device (no TF32 in cuDNN convolutions or CUDA matrix products), and on CUDA
    deterministic algorithms (cuDNN's deterministic ones, no benchmarking, torch's deterministic kernels where it has
    them), so one process or many write the same bytes; for a forward whose graph a ``backward`` follows, attention
    (``scaled_dot_product_attention``) by its math kernel there, as the fused kernels' backward passes add in no
    fixed order. ``tf32``: TF32 for convolutions and matrix products,
    algorithms as torch picks them. ``bf16``/``fp16``: autocast (:func:`compute_precision`); what stays in float32
    runs as torch is set.
    """
    if precision not in ("fp32", "tf32"):
        yield
        return
    exact = precision == "fp32"
    with contextlib.ExitStack() as restore:
        restore.enter_context(_float32_precision("ieee" if exact else "tf32"))
        if exact:
            restore.enter_context(_set(torch.backends.cudnn, deterministic=True, benchmark=False))
            if device.type == "cuda":
                restore.enter_context(_deterministic_algorithms())
                if backward:
                    restore.enter_context(sdpa_kernel([SDPBackend.MATH]))
        yield


@contextlib.contextmanager
def _float32_precision(value: str) -> Iterator[None]:
    """``value`` (``ieee`` or ``tf32``) for float32 convolutions and matrix products inside, torch's settings as
    they were afterwards.

    Set through torch's older switches, which keep its per-backend settings in step (torch refuses to read the
    older switches, as torch.compile does, once the two disagree); what was there is kept, and put back, through
    the per-backend settings where torch has them (a caller's own mix of them included), else the older switches.
    """
    before: list = []
    with contextlib.suppress(RuntimeError):  # unreadable where a caller mixed the two ways: not to be put back
        before.append((torch.backends.cudnn, torch.backends.cudnn.allow_tf32))
    with contextlib.suppress(RuntimeError):
        before.append((None, torch.get_float32_matmul_precision()))
    if hasattr(torch.backends.cuda.matmul, "fp32_precision"):  # after the older switches, which reset them
        before += [(owner, owner.fp32_precision) for owner in map(_backend, _FLOAT32_PRECISIONS)]
    allowed = value == "tf32"
    try:
        torch.backends.cudnn.allow_tf32 = allowed
        torch.set_float32_matmul_precision("high" if allowed else "highest")
        yield
    finally:
        for owner, setting in before:
            if owner is None:
                torch.set_float32_matmul_precision(setting)
            elif isinstance(setting, bool):
                owner.allow_tf32 = setting
            else:
                owner.fp32_precision = setting


def _backend(path: str):
    """The object of ``torch.backends`` at ``path`` (``cudnn.conv``; empty: ``torch.backends`` itself)."""
    owner: object = torch.backends
    for name in filter(None, path.split(".")):
        owner = getattr(owner, name)
    return owner


@contextlib.contextmanager
def _set(owner, **values) -> Iterator[None]:
    """``owner``'s attributes set to ``values`` inside, back to what they were afterwards."""
    before = {name: getattr(owner, name) for name in values}
    for name, value in values.items():
        setattr(owner, name, value)
    try:
        yield
    finally:
        for name, value in before.items():
            setattr(owner, name, value)


@contextlib.contextmanager
def _deterministic_algorithms() -> Iterator[None]:
    """torch's deterministic kernels inside (where an operation has none, torch's warning is not said: see
    :data:`_NO_DETERMINISTIC_KERNEL`), and cuBLAS's deterministic workspace where the process has not chosen one
    (it is read when cuBLAS starts: a process that used cuBLAS before its first run keeps what it had)."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    enabled, warn_only = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
    )
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(enabled, warn_only=warn_only)


#: What torch says of an operation without a deterministic kernel (a few backward passes on CUDA) while
#: :func:`_deterministic_algorithms` asks for them: about a setting hookcli made, not the user, so it is left
#: unsaid. Filtered once, for the process: a filter set and reset around each forward would race the threads
#: that gather and write while the next batch computes.
_NO_DETERMINISTIC_KERNEL = ".*does not have a deterministic implementation, but you set"
warnings.filterwarnings("ignore", message=_NO_DETERMINISTIC_KERNEL, category=UserWarning)

# What torch's compiler says of a GPU whose TF32 tensor cores are left off: ``--precision fp32`` leaves them off on
# purpose (``tf32`` asks for them), so it is not a note about the user's run either.
warnings.filterwarnings("ignore", message=TF32_LEFT_OFF, category=UserWarning)


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
    check_choice("memory format", choice, MEMORY_FORMATS)
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
    torch.set_num_threads(max(1, min(before, usable_cores() - workers)))
    try:
        yield
    finally:
        torch.set_num_threads(before)


def compiled_extractor(model, layers: Mapping[str, str], calls: Mapping[str, int], capture: str):
    """``(function, None)``: batch → ``{key: tensor}`` through a truncated, compiled graph; or ``(None, reason)``."""
    if capture != "output":
        return None, f"{'attention' if capture == 'attention' else 'input'} captures need hooks"
    if "" in layers:
        return None, "the model's own output ('.') is caught by a hook, which a compiled graph does not keep"
    repeated = [path for path, count in calls.items() if count != 1]
    if repeated:
        return None, f"{repeated[0]} runs {calls[repeated[0]]} times per forward, which needs hooks"
    try:
        graph_module = create_feature_extractor(model, return_nodes=dict(layers))
    except Exception as err:  # tracing fails on some models' Python control flow
        return None, f"the model cannot be traced ({type(err).__name__})"
    graph_module.eval()  # its graph of eval mode, where a module's Python forward reads self.training
    _copy_outputs_where_computed(graph_module)
    compiled = torch.compile(graph_module, dynamic=False)

    def run(batch):
        with _quiet_compiler_logs(), quiet_meta_failures():
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

    A device string becomes a ``torch.device`` that exists here and can run the precision (a ``torch.device`` counts as
    resolved: the plan checks the precision before the model loads). Preprocessing defaults to the weights' own,
    workers and memory format are picked as ``auto`` picks them, and ``fuse=None`` becomes true from
    :data:`~hookcli.run.speed.FUSE_FROM` inputs on (:func:`~hookcli.run.speed.choose_fuse`). ``inputs`` counts the
    whole run, also when it resumes part-way, so a resumed run decides as the first did. Resolved settings resolve to
    themselves.
    """
    device = settings.device
    if isinstance(device, str):  # a torch.device is a resolved one, its precision checked as it was resolved
        device = resolve_device(device, loaded.module)
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
        fuse=_fuses(settings.fuse, inputs, loaded) if traits.fuses else False,
        compile=settings.compile and traits.compiles,
        family=loaded.family,
    )


def _fuses(asked: bool | None, inputs: int, loaded) -> bool:
    """:func:`choose_fuse`, but a module handed in fuses only when asked: fusing traces it once, and Python in its
    ``forward`` (a counter, a branch on values) would run at the trace alone."""
    if asked is None and loaded.source == "module":
        return False
    return choose_fuse(asked, inputs)
