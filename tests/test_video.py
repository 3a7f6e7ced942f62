"""Video input: frame counts, clip and pair indices, decoded frames and the errors for damaged input.

The videos are written here with PyAV, in lossless codecs (FFV1 in Matroska, x264's RGB mode at qp 0 in MP4), so
decoded frames equal the written ones exactly."""

import os
import sys
import wave

import numpy as np
import pytest
from PIL import Image

from hookcli.errors import HookcliError, UsageProblem, VideoError
from hookcli.inputs.clips import (
    VIDEO_SUFFIXES,
    Clip,
    FrameTimes,
    ImagePair,
    clip_frames,
    find_clips,
    find_pairs,
    find_videos,
    frame_count,
    frame_times,
    pair_frames,
)
from hookcli.inputs.video import close_decoders, read_frames, read_row

av = pytest.importorskip("av")

WIDTH, HEIGHT, FRAMES = 64, 48, 24
DAMAGED = "Hint: the file may be truncated, corrupt or not a video"


def written_frames(count=FRAMES, width=WIDTH, height=HEIGHT) -> np.ndarray:
    """Frame i has red 10*i everywhere, green rising left to right and blue rising top to bottom."""
    frames = np.zeros((count, height, width, 3), np.uint8)
    frames[..., 0] = (np.arange(count) * 10)[:, None, None]
    frames[..., 1] = (np.arange(width) * 3)[None, None, :]
    frames[..., 2] = (np.arange(height) * 5)[None, :, None]
    return frames


def write_video(path, codec="ffv1", *, count=FRAMES, options=None, container_options=None):
    pixel_format = {"ffv1": "bgr0", "libx264rgb": "rgb24"}[codec]
    with av.open(str(path), "w", options=container_options or {}) as container:
        stream = container.add_stream(codec, rate=24, options=options or {})
        stream.width, stream.height, stream.pix_fmt = WIDTH, HEIGHT, pixel_format
        for pixels in written_frames(count):
            container.mux(stream.encode(av.VideoFrame.from_ndarray(pixels, format="rgb24")))
        container.mux(stream.encode())
    return path


def write_mp4(path, **kwargs):
    return write_video(path, "libx264rgb", options={"qp": "0"}, **kwargs)


def packet_offsets(path) -> list[int]:
    with av.open(str(path)) as container:
        return [packet.pos for packet in container.demux(video=0) if packet.size]


@pytest.fixture(scope="module")
def videos(tmp_path_factory) -> dict:
    folder = tmp_path_factory.mktemp("videos")
    return {"mkv": write_video(folder / "clip.mkv"), "mp4": write_mp4(folder / "clip.mp4")}


@pytest.fixture
def frame_folder(tmp_path):
    """Frames 0..11 saved as frame1.png .. frame12.png, so name order and natural order differ."""
    folder = tmp_path / "frames"
    folder.mkdir()
    for i, pixels in enumerate(written_frames(12)):
        Image.fromarray(pixels).save(folder / f"frame{i + 1}.png")
    return folder


def message(path, text: str) -> str:
    return text.replace("PATH", str(path))


# Counting frames


@pytest.mark.parametrize("kind", ["mkv", "mp4"])
def test_frame_count_of_video_files(videos, kind):
    assert frame_count(videos[kind]) == FRAMES


def test_frame_count_of_a_frame_folder_ignores_other_files(frame_folder):
    (frame_folder / "notes.txt").write_text("not a frame")
    (frame_folder / ".hidden.png").write_bytes(b"")
    (frame_folder / "sub").mkdir()
    assert frame_count(frame_folder) == 12


def test_frame_count_does_not_trust_the_header_of_a_truncated_mp4(tmp_path):
    # With its index at the front, a cut MP4 still says 24 frames in its header, but holds only 12.
    whole = write_video(
        tmp_path / "whole.mp4",
        "libx264rgb",
        options={"qp": "0", "bf": "0"},
        container_options={"movflags": "faststart"},
    )
    cut = tmp_path / "cut.mp4"
    cut.write_bytes(whole.read_bytes()[: packet_offsets(whole)[12]])
    with av.open(str(cut)) as container:
        assert container.streams.video[0].frames == FRAMES
    assert frame_count(cut) == 12
    np.testing.assert_array_equal(read_frames(cut, range(12)), written_frames(12))
    with pytest.raises(VideoError) as caught:
        read_frames(cut, [12])
    assert str(caught.value) == message(cut, f"video 'PATH' ended after 12 frames; frame 12 was asked for. {DAMAGED}")


