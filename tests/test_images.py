"""Decoding every kind of image file to upright 8-bit RGB, and finding the inputs."""

import io

import numpy as np
import pytest
from PIL import Image

from hookcli.errors import ImageError, InputError
from hookcli.inputs.discovery import gather_inputs
from hookcli.inputs.images import load_rgb


def _pixels(path):
    image = load_rgb(path)
    assert image.mode == "RGB"
    return np.asarray(image)


def test_grayscale_and_one_bit(tmp_path):
    Image.new("L", (4, 3), 77).save(tmp_path / "g.png")
    Image.new("1", (4, 3), 1).save(tmp_path / "b.png")
    assert (_pixels(tmp_path / "g.png") == 77).all()
    assert (_pixels(tmp_path / "b.png") == 255).all()


def test_palette_with_and_without_transparency(tmp_path):
    image = Image.new("P", (2, 1))
    image.putpalette([10, 20, 30, 200, 100, 50] + [0] * 762)
    image.putpixel((1, 0), 1)
    image.save(tmp_path / "p.png")
    image.save(tmp_path / "pt.png", transparency=0)
    assert _pixels(tmp_path / "p.png").tolist() == [[[10, 20, 30], [200, 100, 50]]]
    assert _pixels(tmp_path / "pt.png").tolist() == [[[255, 255, 255], [200, 100, 50]]]


def test_alpha_is_composited_onto_white(tmp_path):
    Image.new("RGBA", (1, 1), (200, 0, 0, 0)).save(tmp_path / "clear.png")
    Image.new("RGBA", (1, 1), (200, 0, 0, 255)).save(tmp_path / "solid.png")
    Image.new("RGBA", (1, 1), (0, 0, 0, 128)).save(tmp_path / "half.png")
    Image.new("LA", (1, 1), (0, 0)).save(tmp_path / "la.png")
    assert _pixels(tmp_path / "clear.png").tolist() == [[[255, 255, 255]]]
    assert _pixels(tmp_path / "solid.png").tolist() == [[[200, 0, 0]]]
    assert _pixels(tmp_path / "half.png").tolist() == [[[127, 127, 127]]]
    assert _pixels(tmp_path / "la.png").tolist() == [[[255, 255, 255]]]


def test_cmyk_jpeg(tmp_path):
    Image.new("CMYK", (8, 8), (0, 255, 255, 0)).save(tmp_path / "c.jpg", quality=100)
    red = _pixels(tmp_path / "c.jpg")[4, 4]
    assert red[0] > 240 and red[1] < 15 and red[2] < 15


def test_sixteen_bit_grayscale_is_scaled_not_clipped(tmp_path):
    values = np.array([[0, 257 * 100, 65535]], dtype=np.uint16)
    Image.fromarray(values).save(tmp_path / "g16.png")
    assert Image.open(tmp_path / "g16.png").mode == "I;16"
    assert _pixels(tmp_path / "g16.png")[0, :, 0].tolist() == [0, 100, 255]


def test_exif_orientation_is_applied(tmp_path):
    pixels = np.zeros((2, 3, 3), dtype=np.uint8)
    pixels[0, 0] = (255, 0, 0)  # top-left of the stored (landscape) image
    image = Image.fromarray(pixels)
    exif = image.getexif()
    exif[0x0112] = 6  # "rotate 90° clockwise to display"
    image.save(tmp_path / "rot.png", exif=exif.tobytes())
    upright = _pixels(tmp_path / "rot.png")
    assert upright.shape == (3, 2, 3)
    assert upright[0, 1].tolist() == [255, 0, 0]


