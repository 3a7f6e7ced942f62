"""A run's options checked against the model's family, before any model loads (the family comes from the registry
cache): options a family has no use for are refused, and quantized models run on the CPU."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from hookcli.errors import UsageProblem
from hookcli.families import CPU_ONLY, family_traits
from hookcli.options.run import CLIPS, RunOptions
from hookcli.parsing import parse_region

__all__ = ["fitted_to_family"]


def fitted_to_family(command: str, family: str, opts: RunOptions, given: Mapping) -> RunOptions:
    """``opts`` as ``family`` takes them (``auto`` picks the CPU for a quantized model); refused in one line when
    ``command`` or an option ``given`` does not apply to it."""
    traits, kind, help_hint = family_traits(family), family.replace("_", " "), f"see 'hookcli {command} --help'"
    if opts.region is not None and traits.output != "masks":
        raise UsageProblem("--region applies to segmentation models", hint=help_hint)
    parse_region(opts.region)  # refused now, not once the model has loaded
    clip_options = [name for name in CLIPS if name in given and given[name] != getattr(RunOptions, name)]
    if not traits.videos and clip_options:
        users = "video and optical-flow models" if clip_options[0] == "frame_stride" else "video models"
        raise UsageProblem(
            f"--{clip_options[0].replace('_', '-')} applies to {users}, and this one is {kind}", hint=help_hint
        )
    if traits.row == "pair" and {"clip_length", "clips_per_video"} & set(clip_options):
        raise UsageProblem(
            "optical-flow models take pairs of frames: --clip-length and --clips-per-video do not "
            "apply (--frame-stride sets how far apart the two frames are)",
            hint=help_hint,
        )
    if traits.row == "clip" and opts.memory_format == "channels_last":
        raise UsageProblem(
            "video models take 5-D clips, which have no channels-last layout",
            hint="leave --memory-format at auto or contiguous",
        )
    for name, value, wanted, users in (
        ("pair-with", opts.pair_with, traits.row == "pair", "optical-flow models"),
        ("flow", opts.flow, traits.output == "flow", "optical-flow models"),
        ("detections", opts.detections, traits.output == "detections", "detection models"),
    ):
        if value and not wanted:
            raise UsageProblem(f"--{name} applies to {users}, and this one is {kind}", hint=help_hint)
    if family in CPU_ONLY and opts.device not in ("auto", "cpu"):
        raise UsageProblem(
            f"quantized models run on the CPU only, not on '{opts.device}'",
            hint="use --device cpu (or auto), or the model without the quantized_ prefix",
        )
    if family in CPU_ONLY and opts.precision != "fp32":
        raise UsageProblem(
            f"quantized models compute in int8 and take --precision fp32 only, not {opts.precision}", hint=help_hint
        )
    return dataclasses.replace(opts, device="cpu") if family in CPU_ONLY else opts