def test_a_truncated_mkv_gives_the_frames_it_still_holds(videos, tmp_path):
    cut = tmp_path / "cut.mkv"
    cut.write_bytes(videos["mkv"].read_bytes()[: packet_offsets(videos["mkv"])[10] + 10])
    assert frame_count(cut) == 10
    np.testing.assert_array_equal(read_frames(cut, range(10)), written_frames(10))


# Choosing frames


@pytest.mark.parametrize(
    "count, length, stride, clips, expected",
    [
        (24, 8, 2, 2, [(0, 2, 4, 6, 8, 10, 12, 14), (9, 11, 13, 15, 17, 19, 21, 23)]),
        (24, 4, 1, 1, [(10, 11, 12, 13)]),
        (25, 4, 1, 1, [(10, 11, 12, 13)]),
        (24, 4, 3, 3, [(0, 3, 6, 9), (7, 10, 13, 16), (14, 17, 20, 23)]),
        (10, 4, 1, None, [(0, 1, 2, 3), (4, 5, 6, 7)]),
        (12, 3, 2, None, [(0, 2, 4), (5, 7, 9)]),
        (4, 4, 1, None, [(0, 1, 2, 3)]),
        (4, 4, 1, 3, [(0, 1, 2, 3)] * 3),
        (5, 4, 1, 3, [(0, 1, 2, 3), (0, 1, 2, 3), (1, 2, 3, 4)]),
        (24, 1, 1, 4, [(0,), (7,), (15,), (23,)]),
    ],
)
def test_clip_frames(count, length, stride, clips, expected):
    assert clip_frames(count, length=length, stride=stride, clips=clips) == expected


@pytest.mark.parametrize(
    "count, clips, expected",
    [
        (3, 1, [(0, 2, 2, 2)]),
        (3, 2, [(0, 2, 2, 2)] * 2),
        (3, None, [(0, 2, 2, 2)]),
        (1, 1, [(0, 0, 0, 0)]),
    ],
)
def test_a_video_shorter_than_a_clip_repeats_its_last_frame(count, clips, expected):
    assert clip_frames(count, length=4, stride=2, clips=clips) == expected


def test_pair_frames():
    assert pair_frames(5) == [(0, 1), (1, 2), (2, 3), (3, 4)]
    assert pair_frames(5, stride=3) == [(0, 3), (1, 4)]
    assert pair_frames(3, stride=3) == []
    assert pair_frames(0) == []


@pytest.mark.parametrize(
    "call, text",
    [
        (lambda: clip_frames(24, length=0), "length must be a whole number of at least 1, not 0"),
        (lambda: clip_frames(24, length=4, stride=0), "stride must be a whole number of at least 1, not 0"),
        (lambda: clip_frames(24, length=4, clips=0), "clips must be a whole number of at least 1, not 0"),
        (lambda: clip_frames(0, length=4), "count must be a whole number of at least 1, not 0"),
        (lambda: pair_frames(5, stride=0), "stride must be a whole number of at least 1, not 0"),
    ],
)
def test_bad_clip_options_are_usage_problems(call, text):
    with pytest.raises(UsageProblem) as caught:
        call()
    assert caught.value.message == text
    assert caught.value.exit_code == 2


# Decoding frames


@pytest.mark.parametrize("kind", ["mkv", "mp4"])
def test_read_frames_matches_what_was_written(videos, kind):
    np.testing.assert_array_equal(read_frames(videos[kind], range(FRAMES)), written_frames())


@pytest.mark.parametrize("kind", ["mkv", "mp4"])
def test_read_frames_keeps_the_order_asked_with_repeats(videos, kind):
    frames = read_frames(videos[kind], [17, 3, 17, 0, 3])
    assert frames.shape == (5, HEIGHT, WIDTH, 3) and frames.dtype == np.uint8
    np.testing.assert_array_equal(frames, written_frames()[[17, 3, 17, 0, 3]])
    assert frames[:, 0, 0, 0].tolist() == [170, 30, 170, 0, 30]


