"""hookcli patch: activation patching over pairs, checked against hooks written by hand."""

import json

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from torch import nn

import hookcli
from hookcli.cli import main
from hookcli.errors import FeatureFileError, HookcliError
from hookcli.storage.patch_file import read_patch

SMALL = {"resize": 12, "crop": 12, "mean": 0.5, "std": 0.5, "device": "cpu"}


def _net() -> nn.Module:
    """A CNN whose classes differ from image to image: two convolutions (an in-place ReLU after the first) and a
    linear head on the flattened maps, so that the head is linear in the second convolution's output."""
    torch.manual_seed(1)
    return nn.Sequential(
        nn.Conv2d(3, 6, 3, padding=1),
        nn.ReLU(inplace=True),
        nn.Conv2d(6, 4, 3, stride=2, padding=1),
        nn.Flatten(),
        nn.Linear(4 * 6 * 6, 7),
    ).eval()


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    folder = tmp_path_factory.mktemp("pairs")
    paths = []
    for seed in range(12):
        pixels = np.random.default_rng(seed).integers(0, 256, (12, 12, 3), dtype=np.uint8)
        paths.append(folder / f"{seed:02d}.png")
        Image.fromarray(pixels).save(paths[-1])
    return paths


def _batch(net, paths):
    """The batch hookcli feeds a model (any: the preprocessing is SMALL's), as the first layer's input of the CNN."""
    return hookcli.extract(_net(), "0", paths, capture="input", **SMALL)["0@input"]


@pytest.fixture(scope="module")
def pairs(images):
    """Four pairs whose source and target the net gives other classes."""
    with torch.no_grad():
        classes = _net()(_batch(_net(), images)).argmax(dim=1).tolist()
    found = [(a, b) for a in range(len(images)) for b in range(len(images)) if classes[a] != classes[b]][::7][:4]
    assert len(found) == 4
    return [(images[a], images[b]) for a, b in found]


def _by_hand(net, source, target, layer):
    """m of the target with ``layer``'s output replaced by the source's, by a hook written here; and m of each."""
    batch = _batch(net, [source, target])
    module = net.get_submodule(layer)
    kept = {}
    handle = module.register_forward_hook(lambda m, i, out: kept.__setitem__("source", out.clone()))  # returns None
    with torch.no_grad():
        plain = net(batch)
    handle.remove()
    handle = module.register_forward_hook(lambda m, i, out: kept["source"][:1].expand_as(out).clone())
    with torch.no_grad():
        patched = net(batch[1:])
    handle.remove()
    y_s, y_t = plain[0].argmax(), plain[1].argmax()
    return tuple(float(z[y_s] - z[y_t]) for z in (patched[0], plain[0], plain[1]))


def test_each_patch_equals_a_hook_written_by_hand(pairs):
    net = _net()
    found = hookcli.patch(net, ["0", "2"], pairs, batch_size=4, **SMALL)
    for index, (source, target) in enumerate(pairs):
        for layer in ("0", "2"):
            patched, m_source, m_target = _by_hand(net, source, target, layer)
            assert found["pairs@source_metric"][index].item() == pytest.approx(m_source, abs=1e-5)
            assert found["pairs@target_metric"][index].item() == pytest.approx(m_target, abs=1e-5)
            assert found[f"{layer}@change"][index].item() == pytest.approx(patched - m_target, abs=1e-5)
    # A layer whose output is all the model passes on: patching it gives the source's output, effect 1.
    torch.testing.assert_close(found["2@effect"], torch.ones(4, dtype=torch.float64), rtol=0, atol=1e-6)
    torch.testing.assert_close(found["0@effect"], torch.ones(4, dtype=torch.float64), rtol=0, atol=1e-6)
    assert found["2@mean_effect"].item() == pytest.approx(1.0, abs=1e-6)
    assert found["pairs@source_class"].dtype == torch.int64
    assert (found["pairs@source_class"] != found["pairs@target_class"]).all()


