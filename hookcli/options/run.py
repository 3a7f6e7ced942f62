"""A run's options, each declared once as a typed field of :class:`RunOptions`: flags, default, bounds, help and
the commands that take it.

The command line's Click options (:mod:`hookcli.cli.declared`), the Python API's keywords, the library's checks
and the CLI reference are made from these fields; changing a default or a bound is one edit here. Nothing here
imports torch: a command that answers without it (``--help``, ``models``, an early refusal) reads these alone.

>>> RunOptions().batch_size, declared("batch_size").flags
(16, ('--batch-size', '-b'))
>>> sorted(set(COMMAND_OPTIONS["cam"]) - set(COMMAND_OPTIONS["grad"]))[:2]
['alpha', 'cmap']
>>> try:
...     RunOptions(frame_stride=0)
... except UsageProblem as err:
...     print(err.message)
frame_stride must be a whole number of at least 1, not 0
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path

from hookcli.errors import RANGE_HINT, UsageProblem
from hookcli.files import regular_file_problem
from hookcli.options.declaring import Option, check_flags, check_value, declarations, option
from hookcli.options.effects import EffectOptions
from hookcli.options.stats import StatsOptions
from hookcli.parsing import Part, check_normalisation, parse_device, parse_levels, parse_part, parse_triple

__all__ = [
    "CAM_METHODS",
    "CAPTURE_KINDS",
    "CLIPS",
    "COMMAND_OPTIONS",
    "DECODERS",
    "DTYPES",
    "INTERPOLATIONS",
    "LARGE_INPUT",
    "MAX_SIDE",
    "MEMORY_FORMATS",
    "ON_ERROR",
    "POOLS",
    "PRECISIONS",
    "RUN_COMMANDS",
    "RUN_OPTIONS",
    "SAVED_RUN_OPTIONS",
    "SAVED_STATS_OPTIONS",
    "SCALES",
    "STATS_CHOICES",
    "RunOptions",
    "declared",
    "options_of",
    "refuse_unknown",
    "run_options",
]

#: What ``--capture`` saves of each layer.
CAPTURE_KINDS = ("output", "input", "both", "attention")
#: What ``--capture attention`` keeps of each row's weights ``[heads, queries, keys]`` (``--attention``).
ATTENTION_KEEPS = ("all", "class", "mean", "class-mean")
#: Global pooling of stored rows (``--pool``).
POOLS = ("avg", "max")
#: Stored dtypes (``--dtype``).
DTYPES = ("float32", "float16", "bfloat16")
#: What an unreadable input does (``--on-error``).
ON_ERROR = ("fail", "skip")
#: Compute precisions (``--precision``) and memory layouts (``--memory-format``).
PRECISIONS = ("fp32", "tf32", "bf16", "fp16")
MEMORY_FORMATS = ("auto", "channels_last", "contiguous")
#: Resize interpolations (``--interpolation``) and where images are decoded (``--decode``).
INTERPOLATIONS = ("bilinear", "bicubic", "nearest")
DECODERS = ("cpu", "device")
#: The largest ``--resize`` and ``--crop``: 8192 pixels a side.
MAX_SIDE = 8192
#: Class-activation map methods (``cam --method``).
CAM_METHODS = ("gradcam", "gradcam++", "xgradcam", "layercam")
#: How grid pictures are normalised (``--scale``).
SCALES = ("channel", "grid")
#: Above this many images, a run whose output is left to its default writes a shard folder instead of one file.
LARGE_INPUT = 10_000
#: The commands that run a model over inputs.
RUN_COMMANDS = ("extract", "grad", "cam", "stats", "compare", "ablate", "patch")

#: What a run over saved features takes of a run's options: how to batch and share them out; ``stats`` also what
#: to gather.
SAVED_RUN_OPTIONS = ("batch_size", "force", "shard_size", "part", "incomplete")

_ALL, _ROWS, _GRADIENTS = RUN_COMMANDS, ("extract", "grad"), ("grad", "cam")
#: Options of the commands that go through many inputs in shards: the rows of extract and grad, the statistics,
#: comparisons, ablations and patches; of the commands that run the forward as extract does; and of those whose
#: forward may be compiled or edited (ablate and patch run their own, cut at the layers they change).
_SHARDED = ("extract", "grad", "stats", "compare", "ablate", "patch")
#: The commands whose inputs are a list of images or videos, not pairs (patch takes pairs, and never splits one).
_UNPAIRED = tuple(command for command in RUN_COMMANDS if command != "patch")
_CLIPPED = tuple(command for command in _SHARDED if command != "patch")
_EDITED = ("extract", "grad", "cam", "stats", "compare")
_EXTRACTING = ("extract", "stats", "compare")


@dataclass(frozen=True)
class RunOptions(EffectOptions):
    """Every option of the commands that run a model, named like the command line's long options."""

    weights: str = option(
        ("--weights", "-w"),
        "DEFAULT (the model's own), a weights name (IMAGENET1K_V1; a timm or "
        "OpenCLIP pretrained tag), none (random init) or a .pth/.pt/.safetensors state dict.",
        _ALL,
        default="DEFAULT",
        metavar="WEIGHTS",
        show_default=True,
    )
    seed: int | None = option(
        ("--seed",),
        "Random seed: of --weights none's weights, and of the partner rows of resample (--intervene, ablate --how). "
        "[0]",
        _ALL,
        kind="int",
    )
    resize: int | None = option(
        ("--resize",),
        "Resize the shorter side to this [weights' value].",
        _ALL,
        kind="int",
        low=1,
        high=MAX_SIDE,
    )
    crop: int | None = option(
        ("--crop",),
        "Centre-crop to this square [weights' value].",
        _ALL,
        kind="int",
        low=1,
        high=MAX_SIDE,
    )
    mean: tuple[float, float, float] | None = option(
        ("--mean",),
        "Normalisation mean [weights' value].",
        _ALL,
        kind="parsed",
        metavar="R,G,B",
        parser=parse_triple,
    )
    std: tuple[float, float, float] | None = option(
        ("--std",),
        "Normalisation std [weights' value].",
        _ALL,
        kind="parsed",
        metavar="R,G,B",
        parser=parse_triple,
    )
    interpolation: str | None = option(
        ("--interpolation",),
        "Resize interpolation [weights' value].",
        _ALL,
        kind="choice",
        choices=INTERPOLATIONS,
    )
    fast_decode: bool = option(
        ("--fast-decode",),
        "Decode JPEGs at a reduced scale (1/2, 1/4, 1/8) that keeps the "
        "shorter side at least twice --resize, and resize only the part the crop keeps: several times faster for "
        "large photos, a third faster to resize for small ones; pixel values differ slightly.",
        _ALL,
        kind="flag",
        default=False,
    )
    decode: str = option(
        ("--decode",),
        "Where images are decoded and preprocessed: cpu (decode workers, Pillow), or device (the workers only "
        "read files; JPEGs are decoded batched on the run's device, by nvImageCodec or nvJPEG on CUDA, and every "
        "image resized there as Pillow resizes). Pixel values differ where the GPU's decoder's do; recorded in the "
        "metadata.",
        _ALL,
        kind="choice",
        choices=DECODERS,
        default="cpu",
        show_default=True,
    )
    device: str = option(
        ("--device", "-d"),
        "auto, cpu, cuda, cuda:N, mps.",
        _ALL,
        kind="parsed",
        default="auto",
        metavar="DEVICE",
        parser=parse_device,
        show_default=True,
    )
    batch_size: int = option(
        ("--batch-size", "-b"),
        "Images per forward.",
        _ALL,
        help_in=(("patch", "Images per forward, a pair's two each: an even number."),),
        kind="int",
        default=16,
        low=1,
        show_default=True,
    )
    precision: str = option(
        ("--precision",),
        "Compute precision: fp32 is exact float32 on every device (on CUDA: no TF32, deterministic algorithms); "
        "tf32 (NVIDIA GPUs from Ampere on), bf16 (CPU or GPU) and fp16 (GPU) trade accuracy for speed; {stored}.",
        _ALL,
        kind="choice",
        choices=PRECISIONS,
        default="fp32",
        show_default=True,
    )
    memory_format: str = option(
        ("--memory-format",),
        "auto: channels-last for convolutional models on CPU and CUDA (faster, exact to fp32 rounding).",
        _ALL,
        kind="choice",
        choices=MEMORY_FORMATS,
        default="auto",
        show_default=True,
    )
    compile: bool = option(
        ("--compile",),
        "torch.compile the forward, cut after the last requested layer (falls back to "
        "eager, with a note, where hooks are needed).",
        _EDITED,
        kind="flag",
        default=False,
    )
    workers: int | None = option(
        ("--workers", "-j"),
        "Processes decoding images while the model runs; 0 decodes in the main "
        "process. [GPU: one per spare core up to 16; CPU: 0 up to 4 cores, then a quarter of them]",
        _ALL,
        kind="int",
        low=0,
    )
    recursive: bool = option(
        ("--recursive", "-r"),
        "Look for images in sub-folders of folder inputs.",
        _UNPAIRED,
        kind="flag",
        default=False,
    )
    on_error: str = option(
        ("--on-error",),
        "For unreadable images: stop, or skip them (listed on stderr and in the metadata).",
        _UNPAIRED,
        kind="choice",
        choices=ON_ERROR,
        default="fail",
        show_default=True,
    )
    force: bool = option(
        ("--force", "-f"),
        "Overwrite existing outputs (a folder output: replace a different run).",
        _ALL,
        kind="flag",
        default=False,
    )
    target: str = option(
        ("--target", "-t"),
        "Logit to take gradients of: a class index, a class name of the weights, "
        "or each image's top prediction (topK: the K highest, one gradient each). Segmentation: a class's mask "
        "(topK: the K classes covering most pixels); detection: a detection's score (topK: the K best; a class: "
        "its best; #N: the Nth of the model's output).",
        _GRADIENTS,
        default="top1",
        metavar="CLASS|topK",
        show_default=True,
        help_in=(("cam", "Class the map explains: an index, a class name of the weights, or topK."),),
    )
    capture: str = option(
        ("--capture",),
        "What to save of each layer: its output, its input, both, or an attention module's weights after softmax "
        "(LAYER@attention, [heads, queries, keys] a row), computed from its inputs so that the model keeps its fused "
        "kernel.",
        ("extract",),
        kind="choice",
        choices=CAPTURE_KINDS,
        default="output",
        show_default=True,
    )
    attention: str = option(
        ("--attention",),
        "With --capture attention, what is kept of each image's weights [heads, queries, keys]: all, class (the "
        "first token's row, a ViT's class token: [heads, keys], the other queries not projected), mean (over the "
        "heads: [queries, keys]) or class-mean ([keys]).",
        ("extract",),
        kind="choice",
        choices=ATTENTION_KEEPS,
        default="all",
        show_default=True,
    )
    pool: str | None = option(
        ("--pool",),
        "Store global pooling: [N,C,H,W] -> [N,C] over H,W; tokens [N,T,D] -> [N,D] over T.",
        ("extract",),
        kind="choice",
        choices=POOLS,
    )
    dtype: str = option(
        ("--dtype",),
        "Stored dtype.",
        _ROWS,
        kind="choice",
        choices=DTYPES,
        default="float32",
        show_default=True,
    )
    shard_size: int | None = option(
        ("--shard-size",),
        "Images (rows) per shard in a folder output [an eighth of the inputs in whole batches, at most about 128 MiB "
        "of features].",
        _SHARDED,
        help_in=tuple(
            (
                command,
                "Inputs per shard: what each shard gathers is kept apart in OUTPUT.parts/ until the run completes, "
                "then merged in order (give one for many processes: they share its shards) [an eighth of the "
                "inputs, 256 at least, in whole batches]."
                + (" An even number: a pair's two inputs go together." if command == "patch" else ""),
            )
            for command in ("stats", "compare", "ablate", "patch")
        ),
        kind="int",
        low=1,
    )
    part: Part | None = option(
        ("--part",),
        "Folder output shared by N processes: this one starts with the K-th block of "
        "shards, then takes any shard no process holds [from torchrun or Slurm when they start it].",
        _SHARDED,
        metavar="K/N",
        help_in=tuple(
            (
                command,
                "Run shared by N processes: this one starts with the K-th block of shards, then takes any shard no "
                "process holds; the one that finishes the last merges them into OUTPUT [from torchrun or Slurm when "
                "they start it].",
            )
            for command in ("stats", "compare", "ablate", "patch")
        ),
    )
    fuse: bool | None = option(
        ("--fuse/--no-fuse",),
        "On the CPU, run each convolution outside the hooked layers together "
        "with its BatchNorm, activation and residual add, as one kernel (equal to fp32 rounding); --no-fuse runs "
        "every module as written. Default: fuse runs of 16 images or more, where the one-off cost of tracing "
        "the model pays back.",
        _EXTRACTING,
        kind="flag",
        show_default=True,
    )
    grid: str | None = option(
        ("--grid",),
        "Also render feature-map PNGs into DIR (as hookcli grid).",
        ("extract",),
        metavar="DIR",
    )
    method: str = option(
        ("--method",),
        "",
        ("cam",),
        kind="choice",
        choices=CAM_METHODS,
        default="gradcam",
        show_default=True,
    )
    alpha: float = option(
        ("--alpha",),
        "Overlay opacity.",
        ("cam",),
        kind="float",
        default=0.5,
        low=0,
        high=1,
        show_default=True,
    )
    cmap: str = option(
        ("--cmap",),
        "Heat-map colormap (any matplotlib name).",
        ("cam",),
        default="inferno",
        show_default=True,
    )
    clip_length: int | None = option(
        ("--clip-length",),
        "Video models: frames in a clip (a row) [16].",
        _CLIPPED,
        kind="int",
        low=1,
        high=4096,
    )
    frame_stride: int = option(
        ("--frame-stride",),
        "Frames between a clip's frames; optical flow: between a pair's two.",
        _CLIPPED,
        kind="int",
        default=1,
        low=1,
        high=4096,
        show_default=True,
    )
    clips_per_video: int = option(
        ("--clips-per-video",),
        "Video models: clips spread evenly over each video (1: the middle one); 0: every clip, one after another.",
        _CLIPPED,
        kind="int",
        default=1,
        low=0,
        high=4096,
        show_default=True,
    )
    detections: bool = option(
        ("--detections",),
        "Detection models: also store each image's final detections "
        "(detections#boxes, #labels, #scores, and #masks or #keypoints where the model gives them), rows of their "
        "own lengths.",
        ("extract",),
        kind="flag",
        default=False,
    )
    flow: bool = option(
        ("--flow",),
        "Optical-flow models: also store the final flow field the model returns, key flow, "
        "[N, 2, H, W] in pixels (x, then y).",
        ("extract",),
        kind="flag",
        default=False,
    )
    region: str | None = option(
        ("--region",),
        "Segmentation models: score the target class over this box (fractions of the "
        "image, 0 to 1) instead of over its predicted mask.",
        _GRADIENTS,
        metavar="X0,Y0,X1,Y1",
    )
    pair_with: tuple | None = option(
        ("--pair-with",),
        "Optical-flow models: the second images of pairs given as two image lists "
        "(files, folders or -, in order), the inputs being the first ones. Repeat.",
        _EXTRACTING,
        metavar="IMAGES",
        multiple=True,
    )
    incomplete: bool = option(
        ("--incomplete",),
        "Saved features: take a shard folder that is missing shards (still being written, or cut short) as it "
        "is; the file records the inputs it covers. Without it, such a folder is refused.",
        ("stats", "compare"),
        kind="flag",
        default=False,
    )
    intervene: tuple[str, ...] = option(
        ("--intervene",),
        "Edit a layer's output during the forward, so that everything after it sees the edit: LAYER[:UNITS]=EDIT, "
        "UNITS K, A:B, K,L,M or * (every unit: channels, token features or vector units), EDIT zero, value:V, "
        "mean:FILE (the layer's @mean in a stats file), resample (a partner row's values), scale:F, "
        "add:FILE:KEY:ROW:ALPHA (steer by ALPHA times a row of a tensor) or clamp:LO:HI. Repeat: applied in order.",
        _EDITED,
        default=(),
        metavar="SPEC",
        multiple=True,
    )
    capture_edited: bool = option(
        ("--capture-edited",),
        "A layer both captured and edited is recorded after its edits [as the layer returned it].",
        _EDITED,
        kind="flag",
        default=False,
    )

    def __post_init__(self) -> None:
        for name in _CHECKED:
            check_value(declared(name), getattr(self, name))
        check_flags(self, RUN_OPTIONS)
        if self.fast_decode and self.decode == "device":
            raise UsageProblem(
                "--fast-decode and --decode device cannot be combined",
                hint="--fast-decode is a reduced scale of the CPU's decoder; give one of them",
            )
        for name in ("mean", "std"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, _parsed(name, parse_triple, getattr(self, name)))
        object.__setattr__(self, "quantiles", _parsed("quantiles", parse_levels, self.quantiles))
        try:
            check_normalisation(self.mean, self.std)
        except ValueError as err:
            raise UsageProblem(str(err), hint="see --help for --mean and --std") from None
        object.__setattr__(self, "device", _parsed("device", parse_device, self.device))
        if self.units is not None and not isinstance(self.units, str):  # ablate's units given as numbers
            given = (self.units,) if isinstance(self.units, int) else tuple(self.units)
            if not all(isinstance(unit, int) and not isinstance(unit, bool) for unit in given):
                raise UsageProblem(f"units must be whole numbers, not {self.units!r}", hint=RANGE_HINT)
            object.__setattr__(self, "units", ",".join(map(str, given)))
        if isinstance(self.intervene, str):  # one spec, as the command line's option given once
            object.__setattr__(self, "intervene", (self.intervene,))
        given = self.intervene
        if not isinstance(given, list | tuple) or not all(isinstance(spec, str) for spec in given):
            raise UsageProblem(
                f"intervene takes a spec string or a list of them, not {type(given).__name__} {given!r:.80}",
                hint="give specs as the command line's --intervene takes them, e.g. ['layer3:0:8=zero']",
            )
        object.__setattr__(self, "intervene", tuple(given))
        if isinstance(self.pair_with, str | os.PathLike):  # one folder or file, as inputs may be given
            object.__setattr__(self, "pair_with", (self.pair_with,))
        if self.part is not None and not isinstance(self.part, Part):
            object.__setattr__(self, "part", parse_part(self.part))
        if self.components is not None:
            problem = regular_file_problem(Path(self.components))
            if problem is not None:
                raise UsageProblem(
                    f"--components '{self.components}' {problem}",
                    hint="give the statistics file of a first stats run, made with --pca",
                )


