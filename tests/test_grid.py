"""hookcli grid: pixels at documented positions, shapes, dtypes, overlays, stdin and errors."""

import json

import numpy as np
import pytest
import torch
from matplotlib import colormaps
from PIL import Image
from safetensors.torch import save, save_file

from hookcli.cli import main
from hookcli.pictures.render import NAN_COLOR, as_maps, overlay, scale_maps, tile_maps

PLAIN = ["--plain", "--padding", "1", "--cmap", "gray"]


def _png(path):
    return np.asarray(Image.open(path).convert("RGB"))


def _save(path, tensors, inputs=None):
    metadata = {"inputs": json.dumps([str(p) for p in inputs])} if inputs else None
    save_file(tensors, str(path), metadata=metadata)
    return path


def _grid(runner, *args, input=None):
    result = runner.invoke(main, ["grid", *map(str, args)], input=input)
    assert result.exit_code == 0, result.output
    return result.stdout.splitlines()


def _channel_k_is_k(channels=4, size=7):
    return torch.arange(channels, dtype=torch.float32)[None, :, None, None].expand(1, channels, size, size).clone()


def test_constant_channels_come_out_in_channel_order_at_their_tiles(runner, tmp_path):
    source = _save(tmp_path / "f.safetensors", {"feat": _channel_k_is_k()})
    [written] = _grid(
        runner, source, "-o", tmp_path / "g", "--scale", "grid", "--columns", "2", "--min-tile", "7", *PLAIN
    )
    assert written == str(tmp_path / "g" / "feat__00000_row00000.png")
    pixels = _png(written)
    assert pixels.shape == (1 + 2 * 8, 1 + 2 * 8, 3)  # 2×2 tiles of 7 px, 1 px padding around each
    for k, expected in enumerate([0, 85, 170, 255]):
        row, col = divmod(k, 2)
        tile = pixels[1 + row * 8 : 1 + row * 8 + 7, 1 + col * 8 : 1 + col * 8 + 7]
        assert (tile == expected).all(), k
    assert (pixels[0] == 255).all() and (pixels[:, 8] == 255).all()  # padding lines


def test_viridis_tiles_are_matplotlibs_colours_in_order(runner, tmp_path):
    source = _save(tmp_path / "f.safetensors", {"feat": _channel_k_is_k()})
    [written] = _grid(
        runner,
        source,
        "-o",
        tmp_path / "g",
        "--scale",
        "grid",
        "--columns",
        "4",
        "--min-tile",
        "7",
        "--plain",
        "--padding",
        "0",
    )
    pixels = _png(written)
    expected = np.round(colormaps["viridis"](np.linspace(0, 1, 256))[[0, 85, 170, 255], :3] * 255)
    assert [pixels[3, 7 * k + 3].tolist() for k in range(4)] == expected.astype(int).tolist()


def test_a_constant_channel_is_drawn_not_nan_and_nan_is_marked():
    maps = np.stack([np.full((3, 3), 5.0), np.array([[0, np.nan, 1], [2, np.inf, -np.inf], [1, 1, 1]])])
    scaled = scale_maps(maps.astype(np.float32), "channel")
    assert (scaled[0] == 0).all()
    assert scaled[1, 0, 0] == 0 and scaled[1, 1, 0] == 1 and scaled[1, 1, 1] == 1 and scaled[1, 1, 2] == 0
    assert np.isnan(scaled[1, 0, 1]) and np.isnan(scaled).sum() == 1
    pixels = tile_maps(scaled, columns=2, padding=0, cmap="gray", min_tile=3)
    assert pixels[0, 4].tolist() == list(NAN_COLOR)
    assert (pixels[:, :3] == 0).all()


def test_upscaling_keeps_the_map_shape(runner, tmp_path):
    checker = (np.indices((7, 7)).sum(axis=0) % 2).astype(np.float32)
    source = _save(tmp_path / "f.safetensors", {"feat": torch.from_numpy(checker)[None, None]})
    [written] = _grid(
        runner, source, "-o", tmp_path / "g", "--min-tile", "32", "--padding", "0", "--plain", "--cmap", "gray"
    )
    pixels = _png(written)[..., 0]
    assert pixels.shape == (35, 35)  # 7 × 5: the smallest whole factor reaching 32
    assert (pixels.reshape(7, 5, 7, 5) == (checker * 255).astype(np.uint8)[:, None, :, None]).all()


