"""Pictures of video clips ([C, T, H, W] per row: channels by frames, or one --frame) and of optical-flow fields
(colour-coded, with a colour wheel), through the library and the command line."""

import numpy as np
import pytest
import torch
from PIL import Image

from hookcli.cli import main
from hookcli.errors import UsageProblem
from hookcli.options.grid import GridOptions
from hookcli.pictures.drawing import render_picture
from hookcli.pictures.flow import FLOW_NAN_COLOR, flow_colours, flow_wheel
from hookcli.pictures.grids import plan_grids
from hookcli.pictures.render import map_layout
from hookcli.storage.features import Features
from hookcli.storage.saving import write_safetensors

PLAIN = ["--plain", "--padding", "1", "--cmap", "gray", "--scale", "grid"]
FLOW = {"family": "optical_flow"}


def _png(path):
    return np.asarray(Image.open(path).convert("RGB"))


def _grid(runner, *args):
    result = runner.invoke(main, ["grid", *map(str, args)])
    assert result.exit_code == 0, result.output
    return result


def _clip(channels=8, frames=4, size=6):
    """Channel k, frame t is 4k + t everywhere: each tile's value says where it belongs."""
    values = torch.arange(channels * frames, dtype=torch.float32).reshape(1, channels, frames, 1, 1)
    return values.expand(1, channels, frames, size, size).clone()


def _picture(tensors, metadata=None, **options):
    features = Features(tensors, metadata or {})
    drawing = GridOptions(**options)
    plan = plan_grids(features, drawing, None)
    return render_picture(features, plan[0], drawing), plan.notes


def _captions(monkeypatch):
    import hookcli.pictures.grids

    captions = []
    monkeypatch.setattr(hookcli.pictures.drawing, "add_title", lambda pixels, parts: captions.append(parts) or pixels)
    return captions


# -- video clips -------------------------------------------------------------------------------------


def test_clip_shapes_have_their_layouts():
    assert map_layout([8, 4, 6, 6]) == (8, 6, 6, "frames")
    assert map_layout([8, 4, 1, 1]) == (8, 1, 1, "pooled-frames")
    assert map_layout([8, 1, 6, 6]) == (8, 6, 6, "channels")  # one frame is drawn as that frame
    assert map_layout([512, 1, 1, 1]) == (512, 1, 1, "pooled")  # r3d_18's avgpool: a strip


def test_a_clip_is_a_row_of_frames_per_channel(runner, tmp_path):
    write_safetensors({"clip": _clip()}, {}, tmp_path / "f.safetensors")
    written = _grid(runner, tmp_path / "f.safetensors", "-o", tmp_path / "g", "--min-tile", "6", *PLAIN).stdout
    pixels = _png(written.strip())
    assert pixels.shape == (1 + 8 * 7, 1 + 4 * 7, 3)  # 8 channels x 4 frames of 6 px, 1 px apart
    for channel in range(8):
        for frame in range(4):
            top, left = 1 + channel * 7, 1 + frame * 7
            tile = pixels[top : top + 6, left : left + 6]
            assert (tile == round((4 * channel + frame) / 31 * 255)).all(), (channel, frame)
    assert (pixels[0] == 255).all() and (pixels[:, 7] == 255).all()  # padding lines


def test_a_clip_picture_numbers_its_rows_and_columns_and_says_which_is_which(monkeypatch):
    from hookcli.pictures.render import frame_layout
    from hookcli.pictures.text import _label_bitmap, glyphs, label_size

    captions = _captions(monkeypatch)
    picture, notes = _picture({"clip": _clip().numpy()}, min_tile=6, padding=1)
    layout = frame_layout(8, 4, 6, 6, padding=1, min_tile=6, labels=list(range(8)), min_width=384)
    tile = 6 * layout.factor
    assert layout.header == glyphs(label_size(tile))[1] + 2 and layout.margin > 0
    assert layout.factor == 16  # enlarged until at least 384 px wide (4 frames of 96 px)
    size = label_size(tile)
    for frame in range(4):
        bitmap = _label_bitmap(str(frame), size)
        left = layout.margin + 1 + frame * (tile + 1) + 1
        assert (picture.pixels[1 : 1 + bitmap.shape[0], left : left + bitmap.shape[1], 0] == bitmap).all()
    for channel in (0, 7):
        bitmap = _label_bitmap(str(channel), size)
        top = layout.header + 1 + channel * (tile + 1) + 1
        assert (picture.pixels[top : top + bitmap.shape[0], 2 : 2 + bitmap.shape[1], 0] == bitmap).all()
    assert captions == [["clip", "row00000", "[8, 4, 6, 6]", "channels 0-7", "rows: channels, columns: frames 0-3"]]
    assert notes == ()


