"""A run's rows found (not decoded): images, or for video and optical-flow models the clips or frame pairs of the
videos given, or pairs of images from two lists."""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

from hookcli.console import counted
from hookcli.errors import InputError, UsageProblem, VideoError
from hookcli.families import DEFAULT_CLIP_LENGTH, family_traits
from hookcli.inputs import clips
from hookcli.inputs.clips import ImagePair
from hookcli.inputs.discovery import FoundInputs, find_inputs
from hookcli.options.run import RunOptions

__all__ = ["arguments_of", "find_rows"]


def arguments_of(inputs: Any) -> list[str]:
    """Inputs as given (a path, or a list of them) as a list of strings; anything else is refused."""
    given = (
        [inputs] if isinstance(inputs, str | os.PathLike) else list(inputs) if isinstance(inputs, Iterable) else None
    )
    odd = [inputs] if given is None else [p for p in given if not isinstance(p, str | os.PathLike)]
    if odd:
        raise InputError(
            f"inputs are paths of images, videos, folders or archives, and one given is of type "
            f"{type(odd[0]).__name__}",
            hint="save the images and give their paths (or a folder, or '-' for a list on stdin)",
        )
    return [os.fspath(p) for p in given or ()]


def find_rows(inputs: Any, family: str, opts: RunOptions) -> tuple[FoundInputs, tuple[str, ...]]:
    """``(rows, notes)``: the rows of ``inputs`` (a path, or a list of them) for a model of ``family``, and what
    finding them had to tell."""
    traits, arguments, recursive = family_traits(family), arguments_of(inputs), opts.recursive
    if not traits.videos:
        found = find_inputs(arguments, recursive=recursive)
        return found, (found.note,) if found.note else ()
    if opts.pair_with:
        return _image_pairs(arguments, opts), ()
    rows: list[os.PathLike[str]] = []
    notes: list[str] = []
    for path in clips.find_videos(arguments, recursive=recursive):
        try:
            if traits.row == "clip":
                cut = clips.find_clips(
                    path,
                    length=opts.clip_length or DEFAULT_CLIP_LENGTH,
                    stride=opts.frame_stride,
                    clips=opts.clips_per_video or None,
                )
            else:
                cut = clips.find_pairs(path, stride=opts.frame_stride)
        except VideoError as err:  # its clips cannot be counted, so it has no rows to skip one by one
            if opts.on_error != "skip":
                raise
            said = str(err)  # most reasons name the video already
            notes.append(f"skipped: {said}" if f"'{path}'" in said else f"skipped video '{path}': {said}")
            continue
        if any(len(set(clip.frames)) < len(clip.frames) for clip in cut):
            notes.append(f"'{path}' is shorter than a clip: its last frame is repeated to fill one")
        rows += cut
    if not rows:
        raise VideoError("none of the input videos could be read", hint="every one was skipped, each with its reason")
    return FoundInputs(rows, 0, 0, True), tuple(notes)


def _image_pairs(arguments: list[str], opts: RunOptions) -> FoundInputs:
    """Optical flow from two image lists: the inputs are each pair's first images, ``pair_with`` its second ones."""
    if opts.frame_stride != 1:
        raise UsageProblem(
            "--frame-stride applies to pairs cut from videos, not to pairs given as two image lists",
            hint="see 'hookcli extract --help'",
        )
    pair_with = opts.pair_with or ()  # given: the caller checked
    if "-" in arguments and "-" in pair_with:
        raise UsageProblem(
            "stdin (-) can give one of the two image lists, not both", hint="name the other list's files or folder"
        )
    firsts = find_inputs(arguments, recursive=opts.recursive).paths
    seconds = find_inputs(arguments_of(pair_with), recursive=opts.recursive).paths
    if len(firsts) != len(seconds):
        raise UsageProblem(
            f"the two image lists differ in length: {counted(len(firsts), 'first image')} and "
            f"{len(seconds)} given with --pair-with",
            hint="give one second image for each input image, in order",
        )
    return FoundInputs([ImagePair(a, b) for a, b in zip(firsts, seconds, strict=True)])
