"""Statistics files (hookcli stats) read back: the checks a crafted file meets before anything is drawn or printed,
and info on a statistics file."""

import base64
import hashlib
import io
import json
import re
import urllib.parse
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from safetensors import safe_open
from safetensors.numpy import load_file, save_file

import hookcli
from hookcli.cli import main
from hookcli.errors import FeatureFileError
from hookcli.events import Note
from hookcli.inputs.preprocess import Preprocess
from hookcli.options.grid import GridOptions
from hookcli.pictures.examples import EXAMPLE_SIDE, ExamplePhotos, examples_picture
from hookcli.pictures.photos import model_photo
from hookcli.pictures.render import colorize, overlay, scale_maps
from hookcli.pictures.stats_reports import REPORT_EXAMPLE_SIDE, STATS_CONTENT_SECURITY_POLICY
from hookcli.storage.features import Features
from hookcli.storage.shards import open_features
from hookcli.storage.stats_file import read_stats

SMALL = {"weights": "none", "resize": 64, "crop": 64}


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> list[Path]:
    """Grace Hopper, a gradient and a checkerboard."""
    import matplotlib.cbook

    where = tmp_path_factory.mktemp("photos")
    ramp = np.linspace(0, 255, 48, dtype=np.uint8)
    Image.fromarray(np.stack([np.tile(ramp, (40, 1))] * 3, axis=2)).save(where / "gradient.png")
    squares = (np.indices((40, 48)) // 8).sum(axis=0) % 2 * 255
    Image.fromarray(squares.astype(np.uint8)).convert("RGB").save(where / "squares.png")
    photo = Path(matplotlib.cbook.get_sample_data("grace_hopper.jpg", asfileobj=False))
    return [photo, where / "gradient.png", where / "squares.png"]


@pytest.fixture(scope="module")
def stats_file(tmp_path_factory, inputs) -> Path:
    """resnet18 at 64 px over three inputs: layer3 (256 maps of 4x4) and fc (1,000 values), three examples each."""
    path = tmp_path_factory.mktemp("stats") / "stats.safetensors"
    return hookcli.stats("resnet18", ["layer3", "fc"], inputs, output=path, top=3, **SMALL)


def _units(change):
    def crafted(tensors, metadata):
        units = json.loads(metadata["units"])
        change(units)
        metadata["units"] = json.dumps(units)

    return crafted


def _set(key, value):
    def crafted(tensors, metadata):
        tensors[key] = value(tensors[key])

    return crafted


def _entry(name, value):
    def crafted(tensors, metadata):
        if value is None:
            del metadata[name]
        else:
            metadata[name] = value

    return crafted


def _put(array, where, value):
    array = array.copy()
    array[where] = value
    return array


DAMAGED = "'crafted.safetensors' is a damaged statistics file"
REWRITE = "Hint: write it again with hookcli stats"

CRAFTED = {
    "format 3": (
        _entry("format", "3"),
        "'crafted.safetensors' is a statistics file that is of format \"3\", and this hookcli reads format 4. Hint: "
        "read it with the hookcli that wrote it, or compute the statistics again with hookcli stats",
    ),
    "no format": (
        _entry("format", None),
        "'crafted.safetensors' is a statistics file that gives no format, and this hookcli reads format 4. Hint: "
        "read it with the hookcli that wrote it, or compute the statistics again with hookcli stats",
    ),
    "a field missing": (
        lambda tensors, metadata: tensors.pop("layer3@top_rows"),
        f"{DAMAGED}: 'layer3@top_rows' is missing. {REWRITE}",
    ),
    "a dtype": (
        _set("layer3@mean", lambda mean: mean.astype(np.float32)),
        f"{DAMAGED}: 'layer3@mean' holds F32 values, not F64. {REWRITE}",
    ),
    "a shape": (
        _set("layer3@std", lambda std: std[:255]),
        f"{DAMAGED}: 'layer3@std' has shape [255], not [256] (256 channels). {REWRITE}",
    ),
    "the maps' shape": (
        _set("layer3@top_maps", lambda maps: maps[..., :3]),
        f"{DAMAGED}: 'layer3@top_maps' has shape [256, 3, 4, 3], not [256, 3, 4, 4] (256 channels, 3 examples, "
        f"positions [4, 4]). {REWRITE}",
    ),
    "the examples' shape": (
        _set("fc@top_values", lambda values: values[:, 0]),
        f"{DAMAGED}: 'fc@top_values' has shape [1000], not [1000, K] (1000 channels, K examples each). {REWRITE}",
    ),
    "a negative count": (
        _set("layer3@count", lambda count: np.array(-5, dtype=np.int64)),
        f"{DAMAGED}: 'layer3@count' is -5, and a count is never negative. {REWRITE}",
    ),
    "a row past the inputs": (
        _set("fc@top_rows", lambda rows: _put(rows, (7, 2), 3)),
        f"{DAMAGED}: 'fc@top_rows' names row 3 (channel 7, example 2), and the file lists 3 inputs. {REWRITE}",
    ),
    "a negative row": (
        _set("layer3@top_rows", lambda rows: _put(rows, (0, 0), -1)),
        f"{DAMAGED}: 'layer3@top_rows' names row -1 (channel 0, example 0), and the file lists 3 inputs. {REWRITE}",
    ),
    "a position outside the maps": (
        _set("layer3@top_at", lambda at: _put(at, (200, 1), [4, 0])),
        f"{DAMAGED}: 'layer3@top_at' puts example 1 of channel 200 at [4, 0], outside its positions [4, 4]. {REWRITE}",
    ),
    "quantile levels": (
        _entry("stats", json.dumps({"top": 3, "top_by": "max", "quantiles": [0.5, 0.99], "pca": True})),
        f"{DAMAGED}: 'layer3@quantiles' has 3 quantiles a channel, and its 'stats' metadata lists 2 levels. {REWRITE}",
    ),
    "quantile levels past 1": (
        _entry("stats", json.dumps({"top": 3, "top_by": "max", "quantiles": [0.5, 2, 0.995], "pca": True})),
        f"{DAMAGED}: its 'stats' metadata gives no 'quantiles' levels between 0 and 1. {REWRITE}",
    ),
    "no pca flag": (
        _entry("stats", json.dumps({"top": 3, "top_by": "max", "quantiles": [0.5, 0.99, 0.995]})),
        f"{DAMAGED}: its 'stats' metadata does not say whether it holds PCA ('pca': true or false). {REWRITE}",
    ),
    "no units": (_entry("units", None), f"{DAMAGED}: it has no 'units' metadata. {REWRITE}"),
    "units not JSON": (
        _entry("units", "{layer3"),
        f"{DAMAGED}: its 'units' metadata is not an object of each layer key's units. {REWRITE}",
    ),
    "a units entry missing": (
        _units(lambda units: units.pop("fc")),
        f"{DAMAGED}: 'fc@count' is not a field of a layer its 'units' metadata describes. {REWRITE}",
    ),
    "a units entry without its layout": (
        _units(lambda units: units["layer3"].pop("layout")),
        f"{DAMAGED}: its 'units' entry of 'layer3' has no 'layout'. {REWRITE}",
    ),
    "an unknown layout": (
        _units(lambda units: units["fc"].update(layout="grid")),
        f"{DAMAGED}: its 'units' entry of 'fc' has layout \"grid\", not one of maps, channels_last, tokens, flat. "
        f"{REWRITE}",
    ),
    "channels as text": (
        _units(lambda units: units["fc"].update(channels="1000")),
        f"{DAMAGED}: its 'units' entry of 'fc' gives 'channels' or 'skip' that is not a whole number (channels at "
        f"least 1). {REWRITE}",
    ),
    "units that do not add up": (
        _units(lambda units: units["layer3"].update(spatial=[4, 5])),
        f"{DAMAGED}: its 'units' entry of 'layer3' does not add up: 256 channels over positions [4, 5] (skip 0) laid "
        f"out as maps are not rows of [256, 4, 4]. {REWRITE}",
    ),
    "positions for a flat layer": (
        lambda tensors, metadata: tensors.update({"fc@top_at": np.zeros((1000, 3, 1), dtype=np.int64)}),
        f"{DAMAGED}: 'fc@top_at' is not one of the fields of layer 'fc' (count, mean, std, min, max, zeros, "
        f"quantiles, top_values, top_rows, top_maps, cov, pca_values, pca_vectors). {REWRITE}",
    ),
    "a covariance wider than statistics keep": (
        _units(lambda units: units["fc"].update(channels=9000, row_shape=[9000])),
        f"{DAMAGED}: layer 'fc' has 9,000 channels and their covariance, which is kept of 8,192 channels at most. "
        f"{REWRITE}",
    ),
    "inputs that are not a list": (
        _entry("inputs", '{"a": 1}'),
        f"{DAMAGED}: its 'inputs' metadata is not a list of input paths. {REWRITE}",
    ),
}


@pytest.mark.parametrize("command", ["info", "grid", "report"])
@pytest.mark.parametrize("case", CRAFTED)
def test_a_crafted_statistics_file_is_refused_with_one_line_naming_what_is_wrong(
    runner, stats_file, tmp_path, monkeypatch, crafted_copy, command, case
):
    change, message = CRAFTED[case]
    monkeypatch.chdir(tmp_path)
    crafted_copy(stats_file, tmp_path / "crafted.safetensors", change)
    result = runner.invoke(main, [command, "crafted.safetensors", "-o", "out"][: 2 if command == "info" else 4])
    assert (result.exit_code, result.stderr) == (2, f"Error: {message}\n")
    assert result.stdout == "" and not (tmp_path / "out").exists()


def test_a_genuine_statistics_file_passes_its_checks(stats_file, inputs):
    with open_features(stats_file) as features:
        found = read_stats(features)
        assert [(layer.key, layer.layout, layer.channels, layer.spatial) for layer in found.layers.values()] == [
            ("layer3", "maps", 256, (4, 4)),
            ("fc", "flat", 1000, ()),
        ]
        assert [layer.count for layer in found.layers.values()] == [3 * 16, 3]
        assert found.inputs == [str(path) for path in inputs] and found.levels == (0.5, 0.99, 0.995)
        assert found.channel("layer3", "top_maps", 5).shape == (3, 4, 4)


def test_the_statistics_in_memory_pass_the_same_checks(inputs):
    found = read_stats(hookcli.stats("resnet18", "layer4", inputs[:2], top=1, pca=False, **SMALL))
    layer = found.layers["layer4"]
    assert (layer.channels, layer.spatial, layer.examples, layer.pca) == (512, (2, 2), 1, False)


def test_a_file_that_does_not_say_it_holds_statistics_is_read_as_features(runner, stats_file, tmp_path, crafted_copy):
    path = crafted_copy(stats_file, tmp_path / "x.safetensors", _entry("kind", None))
    with open_features(path) as features, pytest.raises(FeatureFileError) as caught:
        read_stats(features)
    assert str(caught.value) == f"'{path}' is not a statistics file. Hint: hookcli stats writes them"
    result = runner.invoke(main, ["info", str(path)])
    assert result.stdout.splitlines()[1].split() == "key dtype shape size min mean max zeros nan/inf".split()


# -- info ------------------------------------------------------------------------------------------


def test_info_describes_a_statistics_file_by_its_layers(runner, stats_file):
    result = runner.invoke(main, ["info", str(stats_file)])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].endswith("statistics of 2 layers over 3 inputs")
    assert (
        lines[1] == "top 3 examples a channel by max; quantiles 0.5, 0.99, 0.995; covariance and principal components"
    )
    assert (
        lines[2].split()
        == "layer layout channels positions count examples min mean max zeros all-zero pca 90% first 1/5/10".split()
    )
    layer3, fc = (line.split() for line in lines[3:5])
    with safe_open(str(stats_file), "np") as read:
        metadata, tensors = read.metadata(), {key: read.get_tensor(key) for key in read.keys()}
    asked_more = stats_file.parent / "top5.safetensors"  # --top 5 over the same 3 inputs keeps all 3
    save_file(tensors, str(asked_more), {**metadata, "stats": metadata["stats"].replace('"top": 3', '"top": 5')})
    told = runner.invoke(main, ["info", str(asked_more)])
    assert told.stdout.splitlines()[1].startswith("top 5 examples a channel by max (all 3 there are); quantiles")
    assert layer3[:6] == ["layer3", "maps", "256", "[4,4]", "48", "3"]
    assert fc[:6] == ["fc", "flat", "1,000", "-", "3", "3"]
    tensors = load_file(stats_file)
    assert float(layer3[7]) == pytest.approx(tensors["layer3@mean"].mean(), rel=1e-3)
    assert layer3[9] == f"{tensors['layer3@zeros'].mean():.1%}"
    assert lines[5] == "tensors:" and lines[6].split() == ["key", "dtype", "shape", "size"]
    assert lines[7].split()[:3] == ["layer3@count", "I64", "[]"]
    assert "metadata:" in lines and "  kind: stats" in lines