def test_read_frames_takes_numpy_indices(videos):
    np.testing.assert_array_equal(read_frames(videos["mkv"], np.array([2, 1])), written_frames()[[2, 1]])


def test_read_frames_from_a_folder_in_natural_order(frame_folder):
    frames = read_frames(frame_folder, [9, 1, 9, 11])
    # frame10.png holds frame 9 and frame12.png frame 11; name order would have put frame10.png second.
    np.testing.assert_array_equal(frames, written_frames(12)[[9, 1, 9, 11]])


def test_read_frames_from_a_folder_opens_only_the_frames_asked_for(frame_folder):
    (frame_folder / "frame5.png").write_bytes(b"damaged")
    np.testing.assert_array_equal(read_frames(frame_folder, [0, 5]), written_frames(12)[[0, 5]])


def test_find_clips_and_their_frames(videos):
    clips = find_clips(videos["mkv"], length=4, stride=2, clips=3)
    path = str(videos["mkv"])
    assert clips == [Clip(path, (0, 2, 4, 6)), Clip(path, (8, 10, 12, 14)), Clip(path, (17, 19, 21, 23))]
    np.testing.assert_array_equal(read_row(clips[2]), written_frames()[[17, 19, 21, 23]])
    assert clips[1].describe() == {"video": path, "frames": "[8, 10, 12, 14]"}


def test_find_pairs(videos, frame_folder):
    pairs = find_pairs(videos["mp4"], stride=2)
    assert [pair.frames for pair in pairs] == [(i, i + 2) for i in range(22)]
    np.testing.assert_array_equal(read_row(pairs[5]), written_frames()[[5, 7]])
    assert [pair.frames for pair in find_pairs(frame_folder, stride=11)] == [(0, 11)]


# Errors


def expect_error(call, text):
    with pytest.raises(VideoError) as caught:
        call()
    assert str(caught.value) == text
    assert isinstance(caught.value, HookcliError) and caught.value.exit_code == 1


def test_a_text_file_named_mp4(tmp_path):
    path = tmp_path / "notes.mp4"
    path.write_text("this is not a video\n" * 20)
    text = f"cannot read video '{path}': Invalid data found when processing input. {DAMAGED}"
    expect_error(lambda: frame_count(path), text)
    expect_error(lambda: read_frames(path, [0]), text)


def test_an_empty_file(tmp_path):
    path = tmp_path / "empty.mkv"
    path.write_bytes(b"")
    expect_error(
        lambda: frame_count(path), f"video '{path}' is empty. Hint: the file holds no bytes; it may not be written yet"
    )


def test_an_mp4_cut_before_its_index(videos, tmp_path):
    path = tmp_path / "cut.mp4"
    path.write_bytes(videos["mp4"].read_bytes()[:-2000])
    expect_error(
        lambda: frame_count(path), f"cannot read video '{path}': Invalid data found when processing input. {DAMAGED}"
    )


def test_a_video_cut_before_its_first_frame(videos, tmp_path):
    path = tmp_path / "cut.mkv"
    path.write_bytes(videos["mkv"].read_bytes()[: packet_offsets(videos["mkv"])[0] + 10])
    expect_error(lambda: frame_count(path), f"video '{path}' has no frames. {DAMAGED}")


def test_a_file_without_video(tmp_path):
    path = tmp_path / "sound.wav"
    with wave.open(str(path), "wb") as sound:
        sound.setnchannels(1), sound.setsampwidth(2), sound.setframerate(8000)
        sound.writeframes(b"\0\0" * 800)
    expect_error(
        lambda: frame_count(path), f"'{path}' holds no video stream. Hint: pass a video file or a folder of frames"
    )


def test_a_missing_file(tmp_path):
    path = tmp_path / "gone.mp4"
    expect_error(lambda: frame_count(path), f"video not found: '{path}'. Hint: check the path")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs named pipes")
def test_a_fifo_is_refused_without_waiting_as_a_usage_problem(tmp_path):
    path = tmp_path / "pipe.mp4"
    os.mkfifo(path)
    with pytest.raises(UsageProblem) as caught:
        frame_count(path)
    assert str(caught.value) == (
        f"'{path}' is a FIFO (named pipe), not a regular file. "
        "Hint: videos are read from regular files or folders of frames"
    )
    assert caught.value.exit_code == 2


