"""--intervene: every edit equals a hook written by hand (on a CNN and a vision transformer's tokens), captures see
the layer before its edits unless asked, the file records each edit, and bad specs are one line each."""

import copy
import json

import numpy as np
import pytest
import torch
from safetensors.numpy import save_file
from torch import nn

import hookcli
from hookcli.cli import main
from hookcli.errors import FeatureFileError, LayerNotRunError, UsageProblem
from hookcli.options.interventions import Intervention, parse_intervention
from hookcli.run.edits import partners

SMALL = {"resize": 16, "crop": 16, "batch_size": 4}


def _cnn() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 6, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(6, 5, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(5, 4),
    ).eval()


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    from PIL import Image

    folder = tmp_path_factory.mktemp("edited")
    rng = np.random.default_rng(3)
    paths = []
    for n in range(5):
        path = folder / f"{n}.png"
        Image.fromarray(rng.integers(0, 255, size=(20, 24, 3), dtype=np.uint8)).save(path)
        paths.append(str(path))
    return paths


def _inputs(net, photos, layer="0"):
    """The batch hookcli feeds the model, as the first layer's input."""
    return hookcli.extract(net, layer, photos, capture="input", **SMALL)[f"{layer}@input"]


def _by_hand(net, batch, edited: str, edit, read: str):
    """Layer ``read``'s output with ``edit(output)`` returned by a hook on layer ``edited``, written by hand, over
    the batches hookcli runs (resample pairs rows within one)."""
    kept = []
    modules = dict(net.named_modules())
    handles = [
        modules[edited].register_forward_hook(lambda m, i, out: edit(out.clone())),
        modules[read].register_forward_hook(lambda m, i, out: kept.append(out.clone())),
    ]
    try:
        with torch.no_grad():
            for rows in batch.split(SMALL["batch_size"]):
                net(rows)
    finally:
        for handle in handles:
            handle.remove()
    return torch.cat(kept)


def _set(out, units, values):
    out[:, units] = values
    return out


def test_the_spec_reads_as_documented():
    assert parse_intervention("features.14:135=zero") == Intervention("features.14", (135,), "zero")
    assert parse_intervention(" layer4:2:5=scale:0.5 ").units == (2, 3, 4)
    assert parse_intervention("layer4:7,3,7=value:-1").units == (7, 3)
    assert parse_intervention("layer4:*=resample").units is None
    added = parse_intervention("blocks.3=add:C:/runs/s.safetensors:blocks.3@pca_vectors:2:-4")
    assert (added.file, added.key, added.row) == ("C:/runs/s.safetensors", "blocks.3@pca_vectors", 2)
    assert added.numbers == (-4.0,)
    assert parse_intervention("fc=clamp:-1:2.5").numbers == (-1.0, 2.5)
    assert parse_intervention("fc=mean:a:b.safetensors").file == "a:b.safetensors"
    assert added.text == "blocks.3=add:C:/runs/s.safetensors:blocks.3@pca_vectors:2:-4"


@pytest.mark.parametrize(
    ("spec", "why"),
    [
        ("layer4", "it is not LAYER[:UNITS]=EDIT"),
        ("=zero", "it is not LAYER[:UNITS]=EDIT"),
        ("layer4=drop", "'drop' is not an edit"),
        ("layer4:x=zero", "'x' names no units"),
        ("layer4:5:2=zero", "the units 5:2 are no range A:B with 0 <= A < B"),
        ("layer4:-1=zero", "the units -1 are not whole numbers from 0"),
        ("layer4:1_0=zero", "'1_0' names no units"),
        ("layer4:\u0663=zero", "'\u0663' names no units"),
        ("layer4=scale:1_0", "'1_0' is not a number"),
        ("layer4=zero:1", "zero takes nothing after it"),
        ("layer4=zero:", "zero takes nothing after it"),
        ("layer4=value", "value takes value:V"),
        ("layer4=scale:nan", "'nan' is not a finite number"),
        ("layer4=value:1e39", "'1e39' is beyond float32's range (±3.4e38), in which layers compute"),
        ("layer4=scale:-4e38", "'-4e38' is beyond float32's range (±3.4e38), in which layers compute"),
        ("layer4=clamp:2:1", "clamp's LO must not be above its HI (2 > 1)"),
        ("layer4=add:f.safetensors:k:one:1", "add's ROW must be a whole number from 0, not 'one'"),
        ("layer4=add:f.safetensors:k:\u00b2:1", "add's ROW must be a whole number from 0, not '\u00b2'"),
        ("layer4=mean", "mean takes the statistics file: mean:FILE"),
    ],
)
def test_a_bad_spec_is_one_line_saying_why(spec, why):
    with pytest.raises(UsageProblem) as caught:
        parse_intervention(spec)
    assert caught.value.message == f"--intervene '{spec}': {why}"
    assert caught.value.hint.startswith("give LAYER[:UNITS]=EDIT, UNITS as K, A:B, K,L,M or *")