def test_info_json_of_a_statistics_file_has_its_layers_and_no_per_row_statistics(runner, stats_file):
    result = runner.invoke(main, ["info", str(stats_file), "--json"])
    described = json.loads(result.stdout)
    assert (described["kind"], described["inputs"], described["skipped"]) == ("stats", 3, 0)
    assert described["options"] == {"top": 3, "top_by": "max", "quantiles": [0.5, 0.99, 0.995], "pca": True}
    layer3 = described["layers"][0]
    assert {k: layer3[k] for k in ("key", "layout", "channels", "spatial", "row_shape", "count", "examples")} == {
        "key": "layer3",
        "layout": "maps",
        "channels": 256,
        "spatial": [4, 4],
        "row_shape": [256, 4, 4],
        "count": 48,
        "examples": 3,
    }
    tensors = load_file(stats_file)
    values = layer3["values"]
    assert values["min"] == tensors["layer3@min"].min() and values["max"] == tensors["layer3@max"].max()
    assert values["dead"] == int((tensors["layer3@zeros"] == 1).sum())
    variance = np.cumsum(tensors["layer3@pca_values"].clip(0)) / tensors["layer3@pca_values"].clip(0).sum()
    assert values["components_90"] == int(np.argmax(variance >= 0.9 - 1e-12)) + 1
    assert values["explained"] == {str(n): pytest.approx(float(variance[n - 1]), abs=1e-12) for n in (1, 5, 10)}
    assert all("stats" not in tensor for tensor in described["tensors"])
    assert len(described["tensors"]) == 27 and described["metadata"]["kind"] == "stats"