#: Every run option, in declaration order.
RUN_OPTIONS: tuple[Option, ...] = declarations(RunOptions)
_BY_NAME = {option.name: option for option in RUN_OPTIONS}
#: What statistics gather (:class:`~hookcli.options.stats.StatsOptions`' fields).
STATS_CHOICES = tuple(field.name for field in fields(StatsOptions))
#: What ``stats`` of saved features takes: how to batch and share the run, and what to gather.
SAVED_STATS_OPTIONS = (*SAVED_RUN_OPTIONS, *STATS_CHOICES)


def declared(name: str) -> Option:
    """The declaration of run option ``name``."""
    return _BY_NAME[name]


def options_of(command: str) -> list[Option]:
    """The run options ``command`` takes, in declaration order."""
    return [option for option in RUN_OPTIONS if command in option.commands]


#: The options whose bounds or choices are checked when the options are made, in the order their errors come;
#: the others are checked where they are used (the batch size and workers by the run's settings, the capture,
#: pooling and stored dtype by the pipeline, the precision and layout by the device), with those words.
_CHECKED = (
    "resize",
    "crop",
    "shard_size",
    "clip_length",
    "frame_stride",
    "clips_per_video",
    "interpolation",
    "decode",
    "method",
    "alpha",
    "seed",
    "top",
    "top_by",
)