@pytest.mark.parametrize(
    ("spec", "edit"),
    [
        ("0:1,4=zero", lambda out: _set(out, [1, 4], 0.0)),
        ("0=zero", lambda out: torch.zeros_like(out)),
        ("0:2:5=value:1.5", lambda out: _set(out, [2, 3, 4], 1.5)),
        ("0:3=scale:-2", lambda out: _set(out, [3], out[:, [3]] * -2)),
        ("0=clamp:-0.1:0.2", lambda out: out.clamp(-0.1, 0.2)),
        ("0:0,5=resample", lambda out: _set(out, [0, 5], out[partners(out.shape[0], 0)][:, [0, 5]])),
    ],
)
def test_each_edit_equals_a_hook_written_by_hand(photos, tmp_path, spec, edit):
    net = _cnn()
    batch = _inputs(net, photos)
    found = hookcli.extract(net, ["0", "2"], photos, intervene=[spec], **SMALL)
    expected = _by_hand(net, batch, "0", edit, "2")
    torch.testing.assert_close(found["2"], expected, rtol=0, atol=1e-6)
    plain = hookcli.extract(net, "0", photos, **SMALL)["0"]
    assert torch.equal(found["0"], plain)  # the edited layer's capture is what it returned
    written = hookcli.extract(net, ["0", "2"], photos, intervene=[spec], output=tmp_path / "f.safetensors", **SMALL)
    with hookcli.open_features(written) as read:
        assert np.array_equal(read.read("2"), found["2"].numpy())
        assert json.loads(read.metadata["interventions"])["edits"][0]["layer"] == "0"


def test_resample_pairs_each_row_with_another_row_of_its_batch():
    order = partners(5, 0)
    assert sorted(order.tolist()) == [0, 1, 2, 3, 4] and all(order[i] != i for i in range(5))
    assert partners(1, 0).tolist() == [0] and torch.equal(partners(5, 0), order)
    assert not torch.equal(partners(5, 1), order)


def test_edits_compose_in_order_and_capture_edited_records_after_them(photos):
    net = _cnn()
    edits = ["0:1,2=zero", "0:2=value:3", "0=scale:2"]
    found = hookcli.extract(net, "0", photos, intervene=edits, capture_edited=True, **SMALL)
    plain = hookcli.extract(net, "0", photos, **SMALL)["0"]
    expected = plain.clone()
    expected[:, 1] = 0
    expected[:, 2] = 3
    torch.testing.assert_close(found["0"], expected * 2, rtol=0, atol=0)
    recorded = json.loads(found.metadata["interventions"])
    assert recorded == {
        "edits": [
            {"layer": "0", "units": [1, 2], "edit": "zero"},
            {"layer": "0", "units": [2], "edit": "value", "numbers": [3.0]},
            {"layer": "0", "units": None, "edit": "scale", "numbers": [2.0]},
        ],
        "captures": "after edits",
    }
    assert "interventions" not in hookcli.extract(net, "0", photos, **SMALL).metadata


def test_a_file_made_from_inputs_prepared_otherwise_is_said_for_each_edit_that_reads_it(photos, tmp_path):
    from hookcli.events import Note

    net = _cnn()
    stats = hookcli.stats(net, "0", photos, output=tmp_path / "s.safetensors", top=1, **SMALL)
    heard: list = []
    asked = [f"0:1=mean:{stats}", f"0=add:{stats}:0@pca_vectors:1:2.5"]
    hookcli.extract(net, "2", photos, intervene=asked, progress=heard.append, **{**SMALL, "resize": 20})
    said = [event.text for event in heard if isinstance(event, Note) and "prepared otherwise" in event.text]
    assert said == [
        f"--intervene '{spec}': '{stats}' holds values of inputs prepared otherwise than this run's: preprocess "
        "(resize: the file's 16, this run's 20)"
        for spec in asked
    ]
    heard.clear()
    hookcli.extract(net, "2", photos, intervene=asked, progress=heard.append, **SMALL)
    assert not [event for event in heard if isinstance(event, Note) and "prepared otherwise" in event.text]


def test_an_edit_after_the_last_capture_is_said_to_change_nothing(photos):
    from hookcli.events import Note

    def late(**options) -> list[str]:
        heard: list = []
        hookcli.extract(_cnn(), progress=heard.append, **options, **SMALL)
        return [event.text for event in heard if isinstance(event, Note) and "nothing kept" in event.text]

    stops = "it applies after the last value kept is captured, so it changes nothing kept"
    assert late(layers="2", inputs=photos, intervene=["0:1=zero", "4=zero"]) == [f"--intervene '4=zero': {stops}"]
    one_batch = {**SMALL, "batch_size": len(photos)}  # its forward runs whole: the edit runs, after the capture
    heard: list = []
    hookcli.extract(_cnn(), "2", photos, intervene=["0:1=zero", "4=zero"], progress=heard.append, **one_batch)
    assert [event.text for event in heard if "nothing kept" in getattr(event, "text", "")] == [
        f"--intervene '4=zero': {stops}"
    ]
    # The last layer kept is captured before its edit, then the forward stops; captured after it, the edit shows.
    assert late(layers="0", inputs=photos, intervene=["0:1=zero"]) == [f"--intervene '0:1=zero': {stops}"]
    assert late(layers="0", inputs=photos, intervene=["0:1=zero"], capture_edited=True) == []
    heard: list = []
    hookcli.grad(_cnn(), "0", photos, target="0", intervene=["4=zero"], progress=heard.append, **SMALL)
    assert not [event for event in heard if isinstance(event, Note) and "nothing kept" in event.text]  # runs whole


