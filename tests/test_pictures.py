"""What a grid says on its face: channel numbers, shapes without ragged rows, colour bars, sizes that read,
strips for vectors and pooled channels, a sensible default for wide layers, and overlays large enough to see."""

import json

import numpy as np
import pytest
from matplotlib import colormaps
from PIL import Image
from safetensors.numpy import save_file

from hookcli.cli import main
from hookcli.inputs.images import load_rgb, load_with_picture
from hookcli.inputs.preprocess import Preprocess
from hookcli.options.grid import GridOptions
from hookcli.pictures.drawing import render_picture
from hookcli.pictures.grids import plan_grids
from hookcli.pictures.photos import ModelPhotos, heat_picture, model_photo_scaled
from hookcli.pictures.render import grid_columns, tile_layout, tile_maps
from hookcli.pictures.text import _label_bitmap, glyphs, label_size
from hookcli.storage.features import Features


def _png(path):
    return np.asarray(Image.open(path).convert("RGB"))


def _lut(name="viridis"):
    return np.round(colormaps[name](np.linspace(0, 1, 256))[:, :3] * 255).astype(np.uint8)


@pytest.mark.parametrize(
    "count, columns", [(128, 16), (64, 8), (512, 32), (2048, 64), (100, 10), (3, 3), (7, 4), (1, 1), (6, 3)]
)
def test_the_shape_leaves_no_ragged_row_where_a_better_one_exists(count, columns):
    assert grid_columns(count, 32, 32) == columns
    rows = -(-count // columns)
    assert rows * columns - count == {7: 1}.get(count, 0)


def test_each_tile_carries_its_channel_number_above_it():
    maps = np.zeros((3, 10, 10), dtype=np.float32)
    pixels = tile_maps(maps, columns=3, padding=2, cmap="gray", min_tile=40, labels=[7, 18, 9])
    size = label_size(40)
    band = glyphs(size)[1] + 2
    assert pixels.shape == (2 + band + 40 + 2, 2 + 3 * 42, 3)
    for i, label in enumerate(["7", "18", "9"]):
        bitmap = _label_bitmap(label, size)
        left = 2 + i * 42 + 1
        stamped = pixels[3 : 3 + bitmap.shape[0], left : left + bitmap.shape[1], 0]
        assert (stamped == bitmap).all()
        assert bitmap.min() < 100  # there is ink
    assert (pixels[2 + band : 2 + band + 40, 2:42] == 0).all()  # the map itself, black in gray for zeros


def test_labels_that_do_not_fit_are_left_out_and_the_caption_says_so(runner, tmp_path):
    path = tmp_path / "f.safetensors"
    save_file({"x": np.ones((1, 20000, 2, 2), dtype=np.float32)}, str(path))
    assert tile_layout(4, 2, 2, min_tile=4, labels=[19999]).band == 0
    result = runner.invoke(main, ["grid", str(path), "--channels", "0:4", "--min-tile", "4", "-o", str(tmp_path / "g")])
    assert result.exit_code == 0, result.output
    features = Features({"x": np.ones((1, 20000, 2, 2), dtype=np.float32)}, {})
    options = GridOptions(channels="19990:19994", min_tile=4)
    picture = render_picture(features, plan_grids(features, options, None)[0], options)
    wide = render_picture(
        features,
        plan_grids(features, GridOptions(channels="19990:19994"), None)[0],
        GridOptions(channels="19990:19994"),
    )
    assert picture.pixels.shape[0] > wide.pixels.shape[0] - 40  # a caption line more, no label band
    plain = GridOptions(channels="19990:19994", min_tile=4, title=False)
    untitled = render_picture(features, plan_grids(features, plain, None)[0], plain).pixels
    assert picture.pixels.shape[0] > untitled.shape[0]


def test_wide_layers_draw_their_first_64_channels_and_say_how_to_get_the_rest(runner, tmp_path):
    path = tmp_path / "f.safetensors"
    save_file(
        {"wide": np.ones((1, 1024, 7, 7), dtype=np.float32), "narrow": np.ones((1, 64, 7, 7), np.float32)}, str(path)
    )
    result = runner.invoke(main, ["grid", str(path), "--plain", "--padding", "0", "-o", str(tmp_path / "g")])
    assert result.exit_code == 0, result.output
    assert result.stderr == (
        "Note: 'wide': drew channels 0-63 of 1024; --channels 64:128 draws the next 64, "
        "--top 64 the most active, --channels : all of them\n"
    )
    sizes = [Image.open(p).size for p in result.stdout.split()]
    assert sizes == [(8 * 35, 8 * 35), (8 * 35, 8 * 35)]  # 8 x 8 tiles of 7 px enlarged 5 times to pass 32
    everything = runner.invoke(
        main,
        ["grid", str(path), "-k", "wide", "--channels", ":", "--plain", "--padding", "0", "-o", str(tmp_path / "all")],
    )
    assert everything.exit_code == 0 and everything.stderr == ""
    assert Image.open(everything.stdout.strip()).size == (32 * 35, 32 * 35)


def test_top_channels_are_numbered_with_their_own_indices():
    values = np.arange(20, dtype=np.float32)[:, None, None] * np.ones((20, 14, 14), dtype=np.float32)
    values[3] += 100  # channel 3 is the most active, then 19, 18, 17
    features = Features({"x": values[None]}, {})
    options = GridOptions(top=4, columns=4, padding=2, title=False)
    pixels = render_picture(features, plan_grids(features, options, None)[0], options).pixels
    tile = (pixels.shape[1] - 2) // 4
    size = label_size(tile - 2)
    for i, label in enumerate(["3", "19", "18", "17"]):
        bitmap = _label_bitmap(label, size)
        left = 2 + i * tile + 1
        assert (pixels[3 : 3 + bitmap.shape[0], left : left + bitmap.shape[1], 0] == bitmap).all()


def test_one_channel_is_drawn_large_enough_to_read(runner, tmp_path):
    path = tmp_path / "f.safetensors"
    save_file({"x": np.random.default_rng(0).random((1, 8, 14, 14), dtype=np.float32)}, str(path))
    result = runner.invoke(main, ["grid", str(path), "--channels", "5", "-o", str(tmp_path / "g")])
    assert result.exit_code == 0, result.output
    pixels = _png(result.stdout.strip())
    assert pixels.shape[1] == 2 + 28 * 14 + 2  # 14 px enlarged 28 times: at least 384 px wide
    assert pixels.shape[0] < 1.5 * pixels.shape[1]  # the caption and bar are a small part of it


def test_the_colour_bar_runs_through_the_colormap_under_the_tiles():
    features = Features({"x": np.random.default_rng(1).random((1, 4, 8, 8), dtype=np.float32)}, {})
    options = GridOptions(title=False, cmap="magma")
    pixels = render_picture(features, plan_grids(features, options, None)[0], options).pixels
    lut = _lut("magma")
    bottom = pixels[-10]
    runs = [x for x in range(len(bottom)) if (bottom[x] == lut[0]).all()]
    assert runs, "the bar's dark end is drawn"
    start = runs[0]
    bar = bottom[start : start + 128]
    assert (bar[0] == lut[0]).all() and np.abs(bar.astype(int).sum(axis=1)).tolist() != [bar[0].sum()] * 128


@pytest.mark.parametrize("shape, caption_count", [((1, 512, 1, 1), 512), ((1, 512), 512)])
def test_pooled_channels_and_vectors_are_one_strip_of_values(shape, caption_count):
    values = np.linspace(0, 1, 512, dtype=np.float32).reshape(shape)
    features = Features({"x": values}, {})
    options = GridOptions(plain=True, cmap="gray")
    picture = render_picture(features, plan_grids(features, options, None)[0], options)
    assert picture.pixels.shape == (1 + 28 + 2 + 1, 1 + 512 + 1, 3)  # 512 cells of 1 px, one line
    assert (picture.pixels[1:29, 1:513, 0] == np.round(np.linspace(0, 1, 512) * 255)).all()
    titled = GridOptions()
    assert plan_grids(features, titled, None).notes == ()  # all 512 values, no default cut for strips


def test_an_overlay_is_drawn_over_a_view_at_least_512_pixels_with_its_scale(runner, tmp_path, photo):
    inputs = json.dumps([str(photo)])
    preprocess = json.dumps(
        {"resize": 64, "crop": 48, "mean": [0.5] * 3, "std": [0.5] * 3, "interpolation": "bilinear"}
    )
    heat = np.zeros((1, 1, 6, 6), dtype=np.float32)
    heat[0, 0, 2, 3] = 5.0
    path = tmp_path / "f.safetensors"
    save_file({"x": heat}, str(path), metadata={"inputs": inputs, "preprocess": preprocess})
    result = runner.invoke(main, ["grid", str(path), "--overlay", "--no-title", "-o", str(tmp_path / "g")])
    assert result.exit_code == 0, result.output
    pixels = _png(result.stdout.strip())
    assert pixels.shape[1] == 512 and 512 < pixels.shape[0] < 560  # the view, then the colour bar
    assert result.stderr == ""


def test_a_map_that_is_zero_everywhere_is_not_drawn_and_a_note_says_so(runner, tmp_path, photo):
    inputs = json.dumps([str(photo)])
    path = tmp_path / "f.safetensors"
    save_file({"x": np.zeros((1, 4, 6, 6), dtype=np.float32)}, str(path), metadata={"inputs": inputs})
    result = runner.invoke(main, ["grid", str(path), "--overlay", "-o", str(tmp_path / "g")])
    assert result.exit_code == 0, result.output
    assert (
        result.stderr
        == "Note: x, grace_hopper.jpg: the activation map is 0 everywhere: the photo is drawn without it\n"
    )
    photo_pixels = np.zeros((40, 40, 3), dtype=np.uint8) + 77
    pixels, note = heat_picture(photo_pixels, np.zeros((5, 5)), cmap="inferno", alpha=0.5, what="gradcam")
    assert note == "the gradcam map is 0 everywhere: the photo is drawn without it"
    assert (pixels[:40, :40] == 77).all()  # the photo as it is, not darkened


def test_cam_notes_a_map_that_is_zero_everywhere(runner, tmp_path, photo, monkeypatch):
    import torch

    import hookcli.run.gradients

    monkeypatch.setattr(
        hookcli.run.gradients,
        "class_activation_maps",
        lambda activations, gradients, method="gradcam": torch.zeros(activations.shape[0], *activations.shape[2:]),
    )
    result = runner.invoke(
        main,
        [
            "cam",
            "-m",
            "resnet18",
            "-w",
            "none",
            "--resize",
            "64",
            "--crop",
            "64",
            "-t",
            "3",
            "-o",
            str(tmp_path / "cams"),
            str(photo),
        ],
    )
    assert result.exit_code == 0, result.output
    assert result.stderr == (
        "Note: grace_hopper.jpg, class 3: the gradcam map is 0 everywhere: the photo is drawn without it\n"
    )
    assert _png(tmp_path / "cams" / "00000_grace_hopper.png").shape[1] == 512


def test_a_cam_files_maps_are_one_map_a_row_whatever_their_size():
    cams = np.arange(2 * 4 * 4, dtype=np.float32).reshape(2, 4, 4)
    features = Features({"cam": cams}, {"cam_layer": "layer4"})
    options = GridOptions(plain=True, padding=0, cmap="gray")
    jobs = plan_grids(features, options, None)
    assert len(jobs) == 2 and jobs.notes == ()
    pixels = render_picture(features, jobs[1], options).pixels
    assert pixels.shape == (32, 32, 3)  # one 4 x 4 map enlarged 8 times, not 16 tokens folded to a square
    assert (pixels[::8, ::8, 0] == np.round(np.arange(16).reshape(4, 4) / 15 * 255)).all()
    assert len(plan_grids(Features({"cam": cams}, {}), options, None)) == 2  # elsewhere [4, 4] rows are tokens


def test_overlay_skips_values_that_have_no_place_on_the_photo(runner, tmp_path, photo):
    path = tmp_path / "f.safetensors"
    save_file(
        {"x": np.random.default_rng(0).random((1, 4, 6, 6), dtype=np.float32), "v": np.ones((1, 10), dtype=np.float32)},
        str(path),
        metadata={"inputs": json.dumps([str(photo)])},
    )
    result = runner.invoke(main, ["grid", str(path), "--overlay", "-o", str(tmp_path / "g")])
    assert result.exit_code == 0, result.output
    assert result.stderr == (
        "Note: skipped 'v' (shape [1, 10]): --overlay needs maps laid out like the image, and these values are not\n"
    )
    assert [p.split("/")[-1] for p in result.stdout.split()] == ["x__00000_grace_hopper.overlay.png"]


def test_a_cam_map_has_no_channel_number_and_its_bar_gives_its_range():
    maps = np.arange(16, dtype=np.float32).reshape(1, 4, 4)
    options = GridOptions()
    as_cam = Features({"cam": maps}, {"cam_layer": "layer4"})
    as_channel = Features({"cam": maps[:, None]}, {})
    cam = render_picture(as_cam, plan_grids(as_cam, options, None)[0], options).pixels
    channel = render_picture(as_channel, plan_grids(as_channel, options, None)[0], options).pixels
    band = glyphs(label_size(cam.shape[1] - 4))[1] + 2
    assert channel.shape[0] - cam.shape[0] == band  # the same picture but for the number above the tile


def test_control_characters_in_a_key_are_captioned_escaped_as_info_prints_them(monkeypatch):
    import hookcli.pictures.grids

    captions = []
    monkeypatch.setattr(hookcli.pictures.drawing, "add_title", lambda pixels, parts: captions.append(parts) or pixels)
    features = Features({"a\x1b[31mred": np.ones((1, 2, 3, 3), dtype=np.float32)}, {})
    options = GridOptions()
    render_picture(features, plan_grids(features, options, None)[0], options)
    assert captions[0][:2] == ["a\\x1b[31mred", "row00000"]


@pytest.mark.parametrize(
    "preprocess",
    [
        Preprocess(resize=72, crop=64),
        Preprocess(resize=72, crop=64, interpolation="bicubic"),
        Preprocess(resize=(60, 90), crop=None),
        Preprocess(resize=(60, 90), crop=48),
        Preprocess(resize=80, crop=None, kind="segmentation"),
        Preprocess(resize=None, crop=None, mean=None, std=None, kind="detection"),
        Preprocess(resize=None, crop=56, mean=None, std=None, kind="detection"),
    ],
)
def test_a_cams_photo_made_from_the_models_decode_equals_the_photo_decoded_for_drawing(photo, tmp_path, preprocess):
    """A cam run draws over ModelPhotos' view of the image it decoded for the model; grid --overlay decodes the photo
    on its own (model_photo_scaled). Both give the same pixels, for photos larger than the reduced decode too."""
    source = Image.open(photo)
    large_turned = tmp_path / "large-turned.jpg"
    exif = Image.Exif()
    exif[0x0112] = 6
    source.resize((4403, 3001)).save(large_turned, exif=exif, quality=80)
    palette = tmp_path / "palette.png"
    source.resize((90, 70)).convert("P").save(palette, transparency=3)
    wide_gray = tmp_path / "gray16.png"
    Image.fromarray(np.asarray(source.convert("L").resize((70, 50)), dtype=np.uint16) * 257).save(wide_gray)
    for path in (photo, large_turned, palette, wide_gray):
        image, (view, scale) = load_with_picture(path, ModelPhotos(preprocess))
        expected_view, expected_scale = model_photo_scaled(path, preprocess)
        assert np.array_equal(view, expected_view) and scale == expected_scale, path
        assert np.array_equal(np.asarray(image), np.asarray(load_rgb(path))), path  # the model's image is untouched