def test_a_narrow_clips_legend_is_wrapped_whole_under_its_colour_bar():
    from PIL import ImageDraw

    from hookcli.pictures.text import caption_font

    clip = np.random.default_rng(0).random((1, 256, 4, 14, 14), dtype=np.float32)  # r3d_18's layer3, 16 frames
    pixels = _picture({"clip": clip})[0].pixels
    assert pixels.shape[1] == 209  # two labels and the shortest bar: no room beside it for the words
    font = caption_font(209)
    step = font.getbbox("Ag")[3] + 4
    lines = ["each channel scaled to its own", "range over its frames"]
    expected = Image.new("RGB", (209, 2 * step + 2), (255, 255, 255))  # the lines, and 6 pixels under them
    for number, line in enumerate(lines):
        ImageDraw.Draw(expected).text((6, number * step), line, fill=(60, 60, 60), font=font)
    assert np.array_equal(pixels[-2 * step - 2 :], np.asarray(expected))


def test_each_channel_is_scaled_over_all_its_frames():
    clip = _clip(channels=2, frames=3, size=2).numpy()
    picture, _ = _picture({"clip": clip}, plain=True, padding=0, min_tile=2, cmap="gray")
    assert picture.pixels[::2, ::2, 0].tolist() == [[0, 128, 255], [0, 128, 255]]  # 0 1 2 and 4 5 6


def test_frame_2_is_drawn_as_the_channel_maps_of_that_frame(runner, tmp_path):
    clip = torch.rand(1, 8, 4, 6, 6, generator=torch.Generator().manual_seed(0))
    for options in ({"plain": True}, {"title": False}, {"top": 3, "title": False}, {"channels": "2:7", "title": False}):
        framed, _ = _picture({"clip": clip}, frame=2, **options)
        sliced, _ = _picture({"clip": clip[:, :, 2]}, **options)
        assert np.array_equal(framed.pixels, sliced.pixels), options
    write_safetensors({"clip": clip}, {}, tmp_path / "clip.safetensors")
    write_safetensors({"clip": clip[:, :, 2].contiguous()}, {}, tmp_path / "frame.safetensors")
    one = _grid(
        runner, tmp_path / "clip.safetensors", "--frame", "2", "--channels", "3:6", "--plain", "-o", tmp_path / "a"
    ).stdout.strip()
    other = _grid(
        runner, tmp_path / "frame.safetensors", "--channels", "3:6", "--plain", "-o", tmp_path / "b"
    ).stdout.strip()
    assert np.array_equal(_png(one), _png(other))


def test_the_caption_names_the_frame(monkeypatch):
    captions = _captions(monkeypatch)
    _picture({"clip": _clip().numpy()}, frame=3)
    assert captions[0][2:] == ["[8, 4, 6, 6]", "channels 0-7", "frame 3 of 4 frames (0-3)"]


