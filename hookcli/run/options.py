"""A run's options: :class:`RunOptions`, every option of ``extract``, ``grad``, ``cam`` and ``stats`` with its
default and its checks, and which command takes which (:data:`COMMAND_OPTIONS`).

>>> RunOptions().batch_size, sorted(set(COMMAND_OPTIONS["cam"]) - set(COMMAND_OPTIONS["grad"]))[:2]
(16, ['alpha', 'cmap'])
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from hookcli.errors import RANGE_HINT, UsageProblem
from hookcli.inputs.preprocess import check_normalisation
from hookcli.models.specs import regular_file_problem
from hookcli.options import RUN_COMMANDS, RUN_OPTIONS, check_value, declared, declared_field, options_of
from hookcli.parsing import parse_device, parse_levels, parse_triple
from hookcli.run.launch import Part, parse_part

__all__ = ["CLIPS", "COMMAND_OPTIONS", "run_options", "refuse_unknown", "RunOptions"]


@dataclass(frozen=True)
class RunOptions:
    """Every option of extract, grad and cam, named like the command line's long options: defaults, bounds and
    choices are :data:`hookcli.options.RUN_OPTIONS`' (a test checks that the fields are the declared ones)."""

    weights: str = declared_field("weights")
    seed: int | None = declared_field("seed")
    capture: str = declared_field("capture")
    resize: int | None = declared_field("resize")
    crop: int | None = declared_field("crop")
    mean: tuple[float, float, float] | None = declared_field("mean")
    std: tuple[float, float, float] | None = declared_field("std")
    interpolation: str | None = declared_field("interpolation")
    fast_decode: bool = declared_field("fast_decode")
    decode: str = declared_field("decode")
    device: str = declared_field("device")
    batch_size: int = declared_field("batch_size")
    precision: str = declared_field("precision")
    memory_format: str = declared_field("memory_format")
    compile: bool = declared_field("compile")
    workers: int | None = declared_field("workers")
    recursive: bool = declared_field("recursive")
    on_error: str = declared_field("on_error")
    force: bool = declared_field("force")
    pool: str | None = declared_field("pool")
    dtype: str = declared_field("dtype")
    shard_size: int | None = declared_field("shard_size")
    fuse: bool | None = declared_field("fuse")  # None: by the number of inputs (hookcli.run.speed.choose_fuse)
    grid: str | None = declared_field("grid")
    target: str = declared_field("target")
    method: str = declared_field("method")
    alpha: float = declared_field("alpha")
    cmap: str = declared_field("cmap")
    clip_length: int | None = declared_field(
        "clip_length"
    )  # video models: None is hookcli.families.DEFAULT_CLIP_LENGTH
    frame_stride: int = declared_field("frame_stride")
    clips_per_video: int = declared_field("clips_per_video")  # 0: every clip, one after another
    detections: bool = declared_field("detections")
    flow: bool = declared_field("flow")
    region: str | None = declared_field("region")  # segmentation targets: x0,y0,x1,y1 as fractions of the image
    pair_with: tuple | None = declared_field("pair_with")  # optical flow from two image lists: the second images
    part: Part | None = declared_field("part")  # given as K/N (the K-th of N sharing a shard folder), kept parsed
    top: int = declared_field("top")  # stats: examples kept for each channel
    top_by: str = declared_field("top_by")
    quantiles: tuple[float, ...] = declared_field("quantiles")
    pca: bool = declared_field("pca")
    components: str | None = declared_field("components")  # stats: a statistics file whose components to gather
    incomplete: bool = declared_field("incomplete")  # saved features: a shard folder missing shards is taken

    def __post_init__(self) -> None:
        for name in _CHECKED:
            check_value(declared(name), getattr(self, name))
        for option in _FLAGS:  # "no" is true to Python: a flag takes True or False
            check_value(option, getattr(self, option.name))
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


#: The options that are flags, checked to be True or False.
_FLAGS = tuple(
    option for option in RUN_OPTIONS if option.kind == "flag" and option.name in RunOptions.__dataclass_fields__
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
    refuse_unknown(command, given, COMMAND_OPTIONS[command])
    return RunOptions(**given)
