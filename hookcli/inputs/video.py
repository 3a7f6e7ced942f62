"""Find the frames of a video and decode them to RGB.

A *video* is either a video file, decoded with PyAV (the optional extra:
``pip install 'hookcli[video]'``), or a folder of frames: the images directly
in it, in natural order (``frame2`` before ``frame10``). Frames are numbered
from 0 in decoding order.

Video models take clips of ``length`` frames ``stride`` apart
(:func:`clip_frames`, :func:`find_clips`); optical-flow models take pairs of
frames (:func:`pair_frames`, :func:`find_pairs`). :func:`read_frames` decodes
the frames asked for, going once through the file.

>>> import tempfile
>>> from PIL import Image
>>> folder = tempfile.TemporaryDirectory()
>>> for i in (1, 2, 10):
...     Image.new("RGB", (4, 3), (i, 0, 0)).save(f"{folder.name}/frame{i}.png")
>>> clips = find_clips(folder.name, length=2, clips=2)
>>> [clip.frames for clip in clips]
[(0, 1), (1, 2)]
>>> clips[1].read()[:, 0, 0, 0].tolist()
[2, 10]
>>> folder.cleanup()
"""

from __future__ import annotations

import contextlib
import functools
import json
import operator
import os
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hookcli.console import counted
from hookcli.errors import ImageError, InputError, UsageProblem, VideoError, check_whole
from hookcli.files import NotRegularFile, open_regular
from hookcli.inputs.images import load_rgb, pixel_limit
from hookcli.inputs.names import IMAGE_SUFFIXES, is_image_name, read_lines

__all__ = [
    "VIDEO_SUFFIXES",
    "Clip",
    "ImagePair",
    "clip_frames",
    "close_decoders",
    "find_clips",
    "find_pairs",
    "find_videos",
    "frame_count",
    "pair_frames",
    "read_frames",
]

#: Suffixes of the files treated as videos.
VIDEO_SUFFIXES = frozenset(
    {".3gp", ".avi", ".flv", ".m2ts", ".m4v", ".mkv", ".mov", ".mp4", ".mpeg", ".mpg", ".mts", ".ogv", ".webm", ".wmv"}
)

_DAMAGED = "the file may be truncated, corrupt or not a video"
_TOO_LARGE = "scale it down first (ffmpeg -i IN -vf scale=1920:-2 OUT)"


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

    def read(self) -> np.ndarray:
        """The clip's frames, ``uint8`` RGB of shape ``[len(frames), H, W, 3]`` (see :func:`read_frames`)."""
        return read_frames(self.path, self.frames)

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
    _check_clip_options(length, stride, clips)
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

    def read(self) -> np.ndarray:
        """Both images, ``uint8`` RGB ``[2, H, W, 3]``; images of different sizes raise :class:`VideoError`."""
        first, second = (np.asarray(load_rgb(p)) for p in (self.path, self.second))
        if first.shape != second.shape:
            raise VideoError(
                f"the images of the pair '{self.path}' and '{self.second}' differ in size "
                f"({_size(first.shape[1::-1])} and {_size(second.shape[1::-1])})",
                hint="a pair of frames must be of one size",
            )
        return np.stack([first, second])


def find_videos(arguments: Iterable[str], *, recursive: bool = False, stdin=None) -> list[Path]:
    """The videos the command-line inputs name: video files, folders of frames, and the videos in folders.

    A file is a video whatever its suffix (PyAV tells what it holds). A folder
    holding video files (with a suffix of :data:`VIDEO_SUFFIXES`) stands for
    them, in natural order (in its sub-folders too with ``recursive``);
    otherwise it is a folder of frames. ``-`` reads paths from ``stdin``, one
    a line. A missing path, or nothing given, raises :class:`InputError`.
    """
    import sys

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
                (p for p in pattern if p.suffix.lower() in VIDEO_SUFFIXES and not p.is_dir()), key=_natural_key
            )
            found.extend(videos or [path])
    if not found:
        raise InputError("no input videos were given", hint="pass video files or folders of frames, or '-'")
    return found


def find_clips(path: str | os.PathLike, *, length: int, stride: int = 1, clips: int | None = 1) -> list[Clip]:
    """The clips of the video at ``path`` (a file or a folder of frames), as :func:`clip_frames` chooses them."""
    _check_clip_options(length, stride, clips)
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
        return len(_frame_paths(path))
    av = _import_av()
    with _opened(path) as (container, stream):
        count = 0
        try:
            for packet in container.demux(stream):
                count += packet.size > 0  # the demuxer ends with an empty packet
        except av.FFmpegError as err:
            raise VideoError(f"cannot read video '{path}': {_reason(err)}", hint=_DAMAGED) from None
    if not count:
        raise VideoError(f"video '{path}' has no frames", hint=_DAMAGED)
    return count