@pytest.mark.parametrize("tokens, layout", [(197, "tokens+cls"), (196, "tokens")])
def test_vit_token_maps_come_out_square(runner, tmp_path, tokens, layout):
    values = torch.zeros(2, tokens, 8)
    values[:, tokens - 196 :, 0] = torch.arange(196.0)
    if tokens == 197:
        values[:, 0, 0] = -1000.0  # the class token must not reach the map
    assert as_maps(values[0].numpy())[1] == layout
    source = _save(tmp_path / "f.safetensors", {"encoder.ln": values})
    [written] = _grid(runner, source, "-o", tmp_path / "g", "-i", "1", "--channels", "0", "--min-tile", "14", *PLAIN)
    pixels = _png(written)[..., 0]
    assert pixels.shape == (16, 16)
    square = pixels[1:15, 1:15]
    expected = np.round(np.arange(196).reshape(14, 14) / 195 * 255)
    assert (square == expected).all()


def test_vectors_are_strips_and_half_floats_read_fine(runner, tmp_path):
    vector = torch.linspace(0, 1, 100)[None].repeat(2, 1)
    source = _save(tmp_path / "f.safetensors", {"half": vector.half(), "brain": vector.bfloat16(), "full": vector})
    written = _grid(
        runner,
        source,
        "-o",
        tmp_path / "g",
        "-i",
        "0",
        "--min-tile",
        "20",
        "--padding",
        "0",
        "--plain",
        "--cmap",
        "gray",
    )
    assert sorted(p.split("/")[-1] for p in written) == [
        "brain__00000_row00000.png",
        "full__00000_row00000.png",
        "half__00000_row00000.png",
    ]
    full = _png(tmp_path / "g" / "full__00000_row00000.png")
    assert full.shape == (1 + 28 + 2 + 1, 1 + 100 * 7 + 1, 3)  # one line of 100 cells, 7 px each, under 768 px
    assert (full[1:29, 1:701:7, 0] == np.round(np.linspace(0, 1, 100) * 255)).all()
    assert (full[1:29, 1:701, 0] == full[1:29, 1:701:7, 0].repeat(7, axis=1)).all()
    for name in ("half", "brain"):
        assert np.abs(_png(tmp_path / "g" / f"{name}__00000_row00000.png").astype(int) - full).max() <= 1


def test_an_undrawable_tensor_is_skipped_with_a_note(runner, tmp_path):
    source = _save(tmp_path / "f.safetensors", {"ok": torch.ones(1, 2, 3, 3), "odd": torch.ones(1, 2, 2, 2, 2, 2)})
    result = runner.invoke(main, ["grid", str(source), "-o", str(tmp_path / "g")])
    assert result.exit_code == 0
    assert result.stdout == f"{tmp_path / 'g' / 'ok__00000_row00000.png'}\n"
    assert result.stderr == "Note: skipped 'odd' (shape [1, 2, 2, 2, 2, 2]): 5 dimensions per image\n"


def test_top_channels_by_mean_and_channel_ranges(runner, tmp_path):
    feat = _channel_k_is_k(channels=6)
    feat[0, 2] = 100.0  # the largest mean
    source = _save(tmp_path / "f.safetensors", {"feat": feat})
    [top] = _grid(
        runner,
        source,
        "-o",
        tmp_path / "top",
        "--top",
        "2",
        "--scale",
        "grid",
        "--columns",
        "2",
        "--min-tile",
        "7",
        *PLAIN,
    )
    pixels = _png(top)[..., 0]
    assert pixels.shape == (9, 17)
    assert pixels[4, 4] == 255 and pixels[4, 12] == 0  # channel 2 (100) first, then channel 5 (5): range 5…100
    [ranged] = _grid(
        runner, source, "-o", tmp_path / "ranged", "--channels", "3:5", "--scale", "grid", "--min-tile", "7", *PLAIN
    )
    pixels = _png(ranged)[..., 0]
    assert pixels.shape == (9, 17) and pixels[4, 4] == 0 and pixels[4, 12] == 255


