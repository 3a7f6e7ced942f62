"""Decode the frames of videos and the rows cut from them (:mod:`hookcli.inputs.clips`) to RGB arrays.

:func:`read_frames` decodes the frames asked for, going once through the
file; :func:`read_row` reads a run's row, a clip or a pair of frames.

>>> import tempfile
>>> from PIL import Image
>>> from hookcli.inputs.clips import find_clips
>>> folder = tempfile.TemporaryDirectory()
>>> for i in (1, 2, 10):
...     Image.new("RGB", (4, 3), (i, 0, 0)).save(f"{folder.name}/frame{i}.png")
>>> clips = find_clips(folder.name, length=2, clips=2)
>>> [clip.frames for clip in clips]
[(0, 1), (1, 2)]
>>> read_row(clips[1])[:, 0, 0, 0].tolist()
[2, 10]
>>> folder.cleanup()
"""

from __future__ import annotations

import contextlib
import operator
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from hookcli.console import counted
from hookcli.errors import ImageError, UsageProblem, VideoError
from hookcli.inputs.archives import file_stamp, input_files, input_key
from hookcli.inputs.clips import (
    DAMAGED_HINT,
    TOO_LARGE_HINT,
    Clip,
    FrameTimes,
    ImagePair,
    av_reason,
    frame_paths,
    frame_times,
    opened_video,
    size_text,
    video_library,
)
from hookcli.inputs.images import load_rgb
from hookcli.inputs.limits import pixel_limit

__all__ = [
    "Clip",
    "ImagePair",
    "close_decoders",
    "read_frames",
    "read_row",
]


