"""How a run runs, resolved once: :class:`RunSettings` (device, batching, precision, layout, pooling,
preprocessing, what is captured) and the :class:`Batch` of rows each step of the pipeline yields.

>>> RunSettings().pool, POOLS, DTYPES
(None, ('avg', 'max'), ('float32', 'float16', 'bfloat16'))
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from hookcli.errors import check_choice, check_whole
from hookcli.inputs.preprocess import Preprocess
from hookcli.options.run import (
    ATTENTION_KEEPS,
    CAPTURE_KINDS,
    DTYPES,
    MEMORY_FORMATS,
    ON_ERROR,
    POOLS,
    PRECISIONS,
    RunOptions,
)
from hookcli.run.launch import usable_cores
from hookcli.storage.fileformat import RunFacts

if TYPE_CHECKING:
    import torch

__all__ = ["GPU_WORKERS", "MAX_WORKERS", "default_workers", "Batch", "RunSettings"]


@dataclass(frozen=True)
class RunSettings:
    """How to run: everything but the model, the layers and the inputs.

    Fields left to be decided (``preprocess=None``: the weights' own;
    ``device="auto"``; ``workers=None``; ``memory_format="auto"``;
    ``fuse=None``: by the number of inputs) are decided once by
    :func:`hookcli.run.speed.resolve_settings`. ``fuse`` (extraction on the CPU, see
    :mod:`hookcli.run.fusion`) is ignored by gradient runs and by ``compile``,
    which fuses in its own way.
    """

    preprocess: Preprocess | None = None
    capture: str = "output"
    device: str | torch.device = "auto"
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
    #: Edits of layers' outputs during the forward (:mod:`hookcli.run.edits`), in order; ``capture_edited``: a
    #: captured layer that is edited is recorded after its edits.
    edits: tuple[Any, ...] = field(default=(), compare=False)  # hookcli.run.edits.Edit
    capture_edited: bool = False
    #: What ``capture="attention"`` keeps of each row's weights (:data:`~hookcli.options.run.ATTENTION_KEEPS`).
    attention: str = "all"

    def __post_init__(self) -> None:
        check_choice("capture", self.capture, CAPTURE_KINDS)
        check_choice("attention", self.attention, ATTENTION_KEEPS)
        if self.pool is not None:
            check_choice("pool", self.pool, POOLS)
        check_choice("dtype", self.dtype, DTYPES)
        check_choice("on_error", self.on_error, ON_ERROR)
        check_choice("precision", self.precision, PRECISIONS)
        check_choice("memory_format", self.memory_format, MEMORY_FORMATS)
        check_whole("batch_size", self.batch_size, 1)
        check_whole("workers", self.workers, 0, MAX_WORKERS, optional=True)

    @classmethod
    def asked(cls, opts: RunOptions, *, captures: bool = True, stores: bool = True, fuses: bool = True) -> RunSettings:
        """The settings ``opts`` ask for, preprocessing left to the model's. ``captures``: the run captures what
        ``--capture`` and ``--pool`` say (else the layers' outputs whole); ``stores``: as ``--dtype`` says (else
        float32); ``fuses``: its forward may fuse."""
        return cls(
            capture=opts.capture if captures else "output",
            device=opts.device,
            batch_size=opts.batch_size,
            workers=opts.workers,
            pool=opts.pool if captures else None,
            dtype=opts.dtype if stores else "float32",
            on_error=opts.on_error,
            precision=opts.precision,
            memory_format=opts.memory_format,
            compile=opts.compile,
            fuse=opts.fuse if fuses else False,
            final_output=opts.detections or opts.flow,
            capture_edited=opts.capture_edited,
            attention=opts.attention if captures else "all",
        )

    @property
    def recorded_capture(self) -> str:
        """What the metadata's ``capture`` says: the kind, and for attention what is kept of it when not all."""
        if self.capture == "attention" and self.attention != "all":
            return f"attention:{self.attention}"
        return self.capture

    @property
    def fusing(self) -> bool:
        """Whether extraction may fuse: ``fuse`` asked for or chosen, and no ``compile`` (which fuses in its own way).

        False while ``fuse`` is still None: :func:`hookcli.run.speed.resolve_settings` decides it.
        """
        return bool(self.fuse) and not self.compile


@dataclass
class Batch:
    """Rows of one batch: input ``indices`` (in order), their features, and inputs that could not be read.

    ``targets`` (gradient runs only) describes, per row, the logits the
    gradients are of; ``facts`` is what the forward has learnt so far (None
    when no image of the batch could be read); ``pictures``, by input index,
    what the run's picture maker made of each image as it was decoded;
    ``damaged``, ``(input index, what its decoder said)`` for each image
    decoded though its decoder found it damaged.
    """

    indices: list[int]
    features: dict
    failures: list[tuple[int, str]] = field(default_factory=list)
    targets: list | None = None
    facts: RunFacts | None = None
    pictures: dict = field(default_factory=dict)
    damaged: list[tuple[int, str]] = field(default_factory=list)


#: More decoding processes than this would only crowd the machine (each one holds a copy of the decoder's state).
MAX_WORKERS = 128
#: The most decode workers a GPU run starts by itself: a core decodes, resizes and crops about 300 to 650 photos of
#: 500x375 a second for an ImageNet model, and an H100 computes resnet50 at about 7,500 a second in fp32.
GPU_WORKERS = 16


def default_workers(device, images: int, batch_size: int) -> int:
    """Decode processes to start when the user names none.

    None for a single batch. On a GPU, one per spare core this process may use
    (up to :data:`GPU_WORKERS`): decoding is what keeps it fed. On the CPU the
    model's own threads already use every core, so decoding in other processes
    only helps on larger machines.
    """
    cores = usable_cores()
    if images <= batch_size:
        return 0
    if getattr(device, "type", str(device)) in ("cuda", "mps"):
        return max(1, min(GPU_WORKERS, cores - 1))
    return 0 if cores <= 4 else min(4, cores // 4)
