"""stats --components: a second pass gathers each layer's principal components (from an earlier statistics file) as
a layer of their own, checked against projections computed here by hand; what it refuses; and the pictures."""

import json

import numpy as np
import pytest
import torch

import hookcli
from hookcli.cli import main
from hookcli.errors import HookcliError
from hookcli.storage.features import Features
from hookcli.storage.shards import open_features

ROWS = 30


def _features(rows: int = ROWS, seed: int = 0) -> Features:
    """Maps whose channels are mixed by a few factors (so that components differ), tokens with a class token, and
    vectors."""
    rng = np.random.default_rng(seed)
    factors = rng.normal(size=(rows, 3, 1, 1)) * np.array([5.0, 2.0, 1.0])[None, :, None, None]
    maps = np.einsum("nfhw,fc->nchw", factors + rng.normal(size=(rows, 3, 4, 4)) * 0.3, rng.normal(size=(3, 6)))
    maps += rng.normal(size=(rows, 6, 4, 4)) * np.linspace(0.2, 1.0, 6)[None, :, None, None]
    tokens = rng.normal(size=(rows, 10, 5)) + 3.0  # a class token, then 9 patch tokens
    tensors = {
        "maps": (maps + 2.0).astype(np.float32),
        "tokens": tokens.astype(np.float32),
        "vectors": rng.normal(size=(rows, 7)).astype(np.float32),
    }
    inputs = [f"/photos/{n:03d}.jpg" for n in range(rows)]
    return Features(tensors, {"inputs": json.dumps(inputs), "model": "m", "prefix_tokens": "1"})


@pytest.fixture(scope="module")
def first(tmp_path_factory):
    """The first pass: the statistics of the features, with their components."""
    path = tmp_path_factory.mktemp("first") / "first.safetensors"
    return hookcli.stats(features=_features(), output=str(path), top=3)


def _projections(first, key: str, units: np.ndarray) -> np.ndarray:
    """``units`` ``[n, C, P]`` less the first file's means, onto its first components: ``[n, N, P]``."""
    with open_features(first) as stats:
        mean, vectors = stats[f"{key}@mean"], stats[f"{key}@pca_vectors"]
    count = min(16, len(mean))
    return np.einsum("ncp,cj->njp", units - mean[None, :, None], vectors[:, :count])


def _units(features: Features, key: str) -> np.ndarray:
    values = np.asarray(features[key], dtype=np.float64)
    if key == "tokens":
        return values[:, 1:].transpose(0, 2, 1)  # the class token left out
    return values.reshape(len(values), values.shape[1], -1)


def test_each_components_examples_are_the_inputs_of_highest_projection_with_its_maps(first):
    features = _features()
    found = hookcli.stats(features=features, components=str(first), top=4, top_by="mean")
    units = json.loads(found.metadata["units"])
    assert list(units) == ["maps", "tokens", "vectors", "maps#pc", "tokens#pc", "vectors#pc"]
    assert units["maps#pc"] == {"channels": 6, "spatial": [4, 4], "layout": "maps", "skip": 0, "row_shape": [6, 4, 4]}
    assert units["tokens#pc"] == {"channels": 5, "spatial": [9], "layout": "tokens", "skip": 0, "row_shape": [9, 5]}
    assert units["vectors#pc"]["layout"] == "flat" and units["vectors#pc"]["channels"] == 7
    for key in ("maps", "tokens", "vectors"):
        projected = _projections(first, key, _units(features, key))
        scores = projected.mean(axis=2)  # [n, N]: the projection of each input's pooled channels
        expected_rows = np.stack([np.argsort(-scores[:, j], kind="stable")[:4] for j in range(scores.shape[1])])
        np.testing.assert_array_equal(found[f"{key}#pc@top_rows"].numpy(), expected_rows)
        np.testing.assert_allclose(
            found[f"{key}#pc@top_values"].numpy(), np.take_along_axis(scores.T, expected_rows, 1), atol=1e-4
        )
        maps = found[f"{key}#pc@top_maps"].numpy().reshape(len(expected_rows), 4, -1)
        for component, rows in enumerate(expected_rows):
            np.testing.assert_allclose(maps[component], projected[rows, component], atol=1e-4)
        # Over the same inputs, each component's mean is 0 and its variance the component's eigenvalue.
        with open_features(first) as stats:
            variances = stats[f"{key}@pca_values"][: scores.shape[1]]
        np.testing.assert_allclose(found[f"{key}#pc@mean"].numpy(), 0, atol=1e-4)
        np.testing.assert_allclose(np.var(scores, axis=0, ddof=1), variances, rtol=1e-4, atol=1e-5)
    stats = json.loads(found.metadata["stats"])
    assert stats["components"]["source"] == str(first) and len(stats["components"]["stamp"]) == 2


