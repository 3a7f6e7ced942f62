"""Every option a run or a picture takes, declared once: name, flags, type, default, bounds, help and commands.

The command line's Click options (:mod:`hookcli.cli.declared`), the Python
API's keywords and defaults (:class:`hookcli.run.options.RunOptions`,
:class:`hookcli.pictures.options.GridOptions`), the library's range and
choice checks and the CLI reference are all made from :data:`RUN_OPTIONS`
and :data:`hookcli.grid_options.GRID_OPTIONS`. Changing a default or a bound is one edit here.

The choices the options take live here too, so that a command that answers
without torch (``--help``, ``models``, an early refusal) imports this module
alone.

>>> declared("batch_size").default, declared("batch_size").flags, declared("top").default
(16, ('--batch-size', '-b'), 9)
>>> [option.name for option in options_of("cam")][:4]
['weights', 'seed', 'resize', 'crop']
>>> try:
...     check_value(declared("frame_stride"), 0)
... except UsageProblem as err:
...     print(err.message)
frame_stride must be a whole number of at least 1, not 0
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hookcli.errors import RANGE_HINT, UsageProblem, check_choice, check_whole
from hookcli.parsing import parse_device, parse_levels, parse_triple

__all__ = [
    "CAM_METHODS",
    "CAPTURE_KINDS",
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
    "STATS_CHOICES",
    "SCALES",
    "TOP_BY",
    "Option",
    "check_value",
    "declared",
    "declared_field",
    "options_of",
]

#: What ``--capture`` saves of each layer.
CAPTURE_KINDS = ("output", "input", "both")
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
RUN_COMMANDS = ("extract", "grad", "cam", "stats", "compare")
#: What ranks a channel's dataset examples (``stats --top-by``): the largest value of its map, or the map's mean.
TOP_BY = ("max", "mean")

#: What a run over saved features takes of a run's options: how to batch and share them out; ``stats`` also what
#: to gather.
SAVED_RUN_OPTIONS = ("batch_size", "force", "shard_size", "part", "incomplete")

_ALL, _ROWS, _GRADIENTS = RUN_COMMANDS, ("extract", "grad"), ("grad", "cam")
#: Options of the commands that go through many inputs in shards: the rows of extract and grad, the statistics
#: and comparisons; and those of the commands that run the forward as extract does.
_SHARDED = ("extract", "grad", "stats", "compare")
_EXTRACTING = ("extract", "stats", "compare")


@dataclass(frozen=True)
class Option:
    """One option: its keyword ``name`` and command-line ``flags``, the ``kind`` of value it takes (``int``,
    ``float``, ``choice``, ``flag``, ``text`` or ``parsed``: read by its ``parser``, which raises ValueError),
    its ``default``, bounds (``low``, ``high``) or ``choices``, its ``help`` and the ``commands`` that take it.
    A default that depends on what is drawn or run (None here) is said in the help's own words."""

    name: str
    flags: tuple[str, ...]
    help: str
    commands: tuple[str, ...]
    kind: str = "text"
    default: Any = None
    low: float | None = None
    high: float | None = None
    choices: tuple[str, ...] | None = None
    metavar: str | None = None
    parser: Callable[[Any], Any] | None = None
    multiple: bool = False
    show_default: bool = False
    #: The help a command gives instead of ``help`` (``(command, text)`` pairs).
    help_in: tuple[tuple[str, str], ...] = ()

    def help_for(self, command: str) -> str:
        """The help ``command`` gives for this option."""
        return dict(self.help_in).get(command, self.help)

    @property
    def long(self) -> str:
        """The long flag, as errors name it (``--batch-size``)."""
        return self.flags[0].split("/")[0]