def test_keys_images_and_names(runner, tmp_path, images):
    tensors = {
        "layer1.0.relu:0": torch.rand(3, 2, 4, 4),
        "layer1.0.relu:1": torch.rand(3, 2, 4, 4),
        "fc": torch.rand(3, 10),
    }
    source = _save(tmp_path / "f.safetensors", tensors, inputs=images)
    written = _grid(runner, source, "-o", tmp_path / "g", "-k", "layer1.0.relu:*", "-i", "c.png", "-i", "0")
    assert [p.split("/")[-1] for p in written] == [
        "layer1.0.relu_0__00002_c.png",
        "layer1.0.relu_0__00000_a.png",
        "layer1.0.relu_1__00002_c.png",
        "layer1.0.relu_1__00000_a.png",
    ]


def test_overlay_is_brighter_where_the_map_is_high(tmp_path):
    photo = np.full((64, 64, 3), 128, dtype=np.uint8)
    heat = np.zeros((8, 8), dtype=np.float32)
    heat[:4, :4] = 1.0
    blended = overlay(photo, heat, alpha=0.6).astype(float).mean(axis=2)
    assert blended[:24, :24].mean() > blended[40:, 40:].mean() + 80


def test_overlay_from_a_hookcli_file_uses_the_models_view_of_the_input(runner, resnet18_args, tmp_path, photo):
    out = tmp_path / "f.safetensors"
    result = runner.invoke(
        main,
        resnet18_args("extract", "-l", "layer1", "--resize", "64", "--crop", "48", "-o", str(out), str(photo)),
    )
    assert result.exit_code == 0, result.output
    [written] = _grid(runner, out, "-o", tmp_path / "g", "--overlay", "--plain")
    assert written.endswith("layer1__00000_grace_hopper.overlay.png")
    assert _png(written).shape == (48, 48, 3)


def test_extract_output_piped_into_grid_on_stdin(runner, resnet18_args, tmp_path, images):
    result = runner.invoke(
        main,
        resnet18_args("extract", "-l", "layer2", "--resize", "32", "--crop", "32", "-o", "-", *map(str, images[:2])),
    )
    assert result.exit_code == 0
    written = _grid(runner, "-", "-o", tmp_path / "g", input=result.stdout_bytes)
    assert [p.split("/")[-1] for p in written] == ["layer2__00000_a.png", "layer2__00001_b.png"]
    assert _png(written[0]).shape[1] > 300  # 128 channels of 4×4 maps, enlarged to 32 px tiles


def test_extract_grid_option_renders_right_after(runner, resnet18_args, tmp_path, images):
    out = tmp_path / "f.safetensors"
    result = runner.invoke(
        main,
        resnet18_args(
            "extract",
            "-l",
            "layer4",
            "--resize",
            "32",
            "--crop",
            "32",
            "-o",
            str(out),
            "--grid",
            str(tmp_path / "g"),
            str(images[0]),
        ),
    )
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [str(out), str(tmp_path / "g" / "layer4__00000_a.png")]


def test_extract_grid_refuses_drawn_pictures_before_any_work(
    runner, resnet18_args, one_error, tmp_path, images, no_model
):
    (tmp_path / "g").mkdir()
    (tmp_path / "g" / "layer4__00000_a.png").write_bytes(b"drawn before")
    (tmp_path / "g" / "other__00000_a.png").write_bytes(b"another layer's")
    result = runner.invoke(
        main,
        resnet18_args(
            "extract",
            "-l",
            "layer4",
            "-o",
            str(tmp_path / "f.safetensors"),
            "--grid",
            str(tmp_path / "g"),
            str(images[0]),
        ),
    )
    assert one_error(result, 2) == (
        f"Error: --grid folder '{tmp_path / 'g'}' already holds pictures of these layers "
        "('layer4__00000_a.png'). Hint: add --force to draw them again, or give another "
        "--grid folder"
    )
    assert not (tmp_path / "f.safetensors").exists()