def test_an_edit_that_makes_finite_values_infinite_says_so_once_and_a_safe_one_says_nothing(photos):
    from hookcli.events import Note

    def overflows(command, spec: str, **options) -> list[str]:
        heard: list = []
        command(_cnn(), "2", photos, intervene=[spec], progress=heard.append, **options, **SMALL)
        return [event.text for event in heard if isinstance(event, Note) and "became infinite" in event.text]

    past = "range (±3.4e38), in which the layer computes, and became infinite; what reads them reads infinities"
    said = [f"--intervene '0:1=scale:3e38': some values it made are past float32's {past}"]
    assert overflows(hookcli.extract, "0:1=scale:3e38") == said  # two batches, one note
    assert overflows(hookcli.grad, "0:1=scale:3e38", target="0") == said
    assert overflows(hookcli.extract, "0:1=scale:1e-3") == overflows(hookcli.extract, "0:1=scale:-1") == []
    # bfloat16's largest value is 3.3895e38: 3.395e38 rounds down to it, 3.4e38 up, past it.
    bf16 = "some values it made are past bfloat16's " + past
    assert overflows(hookcli.extract, "0:1=value:3.4e38", precision="bf16") == [
        f"--intervene '0:1=value:3.4e38': {bf16}"
    ]
    assert overflows(hookcli.extract, "0:1=value:3.395e38", precision="bf16") == []
    assert overflows(hookcli.extract, "0:1=value:3.4e38") == []  # float32 holds it
    # Numbers past the dtype's range fill and clamp as infinities (torch refuses to take them as they are).
    bounds = hookcli.extract(_cnn(), "2", photos, intervene=["0=clamp:-3.4e38:3.4e38"], precision="bf16", **SMALL)
    torch.testing.assert_close(bounds["2"], hookcli.extract(_cnn(), "2", photos, precision="bf16", **SMALL)["2"])
    captured = hookcli.extract(_cnn(), "0", photos, intervene=["0:1=scale:3e38"], capture_edited=True, **SMALL)["0"]
    plain = hookcli.extract(_cnn(), "0", photos, **SMALL)["0"]
    assert (plain[:, 1].abs() * 3e38 > 3.4028234663852886e38).any()  # so the edit passes float32's range there
    assert torch.isinf(captured[:, 1]).tolist() == (plain[:, 1].abs() * 3e38 > 3.4028234663852886e38).tolist()


def test_the_cams_of_an_edited_run_say_its_edits(photos, tmp_path, monkeypatch):
    import hookcli.pictures.cams

    captions: list = []
    monkeypatch.setattr(hookcli.pictures.cams, "add_title", lambda pixels, parts: captions.append(parts) or pixels)
    asked = ["0:1=zero", "2=scale:0.5"]
    hookcli.cam(_cnn(), photos[:2], layer="2", target="0", intervene=asked, output=tmp_path / "cams", **SMALL)
    assert [parts[-3:] for parts in captions] == [["gradcam at 2", "edited: 0:1=zero", "edited: 2=scale:0.5"]] * 2
    captions.clear()
    hookcli.cam(_cnn(), photos[:1], layer="2", target="0", output=tmp_path / "plain", **SMALL)
    assert captions[0][-1] == "gradcam at 2"


def test_mean_and_steering_read_a_stats_file_of_the_same_layer(photos, tmp_path):
    net = _cnn()
    batch = _inputs(net, photos)
    stats = hookcli.stats(net, "0", photos, output=tmp_path / "s.safetensors", top=1, **SMALL)
    with hookcli.open_features(stats) as read:
        mean = torch.from_numpy(read.read("0@mean")).float()
        vectors = torch.from_numpy(read.read("0@pca_vectors")).float()
    found = hookcli.extract(net, "2", photos, intervene=[f"0:1,3=mean:{stats}"], **SMALL)["2"]
    expected = _by_hand(net, batch, "0", lambda out: _set(out, [1, 3], mean[[1, 3]][None, :, None, None]), "2")
    torch.testing.assert_close(found, expected, rtol=0, atol=1e-5)
    steered = hookcli.extract(net, "2", photos, intervene=[f"0=add:{stats}:0@pca_vectors:1:2.5"], **SMALL)["2"]
    component = vectors[:, 1]  # the columns of @pca_vectors are the components
    expected = _by_hand(net, batch, "0", lambda out: out + 2.5 * component[None, :, None, None], "2")
    torch.testing.assert_close(steered, expected, rtol=0, atol=1e-5)
    channels = vectors.shape[1]
    refusals = {  # ROW in the words of what it picks: a component (a column), or nothing of a vector
        f"0=add:{stats}:0@pca_vectors:{channels}:1": f"'0@pca_vectors' has {channels} components (its columns), and "
        f"ROW {channels} names none of them",
        f"0=add:{stats}:0@mean:1:1": f"'0@mean' is a vector of {mean.shape[0]} values, which ROW 0 reads whole, not "
        "ROW 1",
    }
    for spec, why in refusals.items():
        with pytest.raises(UsageProblem) as refused:
            hookcli.extract(net, "2", photos, intervene=[spec], **SMALL)
        assert refused.value.message == f"--intervene '{spec}': {why}"


def test_a_vision_transformers_tokens_are_edited_feature_by_feature(photos, tmp_path):
    from torchvision.models import VisionTransformer

    torch.manual_seed(0)
    vit = VisionTransformer(image_size=16, patch_size=8, num_layers=2, num_heads=2, hidden_dim=8, mlp_dim=16).eval()
    layer = "encoder.layers.encoder_layer_0"
    batch = _inputs(vit, photos, layer="conv_proj")
    vector = np.linspace(-1, 1, 8, dtype=np.float32)
    save_file({"steer": np.stack([np.zeros(8, np.float32), vector])}, str(tmp_path / "v.safetensors"))
    spec = f"{layer}:2,5=add:{tmp_path / 'v.safetensors'}:steer:1:0.5"
    found = hookcli.extract(vit, "encoder.ln", photos, intervene=[spec, f"{layer}:0=zero"], **SMALL)
    steer = torch.from_numpy(vector)

    def edit(out):
        out[..., [2, 5]] += 0.5 * steer[[2, 5]]
        out[..., 0] = 0
        return out

    expected = _by_hand(vit, batch, layer, edit, "encoder.ln")
    torch.testing.assert_close(found["encoder.ln"], expected, rtol=0, atol=1e-5)


