"""hookcli ablate: each unit's effects equal what hooks written by hand measure, exactly where the output is linear in
the layer; one process and many write the same file; and what cannot be ablated is refused in one line."""

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import hookcli
from hookcli.cli import main
from hookcli.errors import LayerNotRunError, UsageProblem
from hookcli.events import Note
from hookcli.run.edits import partners

SMALL = {"resize": 16, "crop": 16, "batch_size": 3}


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    from PIL import Image

    folder = tmp_path_factory.mktemp("ablated")
    rng = np.random.default_rng(5)
    paths = []
    for n in range(7):
        path = folder / f"{n}.png"
        Image.fromarray(rng.integers(0, 255, size=(20, 24, 3), dtype=np.uint8)).save(path)
        paths.append(str(path))
    return paths


class Residual(nn.Module):
    """A convolution stack with a skip connection around the ablated layer, and a classifier."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 6, 3, padding=1)
        self.block = nn.Conv2d(6, 6, 3, padding=1)
        self.after = nn.Conv2d(6, 5, 1)
        self.head = nn.Linear(5, 4)

    def forward(self, x):
        x = torch.relu(self.stem(x))
        x = torch.relu(self.block(x) + x)
        return self.head(self.after(x).mean(dim=(2, 3)))


def _net() -> Residual:
    torch.manual_seed(0)
    return Residual().eval()


def _inputs(net, photos):
    return hookcli.extract(net, "stem", photos, capture="input", **SMALL)["stem@input"]


def _ablated_by_hand(net, batch, layer, unit, replace):
    """The logits with a hook written by hand replacing unit ``unit`` of ``layer``'s output, batch by batch."""
    module = dict(net.named_modules())[layer]
    found = []
    for rows in batch.split(SMALL["batch_size"]):
        handle = module.register_forward_hook(lambda m, i, out: replace(out.clone(), unit))
        try:
            with torch.no_grad():
                found.append(net(rows))
        finally:
            handle.remove()
    return torch.cat(found)


def _expected(logits, ablated):
    """What the file holds for one unit, computed in the test from the logits."""
    predicted = logits.argmax(1)
    rows = torch.arange(len(logits))
    change = (ablated - logits)[rows, predicted].double()
    p, q = logits.softmax(1), ablated.softmax(1)
    prob = (q - p)[rows, predicted].double()
    kl = (p * (p.log() - q.log())).sum(1).double()
    return {
        "logit_change": change.mean(),
        "logit_change_std": change.std(unbiased=False),
        "prob_change": prob.mean(),
        "flips": (ablated.argmax(1) != predicted).double().mean(),
        "kl": kl.mean(),
        "class_effect": (ablated - logits).double().mean(0),
    }


def _zero(out, unit):
    out[:, unit] = 0
    return out


@pytest.mark.parametrize("how", ["zero", "resample", "mean"])
def test_each_units_effects_equal_hooks_written_by_hand(photos, tmp_path, how):
    net = _net()
    batch = _inputs(net, photos)
    with torch.no_grad():
        logits = torch.cat([net(rows) for rows in batch.split(SMALL["batch_size"])])
    if how == "mean":
        stats = hookcli.stats(net, "block", photos, output=tmp_path / "s.safetensors", top=1, **SMALL)
        with hookcli.open_features(stats) as read:
            means = torch.from_numpy(read.read("block@mean")).float()
        asked, replace = f"mean:{stats}", lambda out, u: _set_unit(out, u, means[u])
    elif how == "resample":
        asked, replace = "resample", lambda out, u: _set_unit(out, u, out[partners(out.shape[0], 0)][:, u])
    else:
        asked, replace = "zero", _zero
    found = hookcli.ablate(net, "block", photos, units="1,4", how=asked, **SMALL)
    assert found["block@units"].tolist() == [1, 4] and int(found["block@count"]) == 7
    for row, unit in enumerate([1, 4]):
        expected = _expected(logits, _ablated_by_hand(net, batch, "block", unit, replace))
        for field, value in expected.items():
            torch.testing.assert_close(found[f"block@{field}"][row], value, rtol=1e-4, atol=1e-5, msg=field)