def test_a_frame_past_the_clip_names_the_frames_there_are(runner, tmp_path):
    source = tmp_path / "f.safetensors"
    write_safetensors({"clip": _clip(), "short": _clip(frames=2)[:, :3]}, {}, source)
    result = _grid(runner, source, "--frame", "3", "-o", tmp_path / "g")
    assert (
        result.stderr == "Note: skipped 'short' (shape [1, 3, 2, 6, 6]): --frame 3 is out of range: it has "
        "2 frames (0-1)\n"
    )
    assert result.stdout == f"{tmp_path / 'g' / 'clip.frame3__00000_row00000.png'}\n"
    result = runner.invoke(main, ["grid", str(source), "--frame", "4", "-o", str(tmp_path / "h")])
    assert result.exit_code == 2
    assert result.output == (
        f"Error: nothing to draw in '{source}': 'clip' (shape [1, 8, 4, 6, 6]): --frame 4 is out of range: it has 4 "
        "frames (0-3); 'short' (shape [1, 3, 2, 6, 6]): --frame 4 is out of range: it has 2 frames (0-1). Hint: "
        "'hookcli info' shows the shapes; choose other tensors (-k) or channels\n"
    )
    assert not (tmp_path / "h").exists()
    result = runner.invoke(main, ["grid", str(source), "--frame", "-1"])
    assert result.exit_code == 2 and "'--frame': -1 is not in the range x>=0" in result.output
    with pytest.raises(UsageProblem, match="frame must be a whole number of at least 0, not -1"):
        GridOptions(frame=-1)


def test_frame_without_clips_draws_as_usual_and_says_it_chose_nothing(runner, tmp_path):
    source = tmp_path / "f.safetensors"
    write_safetensors({"x": torch.ones(1, 3, 5, 5)}, {}, source)
    result = _grid(runner, source, "--frame", "1", "-o", tmp_path / "g")
    assert result.stderr == (
        "Note: --frame 1 chooses a frame of video clips ([C, T, H, W] per row), and none of the tensors has them\n"
    )
    assert len(result.stdout.splitlines()) == 1


def test_a_clip_of_one_frame_is_that_frame():
    clip = torch.rand(1, 5, 1, 6, 6, generator=torch.Generator().manual_seed(1))
    whole, _ = _picture({"clip": clip}, title=False)
    frame, _ = _picture({"clip": clip[:, :, 0]}, title=False)
    assert np.array_equal(whole.pixels, frame.pixels)


def test_pooled_clips_are_a_table_of_channels_by_frames():
    values = torch.arange(3, dtype=torch.float32)[None] * torch.arange(1, 6, dtype=torch.float32)[:, None]
    picture, _ = _picture({"pooled": values.reshape(1, 5, 3, 1, 1)}, plain=True, min_tile=4, cmap="gray")
    assert picture.pixels.shape == (5 * 4, 3 * 4, 3)  # one cell of 4 px per value, no padding between
    assert (picture.pixels[::4, ::4, 0] == [0, 128, 255]).all()  # each channel over its own range


def test_wide_clips_draw_their_first_64_channels(runner, tmp_path):
    source = tmp_path / "f.safetensors"
    write_safetensors({"wide": torch.zeros(1, 100, 2, 3, 3)}, {}, source)
    result = _grid(runner, source, "--plain", "--padding", "0", "--min-tile", "3", "-o", tmp_path / "g")
    assert result.stderr.startswith("Note: 'wide': drew channels 0-63 of 100; --channels 64:128 draws the next 64")
    assert Image.open(result.stdout.strip()).size == (2 * 3, 64 * 3)


def test_overlay_skips_clips_with_a_note(runner, tmp_path, photo):
    source = tmp_path / "f.safetensors"
    write_safetensors({"clip": _clip(), "x": torch.rand(1, 4, 6, 6)}, {"inputs": f'["{photo}"]'}, source)
    result = _grid(runner, source, "--overlay", "-o", tmp_path / "g")
    assert result.stderr == (
        "Note: skipped 'clip' (shape [1, 8, 4, 6, 6]): --overlay needs the photo the model saw, "
        "and a video clip's frames are not kept\n"
    )
    assert [p.split("/")[-1] for p in result.stdout.split()] == ["x__00000_grace_hopper.overlay.png"]


# -- optical flow --------------------------------------------------------------------------------------


def _flow(dx, dy):
    return np.array([[[dx]], [[dy]]], dtype=np.float32)