def test_zeroing_every_unit_of_the_last_layer_makes_logits_its_bias_and_gradients_zero(photos):
    net = _cnn()
    found = hookcli.grad(net, "4", photos, target="0", intervene=["4=zero"], **SMALL)
    assert found["4@grad"].abs().sum().item() == 0
    logits = hookcli.extract(net, "6", photos, intervene=["5:*=zero"], **SMALL)["6"]
    torch.testing.assert_close(logits, net[6].bias.detach().expand(5, 4), rtol=0, atol=0)


def test_a_layer_a_unit_or_a_file_that_cannot_apply_is_refused_before_the_run(photos, tmp_path):
    net = _cnn()
    refusals = {
        "9=zero": "--intervene '9=zero': the model has no layer '9'",
        "2:5=zero": "--intervene '2:5=zero': 2 has 5 units (0 to 4), and unit 5 does not exist",
        "0=mean:nowhere.safetensors": "--intervene '0=mean:nowhere.safetensors': 'nowhere.safetensors' not found",
    }
    for spec, message in refusals.items():
        with pytest.raises(UsageProblem) as caught:
            hookcli.extract(net, "0", photos, intervene=[spec], **SMALL)
        assert caught.value.message == message
    stats = hookcli.stats(net, "2", photos, output=tmp_path / "two.safetensors", top=1, **SMALL)
    with pytest.raises(UsageProblem) as caught:
        hookcli.extract(net, "0", photos, intervene=[f"0=mean:{stats}"], **SMALL)
    assert caught.value.message == f"--intervene '0=mean:{stats}': '{stats}' holds the statistics of 2, not of 0"
    other = hookcli.stats("resnet18", "layer1", photos[:1], output=tmp_path / "r.safetensors", weights="none",
                          top=1, **SMALL)  # fmt: skip
    with pytest.raises(UsageProblem) as caught:
        hookcli.extract(net, "0", photos, intervene=[f"0=mean:{other}"], **SMALL)
    assert caught.value.message.endswith(f"'{other}' was made with the model resnet18, and this run's is Sequential")
    with pytest.raises(UsageProblem) as caught:
        hookcli.extract(net, "0", photos, capture_edited=True, **SMALL)
    assert caught.value.message == "--capture-edited applies to layers edited with --intervene"


def test_a_file_past_float32_damaged_or_unsigned_and_specs_of_another_type_are_refused(photos, tmp_path):
    from safetensors import safe_open
    from safetensors.torch import load_file
    from safetensors.torch import save_file as save_torch

    net = _cnn()
    vectors = tmp_path / "vectors.safetensors"
    save_torch({"huge": torch.full((5,), 1e300, dtype=torch.float64), "fine": torch.ones(5)}, str(vectors))
    with pytest.raises(UsageProblem) as caught:
        hookcli.extract(net, "2", photos, intervene=[f"2=add:{vectors}:huge:0:1"], **SMALL)
    assert caught.value.message == (
        f"--intervene '2=add:{vectors}:huge:0:1': 'huge' holds values beyond float32's range (±3.4e38), in which "
        "layers compute"
    )
    assert hookcli.extract(net, "2", photos, intervene=[f"2=add:{vectors}:fine:0:1"], **SMALL)["2"].isfinite().all()
    stats = hookcli.stats(net, "2", photos, output=tmp_path / "two.safetensors", top=1, **SMALL)
    with safe_open(stats, "pt") as read:
        metadata = read.metadata()
    tensors = load_file(stats)
    folded = tmp_path / "folded.safetensors"
    save_torch({**tensors, "2@mean": tensors["2@mean"].reshape(1, 5)}, str(folded), metadata=metadata)
    unsigned = tmp_path / "unsigned.safetensors"
    save_torch(tensors, str(unsigned), metadata={k: v for k, v in metadata.items() if k != "model"})
    tabled = tmp_path / "tabled.safetensors"
    save_torch(tensors, str(tabled), metadata={**metadata, "layers": json.dumps({"2": {"key": 2}})})
    refusals = {
        tabled: f"'{tabled}' has a table of layers that is not what hookcli writes",
        folded: "'2@mean' has shape [1, 5], and a statistics file's means are one vector",
        unsigned: f"'{unsigned}' records no model (statistics of saved features that named none), so its means "
        "cannot be checked against this run's model",
    }
    for path, message in refusals.items():
        with pytest.raises(UsageProblem) as caught:
            hookcli.extract(net, "0", photos, intervene=[f"2=mean:{path}"], **SMALL)
        assert caught.value.message == f"--intervene '2=mean:{path}': {message}"
    for given in (5, {"2": "zero"}):
        with pytest.raises(UsageProblem) as caught:
            hookcli.extract(net, "2", photos, intervene=given, **SMALL)  # type: ignore[arg-type]
        assert caught.value.message == (
            f"intervene takes a spec string or a list of them, not {type(given).__name__} {given!r}"
        )