def test_a_mean_ablation_from_a_stats_file_of_other_inputs_or_an_edited_run_says_so(photos, tmp_path, monkeypatch):
    from hookcli.events import Note

    net = _net()
    stats = hookcli.stats(net, "block", photos, output=tmp_path / "s.safetensors", top=1, **SMALL)
    heard: list = []
    other = {**SMALL, "crop": SMALL["crop"] - 2}
    hookcli.ablate(net, "block", photos, units="1", how=f"mean:{stats}", progress=heard.append, **other)
    said = [event.text for event in heard if isinstance(event, Note) and "prepared otherwise" in event.text]
    assert said == [
        f"ablate: '{stats}' holds values of inputs prepared otherwise than this run's: preprocess (crop: the file's "
        f"{SMALL['crop']}, this run's {other['crop']})"
    ]
    edited = hookcli.stats(net, "block", photos, output=tmp_path / "e.safetensors", top=1, intervene=["stem=zero"],
                           **SMALL)  # fmt: skip
    heard.clear()
    monkeypatch.chdir(tmp_path)
    found = hookcli.ablate(net, "block", photos, units="1", how=f"mean:{edited.name}", progress=heard.append,
                           **SMALL)  # fmt: skip  # the file named as given, recorded as where it is
    assert [event.text for event in heard if isinstance(event, Note) and "edited" in event.text] == [
        f"ablate: '{edited.name}' holds values of the model as its run edited it (stem=zero)"
    ]
    assert json.loads(found.metadata["ablate"])["file"] == str(edited)
    heard.clear()
    hookcli.ablate(net, "block", photos, units="1", how="resample", progress=heard.append, **{**SMALL, "batch_size": 1})
    assert [event.text for event in heard if isinstance(event, Note) and "resample" in event.text] == [
        "ablate: resample takes each row's values from another row of its batch, and a batch of one row holds no "
        "other, so it changes nothing (give --batch-size 2 or more)"
    ]
    before = Path(stats).read_bytes()
    with pytest.raises(UsageProblem) as refused:  # the statistics read are not overwritten, --force or not
        hookcli.ablate(net, "block", photos, units="1", how=f"mean:{stats}", output=stats, force=True, **SMALL)
    assert refused.value.message == f"output '{stats}' is the input '{stats}'"
    assert Path(stats).read_bytes() == before


class InPlace(Residual):
    """The residual added in place onto the ablated layer's output (a method call, which torch.fx keeps in place)."""

    def forward(self, x):
        x = torch.relu(self.stem(x))
        out = self.block(x)
        out.add_(x)
        return self.head(self.after(torch.relu(out)).mean(dim=(2, 3)))


def test_an_in_place_add_after_the_ablated_layer_does_not_reach_what_is_ablated(photos):
    torch.manual_seed(0)
    net = InPlace().eval()
    batch = _inputs(net, photos)
    with torch.no_grad():
        logits = torch.cat([net(rows) for rows in batch.split(SMALL["batch_size"])])
    found = hookcli.ablate(net, "block", photos, units="2", **SMALL)
    expected = _expected(logits, _ablated_by_hand(net, batch, "block", 2, _zero))
    torch.testing.assert_close(found["block@class_effect"][0], expected["class_effect"], rtol=1e-4, atol=1e-5)


def _set_unit(out, unit, value):
    out[:, unit] = value
    return out


def test_where_the_output_is_linear_in_the_layer_a_units_effect_is_its_weight_times_its_activation(photos):
    torch.manual_seed(1)
    net = nn.Sequential(nn.Flatten(), nn.Linear(3 * 16 * 16, 6), nn.Identity(), nn.Linear(6, 3)).eval()
    activations = hookcli.extract(net, "2", photos, **SMALL)["2"].double()
    found = hookcli.ablate(net, "2", photos, **SMALL)
    weight = net[3].weight.detach().double()
    expected = -(activations.mean(0)[:, None] * weight.T)  # [units, classes]
    torch.testing.assert_close(found["2@class_effect"], expected, rtol=0, atol=1e-5)
    assert found["2@units"].tolist() == list(range(6))