@pytest.mark.parametrize(
    "dx, dy, colour",
    [
        (1, 0, (255, 0, 0)),  # right: the wheel's first hue, red
        (0, 1, (255, 229, 0)),  # down (y runs down the picture): between wheel hues 13 and 14
        (-1, 0, (0, 209, 255)),  # left: hue 27, (0, 255 - floor(2 * 255 / 11), 255)
        (0, -1, (88, 0, 255)),  # up: between hues 40 and 41
        (1, -0.0, (255, 0, 0)),  # a negative zero does not move right to the wheel's far end
    ],
)
def test_flow_colours_at_the_four_directions(dx, dy, colour):
    assert flow_colours(_flow(dx, dy))[0, 0].tolist() == list(colour)


def test_length_goes_from_white_to_full_colour_and_nan_is_black():
    flow = np.array([[[4.0, 2.0, 0.0, np.nan, 1.0]], [[0.0, 0.0, 0.0, 0.0, np.inf]]])
    assert flow_colours(flow)[0].tolist() == [
        [255, 0, 0],
        [255, 127, 127],
        [255, 255, 255],
        list(FLOW_NAN_COLOR),
        list(FLOW_NAN_COLOR),
    ]
    assert flow_colours(np.zeros((2, 3, 3))).min() == 255  # no motion: white, not a division by zero


def test_flow_colours_match_torchvisions_flow_to_image():
    from torchvision.utils import flow_to_image

    flow = torch.randn(2, 40, 50, generator=torch.Generator().manual_seed(0)) * 7
    theirs = flow_to_image(flow).permute(1, 2, 0).numpy().astype(int)
    assert np.abs(flow_colours(flow.numpy()).astype(int) - theirs).max() <= 1  # they add an epsilon to the length


def test_the_wheel_is_full_colour_on_its_rim_and_white_at_its_centre_and_around_it():
    wheel = flow_wheel(33)
    assert wheel[16, 16].tolist() == [255, 255, 255]
    assert wheel[16, 32].tolist() == [255, 0, 0] and wheel[32, 16].tolist() == [255, 229, 0]
    assert wheel[0, 0].tolist() == [255, 255, 255]


def test_a_flow_file_draws_flow_fields_in_colour_and_plain_is_just_the_field(runner, tmp_path):
    rng = np.random.default_rng(0)
    flow = rng.normal(size=(1, 2, 8, 10)).astype(np.float32)
    source = tmp_path / "flow.safetensors"
    write_safetensors({"flow": torch.from_numpy(flow), "fmap": torch.rand(1, 2, 8, 10)}, FLOW, source)
    result = _grid(runner, source, "-k", "flow", "--plain", "-o", tmp_path / "g")
    assert result.stderr == ""
    expected = flow_colours(flow[0]).repeat(4, axis=0).repeat(4, axis=1)  # 10 px enlarged 4 times to pass 32
    assert np.array_equal(_png(result.stdout.strip()), expected)
    drawn = _png(_grid(runner, source, "-k", "flow", "-o", tmp_path / "full").stdout.strip())
    assert drawn.shape[1] >= 384 and drawn.shape[0] > 384 * 8 // 10  # enlarged, with a caption and a wheel


def test_flow_needs_the_family_and_two_channels(runner, tmp_path):
    flow = torch.rand(1, 2, 6, 6)
    as_flow, _ = _picture({"flow": flow}, FLOW, plain=True)
    assert as_flow.pixels.shape == (36, 36, 3)  # one field, no padding
    for metadata, options in ((FLOW, {"flow_as_channels": True}), ({"family": "classification"}, {}), ({}, {})):
        picture, _ = _picture({"flow": flow}, metadata, plain=True, **options)
        assert picture.pixels.shape == (2 + 38, 2 + 2 * 38, 3)  # two channel tiles of 36 px
    three, _ = _picture({"x": torch.rand(1, 3, 6, 6)}, FLOW, plain=True)
    assert three.pixels.shape == (2 + 38, 2 + 3 * 38, 3)
    source = tmp_path / "f.safetensors"
    write_safetensors({"flow": flow}, FLOW, source)
    result = _grid(runner, source, "--flow-as-channels", "--plain", "-o", tmp_path / "g")
    assert _png(result.stdout.strip()).shape == (2 + 38, 2 + 2 * 38, 3)