RUN_OPTIONS: tuple[Option, ...] = (
    Option(
        "weights",
        ("--weights", "-w"),
        "DEFAULT (the model's own), a weights name (IMAGENET1K_V1; a timm or "
        "OpenCLIP pretrained tag), none (random init) or a .pth/.pt/.safetensors state dict.",
        _ALL,
        default="DEFAULT",
        metavar="WEIGHTS",
        show_default=True,
    ),
    Option("seed", ("--seed",), "Random seed for --weights none. [0]", _ALL, kind="int"),
    Option(
        "resize",
        ("--resize",),
        "Resize the shorter side to this [weights' value].",
        _ALL,
        kind="int",
        low=1,
        high=MAX_SIDE,
    ),
    Option("crop", ("--crop",), "Centre-crop to this square [weights' value].", _ALL, kind="int", low=1, high=MAX_SIDE),
    Option(
        "mean",
        ("--mean",),
        "Normalisation mean [weights' value].",
        _ALL,
        kind="parsed",
        metavar="R,G,B",
        parser=parse_triple,
    ),
    Option(
        "std",
        ("--std",),
        "Normalisation std [weights' value].",
        _ALL,
        kind="parsed",
        metavar="R,G,B",
        parser=parse_triple,
    ),
    Option(
        "interpolation",
        ("--interpolation",),
        "Resize interpolation [weights' value].",
        _ALL,
        kind="choice",
        choices=INTERPOLATIONS,
    ),
    Option(
        "fast_decode",
        ("--fast-decode",),
        "Decode JPEGs at a reduced scale (1/2, 1/4, 1/8) that keeps the "
        "shorter side at least twice --resize, and resize only the part the crop keeps: several times faster for "
        "large photos, a third faster to resize for small ones; pixel values differ slightly.",
        _ALL,
        kind="flag",
        default=False,
    ),
    Option(
        "decode",
        ("--decode",),
        "Where images are decoded and preprocessed: cpu (decode workers, Pillow), or "
        "device (the workers only read files; JPEGs are decoded batched on the run's device, nvJPEG on CUDA, and "
        "every image resized there). Pixel values differ slightly; recorded in the metadata.",
        _ALL,
        kind="choice",
        choices=DECODERS,
        default="cpu",
        show_default=True,
    ),
    Option(
        "device",
        ("--device", "-d"),
        "auto, cpu, cuda, cuda:N, mps.",
        _ALL,
        kind="parsed",
        default="auto",
        metavar="DEVICE",
        parser=parse_device,
        show_default=True,
    ),
    Option(
        "batch_size",
        ("--batch-size", "-b"),
        "Images per forward.",
        _ALL,
        kind="int",
        default=16,
        low=1,
        show_default=True,
    ),
    Option(
        "precision",
        ("--precision",),
        (
            "Compute precision: fp32 is exact float32 on every device (on CUDA: no TF32, deterministic algorithms); "
            "tf32 (NVIDIA GPUs from Ampere on), bf16 (CPU or GPU) and fp16 (GPU) trade accuracy for speed; {stored}."
        ),
        _ALL,
        kind="choice",
        choices=PRECISIONS,
        default="fp32",
        show_default=True,
    ),
    Option(
        "memory_format",
        ("--memory-format",),
        "auto: channels-last for convolutional models on CPU and CUDA (faster, exact to fp32 rounding).",
        _ALL,
        kind="choice",
        choices=MEMORY_FORMATS,
        default="auto",
        show_default=True,
    ),
    Option(
        "compile",
        ("--compile",),
        "torch.compile the forward, cut after the last requested layer (falls back to "
        "eager, with a note, where hooks are needed).",
        _ALL,
        kind="flag",
        default=False,
    ),
    Option(
        "workers",
        ("--workers", "-j"),
        "Processes decoding images while the model runs; 0 decodes in the main "
        "process. [GPU: one per spare core up to 16; CPU: 0 up to 4 cores, then a quarter of them]",
        _ALL,
        kind="int",
        low=0,
    ),
    Option(
        "recursive",
        ("--recursive", "-r"),
        "Look for images in sub-folders of folder inputs.",
        _ALL,
        kind="flag",
        default=False,
    ),
    Option(
        "on_error",
        ("--on-error",),
        "For unreadable images: stop, or skip them (listed on stderr and in the metadata).",
        _ALL,
        kind="choice",
        choices=ON_ERROR,
        default="fail",
        show_default=True,
    ),
    Option(
        "force",
        ("--force", "-f"),
        "Overwrite existing outputs (a folder output: replace a different run).",
        _ALL,
        kind="flag",
        default=False,
    ),
    Option(
        "target",
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
    ),
    Option(
        "capture",
        ("--capture",),
        "What to save of each layer.",
        ("extract",),
        kind="choice",
        choices=CAPTURE_KINDS,
        default="output",
        show_default=True,
    ),
    Option(
        "pool",
        ("--pool",),
        "Store global pooling: [N,C,H,W] -> [N,C] over H,W; tokens [N,T,D] -> [N,D] over T.",
        ("extract",),
        kind="choice",
        choices=POOLS,
    ),
    Option(
        "dtype",
        ("--dtype",),
        "Stored dtype.",
        _ROWS,
        kind="choice",
        choices=DTYPES,
        default="float32",
        show_default=True,
    ),
    Option(
        "shard_size",
        ("--shard-size",),
        "Images (rows) per shard in a folder output [an eighth of the inputs in whole batches, at most about 128 MiB "
        "of features].",
        _SHARDED,
        help_in=tuple(
            (
                command,
                "Inputs per shard: what each shard gathers is kept apart in OUTPUT.parts/ until the run completes, "
                "then merged in order (give one for many processes: they share its shards) [an eighth of the "
                "inputs, 256 at least, in whole batches].",
            )
            for command in ("stats", "compare")
        ),
        kind="int",
        low=1,
    ),
    Option(
        "part",
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
            for command in ("stats", "compare")
        ),
    ),
    Option(
        "fuse",
        ("--fuse/--no-fuse",),
        "On the CPU, run each convolution outside the hooked layers together "
        "with its BatchNorm, activation and residual add, as one kernel (equal to fp32 rounding); --no-fuse runs "
        "every module as written. Default: fuse runs of 16 images or more, where the one-off cost of tracing "
        "the model pays back.",
        _EXTRACTING,
        kind="flag",
        show_default=True,
    ),
    Option(
        "grid", ("--grid",), "Also render feature-map PNGs into DIR (as hookcli grid).", ("extract",), metavar="DIR"
    ),
    Option(
        "method", ("--method",), "", ("cam",), kind="choice", choices=CAM_METHODS, default="gradcam", show_default=True
    ),
    Option(
        "alpha", ("--alpha",), "Overlay opacity.", ("cam",), kind="float", default=0.5, low=0, high=1, show_default=True
    ),
    Option(
        "cmap", ("--cmap",), "Heat-map colormap (any matplotlib name).", ("cam",), default="inferno", show_default=True
    ),
    Option(
        "clip_length",
        ("--clip-length",),
        "Video models: frames in a clip (a row) [16].",
        _SHARDED,
        kind="int",
        low=1,
        high=4096,
    ),
    Option(
        "frame_stride",
        ("--frame-stride",),
        "Frames between a clip's frames; optical flow: between a pair's two.",
        _SHARDED,
        kind="int",
        default=1,
        low=1,
        high=4096,
        show_default=True,
    ),
    Option(
        "clips_per_video",
        ("--clips-per-video",),
        "Video models: clips spread evenly over each video (1: the middle one); 0: every clip, one after another.",
        _SHARDED,
        kind="int",
        default=1,
        low=0,
        high=4096,
        show_default=True,
    ),
    Option(
        "detections",
        ("--detections",),
        "Detection models: also store each image's final detections "
        "(detections#boxes, #labels, #scores, and #masks or #keypoints where the model gives them), rows of their "
        "own lengths.",
        ("extract",),
        kind="flag",
        default=False,
    ),
    Option(
        "flow",
        ("--flow",),
        "Optical-flow models: also store the final flow field the model returns, key flow, "
        "[N, 2, H, W] in pixels (x, then y).",
        ("extract",),
        kind="flag",
        default=False,
    ),
    Option(
        "region",
        ("--region",),
        "Segmentation models: score the target class over this box (fractions of the "
        "image, 0 to 1) instead of over its predicted mask.",
        _GRADIENTS,
        metavar="X0,Y0,X1,Y1",
    ),
    Option(
        "pair_with",
        ("--pair-with",),
        "Optical-flow models: the second images of pairs given as two image lists "
        "(files, folders or -, in order), the inputs being the first ones. Repeat.",
        _EXTRACTING,
        metavar="IMAGES",
        multiple=True,
    ),
    Option(
        "top",
        ("--top",),
        "Dataset examples kept for each channel: the inputs that drive it hardest, with where and their maps.",
        ("stats",),
        kind="int",
        default=9,
        low=1,
        high=1000,
        show_default=True,
    ),
    Option(
        "top_by",
        ("--top-by",),
        "What ranks an input for a channel: the largest value of the channel's map, or the map's mean.",
        ("stats",),
        kind="choice",
        choices=TOP_BY,
        default="max",
        show_default=True,
    ),
    Option(
        "quantiles",
        ("--quantiles",),
        "Quantile levels of each channel's values, from 0 to 1, within 0.1% of the count in rank (0.995 is "
        "NetDissect's threshold). [0.5,0.99,0.995]",
        ("stats",),
        kind="parsed",
        default=(0.5, 0.99, 0.995),
        metavar="Q,Q,...",
        parser=parse_levels,
    ),
    Option(
        "pca",
        ("--pca/--no-pca",),
        "The covariance of the channels pooled over positions, and its principal components (a C x C matrix: "
        "--no-pca for layers of more than a few thousand channels).",
        ("stats",),
        kind="flag",
        default=True,
        show_default=True,
    ),
    Option(
        "components",
        ("--components",),
        "A statistics file with PCA of these layers (an earlier run's): also gather each layer's first 16 "
        "principal components as a layer of their own, KEY#pc, a channel a component (the channels less the "
        "file's means, projected at each position): their dataset examples are the inputs that drive each "
        "component hardest (--top-by mean: by the projection of their pooled channels).",
        ("stats",),
        metavar="FILE",
    ),
    Option(
        "incomplete",
        ("--incomplete",),
        "Saved features: take a shard folder that is missing shards (still being written, or cut short) as it "
        "is; the file records the inputs it covers. Without it, such a folder is refused.",
        ("stats", "compare"),
        kind="flag",
        default=False,
    ),
)