def _parsed(name: str, parse: Callable, value):
    try:
        return parse(value)
    except ValueError as err:
        raise UsageProblem(f"invalid {name}: {err}", hint=RANGE_HINT) from None


#: The video options (how rows are cut from videos).
CLIPS = ("clip_length", "frame_stride", "clips_per_video")

#: The options each command takes (the Python function's keywords, the command line's long options).
COMMAND_OPTIONS = {command: tuple(option.name for option in options_of(command)) for command in RUN_COMMANDS}


def refuse_unknown(command: str, given: Mapping, allowed: Sequence[str]) -> None:
    """A keyword a command does not take is a TypeError, as Python's own, naming the closest one."""
    unknown = [name for name in given if name not in allowed]
    if unknown:
        closest = difflib.get_close_matches(unknown[0], allowed, n=1)
        suggestion = f"; did you mean '{closest[0]}'?" if closest else ""
        raise TypeError(
            f"{command}() got an unexpected keyword argument '{unknown[0]}'{suggestion} (it takes {', '.join(allowed)})"
        )


def run_options(command: str, given: Mapping) -> RunOptions:
    """The options ``command`` is given, checked; a keyword it does not take is a TypeError."""
    refuse_unknown(command, given, COMMAND_OPTIONS[command])
    return RunOptions(**given)