def test_a_fifo_among_the_videos_of_a_folder_is_not_left_out(tmp_path):
    os.mkfifo(tmp_path / "a.mp4")
    write_mp4(tmp_path / "b.mp4")
    assert find_videos([str(tmp_path)]) == [tmp_path / "a.mp4", tmp_path / "b.mp4"]


def test_an_empty_folder(tmp_path):
    (tmp_path / "readme.txt").write_text("no frames here")
    expect_error(
        lambda: frame_count(tmp_path),
        f"no frames found in folder '{tmp_path}'. Hint: frame images end in one of .bmp, .gif, .jfif, "
        ".jpeg, .jpg, .pbm, .pgm, .png, .ppm, .tif, .tiff, .webp",
    )


def test_frames_of_different_sizes(frame_folder):
    Image.new("RGB", (32, 30)).save(frame_folder / "frame3.png")
    expect_error(
        lambda: read_frames(frame_folder, [0, 2]),
        f"frames in folder '{frame_folder}' differ in size: 'frame1.png' is 64x48, 'frame3.png' is 32x30. "
        "Hint: all frames of a video must be the same size",
    )


def test_a_damaged_frame_in_a_folder(frame_folder):
    path = frame_folder / "frame2.png"
    path.write_bytes(b"damaged")
    expect_error(
        lambda: read_frames(frame_folder, [1]),
        f"'{path}' is not an image Pillow can read. Hint: check the file type; text or corrupt files cannot be used",
    )


def test_frames_past_the_end(videos, frame_folder):
    path = videos["mkv"]
    expect_error(
        lambda: read_frames(path, [3, 24]), f"video '{path}' ended after 24 frames; frame 24 was asked for. {DAMAGED}"
    )
    expect_error(
        lambda: read_frames(frame_folder, [12]),
        f"folder '{frame_folder}' has 12 frames; frame 12 was asked for. Hint: frames are numbered from 0",
    )


def test_too_few_frames_for_a_pair(tmp_path):
    path = write_video(tmp_path / "one.mkv", count=1)
    expect_error(
        lambda: find_pairs(path),
        f"video '{path}' has 1 frame, too few for a pair 1 apart. Hint: optical flow needs at least two frames",
    )
    path = write_video(tmp_path / "three.mkv", count=3)
    expect_error(
        lambda: find_pairs(path, stride=3),
        f"video '{path}' has 3 frames, too few for a pair 3 apart. Hint: use a smaller stride",
    )


@pytest.mark.parametrize(
    "indices, text",
    [
        ([], "no frames were asked for"),
        ([0, -1], "frame indices must be whole numbers of at least 0, not -1"),
        ([1.5], "frame indices must be whole numbers of at least 0, not 1.5"),
    ],
)
def test_bad_indices_are_usage_problems(videos, indices, text):
    with pytest.raises(UsageProblem) as caught:
        read_frames(videos["mkv"], indices)
    assert caught.value.message == text


def test_without_pyav(videos, monkeypatch):
    monkeypatch.setitem(sys.modules, "av", None)  # makes `import av` raise ImportError
    expect_error(
        lambda: frame_count(videos["mkv"]),
        "reading video files needs PyAV, which is not installed. Hint: pip install 'hookcli[video]'",
    )


def test_video_suffixes():
    assert {".mp4", ".avi", ".mov", ".mkv", ".webm", ".m4v", ".mpg", ".mpeg"} <= VIDEO_SUFFIXES
    assert all(suffix.startswith(".") and suffix == suffix.lower() for suffix in VIDEO_SUFFIXES)