def test_a_vision_transformers_token_features_are_ablated_one_by_one(photos):
    from torchvision.models import VisionTransformer

    torch.manual_seed(0)
    vit = VisionTransformer(image_size=16, patch_size=8, num_layers=2, num_heads=2, hidden_dim=8, mlp_dim=16).eval()
    layer = "encoder.layers.encoder_layer_0"
    batch = hookcli.extract(vit, "conv_proj", photos, capture="input", **SMALL)["conv_proj@input"]
    with torch.no_grad():
        logits = torch.cat([vit(rows) for rows in batch.split(SMALL["batch_size"])])

    def feature(out, unit):
        out[..., unit] = 0
        return out

    found = hookcli.ablate(vit, layer, photos, units="3", **SMALL)
    expected = _expected(logits, _ablated_by_hand(vit, batch, layer, 3, feature))
    torch.testing.assert_close(found[f"{layer}@class_effect"][0], expected["class_effect"], rtol=1e-4, atol=1e-5)


def _digest(path) -> str:
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def test_one_process_and_parts_write_the_same_file_and_the_metadata_says_what_was_ablated(photos, tmp_path, runner):
    net = _net()
    one = hookcli.ablate(net, "block", photos, output=tmp_path / "one.safetensors", shard_size=3, **SMALL)
    shared = tmp_path / "shared.safetensors"
    for part in ("1/2", "2/2"):
        hookcli.ablate(net, "block", photos, output=shared, shard_size=3, part=part, **SMALL)
    assert shared.exists() and _digest(shared) != "" and not (tmp_path / "shared.safetensors.parts").exists()
    with hookcli.open_features(one) as a, hookcli.open_features(shared) as b:
        for key in a.keys():
            assert np.array_equal(a.read(key), b.read(key)), key
        assert a.metadata["kind"] == "ablate" and a.metadata["format"] == "6"
        assert a.metadata["ablate"] == (
            '{"layer": "block", "key": "block", "how": "zero", "units": null, "effect_on": "."}'
        )
    args = ["-m", "resnet18", "-w", "none", "--resize", "32", "--crop", "32", "-l", "layer4", "--units", "0:3", "-q"]
    done = runner.invoke(main, ["ablate", *args, "-o", str(tmp_path / "r.safetensors"), *photos[:2]])
    assert done.exit_code == 0, done.output
    assert done.output.strip() == str(tmp_path / "r.safetensors")


@pytest.mark.parametrize(
    ("keywords", "message"),
    [
        ({"how": "mean"}, "--how takes zero, mean:FILE or resample, not 'mean'"),
        ({"how": "drop"}, "--how takes zero, mean:FILE or resample, not 'drop'"),
        ({"how": "mean:nowhere.safetensors"}, "--how 'mean:nowhere.safetensors': 'nowhere.safetensors' not found"),
        ({"units": "3:1"}, "--units '3:1': the units 3:1 are no range A:B with 0 <= A < B"),
        ({"units": ""}, "--units '': '' names no units"),  # not every unit, as an empty variable would ask
        ({"units": "6"}, "block has 6 units (0 to 5), and unit 6 does not exist"),
        ({"effect_on": "nowhere"}, "--effect-on 'nowhere': the model has no layer 'nowhere'"),
    ],
)
def test_what_cannot_be_ablated_is_refused_in_one_line(photos, keywords, message):
    with pytest.raises(UsageProblem) as caught:
        hookcli.ablate(_net(), "block", photos, **keywords, **SMALL)
    assert caught.value.message.removeprefix("ablate: ") == message


def test_a_layer_the_forward_runs_twice_is_refused_and_a_refused_run_leaves_no_parts(photos, tmp_path):
    with pytest.raises(UsageProblem) as caught:  # resnet18's block calls its one ReLU twice
        hookcli.ablate("resnet18", "layer1.0.relu", photos, weights="none", resize=32, crop=32)
    assert caught.value.message == (
        "ablate: the forward runs layer1.0.relu 2 times, so its output is not one value to ablate"
    )
    out, small = tmp_path / "e.safetensors", {"weights": "none", "resize": 32, "crop": 32, "batch_size": 3}
    with pytest.raises(UsageProblem) as caught:  # a block's width is known at the first batch, once parts are begun
        hookcli.ablate("resnet18", "layer3", photos, units="250:300", output=out, **small)
    assert caught.value.message == "layer3 has 256 units (0 to 255), and unit 256 does not exist"
    assert sorted(path.name for path in tmp_path.iterdir()) == []  # no parts of a run that cannot be continued
    assert hookcli.ablate("resnet18", "layer3", photos, units="250:256", output=out, **small) == out  # corrected