def test_info_no_stats_leaves_the_layer_summary_out(runner, stats_file):
    result = runner.invoke(main, ["info", str(stats_file), "--no-stats"])
    assert result.stdout.splitlines()[2].split() == "layer layout channels positions count examples".split()
    described = json.loads(runner.invoke(main, ["info", str(stats_file), "--json", "--no-stats"]).stdout)
    assert "values" not in described["layers"][0]


# -- grid ------------------------------------------------------------------------------------------

PLAIN = {"plain": True, "padding": 0}


def _synthetic(inputs, units: dict, *, examples: int = 2, preprocess: str | None = None) -> Features:
    """Statistics in memory of layers of ``units``, over ``inputs``: channel c's example k is input
    ``(c + k) % len(inputs)``, its map 0 but for ``c + k + 1`` at position ``(c + k) % positions``."""
    tensors, rows = {}, len(inputs)
    for key, described in units.items():
        channels, spatial = described["channels"], described["spatial"]
        positions = int(np.prod(spatial)) if spatial else 1
        tensors[f"{key}@count"] = np.array(rows * positions, dtype=np.int64)
        for name, value in (("mean", 1.0), ("std", 0.5), ("min", 0.0), ("max", 9.0), ("zeros", 0.25)):
            tensors[f"{key}@{name}"] = np.full(channels, value) + np.arange(channels) / 100
        tensors[f"{key}@quantiles"] = np.tile([0.5, 3.0, 4.0], (channels, 1))
        order = np.arange(channels)[:, None] + np.arange(examples)[None]
        tensors[f"{key}@top_values"] = (order + 1)[:, ::-1].astype(np.float32).copy()
        tensors[f"{key}@top_rows"] = order % rows
        maps = np.zeros((channels, examples, positions), dtype=np.float32)
        np.put_along_axis(maps, (order % positions)[..., None], (order + 1)[..., None], axis=2)
        tensors[f"{key}@top_maps"] = maps.reshape(channels, examples, *spatial)
        if spatial:
            tensors[f"{key}@top_at"] = np.stack(np.unravel_index(order % positions, spatial), axis=-1)
    metadata = {
        "format": "4",
        "kind": "stats",
        "stats": json.dumps({"top": examples, "top_by": "max", "quantiles": [0.5, 0.99, 0.995], "pca": False}),
        "units": json.dumps(units),
        "inputs": json.dumps([str(path) for path in inputs]),
    }
    if preprocess is not None:
        metadata["preprocess"] = preprocess
    return Features(tensors, metadata)


