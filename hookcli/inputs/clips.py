"""The rows of video and optical-flow runs: clips and pairs of frames cut from videos, counted without decoding.

A *video* is either a video file, read with PyAV (the optional extra:
``pip install 'hookcli[video]'``), or a folder of frames: the images directly
in it, in natural order (``frame2`` before ``frame10``). Frames are numbered
from 0 in decoding order.

Video models take clips of ``length`` frames ``stride`` apart
(:func:`clip_frames`, :func:`find_clips`); optical-flow models take pairs of
frames (:func:`pair_frames`, :func:`find_pairs`).
:func:`hookcli.inputs.video.read_row` decodes a row's frames. Nothing here
imports numpy or torch, and PyAV only when a video file is opened (PyAV is an
optional extra: a run of frame folders or images goes without it).

>>> clip_frames(10, length=4), pair_frames(3)
([(3, 4, 5, 6)], [(0, 1), (1, 2)])
"""

from __future__ import annotations

import bisect
import contextlib
import functools
import json
import os
import re
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from hookcli.console import counted
from hookcli.errors import InputError, VideoError, check_whole
from hookcli.files import NotRegularFile, open_regular
from hookcli.inputs.names import IMAGE_SUFFIXES, is_image_name, read_lines

__all__ = [
    "Clip",
    "ImagePair",
    "av_reason",
    "check_clip_options",
    "clip_frames",
    "find_clips",
    "find_pairs",
    "find_videos",
    "FrameTimes",
    "frame_count",
    "frame_paths",
    "frame_times",
    "video_library",
    "natural_key",
    "opened_video",
    "pair_frames",
    "size_text",
]


#: Suffixes of the files treated as videos.
VIDEO_SUFFIXES = frozenset(
    {".3gp", ".avi", ".flv", ".m2ts", ".m4v", ".mkv", ".mov", ".mp4", ".mpeg", ".mpg", ".mts", ".ogv", ".webm", ".wmv"}
)


DAMAGED_HINT = "the file may be truncated, corrupt or not a video"


TOO_LARGE_HINT = "scale it down first (ffmpeg -i IN -vf scale=1920:-2 OUT)"


@dataclass(frozen=True)
class Clip:
    """One model input cut from a video: the video's path and its frame indices, in the order the model sees them.

    >>> clip = Clip("walk.mp4", (0, 2, 4))
    >>> clip.describe()
    {'video': 'walk.mp4', 'frames': '[0, 2, 4]'}
    """

    path: str
    frames: tuple[int, ...]

    def __fspath__(self) -> str:
        """The video's path: where a row's input is named (metadata, file names), the clip names its video."""
        return self.path

    def describe(self) -> dict[str, str]:
        """Metadata for the clip: values are strings, the frame list as JSON."""
        return {"video": self.path, "frames": json.dumps(list(self.frames))}