def test_patching_a_target_with_its_own_activations_changes_nothing(images):
    same = [(images[0], images[0]), (images[3], images[3])]
    found = hookcli.patch(_net(), ["0", "2"], same, positions=True, **SMALL)
    assert found["0@change"].shape == (2, 12, 12) and found["2@change"].shape == (2, 6, 6)
    assert (found["0@change"] == 0).all() and (found["2@change"] == 0).all()
    assert torch.isnan(found["2@effect"]).all() and torch.isnan(found["2@mean_effect"]).all()
    assert found.notes == (
        "2 of 2 pairs have a source and a target of the same class, so their effects are NaN (and m, the "
        "logit of one class less itself, is 0 whatever the patch)",
    )


def test_positions_are_patched_one_at_a_time_and_add_up_where_the_rest_is_linear(pairs):
    net = _net()
    whole = hookcli.patch(net, "2", pairs, **SMALL)
    by_position = hookcli.patch(net, "2", pairs, positions=True, **SMALL)
    assert by_position["2@change"].shape == (4, 6, 6) and by_position["2@mean_effect"].shape == (6, 6)
    # After layer 2 the model is linear, so the changes of its positions add up to the whole layer's.
    torch.testing.assert_close(by_position["2@change"].sum(dim=(1, 2)), whole["2@change"], rtol=1e-6, atol=1e-6)
    # One position by hand: pair 1, row 2, column 3.
    source, target = pairs[1]
    batch = _batch(net, [source, target])
    with torch.no_grad():
        plain = net(batch)
        maps = net[:3](batch)
        patched = maps[1:].clone()
        patched[:, :, 2, 3] = maps[:1, :, 2, 3]
        logits = net[3:](patched)
    y_s, y_t = plain[0].argmax(), plain[1].argmax()
    expected = float(logits[0, y_s] - logits[0, y_t]) - float(plain[1, y_s] - plain[1, y_t])
    assert by_position["2@change"][1, 2, 3].item() == pytest.approx(expected, abs=1e-5)


class InPlace(nn.Module):
    """A residual added in place onto the patched layer's output (a method call, which torch.fx keeps in place)."""

    def __init__(self) -> None:
        super().__init__()
        self.net = _net()
        self.block = nn.Conv2d(6, 6, 3, padding=1)

    def forward(self, x):
        x = self.net[1](self.net[0](x))
        out = self.block(x)
        out.add_(x)
        return self.net[4](self.net[3](self.net[2](out)))


class AddedBack(InPlace):
    """The patched layer's output added in place onto a value computed before it, which the rest then reads."""

    def forward(self, x):
        x = self.net[0](x)
        x.add_(self.block(x))
        return self.net[4](self.net[3](self.net[2](self.net[1](x))))


@pytest.mark.parametrize("model", ["InPlace", "AddedBack"])
def test_an_in_place_add_after_the_patched_layer_reaches_neither_its_copies_nor_earlier_values(pairs, model):
    torch.manual_seed(2)
    net = globals()[model]().eval()
    found = hookcli.patch(net, "block", pairs, **SMALL)
    for index, (source, target) in enumerate(pairs):
        patched, m_source, m_target = _by_hand(net, source, target, "block")
        assert found["block@change"][index].item() == pytest.approx(patched - m_target, abs=1e-5)
    assert found["block@change"].abs().max() > 1e-3  # the patches change something to compare


class Branchy(nn.Module):
    """A model torch.fx cannot trace (a branch on a value), around the CNN."""

    def __init__(self) -> None:
        super().__init__()
        self.net = _net()

    def forward(self, x):
        if x.sum() > 1e9:
            return x
        return self.net(x)


def test_a_model_that_cannot_be_traced_runs_whole_with_a_note_and_the_same_values(pairs):
    traced = hookcli.patch(_net(), ["0", "2"], pairs, positions=True, **SMALL)
    whole = hookcli.patch(Branchy(), ["net.0", "net.2"], pairs, positions=True, **SMALL)
    for layer in ("0", "2"):
        torch.testing.assert_close(whole[f"net.{layer}@change"], traced[f"{layer}@change"], rtol=0, atol=1e-5)
    assert whole.notes == (
        "Branchy cannot be traced by torch.fx, so it runs whole for each patch (the values are the same)",
    )


class Scaled(nn.Module):
    """The CNN with its input scaled first, in its forward: what a forward pre-hook on the CNN does."""

    def __init__(self) -> None:
        super().__init__()
        self.net = _net()

    def forward(self, x):
        return self.net(x * 5 + 1)