class MixedTwice(Residual):
    """A 1x1 convolution the forward runs twice after the block; ``branching``: untraceable by torch.fx."""

    def __init__(self, branching: bool) -> None:
        super().__init__()
        self.mix, self.branching = nn.Conv2d(6, 6, 1), branching

    def forward(self, x):
        x = torch.relu(self.stem(x))
        x = torch.relu(self.block(x) + x)
        if not self.branching or x.sum() > -1e9:
            x = self.mix(self.mix(x))
        return self.head(self.after(x).mean(dim=(2, 3)))


@pytest.mark.parametrize(("branching", "calls"), [(False, "2 times"), (True, "more than once")])
def test_an_effect_on_layer_the_forward_runs_twice_is_refused(photos, branching, calls):
    torch.manual_seed(0)
    with pytest.raises(UsageProblem) as caught:  # its first call's output is not the one the model goes on with
        hookcli.ablate(MixedTwice(branching).eval(), "block", photos, effect_on="mix", units="0:2", **SMALL)
    assert str(caught.value) == (
        f"--effect-on mix: the forward runs mix {calls}, so its output is not one value to measure. Hint: measure a "
        "layer the forward runs once (hookcli layers shows how often each runs), or leave --effect-on out for the "
        "model's output"
    )


def test_ablate_takes_one_layer_and_no_edits(photos):
    with pytest.raises(UsageProblem) as caught:
        hookcli.ablate(_net(), ["stem", "block"], photos, **SMALL)
    assert caught.value.message == "ablate takes one layer, and stem, block were given"
    with pytest.raises(TypeError, match="ablate\\(\\) got an unexpected keyword argument 'intervene'"):
        hookcli.ablate(_net(), "block", photos, intervene=["stem=zero"])