def test_the_caption_gives_the_longest_vector(monkeypatch):
    captions = _captions(monkeypatch)
    flow = np.zeros((1, 2, 4, 4), dtype=np.float32)
    flow[0, :, 1, 2] = (3.0, -4.0)
    picture, notes = _picture({"flow": flow}, FLOW)
    assert captions == [["flow", "row00000", "[2, 4, 4]", "optical flow", "longest vector 5 px"]]
    assert picture.notes == () and notes == ()


def test_a_still_flow_field_is_white_with_a_note(runner, tmp_path):
    source = tmp_path / "f.safetensors"
    write_safetensors({"flow": torch.zeros(1, 2, 6, 6)}, FLOW, source)
    result = _grid(runner, source, "--plain", "-o", tmp_path / "g")
    assert result.stderr == "Note: flow, row00000: the flow field is 0 everywhere (nothing moves): drawn white\n"
    assert (_png(result.stdout.strip()) == 255).all()
    picture, _ = _picture({"flow": torch.full((1, 2, 3, 3), float("nan"))}, FLOW, plain=True)
    assert picture.notes == ("flow, row00000: the flow field has no finite values: drawn black",)
    assert (picture.pixels == 0).all()


def test_overlay_skips_flow_fields_with_a_note(runner, tmp_path, photo):
    source = tmp_path / "f.safetensors"
    write_safetensors(
        {"flow": torch.rand(1, 2, 6, 6), "x": torch.rand(1, 4, 6, 6)}, {**FLOW, "inputs": f'["{photo}"]'}, source
    )
    result = _grid(runner, source, "--overlay", "-o", tmp_path / "g")
    assert result.stderr == (
        "Note: skipped 'flow' (shape [1, 2, 6, 6]): --overlay does not draw optical-flow "
        "fields (--flow-as-channels draws dx and dy as maps)\n"
    )


def test_report_draws_clips_and_flows_with_grids_options(runner, tmp_path):
    source = tmp_path / "f.safetensors"
    write_safetensors({"clip": _clip()}, {}, source)
    flows = tmp_path / "flows.safetensors"
    write_safetensors({"flow": torch.rand(2, 2, 6, 6)}, FLOW, flows)
    for path, rows, options in (
        (source, 1, ["--frame", "1"]),
        (source, 1, []),
        (flows, 2, []),
        (flows, 2, ["--flow-as-channels"]),
    ):
        result = runner.invoke(main, ["report", str(path), "-o", str(tmp_path / "r"), "-f", *options])
        assert (result.exit_code, result.stderr) == (0, ""), result.output
        assert (tmp_path / "r" / "index.html").read_text().count('<img src="data:image/png;base64,') == rows


def test_one_frame_of_a_clip_is_named_apart_from_the_whole_clip(runner, tmp_path):
    source = tmp_path / "f.safetensors"
    write_safetensors({"clip": _clip(), "flat": torch.ones(1, 4)}, {}, source)
    whole = _grid(runner, source, "-o", tmp_path / "g")
    assert whole.stdout.splitlines() == [
        f"{tmp_path / 'g' / 'clip__00000_row00000.png'}",
        f"{tmp_path / 'g' / 'flat__00000_row00000.png'}",
    ]
    one = runner.invoke(main, ["grid", str(source), "--frame", "1", "-o", str(tmp_path / "g")])
    assert one.exit_code == 2 and "flat__00000_row00000.png' already exists" in one.output  # only clips change name
    one = _grid(runner, source, "--frame", "1", "-k", "clip", "-o", tmp_path / "g")
    assert one.stdout == f"{tmp_path / 'g' / 'clip.frame1__00000_row00000.png'}\n"