def read_frames(path: str | os.PathLike, indices: Iterable[int]) -> np.ndarray:
    """Frames ``indices`` of the video at ``path``, as ``uint8`` RGB of shape ``[len(indices), H, W, 3]``.

    Indices may repeat and come in any order; the frames come back in the
    order asked. A file is decoded from its start up to the last frame asked
    for, and only the frames asked for are converted; every frame comes out
    at the size of the earliest one asked for. The file stays open for the
    next read, which continues where this one stopped: clips asked for in
    order cost one pass through the video (the latest frames are kept, so
    overlapping clips do too). From a folder only the frames
    asked for are opened, and they must all be the same size.

    >>> import tempfile
    >>> from PIL import Image
    >>> folder = tempfile.TemporaryDirectory()
    >>> for i in (1, 2, 10):
    ...     Image.new("RGB", (4, 3), (i, 0, 0)).save(f"{folder.name}/frame{i}.png")
    >>> frames = read_frames(folder.name, [2, 0, 2])
    >>> frames.shape, frames.dtype, frames[:, 0, 0, 0].tolist()
    ((3, 3, 4, 3), dtype('uint8'), [10, 1, 10])
    >>> folder.cleanup()

    Raises :class:`VideoError` as :func:`frame_count` does, and for a frame
    past the end of the video or one that cannot be decoded.
    """
    positions = _positions(indices)
    if os.path.isdir(path):
        return _read_folder(path, positions)
    return _read_file(path, positions)


def _check_clip_options(length, stride, clips) -> None:
    check_whole("length", length, 1)
    check_whole("stride", stride, 1)
    check_whole("clips", clips, 1, optional=True)


def _positions(indices: Iterable[int]) -> dict[int, list[int]]:
    """Each frame index asked for → where it goes in the output, in order of position."""
    positions: dict[int, list[int]] = {}
    for position, asked in enumerate(indices):
        try:
            index = operator.index(asked)
        except TypeError:
            index = -1
        if index < 0:
            raise UsageProblem(
                f"frame indices must be whole numbers of at least 0, not {asked!r}", hint="frames are numbered from 0"
            )
        positions.setdefault(index, []).append(position)
    if not positions:
        raise UsageProblem("no frames were asked for", hint="pass at least one frame index")
    return positions


def _read_file(path, positions: dict[int, list[int]]) -> np.ndarray:
    av = _import_av()
    size = sum(map(len, positions.values()))
    frames: np.ndarray | None = None
    decoding = _decoding(path, min(positions))
    try:
        for index in sorted(positions):
            frame = decoding.frame(index)
            _check_frame(path, frame)
            if frames is None:
                frames = np.empty((size, frame.height, frame.width, 3), np.uint8)
            height, width = frames.shape[1:3]
            frames[positions[index]] = frame.to_ndarray(format="rgb24", width=width, height=height)
    except av.FFmpegError as err:
        close_decoders()
        raise VideoError(f"cannot decode video '{path}': {_reason(err)}", hint=_DAMAGED) from None
    except VideoError:
        close_decoders()
        raise
    except _Ended as ended:
        close_decoders()
        raise VideoError(
            f"video '{path}' ended after {counted(ended.decoded, 'frame')}; frame {max(positions)} was asked for",
            hint=_DAMAGED,
        ) from None
    assert frames is not None, "positions names a frame at least"
    return frames


class _Ended(Exception):
    def __init__(self, decoded: int) -> None:
        self.decoded = decoded


#: Decoded frames kept for clips that overlap the one before (pairs of frames, clips spread over a short video).
_RECENT_BYTES = 64 * 1024 * 1024