def test_clips_asked_in_order_continue_one_pass_through_the_file(tmp_path, monkeypatch):
    import hookcli.inputs.video

    path = write_mp4(tmp_path / "long.mp4")
    opened = []
    real = hookcli.inputs.video._Decoding

    def counted(*args):
        opened.append(args[0])
        return real(*args)

    monkeypatch.setattr(hookcli.inputs.video, "_Decoding", counted)
    monkeypatch.setattr(hookcli.inputs.video, "_RECENT_BYTES", 4 * WIDTH * HEIGHT * 3)  # the last 4 frames are kept
    expected = written_frames()
    for frames in ([0, 1, 2], [2, 3, 4], [10, 11], [11, 12], [20, 23]):  # each starts at or after the last one's end
        assert np.array_equal(read_frames(path, frames), expected[frames])
    assert len(opened) == 1
    assert np.array_equal(read_frames(path, [0]), expected[[0]])  # before the kept frames: a new pass
    assert len(opened) == 2
    write_mp4(path, count=6)  # the file changes: it is opened again, not read from the old decoder
    assert np.array_equal(read_frames(path, [1, 5]), written_frames(6)[[1, 5]])
    assert len(opened) == 3
    with pytest.raises(VideoError, match="ended after 6 frames; frame 7 was asked for"):
        read_frames(path, [7])


def test_pairs_of_a_frame_folder_decode_each_frame_once(frame_folder, monkeypatch):
    import hookcli.inputs.video

    decoded = []
    real = hookcli.inputs.video.load_rgb

    def counted(path, **options):
        decoded.append(path.name)
        return real(path, **options)

    monkeypatch.setattr(hookcli.inputs.video, "load_rgb", counted)
    close_decoders()
    pairs = find_pairs(frame_folder)
    rows = [read_row(pair) for pair in pairs]
    assert [row[:, 0, 0, 0].tolist() for row in rows] == [[10 * i, 10 * i + 10] for i in range(11)]
    assert decoded == [f"frame{i + 1}.png" for i in range(12)]  # frame k is the second of pair k-1, the first of k
    # A frame written again is decoded again; the run's end lets go of the frames kept.
    Image.fromarray(written_frames(12)[0]).save(frame_folder / "frame12.png")
    os.utime(frame_folder / "frame12.png", ns=(1, 1))
    assert read_row(pairs[10])[1, 0, 0, 0] == 0 and decoded[-1] == "frame12.png" and len(decoded) == 13
    close_decoders()
    read_row(pairs[0])
    assert decoded[-2:] == ["frame1.png", "frame2.png"]


def test_pairs_of_two_image_lists_share_the_images_they_have_in_common(frame_folder, monkeypatch):
    import hookcli.inputs.video

    decoded = []
    real = hookcli.inputs.video.load_rgb
    monkeypatch.setattr(hookcli.inputs.video, "load_rgb", lambda path: decoded.append(path.name) or real(path))
    close_decoders()
    frames = [frame_folder / f"frame{i + 1}.png" for i in range(4)]
    pairs = [ImagePair(first, second) for first, second in zip(frames, frames[1:])]
    assert [read_row(pair)[:, 0, 0, 0].tolist() for pair in pairs] == [[0, 10], [10, 20], [20, 30]]
    assert decoded == ["frame1.png", "frame2.png", "frame3.png", "frame4.png"]


# Seeking to the keyframe before a clip


def keyframes_every(count: int) -> dict:
    """x264 options for a keyframe every ``count`` frames exactly (no scene cuts in between)."""
    return {"qp": "0", "x264-params": f"keyint={count}:min-keyint={count}:scenecut=0"}


@pytest.fixture
def decoded_frames(monkeypatch):
    """The frames the video reader decodes, counted (a list of their times); the reader starts with nothing open."""
    import contextlib

    import hookcli.inputs.video

    decoded = []
    real = hookcli.inputs.video.opened_video

    class Counting:
        def __init__(self, container):
            self.container = container

        def __getattr__(self, name):
            return getattr(self.container, name)

        def decode(self, *streams):
            for frame in self.container.decode(*streams):
                decoded.append(frame.pts)
                yield frame

    @contextlib.contextmanager
    def counted(path):
        with real(path) as (container, stream):
            yield Counting(container), stream

    monkeypatch.setattr(hookcli.inputs.video, "opened_video", counted)
    close_decoders()
    yield decoded
    close_decoders()


def test_a_clip_past_a_keyframe_is_decoded_from_that_keyframe(tmp_path, decoded_frames):
    path = write_video(tmp_path / "keyed.mp4", "libx264rgb", count=48, options=keyframes_every(6))
    assert frame_times(path).keyframes == (0, 6, 12, 18, 24, 30, 36, 42)
    np.testing.assert_array_equal(read_frames(path, [40, 41]), written_frames(48)[[40, 41]])
    assert len(decoded_frames) == 6  # frames 36 to 41, not 0 to 41