def read_frames(path: str | os.PathLike, indices: Iterable[int]) -> np.ndarray:
    """Frames ``indices`` of the video at ``path``, as ``uint8`` RGB of shape ``[len(indices), H, W, 3]``.

    Indices may repeat and come in any order; the frames come back in the
    order asked. A file is decoded from the keyframe at or before the first
    frame asked for (from its start, for a file whose packets carry no
    timestamps) up to the last, and only the frames asked for are converted;
    every frame comes out at the size of the earliest one asked for. The
    file stays open for the next read, which continues where this one
    stopped (or seeks, past a keyframe): clips asked for in order cost one
    pass through the video (the latest frames are kept, so overlapping clips
    do too). From a folder only the frames asked for are opened (those a
    recent read decoded are taken from it), and they must all be the same
    size.

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
    av, _ = video_library()
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
        _close_video()
        raise VideoError(f"cannot decode video '{path}': {av_reason(err)}", hint=DAMAGED_HINT) from None
    except VideoError:
        _close_video()
        raise
    except _Ended as ended:
        _close_video()
        raise VideoError(
            f"video '{path}' ended after {counted(ended.decoded, 'frame')}; frame {max(positions)} was asked for",
            hint=DAMAGED_HINT,
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

    The last frames decoded are kept (up to :data:`_RECENT_BYTES`), so a clip starting a little behind the decoder
    needs no new pass either; one is kept per process. A frame past a keyframe the decoder has not reached is found by
    seeking to that keyframe (located by the file's :class:`~hookcli.inputs.clips.FrameTimes`), so a worker given every
    other batch, or a clip in the middle, decodes only the frames it needs. After a seek, frames are numbered by their
    presentation time; if one is not the frame its time says (timestamps that disagree with the frames), the file is
    decoded again from the start, without seeking.
    """

    def __init__(self, path, identity) -> None:
        self.path, self.identity = path, identity
        self.recent: dict[int, Any] = {}  # av.VideoFrame by index
        self._keep: int | None = None
        self._times: FrameTimes | None | bool = True  # True: not read yet; None: the file cannot be sought in
        self._open()

    def _open(self) -> None:
        self.opened_video = opened_video(self.path)
        self.container, self.stream = self.opened_video.__enter__()
        self._frames = self.container.decode(self.stream)
        self.next = 0  # the index of the frame the decoder gives next
        self._timed = False  # whether frames are numbered by their times (after a seek)

    def reaches(self, index: int) -> bool:
        return index >= self.next or index in self.recent

    def frame(self, index: int):
        if index in self.recent:
            return self.recent[index]
        if index > self.next:
            self._seek_before(index)
        while self.next <= index:
            frame = next(self._frames, None)
            if frame is None:
                raise _Ended(self.next)
            if self._timed and isinstance(self._times, FrameTimes):
                found = self._times.index(frame.pts)
                if found is not None and found < self.next:
                    continue  # shown before the keyframe sought: the demuxer started earlier, or an open GOP's
                if found != self.next:
                    self._start_again()
                    continue
            if self._keep is None:
                self._keep = max(1, _RECENT_BYTES // max(1, frame.width * frame.height * 3))
            self.recent[self.next] = frame
            if len(self.recent) > self._keep:
                del self.recent[next(iter(self.recent))]
            self.next += 1
        return self.recent[index]

    def _seek_before(self, index: int) -> None:
        """Seek to the last keyframe at or before frame ``index`` if it is past the decoder's position."""
        if self._times is True:
            self._times = frame_times(self.path)
        if not isinstance(self._times, FrameTimes):
            return
        keyframe = self._times.keyframe_before(index)
        if keyframe <= self.next:
            return
        self.container.seek(self._times.times[keyframe], stream=self.stream, backward=True, any_frame=False)
        self._frames = self.container.decode(self.stream)
        self.next, self._timed = keyframe, True

    def _start_again(self) -> None:
        """Decode the file again from its start, frame after frame, never seeking in it."""
        self._times = None
        self.recent = {}
        self.close()
        self._open()

    def close(self) -> None:
        self.recent = {}
        with contextlib.suppress(Exception):
            self.opened_video.__exit__(None, None, None)


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
    _close_video()
    _OPEN.append(_Decoding(path, identity))
    return _OPEN[0]


def close_decoders() -> None:
    """Close the video file kept open for the next read, and let go of the images kept for the next rows (a run
    does at its end)."""
    _close_video()
    _RECENT_IMAGES.clear()


def _close_video() -> None:
    while _OPEN:
        _OPEN.pop().close()


def _read_folder(folder, positions: dict[int, list[int]]) -> np.ndarray:
    paths = frame_paths(folder)
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
            image = _image_array(paths[index])
        except ImageError as err:
            raise VideoError(err.message, hint=err.hint) from None
        image_size = (image.shape[1], image.shape[0])
        if frames is None or first is None:
            first = paths[index], image_size
            frames = np.empty((size, *image.shape), np.uint8)
        elif image_size != first[1]:
            raise VideoError(
                f"frames in folder '{folder}' differ in size: '{first[0].name}' is {size_text(first[1])}, "
                f"'{paths[index].name}' is {size_text(image_size)}",
                hint="all frames of a video must be the same size",
            )
        frames[positions[index]] = image
    assert frames is not None, "positions names a frame at least"
    return frames


#: Images decoded from folders of frames and pairs of images, by what identifies their file (:func:`_file_identity`),
#: kept up to :data:`_RECENT_BYTES` (the latest one at least) for the rows that share them: frame k is the second of
#: pair k - 1 and the first of pair k.
_RECENT_IMAGES: dict[tuple, np.ndarray] = {}


def _image_array(path) -> np.ndarray:
    """The image at ``path`` as ``uint8`` RGB ``[H, W, 3]``, decoded by :func:`load_rgb` unless a recent row of
    this process decoded it (a file changed since is decoded again)."""
    identity = _file_identity(path)
    if identity in _RECENT_IMAGES:
        return _RECENT_IMAGES[identity]
    image = np.asarray(load_rgb(path))
    if identity is not None:
        _RECENT_IMAGES[identity] = image
        kept = sum(array.nbytes for array in _RECENT_IMAGES.values())
        while len(_RECENT_IMAGES) > 1 and kept > _RECENT_BYTES:
            kept -= _RECENT_IMAGES.pop(next(iter(_RECENT_IMAGES))).nbytes
    return image


def _file_identity(path) -> tuple | None:
    """The input's name and the size and modification time of the files it is read from; None when one cannot be
    looked at (decoding then says why)."""
    stamps = [file_stamp(name) for name in input_files(path)]
    if any(stamp is None for stamp in stamps):
        return None
    return input_key(path), *(tuple(stamp) for stamp in stamps if stamp is not None)


def _check_frame(path, frame) -> None:
    if frame.width * frame.height > pixel_limit():
        raise VideoError(
            f"video '{path}' has a frame of {frame.width}x{frame.height} "
            f"({frame.width * frame.height:,} pixels), more than hookcli decodes ({pixel_limit():,})",
            hint=TOO_LARGE_HINT,
        )


def read_row(row: Clip | ImagePair) -> np.ndarray:
    """A row's frames, ``uint8`` RGB ``[T, H, W, 3]``: a clip's (see :func:`read_frames`), or the two images of an
    :class:`~hookcli.inputs.clips.ImagePair`, which must be of one size (else :class:`VideoError`)."""
    if isinstance(row, Clip):
        return read_frames(row.path, row.frames)
    first, second = (_image_array(p) for p in (row.path, row.second))
    if first.shape != second.shape:
        raise VideoError(
            f"the images of the pair '{row.path}' and '{row.second}' differ in size "
            f"({size_text(first.shape[1::-1])} and {size_text(second.shape[1::-1])})",
            hint="a pair of frames must be of one size",
        )
    return np.stack([first, second])