def test_a_models_own_hooks_run_in_a_patch_which_runs_it_whole_and_says_why(pairs):
    expected = hookcli.patch(Scaled(), ["net.0", "net.2"], pairs, positions=True, **SMALL)
    hooked = nn.Sequential(_net())
    hooked.register_forward_pre_hook(lambda module, args: (args[0] * 5 + 1,))
    found = hookcli.patch(hooked, ["0.0", "0.2"], pairs, positions=True, **SMALL)
    for layer in ("0", "2"):
        torch.testing.assert_close(found[f"0.{layer}@change"], expected[f"net.{layer}@change"], rtol=0, atol=1e-5)
    assert found.notes[0] == (
        "Sequential has hooks of its own, which a torch.fx trace would skip, so it runs whole for each patch (the "
        "values are the same)"
    )


def test_a_file_in_shards_and_in_one_go_holds_the_same_and_is_drawn(pairs, tmp_path, runner):
    listing = tmp_path / "pairs.txt"
    listing.write_text("# source\ttarget\n" + "".join(f"{s}\t{t}\n" for s, t in pairs) + "\n")
    net = _net()
    one = hookcli.patch(net, ["0", "2"], listing, output=tmp_path / "one.safetensors", batch_size=2, **SMALL)
    shards = hookcli.patch(net, ["0", "2"], pairs, output=tmp_path / "two.safetensors", shard_size=2, batch_size=2,
                           **SMALL)  # fmt: skip
    first, second = load_file(one), load_file(shards)
    assert sorted(first) == sorted(second) == [
        "0@change", "0@effect", "0@mean_effect", "2@change", "2@effect", "2@mean_effect",
        "pairs@source_class", "pairs@source_metric", "pairs@target_class", "pairs@target_metric",
    ]  # fmt: skip
    assert all(torch.equal(first[key], second[key]) for key in first)
    with safe_open(str(one), "pt") as handle:
        metadata = handle.metadata()
    assert (metadata["kind"], metadata["format"]) == ("patch", "7")
    assert json.loads(metadata["inputs"]) == [str(p) for pair in pairs for p in pair]
    assert json.loads(metadata["patch"]) == {
        "layers": ["0", "2"],
        "keys": {"0": "0", "2": "2"},
        "positions": False,
        "positions_of": {"0": [], "2": []},
    }
    pictures = hookcli.grid(one)
    assert list(pictures) == ["one.png"] and pictures["one.png"].dtype == np.uint8
    done = runner.invoke(main, ["grid", str(one), "--channels", "0:3"])
    assert done.exit_code == 2 and done.stderr.startswith("Error: --channels does not apply to a patching file")
    scaled = runner.invoke(main, ["grid", str(one), "--scale", "grid"])
    assert scaled.exit_code == 2 and scaled.stderr.startswith(
        f"Error: --scale does not apply to a patching file of layers patched whole ('{one}'): its picture has one "
    )


