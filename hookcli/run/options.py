"""A run's options: :class:`RunOptions`, every option of ``extract``, ``grad`` and ``cam`` with its default and
its checks, and which command takes which (:data:`COMMAND_OPTIONS`).

>>> RunOptions().batch_size, sorted(set(COMMAND_OPTIONS["cam"]) - set(COMMAND_OPTIONS["grad"]))[:2]
(16, ['alpha', 'cmap'])
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from hookcli.errors import UsageProblem, check_choice, check_whole

__all__ = ["CLIPS", "COMMAND_OPTIONS", "run_options", "refuse_unknown", "RunOptions"]


@dataclass(frozen=True)
class RunOptions:
    """Every option of extract, grad and cam, named like the command line's long options, with their defaults."""

    weights: str = "DEFAULT"
    seed: int | None = None
    capture: str = "output"
    resize: int | None = None
    crop: int | None = None
    mean: tuple[float, float, float] | None = None
    std: tuple[float, float, float] | None = None
    interpolation: str | None = None
    fast_decode: bool = False
    decode: str = "cpu"  # hookcli.inputs.preprocess.DECODERS
    device: str = "auto"
    batch_size: int = 16
    precision: str = "fp32"
    memory_format: str = "auto"
    compile: bool = False
    workers: int | None = None
    recursive: bool = False
    on_error: str = "fail"
    force: bool = False
    pool: str | None = None
    dtype: str = "float32"
    shard_size: int | None = None
    fuse: bool | None = None  # None: by the number of inputs (hookcli.run.speed.choose_fuse)
    grid: str | None = None
    target: str = "top1"
    method: str = "gradcam"
    alpha: float = 0.5
    cmap: str = "inferno"
    clip_length: int | None = None  # video models: None is 16 (hookcli.families.DEFAULT_CLIP_LENGTH)
    frame_stride: int = 1
    clips_per_video: int = 1  # 0: every clip, one after another
    detections: bool = False
    flow: bool = False
    region: str | None = None  # segmentation targets: x0,y0,x1,y1 as fractions of the image
    pair_with: tuple | None = None  # optical flow from two image lists: the second images, as inputs are given
    part: str | None = None  # K/N: this process is the K-th of N sharing a shard folder (hookcli.run.launch)

    def __post_init__(self) -> None:
        from hookcli.inputs.preprocess import DECODERS, INTERPOLATIONS, MAX_SIDE, check_normalisation, parse_triple
        from hookcli.run.device import parse_device
        from hookcli.run.gradients import CAM_METHODS

        for name, high in (("resize", MAX_SIDE), ("crop", MAX_SIDE), ("shard_size", None), ("clip_length", 4096)):
            check_whole(name, getattr(self, name), 1, high, optional=True)
        check_whole("frame_stride", self.frame_stride, 1, 4096)
        check_whole("clips_per_video", self.clips_per_video, 0, 4096)
        if self.interpolation is not None:
            check_choice("interpolation", self.interpolation, INTERPOLATIONS)
        check_choice("decode", self.decode, DECODERS)
        if self.fast_decode and self.decode == "device":
            raise UsageProblem(
                "--fast-decode and --decode device cannot be combined",
                hint="--fast-decode is a reduced scale of the CPU's decoder; give one of them",
            )
        for name in ("mean", "std"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, _parsed(name, parse_triple, getattr(self, name)))
        try:
            check_normalisation(self.mean, self.std)
        except ValueError as err:
            raise UsageProblem(str(err), hint="see --help for --mean and --std") from None
        object.__setattr__(self, "device", _parsed("device", parse_device, self.device))
        check_choice("method", self.method, CAM_METHODS)
        if not 0 <= self.alpha <= 1:
            raise UsageProblem(f"alpha must be between 0 and 1, not {self.alpha!r}")
        if isinstance(self.pair_with, str | os.PathLike):  # one folder or file, as inputs may be given
            object.__setattr__(self, "pair_with", (self.pair_with,))
        if self.seed is not None and not isinstance(self.seed, int):
            raise UsageProblem(f"seed must be a whole number, not {self.seed!r}")
        if self.part is not None:
            from hookcli.run.launch import parse_part

            parse_part(self.part)


def _parsed(name: str, parse: Callable, value):
    try:
        return parse(value)
    except ValueError as err:
        raise UsageProblem(f"invalid {name}: {err}") from None


_COMMON = (
    "weights",
    "seed",
    "resize",
    "crop",
    "mean",
    "std",
    "interpolation",
    "fast_decode",
    "decode",
    "device",
    "batch_size",
    "precision",
    "memory_format",
    "compile",
    "workers",
    "recursive",
    "on_error",
    "force",
)


#: The options each command takes (the Python function's keywords, the command line's long options).
CLIPS = ("clip_length", "frame_stride", "clips_per_video")


COMMAND_OPTIONS = {
    "extract": (
        *_COMMON,
        "capture",
        "pool",
        "dtype",
        "shard_size",
        "part",
        "fuse",
        "grid",
        *CLIPS,
        "detections",
        "flow",
        "pair_with",
    ),
    "grad": (*_COMMON, "target", "dtype", "shard_size", "part", *CLIPS, "region"),
    "cam": (*_COMMON, "target", "method", "alpha", "cmap", "region"),
}


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