def test_file_errors(runner, one_error, tmp_path):
    good = _save(tmp_path / "good.safetensors", {"feat": torch.ones(2, 3, 4, 4)})
    data = good.read_bytes()
    (tmp_path / "cut.safetensors").write_bytes(data[:-10])
    (tmp_path / "empty.safetensors").write_bytes(b"")
    (tmp_path / "text.safetensors").write_text("hello, these are not tensors")
    out = ["-o", str(tmp_path / "g")]
    cases = [
        (
            "cut.safetensors",
            f"Error: '{tmp_path / 'cut.safetensors'}' is truncated: tensor 'feat' ends at byte "
            f"{len(data)} but the file has {len(data) - 10}. Hint: the file was cut short; write it again",
        ),
        (
            "empty.safetensors",
            f"Error: '{tmp_path / 'empty.safetensors'}' is empty. Hint: it holds no safetensors data",
        ),
        (
            "text.safetensors",
            f"Error: '{tmp_path / 'text.safetensors'}' is not a safetensors file. Hint: its first 8 "
            "bytes do not give a header length that fits the file",
        ),
        ("missing.safetensors", f"Error: no such file: '{tmp_path / 'missing.safetensors'}'. Hint: check the path"),
    ]
    for name, message in cases:
        for command in ("grid", "info"):
            args = [command, str(tmp_path / name)] + (out if command == "grid" else [])
            assert one_error(runner.invoke(main, args), 2) == message
    assert not (tmp_path / "g").exists()


def test_selection_errors_and_existing_pngs(runner, one_error, tmp_path):
    source = _save(tmp_path / "f.safetensors", {"feat": torch.ones(2, 3, 4, 4), "feet": torch.ones(2, 5)})
    out = ["-o", str(tmp_path / "g")]
    assert one_error(runner.invoke(main, ["grid", str(source), *out, "-k", "fat"]), 2) == (
        f"Error: no tensor 'fat' in '{source}' (closest: feat, feet). Hint: 'hookcli info' lists the keys"
    )
    assert one_error(runner.invoke(main, ["grid", str(source), *out, "-k", "fe*.x"]), 2) == (
        f"Error: no tensor 'fe*.x' in '{source}' (closest: feet, feat). Hint: 'hookcli info' lists the keys; * matches "
        "within one dot-separated name, ** across dots"
    )
    assert one_error(runner.invoke(main, ["grid", str(source), *out, "-i", "2"]), 2) == (
        "Error: image index 2 is out of range: the file has 2 images. Hint: use 0 to 1, or an input file name"
    )
    assert one_error(runner.invoke(main, ["grid", str(source), *out, "--cmap", "viridiss"]), 2).startswith(
        "Error: unknown colormap 'viridiss' (closest: viridis"
    )
    assert one_error(runner.invoke(main, ["grid", str(source), *out, "--overlay"]), 2) == (
        f"Error: --overlay needs the input images, and '{source}' does not list them. Hint: overlays work on files "
        "written by hookcli extract, whose 'inputs' metadata names the images"
    )
    assert not (tmp_path / "g").exists()
    first = _grid(runner, source, *out, "-k", "feat", "-i", "1")
    before = (tmp_path / "g" / "feat__00001_row00001.png").read_bytes()
    assert one_error(runner.invoke(main, ["grid", str(source), *out]), 2) == (
        f"Error: '{first[0]}' already exists. Hint: add --force to overwrite, or choose another folder with -o"
    )
    assert sorted(p.name for p in (tmp_path / "g").iterdir()) == ["feat__00001_row00001.png"]
    assert (tmp_path / "g" / "feat__00001_row00001.png").read_bytes() == before
    assert len(_grid(runner, source, *out, "--force")) == 4


def test_info_json_stats_and_stdin(runner, tmp_path):
    tensors = {"a": torch.tensor([[0.0, 1.0], [2.0, float("nan")]]), "b": torch.zeros(2, 3, dtype=torch.bfloat16)}
    data = save(tensors, metadata={"format": "1", "layers": json.dumps({"x": {"keys": ["b", "a"]}})})
    result = runner.invoke(main, ["info", "-", "--json"], input=data)
    assert result.exit_code == 0, result.output
    described = json.loads(result.stdout)
    assert described["file"] == "stdin" and described["bytes"] == len(data)
    assert described["metadata"] == {"format": "1", "layers": {"x": {"keys": ["b", "a"]}}}
    assert described["tensors"] == [
        {
            "key": "b",
            "dtype": "BF16",
            "shape": [2, 3],
            "bytes": 12,
            "stats": {"min": 0.0, "mean": 0.0, "max": 0.0, "zeros": 1.0, "nonfinite": 0},
        },
        {
            "key": "a",
            "dtype": "F32",
            "shape": [2, 2],
            "bytes": 16,
            "stats": {"min": 0.0, "mean": 1.0, "max": 2.0, "zeros": 0.25, "nonfinite": 1},
        },
    ]