def test_the_command_line_patches_pairs_from_two_folders_and_draws_a_map_a_layer(images, tmp_path, runner):
    sources, targets = tmp_path / "s", tmp_path / "t"
    sources.mkdir(), targets.mkdir()
    for number in range(3):
        (sources / f"{number}.png").write_bytes(images[number].read_bytes())
        (targets / f"{number}.png").write_bytes(images[number + 5].read_bytes())
    out = tmp_path / "p.safetensors"
    args = ["patch", "-m", "resnet18", "-w", "none", "-l", "layer1", "-l", "layer4", "--positions", "--resize", "32",
            "--crop", "32", "--pairs-from", str(sources), str(targets), "-o", str(out), "-q"]  # fmt: skip
    done = runner.invoke(main, args)
    assert done.exit_code == 0, done.output
    assert done.stdout == f"{out}\n"
    with hookcli.open_features(out) as read:
        patched = read_patch(read)
        positions = {"layer1": (8, 8), "layer4": (1, 1)}
        assert (patched.keys, patched.pairs, patched.positions) == (["layer1", "layer4"], 3, positions)
    done = runner.invoke(main, ["grid", str(out), "-o", str(tmp_path / "g"), "-q"])
    assert done.exit_code == 0, done.output
    assert sorted(p.name for p in (tmp_path / "g").iterdir()) == ["p__layer1.png", "p__layer4.png"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["-b", "3", "--pairs", "{pairs}"], "Error: --batch-size 3: patch runs pairs, a source then its target, and a "
         "batch or shard must hold whole pairs. Hint: give --batch-size 4"),
        (["--shard-size", "5", "--pairs", "{pairs}"], "Error: --shard-size 5: patch runs pairs, a source then its "
         "target, and a batch or shard must hold whole pairs. Hint: give --shard-size 6"),
        (["--pairs", "{missing}"], "Error: pairs file '{missing}' line 2: no such file or folder: 'nowhere.png'. "
         "Hint: check the path"),
        (["--pairs", "{bad}"], "Error: pairs file '{bad}' line 1 does not hold two paths. Hint: write a pair a line: "
         "the source's path, a tab, the target's"),
        (["--pairs-from", "{folder}", "{other}"], "Error: --pairs-from: '{folder}' holds 2 images and '{other}' 1. "
         "Hint: pairs are made in order of name, so the two folders must hold as many images"),
        ([], "Error: patch takes its pairs from --pairs FILE or --pairs-from SOURCES TARGETS: one of them. Hint: "
         "hookcli patch --help shows both"),
        (["--pairs-from", "{nested}", "{other}"], "Error: --pairs-from: no images found in folder '{nested}'. Hint: "
         "--pairs-from reads a folder's own images, not its sub-folders"),
    ],
    ids=["odd-batch", "odd-shard", "missing-input", "bad-line", "unequal-folders", "no-pairs", "sub-folders"],
)  # fmt: skip
def test_bad_pairs_and_options_are_refused_in_one_line(runner, images, tmp_path, args, message):
    paths = {
        "pairs": tmp_path / "pairs.txt",
        "missing": tmp_path / "missing.txt",
        "bad": tmp_path / "bad.txt",
        "folder": tmp_path / "a",
        "other": tmp_path / "b",
        "nested": tmp_path / "n",
    }
    (paths["nested"] / "inner").mkdir(parents=True)
    (paths["nested"] / "inner" / "0.png").write_bytes(images[0].read_bytes())
    paths["pairs"].write_text(f"{images[0]}\t{images[1]}\n")
    paths["missing"].write_text(f"{images[0]}\t{images[1]}\n{images[2]}\tnowhere.png\n")
    paths["bad"].write_text(f"{images[0]}\n")
    for folder, count in (("folder", 2), ("other", 1)):
        paths[folder].mkdir()
        for number in range(count):
            (paths[folder] / f"{number}.png").write_bytes(images[number].read_bytes())
    filled = [arg.format(**paths) for arg in args]
    done = runner.invoke(main, ["patch", "-m", "resnet18", "-w", "none", "-l", "layer1", *filled, "-o",
                                str(tmp_path / "p.safetensors")])  # fmt: skip
    assert done.exit_code != 0
    assert done.stderr == message.format(**paths) + "\n"
    assert not (tmp_path / "p.safetensors").exists()