def test_truncated_and_fake_images_name_the_file(tmp_path, make_image):
    make_image(tmp_path / "full.jpg", size=(64, 64))
    data = (tmp_path / "full.jpg").read_bytes()
    (tmp_path / "cut.jpg").write_bytes(data[: len(data) // 2])
    (tmp_path / "text.jpg").write_text("hello")
    with pytest.raises(ImageError, match=r"cannot decode image '.*cut.jpg': image file is truncated"):
        load_rgb(tmp_path / "cut.jpg")
    with pytest.raises(ImageError) as caught:
        load_rgb(tmp_path / "text.jpg")
    assert str(caught.value) == (
        f"'{tmp_path / 'text.jpg'}' is not an image Pillow can read. "
        "Hint: check the file type; text or corrupt files cannot be used"
    )


def test_empty_and_oversized_images_say_so(tmp_path, monkeypatch):
    (tmp_path / "zero.jpg").write_bytes(b"")
    with pytest.raises(ImageError) as caught:
        load_rgb(tmp_path / "zero.jpg")
    assert str(caught.value) == (
        f"image '{tmp_path / 'zero.jpg'}' is empty (0 bytes). Hint: the file may not have been written"
    )
    Image.new("L", (100, 50)).save(tmp_path / "wide.png")
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 2000)  # Pillow refuses above twice this
    with pytest.raises(ImageError) as caught:
        load_rgb(tmp_path / "wide.png")
    assert str(caught.value) == (
        f"image '{tmp_path / 'wide.png'}' has 5,000 pixels, more than Pillow decodes (4,000). Hint: shrink it first"
    )


@pytest.fixture
def tree(tmp_path):
    (tmp_path / "sub" / "deeper").mkdir(parents=True)
    for name in ["b.JPG", "a.png", ".hidden.png", "notes.txt", "sub/c.png", "sub/deeper/d.webp"]:
        (tmp_path / name).write_bytes(b"")
    return tmp_path


def test_folders_sorted_filtered_and_recursive(tree):
    assert [p.name for p in gather_inputs([str(tree)])] == ["a.png", "b.JPG"]
    found = gather_inputs([str(tree)], recursive=True)
    assert [p.relative_to(tree).as_posix() for p in found] == ["a.png", "b.JPG", "sub/c.png", "sub/deeper/d.webp"]


def test_stdin_paths_keep_their_order_and_mix_with_arguments(tree):
    stdin = io.StringIO(f"{tree / 'sub/c.png'}\n\n{tree / 'a.png'}\r\n")
    found = gather_inputs([str(tree / "b.JPG"), "-"], stdin=stdin)
    assert [p.name for p in found] == ["b.JPG", "c.png", "a.png"]


def test_input_errors(tree):
    with pytest.raises(InputError, match="no such file or folder: 'missing.png'"):
        gather_inputs(["missing.png"])
    with pytest.raises(InputError, match="no images found in folder '.*sub'. Hint: add --recursive"):
        (tree / "sub" / "c.png").unlink()
        gather_inputs([str(tree / "sub")])
    with pytest.raises(InputError) as caught:
        gather_inputs(["-"], stdin=io.StringIO("\n\n"))
    assert (caught.value.message, caught.value.hint) == (
        "standard input ('-') held no paths",
        "pipe in one path a line (find photos -name '*.jpg' | hookcli …), or pass image files or folders",
    )
    with pytest.raises(InputError, match="no input images were given"):
        gather_inputs([])


def test_a_reduced_decode_keeps_both_sides_at_least_the_size_asked(tmp_path, photo):
    big = Image.open(photo).convert("RGB").resize((2000, 1500))
    big.save(tmp_path / "big.jpg", quality=92)
    big.save(tmp_path / "big.png")
    assert load_rgb(tmp_path / "big.jpg").size == (2000, 1500)
    assert load_rgb(tmp_path / "big.jpg", min_size=512).size == (1000, 750)  # 1/4 would leave 375 < 512
    assert load_rgb(tmp_path / "big.jpg", min_size=180).size == (250, 188)  # 1/8, the smallest scale
    assert load_rgb(tmp_path / "big.jpg", min_size=1600).size == (2000, 1500)  # no scale keeps 1,600
    assert load_rgb(tmp_path / "big.png", min_size=512).size == (2000, 1500)  # only JPEGs decode at a scale
    halved = np.asarray(load_rgb(tmp_path / "big.jpg", min_size=512), dtype=float)
    resized = np.asarray(
        load_rgb(tmp_path / "big.jpg").resize((1000, 750), Image.BILINEAR, reducing_gap=None), dtype=float
    )
    assert np.abs(halved - resized).mean() < 2.0  # the same picture, at the scale asked

    exif = Image.Exif()
    exif[0x0112] = 6  # stored on its side: shown rotated 90° clockwise
    big.save(tmp_path / "turned.jpg", exif=exif)
    assert load_rgb(tmp_path / "turned.jpg", min_size=512).size == (750, 1000)