def test_grid_draws_the_units_of_largest_effect_against_the_classes_they_move(photos, tmp_path, runner):
    from safetensors.numpy import load_file, save_file

    from hookcli.errors import FeatureFileError
    from hookcli.pictures.ablation_grids import ranked_units, strongest_classes

    path = hookcli.ablate(_net(), "block", photos, output=tmp_path / "e.safetensors", **SMALL)
    with hookcli.open_features(path) as read:
        kl, effects = read.read("block@kl"), read.read("block@class_effect")
    drawn = hookcli.grid(path, top=3)
    assert list(drawn) == ["e.png"] and drawn["e.png"].shape[2] == 3
    plain = hookcli.grid(path, top=3, plain=True)["e.png"]
    cell = min(48, 640 // 4)  # 3 units by the 4 classes of the head
    assert plain.shape == (3 * cell, 4 * cell, 3)
    rows = ranked_units(kl, 3)
    assert kl[rows].tolist() == sorted(kl, reverse=True)[:3]
    assert strongest_classes(effects[rows], 2).tolist() == np.argsort(-np.abs(effects[rows]).mean(0))[:2].tolist()
    done = runner.invoke(main, ["grid", str(path), "-o", str(tmp_path / "pictures"), "-k", "block"])
    assert done.exit_code == 2
    assert "Error: --key does not apply to an ablation file" in done.output
    scaled = runner.invoke(main, ["grid", str(path), "-o", str(tmp_path / "pictures"), "--scale", "grid"])
    assert (scaled.exit_code, scaled.stderr) == (
        2,
        f"Error: --scale does not apply to an ablation file ('{path}' holds one matrix of units and classes): its "
        "picture has one colour scale. Hint: leave --scale out\n",
    )
    tensors = load_file(str(path))
    with hookcli.open_features(path) as read:
        metadata = dict(read.metadata)
    del tensors["block@kl"]
    save_file(tensors, str(tmp_path / "damaged.safetensors"), metadata)
    with pytest.raises(FeatureFileError) as caught:
        hookcli.grid(tmp_path / "damaged.safetensors")
    assert caught.value.message == (
        f"'{tmp_path / 'damaged.safetensors'}' is a damaged ablation file: it does not hold the tensors of layer "
        "'block' (block@kl)"
    )


def test_the_readmes_ablation_tour_runs_as_written(runner, tmp_path, monkeypatch):
    import re
    import shlex
    from pathlib import Path

    from PIL import Image

    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)```", readme, flags=re.DOTALL)
    lines = [re.sub(r"\s+#.*$", "", line) for block in blocks for line in block.splitlines()]
    tour = [line for line in lines if line.startswith(("hookcli ablate", "hookcli grid layer4.ablate"))]
    assert len(tour) == 2
    (tmp_path / "photos").mkdir()
    rng = np.random.default_rng(0)
    for name in "abc":
        pixels = rng.integers(0, 255, size=(60, 50, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(tmp_path / "photos" / f"{name}.jpg")
    monkeypatch.chdir(tmp_path)
    for line in tour:
        done = runner.invoke(main, shlex.split(line)[1:])
        assert done.exit_code == 0, (line, done.output)
    with hookcli.open_features("layer4.ablate.safetensors") as read:
        assert read["layer4@class_effect"].shape == (64, 1000) and int(read["layer4@count"]) == 3
    assert (tmp_path / "layer4.ablate_grids" / "layer4.ablate.png").is_file()


def test_the_report_ranks_the_units_and_shows_their_dataset_examples(photos, tmp_path, runner):
    net = _net()
    path = hookcli.ablate(net, "block", photos, output=tmp_path / "e.safetensors", **SMALL)
    stats = hookcli.stats(net, "block", photos, output=tmp_path / "s.safetensors", top=2, **SMALL)
    index = hookcli.report(path, output=tmp_path / "report", examples=str(stats), top=4)
    page = index.read_text()
    with hookcli.open_features(path) as read:
        kl, units = read.read("block@kl"), read.read("block@units")
    ranked = [int(units[i]) for i in np.argsort(-kl, kind="stable")[:4]]
    assert [int(n) for n in __import__("re").findall(r'<tr id="unit-(\d+)">', page)] == ranked
    assert page.count('alt="dataset examples of unit') == 4 and "classes lowered most" in page
    other = hookcli.stats(net, "stem", photos, output=tmp_path / "stem.safetensors", top=1, **SMALL)
    with pytest.raises(UsageProblem) as caught:
        hookcli.report(path, output=tmp_path / "again", examples=str(other))
    assert caught.value.message == (f"--examples '{other}' holds no statistics of block, the layer '{path}' ablates")
    done = runner.invoke(main, ["report", str(stats), "-o", str(tmp_path / "r2"), "--examples", str(stats)])
    assert done.exit_code == 2
    assert f"Error: --examples shows the dataset examples of an ablation file's units, and '{stats}' is not one" in (
        done.output
    )
    refused = runner.invoke(main, ["grid", str(path), "--examples", str(stats)])
    assert refused.exit_code == 2 and "No such option: --examples" in refused.output


def _after_by_hand(net, batch):
    """The logits, and ``after``'s output as it returns it, of the model as it is and with unit 2 of ``block`` zeroed
    (``(logits, ablated, plain, edited)``), by hooks written here."""
    kept = []
    handle = net.after.register_forward_hook(lambda m, i, out: kept.append(out.flatten(1).clone()))
    try:
        with torch.no_grad():
            logits = torch.cat([net(rows) for rows in batch.split(SMALL["batch_size"])])
        plain = torch.cat(kept)
        kept.clear()
        ablated = _ablated_by_hand(net, batch, "block", 2, _zero)
        edited = torch.cat(kept)
    finally:
        handle.remove()
    return logits, ablated, plain, edited


def test_effects_on_another_layer_equal_hooks_written_by_hand(photos):
    net = _net()
    _, ablated, plain, edited = _after_by_hand(net, _inputs(net, photos))
    assert ablated.shape == (7, 4)
    found = hookcli.ablate(net, "block", photos, units="2", effect_on="after", **SMALL)
    assert found["block@class_effect"].shape == (1, plain.shape[1])
    expected = _expected(plain, edited)
    torch.testing.assert_close(found["block@class_effect"][0], expected["class_effect"], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(found["block@kl"][0], expected["kl"], rtol=1e-4, atol=1e-6)


class ReluAfter(Residual):
    """The measured layer's output changed in place by the ReLU after it, as in torchvision's ResNets and VGGs; and a
    value from before the ablated layer changed in place by an add after it."""

    def forward(self, x):
        x = torch.relu(self.stem(x))
        x.add_(self.block(x))
        out = self.after(x)
        torch.relu_(out)
        return self.head(out.mean(dim=(2, 3)))


class ReluAfterBranching(ReluAfter):
    """:class:`ReluAfter` that torch.fx cannot trace."""

    def forward(self, x):
        if x.sum() < -1e9:
            return x
        return super().forward(x)


@pytest.mark.parametrize("model", [ReluAfter, ReluAfterBranching])
def test_effects_are_of_what_the_layers_return_before_in_place_operations_after_them(photos, model):
    torch.manual_seed(0)
    net = model().eval()
    logits, ablated, plain, edited = _after_by_hand(net, _inputs(net, photos))
    assert (plain < 0).any()  # values the ReLU after the layer would change
    on_after = hookcli.ablate(net, "block", photos, units="2", effect_on="after", **SMALL)
    expected = _expected(plain, edited)
    torch.testing.assert_close(on_after["block@class_effect"][0], expected["class_effect"], rtol=1e-4, atol=1e-5)
    on_output = hookcli.ablate(net, "block", photos, units="2", **SMALL)
    expected = _expected(logits, ablated)
    torch.testing.assert_close(on_output["block@class_effect"][0], expected["class_effect"], rtol=1e-4, atol=1e-5)
    assert expected["class_effect"].abs().max() > 1e-3


class Branching(Residual):
    """A model torch.fx cannot trace: its forward branches on a tensor's value."""

    def forward(self, x):
        x = torch.relu(self.stem(x))
        if x.sum() > -1e9:
            x = torch.relu(self.block(x) + x)
        return self.head(self.after(x).mean(dim=(2, 3)))


def test_a_model_that_cannot_be_traced_runs_whole_for_each_chunk_and_says_so(photos):
    torch.manual_seed(0)
    net, plain = Branching().eval(), _net()
    heard = []
    found = hookcli.ablate(net, "block", photos, units="0,3", progress=heard.append, **SMALL)
    expected = hookcli.ablate(plain, "block", photos, units="0,3", **SMALL)
    for key in expected:
        torch.testing.assert_close(found[key], expected[key], rtol=1e-5, atol=1e-6, msg=key)
    notes = [event.text for event in heard if type(event).__name__ == "Note"]
    assert any(text.startswith("Branching cannot be traced by torch.fx, so the layers before block run again") for
               text in notes), notes  # fmt: skip


class Scaled(Residual):
    """The residual model with its input scaled first, in its forward: what a pre-hook on the model does."""

    def forward(self, x):
        return super().forward(x * 5 + 1)


class CalledScaled(Residual):
    """The same, by a ``__call__`` of its own, which a trace of ``forward`` would skip."""

    def __call__(self, x):
        return super().__call__(x * 5 + 1)


def test_a_models_own_hooks_and_call_run_in_an_ablation_which_says_it_runs_untraced(photos):
    expected = hookcli.ablate(_scaled(Scaled), "block", photos, units="0:4", **SMALL)
    hooked = _scaled(Residual)
    hooked.register_forward_pre_hook(lambda module, args: (args[0] * 5 + 1,))
    for net, why in ((hooked, "has hooks of its own"), (_scaled(CalledScaled), "has a __call__ of its own")):
        heard = []
        found = hookcli.ablate(net, "block", photos, units="0:4", progress=heard.append, **SMALL)
        for key in expected:
            torch.testing.assert_close(found[key], expected[key], rtol=1e-5, atol=1e-6, msg=key)
        notes = [event.text for event in heard if type(event).__name__ == "Note"]
        said = f"{type(net).__name__} {why}, which a torch.fx trace would skip, so the layers before block run again"
        assert any(text.startswith(said) for text in notes), notes


class Doubling(nn.Module):
    def forward(self, x):
        return x * 2


def test_a_layer_inside_a_module_with_hooks_is_ablated_with_them_running(photos):
    torch.manual_seed(0)
    net = nn.Sequential(nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU()), nn.Conv2d(4, 4, 3))
    net = nn.Sequential(*net, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 5)).eval()
    doubled = nn.Sequential(nn.Sequential(*net[0], Doubling()), *net[1:]).eval()  # the hook's work, in the forward
    net[0].register_forward_hook(lambda module, args, output: output * 2)
    heard = []
    found = hookcli.ablate(net, "0.0", photos, units="0:2", progress=heard.append, **SMALL)
    expected = hookcli.ablate(doubled, "0.0", photos, units="0:2", **SMALL)
    for key in expected:
        torch.testing.assert_close(found[key], expected[key], rtol=1e-5, atol=1e-6, msg=key)
    said = "Sequential has hooks on 0, which holds 0.0, and a torch.fx trace would skip them, so the layers before 0.0"
    assert any(event.text.startswith(said) for event in heard if type(event).__name__ == "Note")


def _scaled(kind):
    torch.manual_seed(0)
    return kind().eval()


def test_a_damaged_part_is_refused_naming_it_and_what_is_wrong(photos, tmp_path):
    import shutil

    from safetensors.numpy import load_file, save_file

    from hookcli.errors import FeatureFileError, ImageError

    inputs = [shutil.copy(photo, tmp_path / Path(photo).name) for photo in photos]
    good = Path(inputs[4]).read_bytes()
    Path(inputs[4]).write_bytes(b"not an image")  # the second shard fails: the first one's part is left
    net, out = _net(), tmp_path / "e.safetensors"
    with pytest.raises(ImageError):
        hookcli.ablate(net, "block", inputs, output=out, shard_size=3, **SMALL)
    parts = sorted((tmp_path / "e.safetensors.parts").glob("*.safetensors"))
    assert len(parts) == 1
    from safetensors import safe_open

    tensors = load_file(str(parts[0]))
    with safe_open(str(parts[0]), "np") as read:
        metadata = read.metadata()
    name = next(key for key in tensors if key.endswith("/logit") or key == "logit")
    tensors[name] = tensors[name][:2]  # fewer units than the part's other sums
    save_file(tensors, str(parts[0]), metadata)
    Path(inputs[4]).write_bytes(good)
    with pytest.raises(FeatureFileError) as caught:
        hookcli.ablate(net, "block", inputs, output=out, shard_size=3, **SMALL)
    assert caught.value.message == (
        f"part '{parts[0]}' of '{out}' is damaged: its 'logit_squares' is not one float64 value a unit"
    )
    assert caught.value.hint == "it is removed: run the same command again to compute it"
    assert not out.exists() and not parts[0].exists()
    again = hookcli.ablate(net, "block", inputs, output=out, shard_size=3, **SMALL)  # the part computed again
    whole = hookcli.ablate(net, "block", inputs, output=tmp_path / "whole.safetensors", shard_size=3, **SMALL)
    assert again.read_bytes() == whole.read_bytes()


class Unused(Residual):
    """A model that holds a layer its forward never calls."""

    def __init__(self) -> None:
        super().__init__()
        self.unused = nn.Conv2d(6, 6, 1)


def test_what_an_ablation_cannot_measure_is_refused_and_numbers_are_taken_as_units(photos, tmp_path):
    refusals = {
        "the layer itself": ({"effect_on": "block"}, "--effect-on block is the ablated layer itself"),
        "a layer before": (
            {"effect_on": "stem"},
            "--effect-on stem runs before block, the ablated layer, so nothing it returns can change",
        ),
    }
    for keywords, message in refusals.values():
        with pytest.raises(UsageProblem) as caught:
            hookcli.ablate(_net(), "block", photos, **keywords, **SMALL)
        assert caught.value.message == message
    torch.manual_seed(0)
    with pytest.raises(LayerNotRunError) as caught:
        hookcli.ablate(Unused().eval(), "unused", photos, **SMALL)
    assert caught.value.message == "ablate: the forward never runs unused"
    listed = hookcli.ablate(_net(), "block", photos, units=[4, 1], **SMALL)
    assert listed["block@units"].tolist() == [4, 1]
    with pytest.raises(UsageProblem) as caught:
        hookcli.ablate(_net(), "block", photos, units="3:9", **SMALL)
    assert caught.value.message == "ablate: block has 6 units (0 to 5), and unit 6 does not exist"
    alone = hookcli.ablate(_net(), "block", photos, how="resample", batch_size=1, resize=16, crop=16)
    assert alone["block@kl"].abs().max().item() < 1e-12  # each row is its own partner: nothing changes
    assert alone["block@class_effect"].abs().max().item() < 1e-6 and alone["block@flips"].abs().max().item() == 0
    assert json.loads(alone.metadata["ablate"])["batch_size"] == 1  # the rows a batch pairs: part of the run


def test_a_mean_of_other_weights_is_refused_and_the_spec_is_named_as_written(photos, tmp_path):
    other = hookcli.stats("resnet18", "layer1", photos[:2], output=tmp_path / "s3.safetensors", weights="none",
                          seed=3, top=1, resize=32, crop=32)  # fmt: skip
    with pytest.raises(UsageProblem) as caught:
        hookcli.extract("resnet18", "layer2", photos[:1], weights="none", intervene=[f"layer1=mean:{other}"],
                        resize=32, crop=32)  # fmt: skip
    assert caught.value.message == (
        f"--intervene 'layer1=mean:{other}': '{other}' was made with other weights "
        '({"source": "none", "seed": 3}) than this run\'s ({"source": "none", "seed": 0})'
    )
    with pytest.raises(UsageProblem) as caught:
        hookcli.extract("resnet18", "layer2", photos[:1], weights="none", intervene=["layer1:60:70=zero"])
    assert (
        caught.value.message
        == "--intervene 'layer1:60:70=zero': layer1 has 64 units (0 to 63), and unit 64 does not exist"
    )


def test_a_traced_run_keeps_only_the_values_a_later_run_reads():
    """What ablate and patch run the model with (hookcli.run.replay.Kept) lets each value go after its last user, but
    those a later run starts from: one forward's worth of memory, not every layer's output at once."""
    from hookcli.run.replay import Kept, traced

    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Conv2d(4, 4, 3), nn.ReLU(), nn.Flatten()).eval()
    graph, _ = traced(model, set())
    nodes = {node.name: node for node in graph.graph.nodes}
    x = torch.randn(2, 3, 8, 8)
    kept = Kept(graph, copied={nodes["_1"]}, keep={nodes["_2"]})
    with torch.no_grad():
        output = kept.run(x)
        expected = model(x)
    assert torch.equal(output, expected)
    assert set(kept.env) == {nodes["_2"], nodes["output"]}  # the input and every other layer's output are gone
    torch.testing.assert_close(kept.env[nodes["_2"]], model[:3](x), rtol=0, atol=0)
    assert torch.equal(kept.copies[nodes["_1"]], model[:2](x))
    everything = Kept(graph, keep=set(graph.graph.nodes))
    everything.run(x)
    assert set(everything.env) == set(graph.graph.nodes)


def test_the_kl_of_a_tiny_change_keeps_its_digits():
    from hookcli.run.ablation import _changes

    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 10, generator=generator) * 1e-3  # a random-weight model's small logits
    moved = logits + torch.randn(2, 3, 10, generator=generator) * 1e-6  # two units that barely change them
    found = _changes(torch.cat([logits[None], moved]))["kl"]
    p, q = logits.double().softmax(dim=1), moved.double().softmax(dim=2)
    direct = (p * (p.log() - q.log())).sum(dim=2).T  # the definition, in float64: fine at these sizes
    assert bool((direct > 1e-14).all()) and bool((direct < 1e-11).all())
    torch.testing.assert_close(found, direct, rtol=1e-3, atol=0)


class Nested(Residual):
    """:class:`Residual` whose layer after the block holds its convolution inside."""

    def __init__(self) -> None:
        super().__init__()
        self.after = nn.Sequential(nn.Conv2d(6, 5, 1), nn.ReLU())


def test_a_layer_inside_the_measured_one_is_ablated_whole_and_one_inside_the_ablated_one_is_refused(photos):
    torch.manual_seed(0)
    net = Nested().eval()
    batch, kept = _inputs(net, photos), []
    handle = net.after.register_forward_hook(lambda m, i, out: kept.append(out.flatten(1).clone()))
    try:
        with torch.no_grad():
            [net(rows) for rows in batch.split(SMALL["batch_size"])]
        plain = torch.cat(kept)
        kept.clear()
        _ablated_by_hand(net, batch, "after.0", 2, _zero)
        edited = torch.cat(kept)
    finally:
        handle.remove()
    notes = []
    found = hookcli.ablate(net, "after.0", photos, units="2", effect_on="after", progress=notes.append, **SMALL)
    expected = _expected(plain, edited)
    torch.testing.assert_close(found["after.0@class_effect"][0], expected["class_effect"], rtol=1e-4, atol=1e-5)
    assert expected["class_effect"].abs().max() > 1e-3
    assert [note.text for note in notes if isinstance(note, Note)][-1:] == [
        "Nested holds after.0 inside after, which a torch.fx trace would keep whole, so the layers before after.0 "
        "run again for each chunk of units (the values are the same)"
    ]
    with pytest.raises(UsageProblem) as caught:
        hookcli.ablate(net, "after", photos, effect_on="after.0", **SMALL)
    assert caught.value.message == (
        "--effect-on after.0 runs inside after, the ablated layer, before its output is ablated, so nothing it "
        "returns can change"
    )
