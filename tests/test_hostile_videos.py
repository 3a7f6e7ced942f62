"""Crafted videos: frames larger than any image hookcli decodes are refused before they are converted."""

import fractions
import struct
import zlib

import av
import pytest

VIDEO = [
    "extract",
    "-m",
    "r3d_18",
    "-w",
    "none",
    "-l",
    "layer1",
    "--resize",
    "32",
    "--crop",
    "32",
    "--clip-length",
    "3",
]


def _png(width: int, height: int) -> bytes:
    """An 8-bit RGB PNG of zeros: tiny, compressed row by row, and ``width * height * 3`` bytes once decoded."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    packer, row = zlib.compressobj(9), bytes(1 + 3 * width)
    pixels = b"".join(packer.compress(row) for _ in range(height)) + packer.flush()
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", pixels) + chunk(b"IEND", b"")


@pytest.fixture(scope="module")
def huge_frame() -> bytes:
    return _png(16000, 16000)  # 750 KB on disk, 768 MB decoded


def _mov(path, frame: bytes, declared: int, count: int = 3):
    """A .mov of ``count`` PNG frames, muxed as they are (no encoding), its header saying ``declared`` pixels a
    side."""
    with av.open(str(path), "w") as container:
        stream = container.add_stream("png", rate=1)
        stream.width = stream.height = declared
        stream.pix_fmt = "rgb24"
        for number in range(count):
            packet = av.Packet(frame)
            packet.stream, packet.pts, packet.dts, packet.time_base = stream, number, number, fractions.Fraction(1)
            container.mux(packet)
    return path


@pytest.mark.parametrize("declared", [16000, 64], ids=["said", "hidden"])
def test_a_video_of_huge_frames_is_refused_in_bounded_memory(tmp_path, huge_frame, peak_of, declared):
    video = _mov(tmp_path / "huge.mov", huge_frame, declared)
    code, peak, stderr = peak_of(*VIDEO, video, "-o", tmp_path / "f.safetensors")
    assert (code, stderr) == (
        1,
        f"Error: video '{video}' has frames of 16000x16000 (256,000,000 pixels), more than "
        "hookcli decodes (178,956,970). Hint: scale it down first (ffmpeg -i IN -vf "
        "scale=1920:-2 OUT)",
    )
    assert peak < 2**31, peak  # the header, and at most FFmpeg's probe of one frame
    assert not (tmp_path / "f.safetensors").exists()


def test_a_frame_folder_of_huge_images_is_refused_in_bounded_memory(tmp_path, huge_frame, peak_of):
    folder = tmp_path / "frames"
    folder.mkdir()
    for number in range(3):
        (folder / f"frame{number}.png").write_bytes(huge_frame)
    code, peak, stderr = peak_of(*VIDEO, folder, "-o", tmp_path / "f.safetensors")
    assert (code, stderr) == (
        1,
        f"Error: image '{folder / 'frame0.png'}' has 256,000,000 pixels, more than Pillow "
        "decodes (178,956,970). Hint: shrink it first; or add --on-error skip to leave "
        "out the videos that fail so",
    )
    # Loading torch takes 0.5 GiB under Python 3.11 and 0.7 GiB under 3.13; a decoded frame would add 0.7 more.
    assert peak < 1.5 * 2**30, peak
    assert not (tmp_path / "f.safetensors").exists()


def test_the_pixel_limit_follows_pillows_and_applies_to_every_frame_read(tmp_path, monkeypatch):
    """A limit lowered in Pillow is the limit of video frames too (a frame is refused before it is converted)."""
    from PIL import Image

    from hookcli.errors import VideoError
    from hookcli.inputs import video

    small = _mov(tmp_path / "small.mov", _png(40, 30), 40)
    assert video.read_frames(small, [0, 2]).shape == (2, 30, 40, 3)
    video.close_decoders()
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 500)
    with pytest.raises(VideoError) as caught:
        video.read_frames(small, [0])
    assert str(caught.value) == (
        f"video '{small}' has frames of 40x30 (1,200 pixels), more than hookcli decodes "
        "(1,000). Hint: scale it down first (ffmpeg -i IN -vf scale=1920:-2 OUT)"
    )