_BY_NAME = {option.name: option for option in RUN_OPTIONS}
#: What statistics gather (``stats``' own options: ``top``, ``top_by``, ``quantiles``, ``pca``, ``components``).
STATS_CHOICES = tuple(option.name for option in RUN_OPTIONS if option.commands == ("stats",))
#: What ``stats`` of saved features takes: how to batch and share the run, and what to gather.
SAVED_STATS_OPTIONS = (*SAVED_RUN_OPTIONS, *STATS_CHOICES)


def declared(name: str, table: tuple[Option, ...] | None = None) -> Option:
    """The declaration of option ``name`` (of :data:`RUN_OPTIONS`, or of ``table``)."""
    if table is None:
        return _BY_NAME[name]
    return next(option for option in table if option.name == name)


def declared_field(name: str, table: tuple[Option, ...] | None = None) -> Any:
    """A dataclass field holding option ``name``'s declared default: how ``RunOptions`` and ``GridOptions`` take
    their defaults from the declarations."""
    return field(default=declared(name, table).default)


def options_of(command: str) -> list[Option]:
    """The run options ``command`` takes, in declaration order."""
    return [option for option in RUN_OPTIONS if command in option.commands]


def check_value(option: Option, value: Any) -> None:
    """Refuse, with the library's words, a ``value`` outside ``option``'s bounds or choices (None passes when the
    option has no default)."""
    if value is None and option.default is None:
        return
    if option.kind == "int":
        if option.low is not None:
            check_whole(option.name, value, int(option.low), None if option.high is None else int(option.high))
        elif isinstance(value, bool) or not isinstance(value, int):
            raise UsageProblem(f"{option.name} must be a whole number, not {value!r}", hint=RANGE_HINT)
    elif option.kind == "float":
        low, high = option.low or 0.0, option.high or 0.0
        if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
            raise UsageProblem(f"{option.name} must be between {low:g} and {high:g}, not {value!r}", hint=RANGE_HINT)
    elif option.kind == "choice":
        check_choice(option.name, value, option.choices)
    elif option.kind == "flag" and not isinstance(value, bool):
        raise UsageProblem(f"{option.name} must be True or False, not {value!r}", hint=RANGE_HINT)