def test_the_command_line_edits_and_refuses_in_one_line(runner, photos, tmp_path):
    common = ["-m", "resnet18", "-w", "none", "--resize", "32", "--crop", "32", "-q"]
    out = tmp_path / "edited.safetensors"
    done = runner.invoke(main, ["extract", *common, "-l", "layer2", "--intervene", "layer1:0:8=zero", "-o", str(out),
                                *photos[:2]])  # fmt: skip
    assert done.exit_code == 0, done.output
    with hookcli.open_features(out) as read:
        assert json.loads(read.metadata["interventions"])["edits"][0]["units"] == list(range(8))
    shown = runner.invoke(main, ["info", str(out)])
    assert '    edits: [{"layer": "layer1", "units": [0, 1, 2, 3, 4, 5, 6, 7], "edit": "zero"}]' in shown.output
    folder = tmp_path / "feats"
    args = ["extract", *common, "-l", "layer2", "-o", f"{folder}/", *photos[:2]]
    assert runner.invoke(main, [*args, "--intervene", "layer1=zero"]).exit_code == 0
    again = runner.invoke(main, [*args, "--intervene", "layer1=scale:2"])
    assert again.exit_code != 0 and "interventions" in again.output
    bad = runner.invoke(main, ["extract", *common, "-l", "layer2", "--intervene", "layer1=nothing", *photos[:1]])
    assert bad.exit_code == 2
    assert bad.output.strip().splitlines()[-1] == (
        "Error: --intervene 'layer1=nothing': 'nothing' is not an edit. Hint: give LAYER[:UNITS]=EDIT, UNITS as K, "
        "A:B, K,L,M or *, EDIT one of zero, value:V, mean:FILE, resample, scale:F, add:FILE:KEY:ROW:ALPHA, clamp:LO:HI"
    )


def test_statistics_are_gathered_over_the_edited_forward(photos):
    net = _cnn()
    edited = hookcli.stats(net, ["0", "2"], photos, intervene=["0:1=value:7"], capture_edited=True, top=1, **SMALL)
    assert edited["0@mean"][1].item() == pytest.approx(7.0) and edited["0@std"][1].item() == 0
    assert json.loads(edited.metadata["interventions"])["captures"] == "after edits"
    plain = hookcli.stats(net, ["0", "2"], photos, top=1, **SMALL)
    assert not torch.equal(edited["2@mean"], plain["2@mean"]) and torch.equal(edited["0@mean"][0], plain["0@mean"][0])


def test_compare_edits_the_first_side_only(photos):
    net, twin = _cnn(), _cnn()
    compared = hookcli.compare(net, "2", photos, model2=twin, layers2="2", intervene=["0:0:3=zero"], **SMALL)
    plain = hookcli.compare(net, "2", photos, model2=twin, layers2="2", **SMALL)
    assert plain["linear-cka"].item() == pytest.approx(1.0)
    assert compared["linear-cka"].item() < 0.999
    from hookcli.storage.compare_file import read_comparison

    assert read_comparison(compared).sources() == ("Sequential (edited)", "Sequential")
    assert read_comparison(plain).sources() == ("Sequential", "Sequential")


def test_compare_of_one_module_with_itself_runs_the_second_side_on_a_copy(photos):
    net = _cnn()
    expected = hookcli.compare(net, "2", photos, model2=copy.deepcopy(net), layers2="2", intervene=["0:0:3=zero"],
                               **SMALL)["linear-cka"]  # fmt: skip
    for second in ({"layers2": "2"}, {"model2": net, "layers2": "2"}):
        found = hookcli.compare(net, "2", photos, intervene=["0:0:3=zero"], **second, **SMALL)["linear-cka"]
        assert torch.equal(found, expected) and found.item() < 0.999  # the edit is the first side's alone
    loaded = hookcli.load_model("resnet18", "none")
    layers = hookcli.compare(loaded, "layer1", photos, layers2="layer2", resize=32, crop=32, batch_size=5)
    assert layers["linear-cka"].shape == (1, 1) and 0 < layers["linear-cka"].item() < 1
    assert not any(module._forward_hooks for module in net.modules())  # given back as it came


@pytest.fixture(scope="module")
def detection(tmp_path_factory):
    """A detector's name, its backbone layer after the edited one, two noise images of other sizes, a vector file
    for the edited layer (``backbone.body.2``, 24 channels), and the layer's features unedited."""
    from PIL import Image

    where = tmp_path_factory.mktemp("detection")
    rng = np.random.default_rng(0)
    images = []
    for n, size in enumerate([(64, 48), (40, 72)]):
        images.append(where / f"{n}.png")
        Image.fromarray(rng.integers(0, 255, size=(*size, 3), dtype=np.uint8)).save(images[-1])
    save_file({"v": np.linspace(-1, 1, 48, dtype=np.float32).reshape(2, 24)}, str(where / "v.safetensors"))
    name, layer = "fasterrcnn_mobilenet_v3_large_320_fpn", "backbone.body.3"
    plain = hookcli.extract(name, layer, images, weights="none", device="cpu")
    return name, layer, images, where / "v.safetensors", plain