class _Decoding:
    """A video file kept open between reads, so that clips asked for in order cost one pass through it.

    The frames decoded last are kept (up to :data:`_RECENT_BYTES`), so a clip
    that starts before the decoder's position but within them needs no new
    pass either. One is kept per process (decoding workers have their own).
    """

    def __init__(self, path, identity) -> None:
        self.identity = identity
        self._opened = _opened(path)
        container, stream = self._opened.__enter__()
        self._frames = container.decode(stream)
        self.next = 0  # the index of the frame the decoder gives next
        self.recent: dict[int, Any] = {}  # av.VideoFrame by index
        self._keep: int | None = None

    def reaches(self, index: int) -> bool:
        return index >= self.next or index in self.recent

    def frame(self, index: int):
        if index in self.recent:
            return self.recent[index]
        while self.next <= index:
            frame = next(self._frames, None)
            if frame is None:
                raise _Ended(self.next)
            if self._keep is None:
                self._keep = max(1, _RECENT_BYTES // max(1, frame.width * frame.height * 3))
            self.recent[self.next] = frame
            if len(self.recent) > self._keep:
                del self.recent[next(iter(self.recent))]
            self.next += 1
        return self.recent[index]

    def close(self) -> None:
        self.recent = {}
        with contextlib.suppress(Exception):
            self._opened.__exit__(None, None, None)


_OPEN: list[_Decoding] = []


def _decoding(path, first: int) -> _Decoding:
    """The open decoding of ``path`` if it can give frame ``first`` on (the same file, unchanged), else a new one."""
    try:
        status = os.stat(path)
        identity = (os.path.abspath(path), status.st_ino, status.st_size, status.st_mtime_ns)
    except OSError:  # opening says what is wrong
        identity = None
    if identity is not None and _OPEN and _OPEN[0].identity == identity and _OPEN[0].reaches(first):
        return _OPEN[0]
    close_decoders()
    _OPEN.append(_Decoding(path, identity))
    return _OPEN[0]


def close_decoders() -> None:
    """Close the video file kept open for the next read (a run does at its end)."""
    while _OPEN:
        _OPEN.pop().close()


def _read_folder(folder, positions: dict[int, list[int]]) -> np.ndarray:
    paths = _frame_paths(folder)
    last = max(positions)
    if last >= len(paths):
        raise VideoError(
            f"folder '{folder}' has {counted(len(paths), 'frame')}; frame {last} was asked for",
            hint="frames are numbered from 0",
        )
    size = sum(map(len, positions.values()))
    frames: np.ndarray | None = None
    first: tuple[Path, tuple[int, int]] | None = None
    for index in sorted(positions):
        try:
            image = load_rgb(paths[index])
        except ImageError as err:
            raise VideoError(err.message, hint=err.hint) from None
        if frames is None or first is None:
            first = paths[index], image.size
            frames = np.empty((size, image.height, image.width, 3), np.uint8)
        elif image.size != first[1]:
            raise VideoError(
                f"frames in folder '{folder}' differ in size: '{first[0].name}' is {_size(first[1])}, "
                f"'{paths[index].name}' is {_size(image.size)}",
                hint="all frames of a video must be the same size",
            )
        frames[positions[index]] = np.asarray(image)
    assert frames is not None, "positions names a frame at least"
    return frames


def _frame_paths(folder) -> list[Path]:
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
    return sorted(paths, key=_natural_key)


def _natural_key(path: Path) -> tuple:
    # Splitting on runs of digits puts text at even positions and numbers at odd ones, so keys always compare.
    parts = re.split(r"(\d+)", path.name.casefold())
    return [int(part) if i % 2 else part for i, part in enumerate(parts)], path.name


@contextlib.contextmanager
def _opened(path) -> Iterator[tuple]:
    """The open container of the video file at ``path`` and its video stream; failures to open are VideoErrors."""
    av = _import_av()
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
            raise VideoError(f"cannot read video '{path}': {_reason(err)}", hint=_DAMAGED) from None
        with container:
            streams = [s for s in container.streams.video if not s.disposition & av.stream.Disposition.attached_pic]
            if not streams:
                raise VideoError(f"'{path}' holds no video stream", hint="pass a video file or a folder of frames")
            _limit_pixels(path, streams[0])
            yield container, streams[0]


def _limit_pixels(path, stream) -> None:
    """Refuse a video whose frames are larger than any image hookcli decodes, and have the decoder refuse a frame
    larger than its header said before it allocates it (FFmpeg's ``max_pixels``)."""
    limit = pixel_limit()
    width, height = stream.codec_context.width, stream.codec_context.height
    if width * height > limit:
        raise VideoError(
            f"video '{path}' has frames of {width}x{height} ({width * height:,} pixels), more than "
            f"hookcli decodes ({limit:,})",
            hint=_TOO_LARGE,
        )
    stream.codec_context.options = {**stream.codec_context.options, "max_pixels": str(min(limit, 2**31 - 1))}


def _check_frame(path, frame) -> None:
    if frame.width * frame.height > pixel_limit():
        raise VideoError(
            f"video '{path}' has a frame of {frame.width}x{frame.height} "
            f"({frame.width * frame.height:,} pixels), more than hookcli decodes ({pixel_limit():,})",
            hint=_TOO_LARGE,
        )


def _import_av():
    try:
        import av
    except ImportError:
        raise VideoError(
            "reading video files needs PyAV, which is not installed", hint="pip install 'hookcli[video]'"
        ) from None
    return av


def _reason(err: Exception) -> str:
    return getattr(err, "strerror", None) or str(err) or type(err).__name__


def _size(size: tuple[int, int]) -> str:
    return f"{size[0]}x{size[1]}"