def test_a_decode_worker_given_every_other_batch_decodes_only_around_its_own_clips(tmp_path, decoded_frames):
    path = write_video(tmp_path / "keyed.mp4", "libx264rgb", count=48, options=keyframes_every(6))
    clips = find_clips(path, length=4, clips=None)  # frames 0-3, 4-7, …, 44-47
    batches = [clips[start : start + 2] for start in range(0, len(clips), 2)]
    for batch in batches[1::2]:  # the second of two workers: frames 8-15, 24-31 and 40-47
        for clip in batch:
            np.testing.assert_array_equal(read_row(clip), written_frames(48)[list(clip.frames)])
    assert len(decoded_frames) == 10 + 8 + 12  # from keyframes 6, 24 and 36; all 48 frames before


def test_frames_read_by_seeking_equal_frames_decoded_in_order_whatever_the_codec(tmp_path):
    """B-frames (shown in another order than stored) and open GOPs, against PyAV decoding the file from its start."""
    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 256, (HEIGHT, WIDTH, 3), dtype=np.uint8)
    for codec, suffix, options in [
        ("libx264", "mp4", {"g": "6", "bf": "2", "sc_threshold": "0"}),
        ("libx264", "mkv", {"g": "12", "bf": "3", "x264-params": "open-gop=1"}),
        ("mpeg4", "avi", {"g": "6", "bf": "2"}),
        ("libvpx-vp9", "webm", {"g": "6"}),
    ]:
        path = tmp_path / f"{codec}.{suffix}"
        with av.open(str(path), "w") as container:
            stream = container.add_stream(codec, rate=24, options=options)
            stream.width, stream.height, stream.pix_fmt = WIDTH, HEIGHT, "yuv420p"
            for shift in range(FRAMES):
                frame = av.VideoFrame.from_ndarray(np.roll(pixels, shift, axis=1), format="rgb24")
                container.mux(stream.encode(frame))
            container.mux(stream.encode())
        with av.open(str(path)) as container:
            in_order = np.stack([frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)])
        for indices in ([20, 21], [7], [13, 3, 23], [23], [1, 2]):
            close_decoders()
            np.testing.assert_array_equal(read_frames(path, indices), in_order[indices], err_msg=f"{path} {indices}")


def test_a_video_whose_times_disagree_with_its_frames_is_decoded_from_its_start(tmp_path, decoded_frames, monkeypatch):
    import hookcli.inputs.video

    path = write_video(tmp_path / "keyed.mp4", "libx264rgb", count=48, options=keyframes_every(6))
    true = frame_times(path)
    shifted = FrameTimes(tuple(time + 1 for time in true.times), true.keyframes)  # no frame has the time it says
    monkeypatch.setattr(hookcli.inputs.video, "frame_times", lambda path: shifted)
    np.testing.assert_array_equal(read_frames(path, [40, 41]), written_frames(48)[[40, 41]])
    assert len(decoded_frames) == 1 + 42  # the keyframe sought, then frames 0 to 41
    np.testing.assert_array_equal(read_frames(path, [46]), written_frames(48)[[46]])
    assert len(decoded_frames) == 1 + 42 + 5  # never seeking again: on from frame 42


def test_a_stream_without_timestamps_is_decoded_from_its_start(tmp_path, decoded_frames):
    path = tmp_path / "raw.h264"
    with av.open(str(path), "w", format="h264") as container:
        stream = container.add_stream("libx264", rate=24, options={"g": "4"})
        stream.width, stream.height, stream.pix_fmt = WIDTH, HEIGHT, "yuv420p"
        for pixels in written_frames(12):
            container.mux(stream.encode(av.VideoFrame.from_ndarray(pixels, format="rgb24")))
        container.mux(stream.encode())
    assert frame_times(path) is None
    with av.open(str(path)) as container:
        in_order = np.stack([frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)])
    np.testing.assert_array_equal(read_frames(path, [10]), in_order[[10]])
    assert len(decoded_frames) == 11