def test_info_text(runner, tmp_path):
    source = _save(tmp_path / "f.safetensors", {"feat": torch.tensor([[-1.0, 0.0, 3.0, 2.0]])}, inputs=["x.jpg"])
    result = runner.invoke(main, ["info", str(source)])
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [
        f"{source}  {source.stat().st_size} B  1 tensor",
        "key   dtype  shape  size  min  mean  max  zeros  nan/inf",
        "feat  F32    [1,4]  16 B   -1     1    3  25.0%        0",
        "metadata:",
        "  inputs: (1)",
        "    x.jpg",
    ]


def test_images_are_chosen_by_range_too_in_the_order_given(runner, tmp_path):
    source = _save(
        tmp_path / "f.safetensors", {"feat": torch.zeros(6, 2, 3, 3)}, inputs=[f"/p/{n}.jpg" for n in "abcdef"]
    )
    written = _grid(runner, source, "-o", tmp_path / "g", "-i", "e", "-i", "1:3", "-i", "2", *PLAIN)
    assert [p.split("/")[-1] for p in written] == ["feat__00004_e.png", "feat__00001_b.png", "feat__00002_c.png"]
    written = _grid(runner, source, "-o", tmp_path / "h", "-i", "-2:", *PLAIN)
    assert [p.split("/")[-1] for p in written] == ["feat__00004_e.png", "feat__00005_f.png"]
    result = runner.invoke(main, ["grid", str(source), "-i", "4:2", "-o", str(tmp_path / "k")])
    assert result.exit_code == 2
    assert result.stderr == (
        "Error: image range '4:2' selects no images: the file has 6 images. "
        "Hint: A:B takes rows A to B-1, as a Python slice does; the rows are 0 to 5\n"
    )


def test_channels_given_twice_are_refused_rather_than_the_first_left_out(runner, tmp_path):
    path = tmp_path / "maps.safetensors"
    save_file({"maps": torch.rand(1, 64, 4, 4)}, str(path))
    args = ["grid", str(path), "-o", str(tmp_path / "out")]
    twice = runner.invoke(main, [*args, "--channels", "16", "--channels", "40:45"])
    assert (twice.exit_code, twice.stderr) == (
        2,
        "Error: invalid channels: given 2 times (16, 40:45); give one range A:B or one channel K. Hint: see --help for "
        "the values each option takes\n",
    )
    assert not (tmp_path / "out").exists()
    once = runner.invoke(main, [*args, "--channels", "40:45"])
    assert once.exit_code == 0 and once.stdout == f"{tmp_path / 'out' / 'maps__00000_row00000.png'}\n", once.output


def test_a_file_hookcli_did_not_write_says_how_its_many_pictures_were_read(tmp_path):
    from hookcli.options.grid import GridOptions
    from hookcli.pictures.grids import FOREIGN_PICTURES, plan_grids
    from hookcli.storage.shards import open_features

    checkpoint = _save(
        tmp_path / "weights.safetensors", {f"block{k}.weight": torch.ones(30, 2, 3, 3) for k in range(3)}
    )
    with open_features(checkpoint) as features:
        assert plan_grids(features, GridOptions(), None).notes == (
            f"'{checkpoint}' was not written by hookcli: each tensor's first dimension is read as its images, "
            "90 pictures of 3 tensors; -k chooses tensors, -i images",
        )
        assert plan_grids(features, GridOptions(keys=("block0.weight",)), None).notes == ()
        assert plan_grids(features, GridOptions(images="0:21"), None).notes == ()  # 63 pictures: few enough
    assert FOREIGN_PICTURES == 64