# Not mean:FILE: it takes a stats file of the layer, and a detector's rows, each of its image's own size, give none.
@pytest.mark.parametrize("edit", ["zero", "value", "scale", "clamp", "resample", "add"])
def test_every_edit_of_a_detection_backbone_equals_a_hook_by_hand_in_memory_and_in_a_file(detection, tmp_path, edit):
    from hookcli.models.loading import load_model

    name, layer, images, vectors, plain = detection
    units = [0, 1, 2, 3]
    specs = {
        "zero": ("zero", lambda out: _set(out, units, 0.0)),
        "value": ("value:0.75", lambda out: _set(out, units, 0.75)),
        "scale": ("scale:-1.5", lambda out: _set(out, units, out[:, units] * -1.5)),
        "clamp": ("clamp:0:0.05", lambda out: _set(out, units, out[:, units].clamp(0, 0.05))),
        "resample": ("resample", lambda out: _set(out, units, out[partners(out.shape[0], 0)][:, units])),
        "add": (f"add:{vectors}:v:1:2", lambda out: _set(out, units, out[:, units]
                                                          + 2 * torch.linspace(-1, 1, 48)[24:28][None, :, None, None])),
    }  # fmt: skip
    spec, by_hand = specs[edit]
    asked = [f"backbone.body.2:0:4={spec}"]
    edited = hookcli.extract(name, layer, images, weights="none", device="cpu", intervene=asked)
    loaded = load_model(name, "none")
    hook = loaded.module.get_submodule("backbone.body.2").register_forward_hook(lambda m, i, out: by_hand(out.clone()))
    try:
        expected = hookcli.extract(loaded, layer, images, device="cpu")
    finally:
        hook.remove()
    written = hookcli.extract(
        name, layer, images, weights="none", device="cpu", intervene=asked, output=tmp_path / "f.safetensors"
    )
    with hookcli.open_features(written) as read:
        for row in range(2):
            torch.testing.assert_close(edited.read(layer, row), expected.read(layer, row), rtol=0, atol=1e-5)
            assert np.array_equal(read.read(layer, row), edited.read(layer, row))
            assert not np.allclose(edited.read(layer, row), plain.read(layer, row))
        assert json.loads(read.metadata["interventions"])["edits"][0]["edit"] == edit


def _vit():
    from torchvision.models import VisionTransformer

    torch.manual_seed(0)
    return VisionTransformer(image_size=16, patch_size=8, num_layers=2, num_heads=2, hidden_dim=8, mlp_dim=16).eval()


def _tokens(out, units, values):
    out[..., units] = values
    return out


@pytest.mark.parametrize("edit", ["zero", "value", "scale", "clamp", "resample", "mean", "add"])
def test_every_edit_of_token_features_equals_a_hook_by_hand_in_memory_and_in_a_file(photos, tmp_path, edit):
    vit, layer, units = _vit(), "encoder.layers.encoder_layer_0", [1, 6]
    batch = _inputs(vit, photos, layer="conv_proj")
    stats = hookcli.stats(vit, layer, photos, output=tmp_path / "s.safetensors", top=1, pca=False, **SMALL)
    with hookcli.open_features(stats) as read:
        mean = torch.from_numpy(read.read(f"{layer}@mean")).float()
    save_file({"v": np.arange(16, dtype=np.float32).reshape(2, 8)}, str(tmp_path / "v.safetensors"))
    specs = {
        "zero": ("zero", lambda out: _tokens(out, units, 0.0)),
        "value": ("value:-0.5", lambda out: _tokens(out, units, -0.5)),
        "scale": ("scale:3", lambda out: _tokens(out, units, out[..., units] * 3)),
        "clamp": ("clamp:-0.2:0.1", lambda out: _tokens(out, units, out[..., units].clamp(-0.2, 0.1))),
        "resample": ("resample", lambda out: _tokens(out, units, out[partners(out.shape[0], 0)][..., units])),
        "mean": (f"mean:{stats}", lambda out: _tokens(out, units, mean[units])),
        "add": (f"add:{tmp_path / 'v.safetensors'}:v:1:0.25", lambda out: _tokens(out, units, out[..., units]
                                                                               + 0.25 * torch.tensor([9.0, 14.0]))),
    }  # fmt: skip
    spec, by_hand = specs[edit]
    asked = [f"{layer}:1,6={spec}"]
    in_memory = hookcli.extract(vit, "encoder.ln", photos, intervene=asked, **SMALL)["encoder.ln"]
    torch.testing.assert_close(in_memory, _by_hand(vit, batch, layer, by_hand, "encoder.ln"), rtol=0, atol=1e-5)
    written = hookcli.extract(vit, "encoder.ln", photos, intervene=asked, output=tmp_path / "f.safetensors", **SMALL)
    with hookcli.open_features(written) as read:
        assert np.array_equal(read.read("encoder.ln"), in_memory.numpy())
        assert json.loads(read.metadata["interventions"])["edits"][0]["edit"] == edit


class Spare(nn.Module):
    """A CNN that holds a layer its forward never calls."""

    def __init__(self) -> None:
        super().__init__()
        self.net, self.spare = _cnn(), nn.Conv2d(3, 3, 1)

    def forward(self, x):
        return self.net(x)


def test_an_edit_of_a_layer_the_forward_never_runs_is_refused_at_the_first_batch(photos, tmp_path):
    out = tmp_path / "never.safetensors"
    with pytest.raises(LayerNotRunError) as caught:  # exit 1, as a captured layer that never runs
        hookcli.extract(Spare().eval(), "net.2", photos, intervene=["spare=zero"], output=out, **SMALL)
    assert caught.value.message == "--intervene 'spare=zero': the forward never runs spare"
    assert not out.exists()