def test_parts_and_shards_gather_the_components_one_process_gathers(first, tmp_path):
    features = _features()
    whole = hookcli.stats(features=features, components=str(first), top=3)
    sharded = hookcli.stats(features=features, components=str(first), top=3, shard_size=8, batch_size=5)
    for key in ("maps#pc@top_rows", "tokens#pc@top_maps", "vectors#pc@quantiles", "maps#pc@cov"):
        np.testing.assert_allclose(sharded[key].numpy(), whole[key].numpy(), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(
    ("tensors", "message"),
    [
        (
            None,
            "'{plain}' holds no principal components (it was made with --no-pca). Hint: give a statistics file made "
            "with --pca",
        ),
        (
            {"elsewhere": torch.zeros(ROWS, 6)},
            "'{first}' holds the components of 'maps', 'tokens', 'vectors', and none of this run's layers "
            "('elsewhere'). Hint: give the statistics file of the same layers (hookcli info lists them)",
        ),
        (
            {"vectors": torch.zeros(ROWS, 3)},
            "'vectors' has 3 channels, and its components in '{first}' 7. Hint: give the statistics file of the same "
            "layer of the same model",
        ),
    ],
    ids=["no components", "other layers", "other channels"],
)
def test_a_file_without_components_or_of_other_layers_is_refused(first, tmp_path, tensors, message):
    features = _features()
    plain = hookcli.stats(features=features, output=str(tmp_path / "plain.safetensors"), pca=False)
    given = features if tensors is None else Features(tensors, {"inputs": features.metadata["inputs"]})
    with pytest.raises(HookcliError) as refused:
        hookcli.stats(features=given, components=str(plain if tensors is None else first))
    assert str(refused.value) == message.format(plain=plain, first=first)


def test_grid_draws_a_picture_a_component_named_so(runner, first, tmp_path):
    second = hookcli.stats(features=_features(), components=str(first), output=str(tmp_path / "pc.safetensors"))
    out = tmp_path / "g"
    done = runner.invoke(main, ["grid", str(second), "-k", "maps#pc", "--channels", "0:2", "-o", str(out)])
    assert done.exit_code == 0, done.output
    assert done.stdout.splitlines() == [str(out / f"maps#pc__component{n:05d}.png") for n in range(2)]


def test_a_components_file_that_is_not_there_is_refused_before_the_model_loads(
    runner, one_error, tmp_path, photo, no_model
):
    args = ["stats", "-m", "resnet18", "-l", "layer4", "--weights", "none", str(photo), "-o", str(tmp_path / "s")]
    refused = runner.invoke(main, [*args, "--components", str(tmp_path / "first.safetensors")])
    assert one_error(refused) == (
        f"Error: --components '{tmp_path / 'first.safetensors'}' not found. Hint: give the statistics file of a "
        "first stats run, made with --pca"
    )


def test_the_report_calls_a_component_a_component(first, tmp_path):
    second = hookcli.stats(features=_features(), components=str(first), output=str(tmp_path / "pc.safetensors"))
    hookcli.report(second, output=tmp_path / "r", keys=["vectors#pc"])
    page = (tmp_path / "r" / "layer-vectors#pc.html").read_text()
    assert "<h3>Components</h3>\n<p>7 components; click" in page and "<h3>Component 6</h3>" in page
    assert "<h3>Channel" not in page


def test_layers_the_file_has_no_components_of_are_refused_before_any_work(runner, one_error, first, tmp_path):
    others = Features({"elsewhere": torch.zeros(ROWS, 6)}, {"inputs": _features().metadata["inputs"]})
    saved = str(tmp_path / "others.safetensors")
    from safetensors.torch import save_file

    save_file({"elsewhere": others["elsewhere"]}, saved, metadata=dict(others.metadata))
    out = tmp_path / "s.safetensors"
    refused = runner.invoke(main, ["stats", saved, "--components", str(first), "-o", str(out)])
    assert one_error(refused).startswith(f"Error: '{first}' holds the components of 'maps', 'tokens', 'vectors'")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["others.safetensors"]


def test_a_layer_the_file_has_no_components_of_is_gathered_alone_and_said(first, tmp_path):
    features = _features()
    more = Features({**{key: features[key] for key in ("maps", "vectors")}, "extra": torch.ones(ROWS, 3)},
                    dict(features.metadata))  # fmt: skip
    heard = []
    found = hookcli.stats(features=more, components=str(first), progress=heard.append, top=2)
    assert list(json.loads(found.metadata["units"])) == ["extra", "maps", "vectors", "maps#pc", "vectors#pc"]
    assert [event.text for event in heard if type(event).__name__ == "Note"] == [
        f"'extra' has no components in '{first}': its channels are gathered, not its components"
    ]


def test_an_output_that_is_the_components_file_is_refused_force_or_not(runner, one_error, tmp_path, photo):
    saved = hookcli.extract("resnet18", "layer4", [photo, photo], weights="none", resize=32, crop=32,
                            output=str(tmp_path / "f.safetensors"))  # fmt: skip
    components = hookcli.stats(features=str(saved), top=1, output=str(tmp_path / "pca.safetensors"))
    before = components.read_bytes()
    for args in (
        ["stats", str(saved), "--components", str(components), "-o", str(components), "--force"],
        ["stats", "-m", "resnet18", "-l", "layer4", "--weights", "none", "--resize", "32", "--crop", "32", str(photo),
         "--components", str(components), "-o", str(components), "--force"],
    ):  # fmt: skip
        assert one_error(runner.invoke(main, args)) == (
            f"Error: output '{components}' is the input '{components}'. Hint: write the output somewhere else with -o"
        )
    assert components.read_bytes() == before


def test_components_that_are_not_finite_are_refused_in_one_line(tmp_path):
    features = _features()
    spoiled = np.array(features["vectors"])
    spoiled[3, 2] = np.nan  # one value: its channel's covariance, and so every component, is NaN
    given = Features({**{key: features[key] for key in ("maps", "tokens")}, "vectors": spoiled}, features.metadata)
    made = hookcli.stats(features=given, output=str(tmp_path / "nan.safetensors"), top=1)
    with pytest.raises(HookcliError) as refused:
        hookcli.stats(features=features, components=str(made))
    assert (refused.value.message, refused.value.hint) == (
        f"'{made}' holds components of 'vectors' that are not finite numbers: its statistics took NaN or infinite "
        "values, and every projection onto them would be NaN",
        "gather the statistics again of inputs whose values are finite",
    )