def clip_frames(count: int, *, length: int, stride: int = 1, clips: int | None = 1) -> list[tuple[int, ...]]:
    """The frame indices of each clip of a video of ``count`` frames.

    A clip is ``length`` frames ``stride`` apart, so it spans
    ``(length - 1) * stride + 1`` frames. ``clips`` clips are spread evenly
    over the video: one clip is the centred one; with more, the first starts
    at frame 0 and the last ends at the last frame (clips overlap, or repeat,
    when the video is short). ``clips=None`` takes every whole clip that does
    not overlap the one before, from frame 0; frames left over at the end are
    not used.

    A video shorter than one clip is padded by repeating its last frame, and
    gives ``clips`` such clips (one for ``clips=None``).

    >>> clip_frames(24, length=8, stride=2, clips=2)
    [(0, 2, 4, 6, 8, 10, 12, 14), (9, 11, 13, 15, 17, 19, 21, 23)]
    >>> clip_frames(10, length=4)
    [(3, 4, 5, 6)]
    >>> clip_frames(10, length=4, clips=None)
    [(0, 1, 2, 3), (4, 5, 6, 7)]
    >>> clip_frames(3, length=4, stride=2)
    [(0, 2, 2, 2)]
    """
    check_clip_options(length, stride, clips)
    check_whole("count", count, 1)
    span = (length - 1) * stride + 1
    if count < span:
        padded = tuple(min(i * stride, count - 1) for i in range(length))
        return [padded] * (1 if clips is None else clips)
    starts: Sequence[int]
    if clips is None:
        starts = range(0, count - span + 1, span)
    elif clips == 1:
        starts = [(count - span) // 2]
    else:
        starts = [k * (count - span) // (clips - 1) for k in range(clips)]
    return [tuple(range(start, start + span, stride)) for start in starts]


def pair_frames(count: int, *, stride: int = 1) -> list[tuple[int, int]]:
    """Every pair of frames ``stride`` apart, ``(i, i + stride)``, in a video of ``count`` frames (for optical flow).

    A video of ``stride`` frames or fewer has no pairs: the list is empty.

    >>> pair_frames(4)
    [(0, 1), (1, 2), (2, 3)]
    >>> pair_frames(4, stride=2)
    [(0, 2), (1, 3)]
    """
    check_whole("stride", stride, 1)
    check_whole("count", count, 0)
    return [(i, i + stride) for i in range(count - stride)]


@dataclass(frozen=True)
class ImagePair:
    """Two images given as a pair of frames (optical flow from two image lists): ``path`` first, ``second`` after."""

    path: str | os.PathLike  # a disk path or an archive member (hookcli.inputs.archives), each read as it is
    second: str | os.PathLike

    def __fspath__(self) -> str:
        return os.fspath(self.path)


def find_videos(arguments: Iterable[str], *, recursive: bool = False, stdin=None) -> list[Path]:
    """The videos the command-line inputs name: video files, folders of frames, and the videos in folders.

    A file is a video whatever its suffix (PyAV tells what it holds). A folder
    holding video files (with a suffix of :data:`VIDEO_SUFFIXES`) stands for
    them, in natural order (in its sub-folders too with ``recursive``);
    otherwise it is a folder of frames. ``-`` reads paths from ``stdin``, one
    a line. A missing path, or nothing given, raises :class:`InputError`.
    """
    found: list[Path] = []
    for argument in arguments:
        names = read_lines(stdin or sys.stdin) if argument == "-" else [argument]
        for name in names:
            path = Path(name)
            if not path.exists():
                raise InputError(f"no such file or folder: '{name}'", hint="check the path")
            if not path.is_dir():
                found.append(path)
                continue
            pattern = path.rglob("*") if recursive else path.iterdir()
            # Every entry named like a video, FIFOs too: opening one says why it cannot be read, none is dropped.
            videos = sorted(
                (p for p in pattern if p.suffix.lower() in VIDEO_SUFFIXES and not p.is_dir()), key=natural_key
            )
            found.extend(videos or [path])
    if not found:
        raise InputError("no input videos were given", hint="pass video files or folders of frames, or '-'")
    return found


def find_clips(path: str | os.PathLike, *, length: int, stride: int = 1, clips: int | None = 1) -> list[Clip]:
    """The clips of the video at ``path`` (a file or a folder of frames), as :func:`clip_frames` chooses them."""
    check_clip_options(length, stride, clips)
    count = frame_count(path)
    return [Clip(os.fspath(path), frames) for frames in clip_frames(count, length=length, stride=stride, clips=clips)]


def find_pairs(path: str | os.PathLike, *, stride: int = 1) -> list[Clip]:
    """The frame pairs of the video at ``path``, as :func:`pair_frames` chooses them, each as a two-frame clip.

    A video with no pair raises :class:`VideoError`.
    """
    check_whole("stride", stride, 1)
    count = frame_count(path)
    pairs = pair_frames(count, stride=stride)
    if not pairs:
        hint = "use a smaller stride" if count > 1 else "optical flow needs at least two frames"
        raise VideoError(f"video '{path}' has {counted(count, 'frame')}, too few for a pair {stride} apart", hint=hint)
    return [Clip(os.fspath(path), pair) for pair in pairs]


def frame_count(path: str | os.PathLike) -> int:
    """The number of frames of the video at ``path``: a video file or a folder of frames.

    For a file the packets of its video stream are counted, without decoding
    them; a count in the file's header is not trusted, since a truncated file
    keeps it. A folder's frames are counted by name, without opening them.

    Raises :class:`VideoError` naming the file for a missing, empty, damaged
    or non-video file, a folder with no frames, and a video of no frames.
    """
    if os.path.isdir(path):
        return len(frame_paths(path))
    return len(_frame_packets(path))


@dataclass(frozen=True)
class FrameTimes:
    """When each frame of a video file is shown, read from its packets without decoding them, so that a reader can
    seek to the keyframe before the frame it wants instead of decoding every frame before it.

    ``times`` are the frames' presentation times (in the stream's time base), in order: frame k is the one shown at
    ``times[k]``; ``keyframes`` the indices of the frames a decoder can start from.

    >>> times = FrameTimes((0, 512, 1024, 1536), (0, 2))
    >>> times.index(1024), times.index(700), times.keyframe_before(3)
    (2, None, 2)
    """

    times: tuple[int, ...]
    keyframes: tuple[int, ...]

    def index(self, time: int | None) -> int | None:
        """The index of the frame shown at ``time``; None for a time no packet has."""
        if time is None:
            return None
        position = bisect.bisect_left(self.times, time)
        return position if position < len(self.times) and self.times[position] == time else None

    def keyframe_before(self, index: int) -> int:
        """The last keyframe at or before frame ``index`` (frame 0 when there is none)."""
        position = bisect.bisect_right(self.keyframes, index)
        return self.keyframes[position - 1] if position else 0


def frame_times(path: str | os.PathLike) -> FrameTimes | None:
    """The :class:`FrameTimes` of the video file at ``path``; None when its packets do not give every frame a time
    of its own (a raw stream without timestamps, say), where frames can be told apart only by decoding from the
    start. Errors are :func:`frame_count`'s."""
    packets = _frame_packets(path)
    times = sorted(time for time, _ in packets if time is not None)
    if len(times) != len(packets) or len(set(times)) != len(times):
        return None
    keyframes = sorted(bisect.bisect_left(times, time) for time, key in packets if key and time is not None)
    return FrameTimes(tuple(times), tuple(keyframes))


def _frame_packets(path) -> list[tuple[int | None, bool]]:
    """``(presentation time, whether a keyframe)`` of each packet of the video file's stream that holds a frame, in
    file order."""
    av, _ = video_library()
    with opened_video(path) as (container, stream):
        packets = []
        try:
            for packet in container.demux(stream):
                if packet.size > 0:  # the demuxer ends with an empty packet
                    packets.append((packet.pts, bool(packet.is_keyframe)))
        except av.FFmpegError as err:
            raise VideoError(f"cannot read video '{path}': {av_reason(err)}", hint=DAMAGED_HINT) from None
    if not packets:
        raise VideoError(f"video '{path}' has no frames", hint=DAMAGED_HINT)
    return packets


def check_clip_options(length, stride, clips) -> None:
    check_whole("length", length, 1)
    check_whole("stride", stride, 1)
    check_whole("clips", clips, 1, optional=True)


def frame_paths(folder) -> list[Path]:
    """The frame images directly in ``folder``, in natural order (``frame2`` before ``frame10``).

    Every clip of a folder asks: the list is made once for as long as the folder stays unchanged.
    """
    try:
        changed = os.stat(folder).st_mtime_ns
    except OSError:
        changed = None  # listing says what is wrong
    return list(_listed_frames(os.fspath(folder), os.path.abspath(folder), changed))


@functools.lru_cache(maxsize=8)
def _listed_frames(folder: str, where: str, changed: int | None) -> tuple[Path, ...]:
    """``where`` (the folder's absolute path) and ``changed`` (its time) key the cache; errors name ``folder``."""
    return tuple(_frame_listing(folder))


def _frame_listing(folder) -> list[Path]:
    try:
        paths = [p for p in Path(folder).iterdir() if not p.is_dir() and is_image_name(p.name)]
    except OSError as err:
        raise VideoError(f"cannot read folder '{folder}': {err.strerror}", hint="check the path") from None
    if not paths:
        raise VideoError(
            f"no frames found in folder '{folder}'",
            hint=f"frame images end in one of {', '.join(sorted(IMAGE_SUFFIXES))}",
        )
    return sorted(paths, key=natural_key)


def natural_key(path: Path) -> tuple:
    # Splitting on runs of digits puts text at even positions and numbers at odd ones, so keys always compare.
    parts = re.split(r"(\d+)", path.name.casefold())
    return [int(part) if i % 2 else part for i, part in enumerate(parts)], path.name


@contextlib.contextmanager
def opened_video(path) -> Iterator[tuple]:
    """The open container of the video file at ``path`` and its video stream; failures to open are VideoErrors."""
    av, pixel_limit = video_library()
    try:
        handle = open_regular(path)
    except FileNotFoundError:
        raise VideoError(f"video not found: '{path}'", hint="check the path") from None
    except NotRegularFile as err:  # a usage problem, as a FIFO given as an image is
        raise InputError(str(err), hint="videos are read from regular files or folders of frames") from None
    except OSError as err:
        raise VideoError(f"cannot open video '{path}': {err.strerror}", hint="check the path") from None
    with handle:
        if os.fstat(handle.fileno()).st_size == 0:
            raise VideoError(f"video '{path}' is empty", hint="the file holds no bytes; it may not be written yet")
        try:
            container = av.open(handle)
        except (av.FFmpegError, OSError) as err:
            raise VideoError(f"cannot read video '{path}': {av_reason(err)}", hint=DAMAGED_HINT) from None
        with container:
            streams = [s for s in container.streams.video if not s.disposition & av.stream.Disposition.attached_pic]
            if not streams:
                raise VideoError(f"'{path}' holds no video stream", hint="pass a video file or a folder of frames")
            _limit_pixels(path, streams[0], pixel_limit())
            yield container, streams[0]


def _limit_pixels(path, stream, limit: int) -> None:
    """Refuse a video whose frames are larger than ``limit`` pixels, and have the decoder refuse a frame larger than
    its header said before it allocates it (FFmpeg's ``max_pixels``)."""
    width, height = stream.codec_context.width, stream.codec_context.height
    if width * height > limit:
        raise VideoError(
            f"video '{path}' has frames of {width}x{height} ({width * height:,} pixels), more than "
            f"hookcli decodes ({limit:,})",
            hint=TOO_LARGE_HINT,
        )
    stream.codec_context.options = {**stream.codec_context.options, "max_pixels": str(min(limit, 2**31 - 1))}


def video_library() -> tuple[ModuleType, Callable[[], int]]:
    """``(av, pixel_limit)``: PyAV and :func:`hookcli.inputs.limits.pixel_limit` (Pillow's), imported when a video
    file is first opened. PyAV is an optional extra, and neither is needed to find images, frame folders or the
    rows of a run, so a command refuses what it refuses before they load."""
    try:
        import av
    except ImportError:
        raise VideoError(
            "reading video files needs PyAV, which is not installed", hint="pip install 'hookcli[video]'"
        ) from None
    from hookcli.inputs.limits import pixel_limit

    return av, pixel_limit


def av_reason(err: Exception) -> str:
    return getattr(err, "strerror", None) or str(err) or type(err).__name__


def size_text(size: tuple[int, int]) -> str:
    return f"{size[0]}x{size[1]}"