def test_a_reports_summary_names_the_edits_and_ignores_metadata_that_does_not_say_them(photos, tmp_path):
    from hookcli.storage.recorded_run import recorded_edits

    out = hookcli.extract(_cnn(), "2", photos, intervene=["0:0:3=zero", "1=scale:0.5"], output=tmp_path / "e.st",
                          **SMALL)  # fmt: skip
    page = hookcli.report(out, output=tmp_path / "r").read_text()
    assert "<th>edited (--intervene)</th><td>0:0:3=zero; 1=scale:0.5</td>" in page
    with hookcli.open_features(out) as read:
        assert recorded_edits(read.metadata) == ["0:0:3=zero", "1=scale:0.5"]
    damaged = ['{"edits": [{"layer": "0", "units": "x", "edit": "zero"}]}', '{"edits": 3}', "not json", "[1]"]
    assert [recorded_edits({"interventions": text}) for text in damaged] == [[], [], [], []]
    net, named = _cnn(), "<th>edited (--intervene)</th><td>0:1=value:7</td>"
    stats = hookcli.stats(net, "2", photos, intervene=["0:1=value:7"], top=1, output=tmp_path / "s.st", **SMALL)
    compared = hookcli.compare(net, "2", photos, model2=_cnn(), layers2="2", intervene=["0:1=value:7"],
                               output=tmp_path / "c.st", **SMALL)  # fmt: skip
    for made in (stats, compared):
        assert named in hookcli.report(made, output=tmp_path / made.stem).read_text()
    plain = hookcli.stats(net, "2", photos, top=1, output=tmp_path / "p.st", **SMALL)
    assert "edited (--intervene)" not in hookcli.report(plain, output=tmp_path / "p").read_text()


def test_seed_sets_the_pairing_of_resample_with_weights_from_a_file(photos, tmp_path):
    weights = tmp_path / "r18.pth"
    torch.save(hookcli.load_model("resnet18", "none").module.state_dict(), weights)
    small = {"weights": str(weights), "resize": 32, "crop": 32, "batch_size": 5, "intervene": ["layer1=resample"]}
    runs = {seed: hookcli.extract("resnet18", "layer2", photos, seed=seed, **small) for seed in (None, 0, 1)}
    assert torch.equal(runs[None]["layer2"], runs[0]["layer2"])  # 0, the default
    assert not torch.equal(runs[0]["layer2"], runs[1]["layer2"])  # another pairing of the five rows
    assert [json.loads(runs[s].metadata["interventions"])["edits"][0]["seed"] for s in (0, 1)] == [0, 1]
    assert json.loads(runs[0].metadata["interventions"])["batch_size"] == 5  # the rows a batch pairs
    with pytest.raises(UsageProblem, match="^--seed only applies to --weights none and to resample's pairing"):
        hookcli.extract("resnet18", "layer2", photos, seed=1, weights=str(weights), resize=32, crop=32)


def test_a_folder_of_other_edits_names_where_they_differ(photos, tmp_path):
    folder = f"{tmp_path}/edited/"
    resampled = {**SMALL, "intervene": ["0=resample"], "output": f"{tmp_path}/resampled/", "shard_size": 4}
    hookcli.extract(_cnn(), "2", photos, **{**resampled, "batch_size": 4})
    with pytest.raises(UsageProblem) as refused:  # other batches pair other rows
        hookcli.extract(_cnn(), "2", photos, **{**resampled, "batch_size": 2})
    assert refused.value.message.endswith("(batch_size: the folder's 4, this command's 2))")
    hookcli.extract(_cnn(), "2", photos, intervene=["0=zero"], output=folder, shard_size=2, **SMALL)
    with pytest.raises(UsageProblem) as refused:
        hookcli.extract(_cnn(), "2", photos, intervene=["0=scale:2"], output=folder, shard_size=2, **SMALL)
    assert refused.value.message.endswith(  # the long JSON of each side shown from a little before it differs
        'differs in: interventions (edits: the folder\'s …l, "edit": "zero"}], this command\'s …l, "edit": "scale", '
        '"numbers": [2.0]}]))'
    )


class Unusual(nn.Module):
    """Outputs whose shape alone misleads: a convolution striding rows only (``[16, 8, 16]`` from square 16-pixel
    inputs: C equals H) and a Conv1d over the flattened map (``[C, L]``, read as tokens by shape)."""

    def __init__(self) -> None:
        super().__init__()
        self.rows = nn.Conv2d(3, 8, 3, stride=(2, 1), padding=1)
        self.mix = nn.Conv1d(8, 6, 1)
        self.head = nn.Linear(6, 5)

    def forward(self, x):
        return self.head(self.mix(self.rows(x).flatten(2)).relu().mean(2))


def test_units_are_the_channels_a_module_says_its_output_has_where_the_shape_alone_misleads(photos):
    torch.manual_seed(0)
    net = Unusual().eval()
    square = {**SMALL, "resize": 16, "crop": 16}
    edited = hookcli.extract(net, ["rows", "mix"], photos, intervene=["rows:3=zero", "mix:2=zero"],
                             capture_edited=True, **square)  # fmt: skip
    rows, mix = edited["rows"], edited["mix"]
    assert rows.shape[1:] == (8, 8, 16) and mix.shape[1:] == (6, 128)
    assert (rows[:, 3] == 0).all() and (rows[..., 3] != 0).any()  # channel 3, not column 3
    assert (mix[:, 2] == 0).all() and (mix[..., 2] != 0).any()  # channel 2, not position 2
    stats = hookcli.stats(net, ["rows", "mix"], photos, top=1, **square)
    assert stats["rows@mean"].shape == (8,) and stats["mix@mean"].shape == (6,)
    plain = hookcli.extract(net, "mix", photos, **square)["mix"].double()
    torch.testing.assert_close(stats["mix@mean"], plain.mean(dim=(0, 2)), rtol=1e-6, atol=1e-8)
    assert hookcli.ablate(net, "mix", photos, **square)["mix@units"].shape == (6,)
    pooled = hookcli.extract(net, ["rows", "mix"], photos, pool="avg", **square)
    assert pooled["rows"].shape == (5, 8) and pooled["mix"].shape == (5, 6)
    torch.testing.assert_close(pooled["mix"], plain.mean(dim=2).float(), rtol=1e-5, atol=1e-6)