def _model_view(path, preprocess: str, side: int = EXAMPLE_SIDE) -> np.ndarray:
    seen = model_photo(path, Preprocess.from_metadata(preprocess), enlarge=False)
    return np.asarray(Image.fromarray(seen).resize((side, side), Image.Resampling.BILINEAR))


def _preprocess(stats_file) -> str:
    with open_features(stats_file) as features:
        return features.metadata["preprocess"]


def test_grid_draws_a_picture_a_channel_named_by_layer_and_channel(runner, stats_file, tmp_path):
    result = runner.invoke(main, ["grid", str(stats_file), "-o", str(tmp_path / "g"), "--channels", "3:5"])
    assert result.exit_code == 0, result.output
    names = ["layer3__channel00003.png", "layer3__channel00004.png", "fc__channel00003.png", "fc__channel00004.png"]
    assert result.stdout.splitlines() == [str(tmp_path / "g" / name) for name in names]
    picture = np.asarray(Image.open(tmp_path / "g" / names[0]))
    assert picture.shape[1] >= 3 * EXAMPLE_SIDE and (picture != 255).any()


def test_grid_top_draws_the_channels_of_highest_mean_highest_first(stats_file):
    pictures = hookcli.grid(stats_file, keys="layer3", top=3, **PLAIN)
    means = load_file(stats_file)["layer3@mean"]
    assert list(pictures) == [f"layer3__channel{c:05d}.png" for c in np.argsort(-means, kind="stable")[:3]]


def test_grid_draws_a_wide_layers_first_64_channels_and_says_how_to_draw_the_others(stats_file):
    events = []
    pictures = hookcli.grid(stats_file, keys="layer3", progress=events.append, **PLAIN)
    assert list(pictures) == [f"layer3__channel{c:05d}.png" for c in range(64)]
    assert (
        Note(
            "'layer3': drew channels 0-63 of 256; --channels 64:128 draws the next 64, --top 64 those of highest mean, "
            "--channels : all of them"
        )
        in events
    )


def test_each_example_is_the_map_over_the_photo_the_model_saw_with_its_maximum_ringed(stats_file, inputs):
    tensors, preprocess = load_file(stats_file), _preprocess(stats_file)
    [pixels] = hookcli.grid(stats_file, keys="layer3", channels="7", columns=3, **PLAIN).values()
    assert pixels.shape == (EXAMPLE_SIDE, 3 * EXAMPLE_SIDE, 3)
    cell = EXAMPLE_SIDE / 4
    for rank in range(3):
        row, heat = tensors["layer3@top_rows"][7, rank], tensors["layer3@top_maps"][7, rank]
        expected = overlay(_model_view(inputs[row], preprocess), heat, cmap="inferno", alpha=0.5)
        tile = pixels[:, rank * EXAMPLE_SIDE : (rank + 1) * EXAMPLE_SIDE]
        y, x = (tensors["layer3@top_at"][7, rank] + 0.5) * cell
        differs = np.argwhere((tile != expected).any(axis=2))
        assert len(differs) and np.abs(differs - [y, x]).max() <= cell / 2 + 2, rank  # the ring, round the peak


def test_a_flat_layers_examples_are_their_photos(stats_file, inputs):
    tensors, preprocess = load_file(stats_file), _preprocess(stats_file)
    [pixels] = hookcli.grid(stats_file, keys="fc", channels="11", columns=3, **PLAIN).values()
    for rank, row in enumerate(tensors["fc@top_rows"][11]):
        tile = pixels[:, rank * EXAMPLE_SIDE : (rank + 1) * EXAMPLE_SIDE]
        np.testing.assert_array_equal(tile, _model_view(inputs[row], preprocess))