def test_what_cannot_be_patched_is_refused_before_the_run(images, tmp_path):
    pair = [(images[0], images[1])]
    with pytest.raises(HookcliError) as refused:
        hookcli.patch("fasterrcnn_mobilenet_v3_large_320_fpn", "backbone.body.1", pair, weights="none")
    assert (refused.value.message, refused.value.hint) == (
        "patch does not apply to detection models",
        "patch measures the logit of the source's class less the target's (classifiers)",
    )
    with pytest.raises(HookcliError) as refused:
        hookcli.patch("r3d_18", "layer1", pair, weights="none")
    assert refused.value.message == "patch does not apply to video models"

    class Twice(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv, self.head = nn.Conv2d(3, 3, 1), nn.Linear(3, 2)

        def forward(self, x):
            return self.head(self.conv(self.conv(x)).mean(dim=(2, 3)))

    with pytest.raises(HookcliError) as refused:
        hookcli.patch(Twice(), "conv", pair, **SMALL)
    assert refused.value.message == "patch: the forward runs conv 2 times, so its output is not one value to patch"
    with pytest.raises(HookcliError) as refused:
        hookcli.patch(_net(), "0", [(images[0],)], **SMALL)
    assert refused.value.message == f"a pair is a source and a target, not {(images[0],)!r}"
    with pytest.raises(HookcliError) as refused:
        hookcli.patch(_net(), "0", [(images[0], images[0].parent)], **SMALL)  # a folder would shift every pair
    assert refused.value.message == f"pair 0: '{images[0].parent}' is not one image"
    with pytest.raises(TypeError, match="^patch\\(\\) got an unexpected keyword argument 'on_error'"):
        hookcli.patch(_net(), "0", pair, on_error="skip", **SMALL)  # a pair is never split
    with pytest.raises(HookcliError) as refused:
        hookcli.patch(_net(), "0", pair, pairs_from=(images[0].parent, images[0].parent), **SMALL)
    assert refused.value.message.startswith("patch takes its pairs from a pairs file, a list of pairs or two folders")


def test_a_damaged_patching_file_is_refused_in_one_line(pairs, tmp_path):
    out = hookcli.patch(_net(), "2", pairs, output=tmp_path / "p.safetensors", **SMALL)
    tensors = load_file(out)
    with safe_open(str(out), "pt") as handle:
        metadata = handle.metadata()
    del tensors["2@effect"]
    save_file(tensors, str(tmp_path / "damaged.safetensors"), metadata)
    with pytest.raises(FeatureFileError) as refused, hookcli.open_features(tmp_path / "damaged.safetensors") as read:
        read_patch(read)
    assert refused.value.message.endswith(
        "is a damaged patching file: it does not hold the tensors its layers and pairs make (2@effect)"
    )
    tensors = load_file(out)
    tensors["pairs@source_class"] = tensors["pairs@source_class"].double()
    save_file(tensors, str(tmp_path / "retyped.safetensors"), metadata)
    with pytest.raises(FeatureFileError) as refused, hookcli.open_features(tmp_path / "retyped.safetensors") as read:
        read_patch(read)
    assert refused.value.message.endswith("'pairs@source_class' is F64 [4], not I64 [4]")
    for inputs in (json.loads(metadata["inputs"])[:3], None):  # 3 names for 4 pairs, or none
        save_file(load_file(out), str(tmp_path / "renamed.safetensors"), {**metadata, "inputs": json.dumps(inputs)})
        with pytest.raises(FeatureFileError) as refused:
            hookcli.report(tmp_path / "renamed.safetensors", output=tmp_path / "report")
        assert refused.value.message.endswith(
            "is a damaged patching file: its 'inputs' metadata does not name a source and a target for each of its 4 "
            "pairs"
        )
    assert not (tmp_path / "report").exists()


def test_parts_shared_by_processes_write_what_one_process_writes(pairs, tmp_path):
    net = _net()
    one = hookcli.patch(net, ["0", "2"], pairs, output=tmp_path / "one.safetensors", shard_size=2, batch_size=2,
                        **SMALL)  # fmt: skip
    shared = tmp_path / "shared.safetensors"
    for part in ("1/2", "2/2"):
        hookcli.patch(net, ["0", "2"], pairs, output=shared, shard_size=2, batch_size=2, part=part, **SMALL)
    assert not (tmp_path / "shared.safetensors.parts").exists()
    first, second = load_file(one), load_file(shared)
    assert sorted(first) == sorted(second) and all(torch.equal(first[key], second[key]) for key in first)


def test_a_vision_transformers_tokens_are_patched_one_at_a_time(images):
    from torchvision.models import VisionTransformer

    torch.manual_seed(0)
    vit = VisionTransformer(image_size=16, patch_size=8, num_layers=2, num_heads=2, hidden_dim=8, mlp_dim=16).eval()
    nn.init.normal_(vit.heads.head.weight)  # torchvision starts the head at zero: every class alike
    layer = "encoder.layers.encoder_layer_0"
    pairs = [(images[0], images[1]), (images[2], images[3])]
    found = hookcli.patch(vit, layer, pairs, positions=True, **{**SMALL, "resize": 16, "crop": 16})
    whole = hookcli.patch(vit, layer, pairs, **{**SMALL, "resize": 16, "crop": 16})
    assert found[f"{layer}@change"].shape == (2, 5)  # the class token and 4 patches
    assert found[f"{layer}@mean_effect"].shape == (5,)
    # Each token is patched alone, and at least one moves m; the whole layer moves it as far as the source.
    assert torch.isfinite(found[f"{layer}@change"]).all() and (found[f"{layer}@change"] != 0).any()
    defined = torch.isfinite(whole[f"{layer}@effect"])
    torch.testing.assert_close(whole[f"{layer}@effect"][defined], torch.ones(int(defined.sum()), dtype=torch.float64),
                               rtol=0, atol=1e-6)  # fmt: skip
    # grid folds the 4 patch tokens to their 2x2 square (cells of 48 pixels), the class token said in the labels.
    (plain,) = hookcli.grid(found, plain=True).values()
    assert plain.shape == (2 * 10 + 2 * 48, 10 + 3 * (2 * 48 + 10), 3)
    channel, grid = (next(iter(hookcli.grid(found, scale=scale).values())) for scale in ("channel", "grid"))
    assert not np.array_equal(channel, grid)  # each map on its own range, or all on one


def test_the_report_shows_the_pictures_and_the_pairs(pairs, tmp_path, runner):
    out = hookcli.patch(_net(), ["0", "2"], pairs, output=tmp_path / "p.safetensors", **SMALL)
    done = runner.invoke(main, ["report", str(out), "-o", str(tmp_path / "r"), "--top", "2"])
    assert done.exit_code == 0, done.output
    page = (tmp_path / "r" / "index.html").read_text()
    assert "<tr><th>pairs</th><td>4</td></tr>" in page
    assert "<tr><th>layers patched (positions)</th><td>0 whole, 2 whole</td></tr>" in page
    assert page.count('<img src="data:image/png;base64,') == 1
    rows = page[page.index('<table class="pairs">') :].split("</table>")[0].count("<tr><td>")
    assert rows == 2 and "the first 2 of 4" in page
    done = runner.invoke(main, ["report", str(out), "-o", str(tmp_path / "r2"), "--page-size", "3"])
    assert done.exit_code == 2 and "is one page" in done.stderr


def test_maps_too_large_for_a_picture_are_refused_with_the_option_that_draws_fewer(pairs, monkeypatch):
    import hookcli.pictures.patch_grids as patch_grids

    found = hookcli.patch(_net(), "2", pairs, positions=True, **SMALL)  # maps of 6x6 positions
    monkeypatch.setattr(patch_grids, "MAX_PIXELS", 5 * 36 - 1)
    with pytest.raises(HookcliError) as refused:
        hookcli.grid(found)
    assert (refused.value.message, refused.value.hint) == (
        "'2' has maps of 6x6 positions: 5 of them are larger than a picture may be (179 pixels)",
        "draw fewer pairs with --top",
    )
    assert list(hookcli.grid(found, top=3)) == ["patch__2.png"]  # the mean and 3 pairs fit


def test_a_pairs_file_written_with_a_byte_order_mark_reads_its_first_path(images, tmp_path):
    from hookcli.inputs.pairs import read_pairs

    listing = tmp_path / "marked.txt"
    listing.write_text(f"{images[0]}\t{images[1]}\n", encoding="utf-8-sig")
    assert [tuple(map(str, pair)) for pair in read_pairs(listing)] == [(str(images[0]), str(images[1]))]


def test_a_layer_inside_another_patched_with_it_is_patched_as_when_it_is_alone(pairs):
    torch.manual_seed(1)
    net = nn.Sequential(_net()[:3], _net()[3:]).eval()  # the convolutions inside the first half
    both = hookcli.patch(net, ["0", "0.2"], pairs, **SMALL)
    alone = {layer: hookcli.patch(net, layer, pairs, **SMALL) for layer in ("0", "0.2")}
    for layer in ("0", "0.2"):
        keys = [key for key in alone[layer].keys() if key.startswith(f"{layer}@")]
        assert keys and all(torch.equal(both[key], alone[layer][key]) for key in keys), layer
    assert both.notes[-1] == (
        "Sequential holds 0.2 inside 0, which a torch.fx trace would keep whole, so it runs whole for each patch (the "
        "values are the same)"
    )