def test_saved_features_keep_the_channels_their_modules_said_and_files_without_them_go_by_shape(photos, tmp_path):
    torch.manual_seed(0)
    net = Unusual().eval()
    square = {**SMALL, "resize": 16, "crop": 16}
    saved = hookcli.extract(net, ["rows", "mix"], photos, output=tmp_path / "f.safetensors", **square)
    with hookcli.open_features(saved) as read:
        table = json.loads(read.metadata["layers"])
    assert {path: entry.get("units") for path, entry in table.items()} == {"rows": 8, "mix": 6}
    ran = hookcli.stats(net, ["rows", "mix"], photos, top=1, **square)
    found = hookcli.stats(features=saved, top=1)
    assert found["rows@mean"].shape == (8,) and found["mix@mean"].shape == (6,)
    torch.testing.assert_close(found["mix@mean"], ran["mix@mean"], rtol=1e-12, atol=0)
    compared = hookcli.compare(features=saved, keys=["rows", "mix"])
    assert compared["linear-cka@widths"].tolist() == [8, 6]
    ran = hookcli.compare(net, ["rows", "mix"], photos, **square)
    torch.testing.assert_close(compared["linear-cka"], ran["linear-cka"], rtol=1e-9, atol=1e-12)
    # A file whose table says no units (older, or written by hand) reads a Conv1d's [C, L] as tokens, by shape.
    from safetensors.torch import load_file, save_file

    metadata = dict(read.metadata)
    table["mix"].pop("units")
    bare = tmp_path / "bare.safetensors"
    save_file(load_file(saved), bare, metadata={**metadata, "layers": json.dumps(table)})
    assert hookcli.stats(features=bare, keys="mix", top=1)["mix@mean"].shape == (128,)
    assert hookcli.compare(features=bare, keys=["rows", "mix"])["linear-cka@widths"].tolist() == [8, 128]
    # A gradient has its layer's output's shape, and its layer's units.
    grads = hookcli.grad(net, "mix", photos, target="0", output=tmp_path / "g.safetensors", **square)
    found = hookcli.stats(features=grads, top=1)
    assert found["mix@mean"].shape == found["mix@grad@mean"].shape == (6,)
    table["mix"]["units"] = -6  # not a count: the table is not hookcli's, and the file is refused in one line
    save_file(load_file(saved), bare, metadata={**metadata, "layers": json.dumps(table)})
    with pytest.raises(FeatureFileError, match=r"its 'layers' metadata is not a table of layers \(key, type"):
        hookcli.stats(features=bare, keys="mix", top=1)


def test_a_file_of_an_edited_run_is_said_and_one_of_no_features_is_refused_naming_the_edit(runner, photos, tmp_path):
    from hookcli.events import Note

    net = _cnn()
    stats = hookcli.stats(net, "0", photos, output=tmp_path / "s.safetensors", intervene=["0:0=zero"], **SMALL)
    shown = runner.invoke(main, ["info", str(stats)]).output  # the identity's copy, JSON text, as what it holds
    assert '\n    interventions: {"edits": [{"layer": "0", "units": [0], "edit": "zero"}], "captures": ' in shown
    assert '\n    stats: {"top": 9, "top_by": "max", ' in shown
    heard: list = []
    hookcli.extract(net, "2", photos, intervene=[f"0=mean:{stats}"], progress=heard.append, **SMALL)
    assert [event.text for event in heard if isinstance(event, Note) and "edited" in event.text] == [
        f"--intervene '0=mean:{stats}': '{stats}' holds values of the model as its run edited it (0:0=zero)"
    ]
    text = tmp_path / "means.txt"
    text.write_text("0.5\n")
    with pytest.raises(UsageProblem) as refused:
        hookcli.extract(net, "2", photos, intervene=[f"0=mean:{text}"], **SMALL)
    assert refused.value.message == f"--intervene '0=mean:{text}': '{text}' is not a safetensors file"


def test_resampling_batches_of_one_row_is_said_to_change_nothing(photos):
    from hookcli.events import Note

    heard: list = []
    plain = hookcli.extract(_cnn(), "2", photos, **{**SMALL, "batch_size": 1})
    found = hookcli.extract(_cnn(), "2", photos, intervene=["0=resample"], progress=heard.append,
                            **{**SMALL, "batch_size": 1})  # fmt: skip
    assert torch.equal(found["2"], plain["2"])
    assert [event.text for event in heard if isinstance(event, Note) and "resample" in event.text] == [
        "--intervene '0=resample': resample takes each row's values from another row of its batch, and a batch of "
        "one row holds no other, so it changes nothing (give --batch-size 2 or more)"
    ]


def test_a_layer_whose_name_holds_a_colon_is_named_in_the_refusal(photos):
    net = nn.Sequential()
    net.add_module("a:1", nn.Conv2d(3, 4, 3))
    net.add_module("flat", nn.Flatten())
    with pytest.raises(UsageProblem) as refused:
        hookcli.extract(net, "flat", photos[:1], intervene=["a:1=zero"], **SMALL)
    assert refused.value.message == (
        "--intervene 'a:1=zero': the model has no layer 'a' (its layer 'a:1' has ':' in its name, where --intervene "
        "reads UNITS)"
    )
    assert refused.value.hint.endswith("; a layer whose name holds ':' or '=' cannot be edited by name")