def test_token_maps_fold_to_a_square_over_the_photo(stats_file, inputs):
    units = {"blocks.3": {"channels": 4, "spatial": [16], "layout": "tokens", "skip": 1, "row_shape": [17, 4]}}
    features = _synthetic(inputs, units, preprocess=_preprocess(stats_file))
    [pixels] = hookcli.grid(features, channels="2", columns=2, **PLAIN).values()
    for rank in range(2):
        token, row = 2 + rank, (2 + rank) % 3
        heat = np.zeros(16, dtype=np.float32)
        heat[token] = token + 1
        expected = overlay(_model_view(inputs[row], _preprocess(stats_file)), heat.reshape(4, 4))
        tile = pixels[:, rank * EXAMPLE_SIDE : (rank + 1) * EXAMPLE_SIDE]
        y, x = (np.array(divmod(token, 4)) + 0.5) * EXAMPLE_SIDE / 4
        differs = np.argwhere((tile != expected).any(axis=2))
        assert len(differs) and np.abs(differs - [y, x]).max() <= EXAMPLE_SIDE / 8 + 2, rank


def test_a_clips_map_is_drawn_alone_at_the_frame_of_its_largest_value(inputs):
    units = {"layer2": {"channels": 3, "spatial": [2, 4, 4], "layout": "maps", "skip": 0, "row_shape": [3, 2, 4, 4]}}
    features = _synthetic(inputs, units)
    features.metadata["frames"] = json.dumps([[0, 1]] * len(inputs))
    events = []
    [plain] = hookcli.grid(features, channels="1", columns=2, progress=events.append, **PLAIN).values()
    assert Note("the maps are drawn without their photos: a video's frames are not kept") in events
    heat = np.zeros((4, 4), dtype=np.float32)  # example 0 of channel 1: position 1 of [2, 4, 4], frame 0
    heat[0, 1] = 2
    alone = colorize(scale_maps(heat[None])[0], "inferno").repeat(EXAMPLE_SIDE // 4, 0).repeat(EXAMPLE_SIDE // 4, 1)
    assert (plain[:, :EXAMPLE_SIDE] == alone).all(axis=2).mean() > 0.9
    [captioned] = hookcli.grid(features, channels="1", columns=2).values()
    assert captioned.shape[0] > plain.shape[0]


def test_tokens_that_do_not_fold_are_drawn_alone_as_a_row(inputs, stats_file):
    units = {"blocks.3": {"channels": 2, "spatial": [6], "layout": "tokens", "skip": 1, "row_shape": [7, 2]}}
    features = _synthetic(inputs, units, preprocess=_preprocess(stats_file))
    [plain] = hookcli.grid(features, channels="0", columns=1, **PLAIN).values()
    row = colorize(scale_maps(np.eye(6, dtype=np.float32)[None, :1])[0], "inferno")  # example 0: token 0
    factor = EXAMPLE_SIDE // 6  # one pixel high and six wide: enlarged to fit the tile, in proportion
    expected = row.repeat(factor, axis=0).repeat(factor, axis=1)
    assert plain.shape[:2] == (2 * factor, expected.shape[1])  # the two examples, one above the other
    assert (plain[:factor] == expected).all(axis=2).mean() > 0.8


@pytest.mark.parametrize("positions", [6, 16])
def test_a_conv1d_layers_maps_pass_the_checks_and_are_drawn_alone_as_a_row(inputs, stats_file, positions):
    units = {"mix": {"channels": 2, "spatial": [positions], "layout": "maps", "skip": 0, "row_shape": [2, positions]}}
    features = _synthetic(inputs, units, preprocess=_preprocess(stats_file))
    [plain] = hookcli.grid(features, channels="0", columns=1, **PLAIN).values()
    row = colorize(scale_maps(np.eye(positions, dtype=np.float32)[None, :1])[0], "inferno")  # example 0: position 0
    factor = EXAMPLE_SIDE // positions  # a line of positions, never folded to a square as a ViT's tokens are
    expected = row.repeat(factor, axis=0).repeat(factor, axis=1)
    assert plain.shape[1] == expected.shape[1] and plain.shape[0] < plain.shape[1] / 2  # two lines, not squares
    assert (plain[:factor] == expected).all(axis=2).mean() > 0.8


def test_a_photo_that_cannot_be_read_leaves_the_map_alone_and_says_so(stats_file, inputs, tmp_path):
    moved = [tmp_path / "gone.jpg", *inputs[1:]]
    units = {"layer3": {"channels": 2, "spatial": [4, 4], "layout": "maps", "skip": 0, "row_shape": [2, 4, 4]}}
    features = _synthetic(moved, units, preprocess=_preprocess(stats_file))
    events = []
    [plain] = hookcli.grid(features, channels="0", columns=2, progress=events.append, **PLAIN).values()
    heat = np.zeros((4, 4), dtype=np.float32)
    heat[0, 0] = 1
    alone = colorize(scale_maps(heat[None])[0], "inferno").repeat(EXAMPLE_SIDE // 4, 0).repeat(EXAMPLE_SIDE // 4, 1)
    tile = plain[:, :EXAMPLE_SIDE]
    assert (tile == alone).all(axis=2).mean() > 0.9  # all but the ring
    [captioned] = hookcli.grid(features, channels="0", columns=2, progress=events.append).values()
    assert captioned.shape[0] > plain.shape[0]
    notes = [event.text for event in events if isinstance(event, Note)]
    assert notes == [f"the photo of input 0 (gone.jpg) cannot be read: image not found: '{moved[0]}'"] * 2


def test_grid_refuses_rows_unknown_layers_and_empty_channel_ranges(runner, stats_file, tmp_path):
    for args, message in (
        (
            ["-i", "0"],
            f"--image chooses rows of a features file, and '{stats_file}' holds statistics of channels. Hint: "
            "choose layers with -k and channels with --channels or --top",
        ),
        (
            ["-k", "layer9"],
            f"no layer 'layer9' in '{stats_file}' (closest: layer3, fc). Hint: 'hookcli info' lists the keys",
        ),
        (
            ["--overlay"],
            f"--overlay applies to a features file's maps, and '{stats_file}' holds statistics, whose examples are "
            "each drawn over its photo on its own range. Hint: leave it out",
        ),
        (
            ["--scale", "grid"],
            f"--scale applies to a features file's maps, and '{stats_file}' holds statistics, whose examples are "
            "each drawn over its photo on its own range. Hint: leave it out",
        ),
        (
            ["-k", "layer3", "--channels", "300:"],
            "--channels selects none of the 256 channels (0-255) of 'layer3'. Hint: give a range within them, or "
            "leave --channels out",
        ),
    ):
        result = runner.invoke(main, ["grid", str(stats_file), "-o", str(tmp_path / "g"), *args])
        assert (result.exit_code, result.stderr) == (2, f"Error: {message}\n")
    assert not (tmp_path / "g").exists()
    # Of several layers, one that has none of the channels is left out, said in a note, as a features file's is.
    drawn = runner.invoke(main, ["grid", str(stats_file), "-o", str(tmp_path / "g"), "--channels", "300:302"])
    assert drawn.exit_code == 0, drawn.output
    assert drawn.stderr.startswith(
        "Note: skipped 'layer3': --channels selects none of the 256 channels (0-255) of 'layer3'\n"
    )
    assert sorted(path.name for path in (tmp_path / "g").iterdir()) == ["fc__channel00300.png", "fc__channel00301.png"]


def test_grid_keeps_existing_pictures_without_force(runner, stats_file, tmp_path):
    args = ["grid", str(stats_file), "-o", str(tmp_path / "g"), "-k", "fc", "--channels", "0"]
    assert runner.invoke(main, args).exit_code == 0
    refused = runner.invoke(main, args)
    assert refused.exit_code == 2 and "fc__channel00000.png" in refused.stderr
    assert runner.invoke(main, [*args, "--force"]).exit_code == 0


def test_grid_draws_the_pictures_not_there_yet_and_names_those_it_leaves(runner, stats_file, tmp_path):
    out = tmp_path / "g"
    args = ["grid", str(stats_file), "-o", str(out), "-k", "fc", "--channels"]
    assert runner.invoke(main, [*args, "1"]).exit_code == 0
    mine = (out / "fc__channel00001.png").read_bytes()
    done = runner.invoke(main, [*args, "0:3"])
    assert done.exit_code == 0, done.output
    assert done.stdout.splitlines() == [str(out / f"fc__channel{n:05d}.png") for n in (0, 2)]
    assert done.stderr == ("Note: left 1 picture that exists as it is: fc__channel00001.png (--force draws it again)\n")
    assert (out / "fc__channel00001.png").read_bytes() == mine
    assert sorted(p.name for p in out.iterdir()) == [f"fc__channel{n:05d}.png" for n in range(3)]


# -- report ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def stats_report(stats_file, tmp_path_factory) -> Path:
    """The report of the statistics file, 100 channels a page."""
    return hookcli.report(stats_file, output=tmp_path_factory.mktemp("report") / "r", page_size=100)


def _ids(text: str, css: str) -> list[str]:
    return re.findall(rf'<section class="{css}" id="([^"]+)">', text)


def test_report_writes_an_index_and_each_layers_pages(stats_report):
    names = sorted(path.name for path in stats_report.parent.iterdir())
    fc = ["layer-fc.html", *(f"layer-fc-{n:05d}.html" for n in range(2, 11))]
    assert names == sorted(
        ["index.html", "layer-layer3.html", "layer-layer3-00002.html", "layer-layer3-00003.html", *fc]
    )
    index = stats_report.read_text()
    assert '<a href="layer-layer3.html">layer3</a>' in index and '<a href="layer-fc.html">fc</a>' in index
    assert "<tr><th>inputs</th><td>3</td></tr>" in index
    assert '<details class="about">\n<summary>The file: its tensors and metadata</summary>\n<div id="file">' in index
    second = (stats_report.parent / "layer-layer3-00002.html").read_text()
    assert _ids(second, "channel") == [f"channel-{c}" for c in range(100, 200)]
    assert (
        '<a href="layer-layer3.html" rel="prev">' in second
        and '<a href="layer-layer3-00003.html" rel="next">' in second
    )


def test_a_layers_first_page_has_its_components_and_a_table_of_every_channel(stats_report, stats_file):
    tensors = load_file(stats_file)
    first = (stats_report.parent / "layer-layer3.html").read_text()
    assert '<section id="pca">' in first and first.count('<svg class="scree"') == 1
    table = re.search(r'<table class="units sortable">.*?</table>', first, flags=re.S).group(0)
    rows = re.findall(r"<tr><td data-value=\"(\d+)\"><a href=\"([^\"]+)\">\d+</a></td>(.*?)</tr>", table)
    assert [int(c) for c, _, _ in rows] == list(range(256))
    assert rows[150][1] == "layer-layer3-00002.html#channel-150"
    values = [float(v) for v in re.findall(r'data-value="([^"]+)"', rows[7][2])]
    quantiles = tensors["layer3@quantiles"][7].tolist()
    expected = [tensors[f"layer3@{name}"][7] for name in ("mean", "std", "zeros")]
    assert values == [*expected, *quantiles, tensors["layer3@max"][7], tensors["layer3@top_values"][7, 0]]


def test_each_channel_has_its_numbers_its_quantiles_chart_and_its_examples(stats_report, stats_file, inputs):
    first = (stats_report.parent / "layer-layer3.html").read_text()
    sections = dict(re.findall(r'<section class="channel" id="channel-(\d+)">(.*?)</section>', first, flags=re.S))
    assert list(sections) == [str(c) for c in range(100)]
    section = sections["5"]
    assert section.count('<svg class="quantiles"') == 1 and section.count("<img ") == 1
    [data] = re.findall(r'<img src="data:image/jpeg;base64,([^"]+)"', section)
    pixels = np.asarray(Image.open(io.BytesIO(base64.b64decode(data))))
    with open_features(stats_file) as features:
        found = read_stats(features)
        photos = ExamplePhotos(found, REPORT_EXAMPLE_SIDE)
        expected = examples_picture(found, found.layers["layer3"], 5, GridOptions(), photos, title=False).pixels
    assert pixels.shape == expected.shape and np.abs(pixels.astype(int) - expected).mean() < 4  # JPEG's losses


def test_every_page_allows_its_sorting_script_by_its_hash_and_nothing_else(stats_report):
    for page in stats_report.parent.iterdir():
        text = page.read_text()
        [script] = re.findall(r"<script>(.*?)</script>", text, flags=re.S)
        digest = base64.b64encode(hashlib.sha256(script.encode()).digest()).decode()
        assert f"script-src 'sha256-{digest}'" in text
        assert f'content="{STATS_CONTENT_SECURITY_POLICY}"' in text


def test_report_top_and_a_file_without_components(inputs, tmp_path):
    features = hookcli.stats("resnet18", "fc", inputs, top=2, pca=False, **SMALL)
    index = hookcli.report(features, output=tmp_path / "r", keys="fc", top=5)
    page = (index.parent / "layer-fc.html").read_text()
    means = features["fc@mean"].numpy()
    assert _ids(page, "channel") == [f"channel-{c}" for c in np.argsort(-means, kind="stable")[:5]]
    assert '<section id="pca">' not in page and "<tr><th>principal components</th><td>no</td></tr>" in index.read_text()


def test_report_of_a_statistics_file_pages_64_channels_by_default_and_keeps_existing_pages(
    runner, stats_file, tmp_path
):
    result = runner.invoke(main, ["report", str(stats_file), "-o", str(tmp_path / "r"), "-k", "layer3"])
    assert (result.exit_code, result.stdout) == (0, f"{tmp_path / 'r' / 'index.html'}\n")
    assert len(list((tmp_path / "r").glob("layer-layer3*.html"))) == 4
    again = runner.invoke(main, ["report", str(stats_file), "-o", str(tmp_path / "r"), "-k", "layer3"])
    assert (again.exit_code, again.stderr) == (
        2,
        f"Error: '{tmp_path / 'r' / 'layer-layer3.html'}' and 4 more already exist. Hint: add --force to overwrite, "
        "or choose another folder with -o\n",
    )


def test_the_report_of_a_statistics_file_sorts_in_a_browser(stats_report, stats_file, browser):
    from selenium.webdriver.common.by import By

    browser.get((stats_report.parent / "layer-layer3.html").as_uri())
    assert browser.title == f"{stats_file} · hookcli report · layer3 · page 1 of 3"

    def first_channels() -> list[int]:
        rows = browser.find_elements(By.CSS_SELECTOR, "table.units tbody tr")
        return [int(row.find_element(By.TAG_NAME, "td").get_attribute("data-value")) for row in rows[:3]]

    means = load_file(stats_file)["layer3@mean"]
    mean = browser.find_element(By.XPATH, "//table[contains(@class, 'units')]//button[text()='mean']")
    browser.execute_script("arguments[0].scrollIntoView()", mean)
    mean.click()
    assert first_channels() == np.argsort(-means, kind="stable")[:3].tolist()
    mean.click()
    assert first_channels() == np.argsort(means, kind="stable")[:3].tolist()
    complete = browser.execute_script("return [...document.images].every(i => i.complete && i.naturalWidth > 0);")
    assert complete and len(browser.find_elements(By.CSS_SELECTOR, "section.channel img")) == 100
    severe = [entry for entry in browser.get_log("browser") if entry["level"] == "SEVERE"]
    assert severe == []

    browser.get(stats_report.as_uri())  # the table of layers: no word (a header, a number) broken across lines
    broken = browser.execute_script(
        """return [...document.querySelectorAll("table.layers th, table.layers td")]
            .filter(cell => !/\\s/.test(cell.textContent.trim()))
            .filter(cell => {
                const range = document.createRange();
                range.selectNodeContents(cell);
                return new Set([...range.getClientRects()].map(rect => Math.round(rect.top))).size > 1;
            })
            .map(cell => cell.textContent);"""
    )
    cells = browser.find_elements(By.CSS_SELECTOR, "table.layers td")
    assert broken == [] and len(cells) > 10


def test_a_report_gives_a_layer_at_most_its_first_channels_unless_chosen(inputs, tmp_path, monkeypatch):
    from hookcli.pictures import stats_reports

    monkeypatch.setattr(stats_reports, "MOST_REPORTED", 2)
    units = {"wide": {"channels": 5, "spatial": [2, 2], "layout": "maps", "skip": 0, "row_shape": [5, 2, 2]}}
    heard: list = []
    index = hookcli.report(_synthetic(inputs, units), output=tmp_path / "r", page_size=10, progress=heard.append)
    assert [event.text for event in heard if isinstance(event, Note)] == [
        "'wide': drew channels 0-1 of 5; --channels 2:4 draws the next 2, --top 2 those of highest mean, --channels "
        ": all of them"
    ]
    layer = (index.parent / "layer-wide.html").read_text()
    assert "channel 1" in layer and "channel 2" not in layer
    every = hookcli.report(_synthetic(inputs, units), output=tmp_path / "all", page_size=10, channels=":")
    assert "channel 4" in (every.parent / "layer-wide.html").read_text()


def test_links_to_a_layer_whose_key_holds_a_hash_reach_its_pages(inputs, tmp_path):
    units = {"blocks#0": {"channels": 3, "spatial": [2, 2], "layout": "maps", "skip": 0, "row_shape": [3, 2, 2]}}
    index = hookcli.report(_synthetic(inputs, units), output=tmp_path / "r", page_size=2)
    assert sorted(path.name for path in index.parent.iterdir()) == [
        "index.html",
        "layer-blocks#0-00002.html",
        "layer-blocks#0.html",
    ]
    links = re.findall(r'href="(layer-[^"]+)"', index.read_text())
    links += re.findall(r'href="(layer-[^"]+)"', (index.parent / "layer-blocks#0.html").read_text())
    assert links and all((index.parent / urllib.parse.unquote(link.split("#")[0])).exists() for link in links)
    assert "layer-blocks%230-00002.html#channel-2" in links


def test_names_of_hundreds_of_kilobytes_are_drawn_shortened_in_bounded_time_and_size(tmp_path):
    import time

    import torch
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    import hookcli
    from hookcli.storage.features import Features

    long = "/photos/" + "x" * 300_000 + ".jpg"
    inputs = [long, *(f"/photos/{i}.jpg" for i in range(5))]
    maps = torch.rand(6, 3, 4, 4, generator=torch.Generator().manual_seed(0))
    maps[0] += 1  # the long name is every channel's first example
    features = Features({"maps": maps, "more": maps.flip(0)}, {"inputs": json.dumps(inputs)})
    stats = hookcli.stats(features=features, keys="maps", top=2, output=str(tmp_path / "s.safetensors"))
    written = hookcli.compare(features=features, output=str(tmp_path / "c.safetensors"))
    with safe_open(written, "pt") as handle:  # as a comparison of models whose names are 1M characters
        metadata = {**handle.metadata(), "compare_of": "null", "model": "m" * 1_000_000}
    similar = tmp_path / "crafted.safetensors"
    save_file(load_file(written), similar, metadata=metadata)
    start = time.perf_counter()
    pictures = {**hookcli.grid(stats, channels="0:3"), **hookcli.grid(str(similar))}
    assert time.perf_counter() - start < 30
    assert len(pictures) == 4 and max(pixels.shape[1] for pixels in pictures.values()) < 3000


def test_the_report_says_what_share_of_the_variance_the_first_components_explain(stats_report, stats_file):
    variances = load_file(stats_file)["layer3@pca_values"].clip(0)
    shares = np.cumsum(variances) / variances.sum()
    page = (stats_report.parent / "layer-layer3.html").read_text()
    expected = f"the first 1, 5, 10 explain {shares[0]:.1%}, {shares[4]:.1%}, {shares[9]:.1%}."
    assert expected in page


def test_an_examples_picture_holds_one_map_at_a_time_and_shrinks_it_to_its_tile(tmp_path):
    import tracemalloc

    from safetensors.numpy import save_file

    side, count = 1024, 9  # 36 MiB of maps, 4 MiB each
    units = {"x": {"channels": 1, "spatial": [side, side], "layout": "maps", "skip": 0, "row_shape": [1, side, side]}}
    tensors = {"x@count": np.array(10, np.int64), "x@quantiles": np.ones((1, 1)),
               **{f"x@{name}": np.ones(1) for name in ("mean", "std", "min", "max", "zeros")},
               "x@top_values": np.ones((1, count), np.float32), "x@top_rows": np.zeros((1, count), np.int64),
               "x@top_at": np.zeros((1, count, 2), np.int64),
               "x@top_maps": np.random.default_rng(0).random((1, count, side, side), dtype=np.float32)}  # fmt: skip
    metadata = {"format": "4", "kind": "stats", "inputs": json.dumps([str(tmp_path / "gone.png")]),
                "units": json.dumps(units), "stats": json.dumps({"top": count, "top_by": "max", "quantiles": [0.5],
                                                                 "pca": False})}  # fmt: skip
    save_file(tensors, str(tmp_path / "big.safetensors"), metadata)
    del tensors
    with open_features(tmp_path / "big.safetensors") as read:
        stats = read_stats(read)
        tracemalloc.start()
        picture = examples_picture(stats, stats.layers["x"], 0, GridOptions(), ExamplePhotos(stats, 96))
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert peak < 24 * 2**20, peak  # one map read at a time (4 MiB), brought down to a tile of 96 pixels a side
    assert max(picture.pixels.shape[:2]) < 800
