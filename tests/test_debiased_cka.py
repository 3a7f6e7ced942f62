"""compare --debiased: linear CKA whose HSICs are the unbiased estimator of Song et al. (2012), checked against the
estimator computed from whole Gram matrices, its merges, its files, and the note that says when inputs are few."""

import json

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.numpy import load_file, save_file

import hookcli
from hookcli.cli import main
from hookcli.errors import UsageProblem
from hookcli.statistics.debiased_cka import DebiasedLinearCKA
from hookcli.statistics.similarity import hsic_unbiased
from hookcli.storage.features import Features
from hookcli.storage.shards import open_features


def _features(rows: int, seed: int = 0, offset: float = 50.0, dtype=np.float32) -> Features:
    """Three representations, two of them related; far from 0, as post-ReLU features are."""
    rng = np.random.default_rng(seed)
    base = rng.normal(size=(rows, 6))
    tensors = {
        "a": (base + offset).astype(dtype),
        "b": (base @ rng.normal(size=(6, 9)) + rng.normal(size=(rows, 9)) + offset).astype(dtype),
        "c": (rng.normal(size=(rows, 2, 2, 2)) + offset).astype(dtype),
    }
    inputs = [f"/photos/{n:03d}.jpg" for n in range(rows)]
    return Features(tensors, {"inputs": json.dumps(inputs), "model": "m"})


def _debiased(x: np.ndarray, y: np.ndarray) -> float:
    """The debiased CKA of Nguyen et al. and Song et al., from the whole linear Gram matrices (of the centred rows:
    the estimator does not change with a shift, and Gram matrices of rows far from 0 lose its digits)."""
    x, y = (np.asarray(v, dtype=np.float64).reshape(len(v), -1) for v in (x, y))
    x, y = (torch.from_numpy(v - v.mean(axis=0)) for v in (x, y))

    def hsic(a, b):
        return hsic_unbiased(a @ a.T, b @ b.T)

    return float(hsic(x, y) / (hsic(x, x) * hsic(y, y)).sqrt())


def _pooled(features: Features, key: str) -> np.ndarray:
    values = np.asarray(features[key], dtype=np.float64)
    return values.reshape(len(values), values.shape[1], -1).mean(axis=2)


KEYS = ["a", "b", "c"]


def test_debiased_cka_is_the_unbiased_estimator_of_the_whole_gram_matrices_however_the_rows_are_cut():
    features = _features(23)
    pooled = {key: _pooled(features, key) for key in KEYS}
    expected = np.array([[_debiased(pooled[r], pooled[c]) for c in KEYS] for r in KEYS])
    for batch, shard in ((23, None), (4, 8), (5, 5)):
        found = hookcli.compare(features=features, debiased=True, batch_size=batch, shard_size=shard)
        np.testing.assert_allclose(found["linear-cka"].numpy(), expected, rtol=1e-9, atol=1e-12)
        assert json.loads(found.metadata["settings"]) == {"pool": "avg", "estimator": "debiased"}
    two_sides = hookcli.compare(features=features, features2=features, keys=["a"], keys2=["b", "c"], debiased=True)
    np.testing.assert_allclose(two_sides["linear-cka"].numpy(), expected[:1, 1:], rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("spoilt", [float("nan"), float("inf")])
def test_a_representation_with_a_value_that_is_not_finite_leaves_the_others_debiased_cka_as_it_was(spoilt):
    features = _features(23)
    pooled = {key: _pooled(features, key) for key in KEYS}
    expected = np.array([[_debiased(pooled[r], pooled[c]) for c in KEYS] for r in KEYS])
    bad = np.array(features["a"], dtype=np.float32)
    bad[9, 2] = spoilt  # in the second shard of 8, and in a batch of 4 or 5 after the first
    spoiled = Features({**{key: features[key] for key in KEYS}, "bad": bad}, dict(features.metadata))
    for batch, shard in ((23, None), (4, 8), (5, 5)):
        found = hookcli.compare(features=spoiled, debiased=True, batch_size=batch, shard_size=shard)
        order = json.loads(found.metadata["rows"])
        assert order == ["a", "b", "bad", "c"] and json.loads(found.metadata["undefined"]) == ["bad"]
        matrix = found["linear-cka"].numpy()
        kept = [order.index(key) for key in KEYS]
        np.testing.assert_allclose(matrix[np.ix_(kept, kept)], expected, rtol=1e-9, atol=1e-12)
        assert np.isnan(matrix[2]).all() and np.isnan(matrix[:, 2]).all()


def test_unrelated_representations_read_high_plainly_and_near_0_debiased():
    rng = np.random.default_rng(3)
    rows, names = 24, [f"r{n}" for n in range(6)]
    tensors = {name: rng.normal(size=(rows, 64)).astype(np.float32) for name in names}
    features = Features(tensors, {"inputs": json.dumps([f"{n}.jpg" for n in range(rows)])})
    apart = ~np.eye(len(names), dtype=bool)
    plain = hookcli.compare(features=features)["linear-cka"].numpy()[apart]
    debiased = hookcli.compare(features=features, debiased=True)["linear-cka"].numpy()[apart]
    assert plain.min() > 0.65 and abs(debiased.mean()) < 0.02 and np.abs(debiased).max() < 0.1, (plain, debiased)


def test_sums_about_means_far_from_0_keep_the_precision_of_sums_about_0():
    near, far = _features(40, offset=0.0, dtype=np.float64), _features(40, offset=1e6, dtype=np.float64)
    shifted = hookcli.compare(features=far, debiased=True, batch_size=3)["linear-cka"].numpy()
    np.testing.assert_allclose(
        shifted, hookcli.compare(features=near, debiased=True, batch_size=3)["linear-cka"].numpy(), atol=1e-8
    )


def test_debiased_files_merge_into_the_whole_and_not_with_plain_ones(runner, one_error, tmp_path):
    features = _features(24, seed=1)
    whole = hookcli.compare(features=features, debiased=True, batch_size=4)
    halves = []
    for name, rows in (("a", slice(0, 10)), ("b", slice(10, 24))):
        inputs = json.loads(features.metadata["inputs"])[rows]
        half = Features({key: features[key][rows] for key in KEYS}, {"inputs": json.dumps(inputs), "model": "m"})
        out = str(tmp_path / f"{name}.safetensors")
        halves.append(str(hookcli.compare(features=half, debiased=True, batch_size=3, output=out)))
    out = tmp_path / "merged.safetensors"
    done = runner.invoke(main, ["compare", "--merge", *halves, "-o", str(out)])
    assert done.exit_code == 0 and done.stdout == f"{out}\n", done.output
    assert (
        done.stderr
        == "Note: 24 inputs are too few to read the matrix: give 100 at least (with fewer, similarities are noise)\n"
    )
    with open_features(out) as merged:
        np.testing.assert_allclose(merged["linear-cka"], whole["linear-cka"].numpy(), rtol=1e-10, atol=1e-12)
        assert sorted(k for k in merged.keys() if k.startswith("linear-cka@")) == [
            "linear-cka@comoment",
            "linear-cka@count",
            "linear-cka@fourth",
            "linear-cka@mean",
            "linear-cka@third",
            "linear-cka@widths",
        ]
    plain = str(hookcli.compare(features=features, output=str(tmp_path / "plain.safetensors")))
    refused = runner.invoke(main, ["compare", "--merge", halves[0], plain, "-o", str(tmp_path / "x.safetensors")])
    assert one_error(refused).startswith(f"Error: '{plain}' compares other representations than the first file")


def test_a_debiased_file_whose_sums_have_other_shapes_is_refused(runner, one_error, tmp_path):
    path = hookcli.compare(features=_features(12), debiased=True, output=str(tmp_path / "d.safetensors"))
    tensors = load_file(path)
    with safe_open(path, "np") as opened:
        metadata = opened.metadata()
    tensors["linear-cka@fourth"] = np.zeros((2, 2))
    save_file(tensors, str(tmp_path / "crafted.safetensors"), metadata=metadata)
    refused = runner.invoke(main, ["info", str(tmp_path / "crafted.safetensors")])
    assert one_error(refused) == (
        f"Error: '{tmp_path / 'crafted.safetensors'}' is a damaged comparison file: 'linear-cka@fourth' is F64 "
        "[2, 2], not F64 [3, 3] (each pair's sums about the column means, for each representation). Hint: write it "
        "again with hookcli compare"
    )


def test_debiased_is_refused_for_other_methods_and_below_four_inputs(runner, one_error):
    with pytest.raises(UsageProblem) as refused:
        hookcli.compare(features=_features(12), method="minibatch-cka", debiased=True)
    assert str(refused.value) == (
        "--debiased applies to linear-cka, not minibatch-cka. Hint: leave it out (minibatch-cka's estimator is "
        "unbiased already), or give --method linear-cka"
    )
    with pytest.raises(UsageProblem) as few:
        hookcli.compare(features=_features(3), debiased=True)
    assert str(few.value) == (
        "debiased CKA needs 4 inputs at least, and 3 were given. Hint: give more inputs, or leave out --debiased"
    )
    with pytest.raises(UsageProblem) as few:  # no shard or batch size gives 3 inputs a minibatch of 4
        hookcli.compare(features=_features(3), method="minibatch-cka", batch_size=4)
    assert str(few.value) == (
        "minibatch CKA needs 4 inputs at least, and 3 were given. Hint: give more inputs, or use another --method"
    )
    cka = DebiasedLinearCKA(1, 1)
    assert cka.result().isnan().all()  # nothing seen: undefined


def test_a_comparison_over_few_inputs_says_how_many_to_give(runner, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = _features(12)
    save_file({k: np.asarray(path[k]) for k in KEYS}, "f.safetensors", metadata=dict(path.metadata))
    done = runner.invoke(main, ["compare", "f.safetensors", "-o", "c.safetensors"])
    assert done.exit_code == 0 and done.stderr == (
        "Note: 12 inputs are too few to read the matrix: give 100 at least, and more than the 9 values a row of 'b' "
        "(with fewer, similarities are high even between unrelated representations)\n"
    )
    many = _features(120)
    save_file({k: np.asarray(many[k]) for k in KEYS}, "g.safetensors", metadata=dict(many.metadata))
    done = runner.invoke(main, ["compare", "g.safetensors", "-o", "d.safetensors"])
    assert done.exit_code == 0 and done.stderr == ""


def test_too_few_inputs_for_debiased_cka_are_refused_before_any_work(runner, one_error, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    few = _features(3)
    save_file({k: np.asarray(few[k]) for k in KEYS}, "f.safetensors", metadata=dict(few.metadata))
    refused = runner.invoke(main, ["compare", "f.safetensors", "--debiased", "-o", "c.safetensors"])
    assert one_error(refused) == (
        "Error: debiased CKA needs 4 inputs at least, and 3 were given. Hint: give more inputs, or leave out --debiased"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.safetensors"]  # no parts folder left to block a rerun


def test_a_debiased_heatmap_says_it_is_debiased(tmp_path):
    from hookcli.pictures.compare_grids import method_name
    from hookcli.storage.compare_file import read_comparison

    for debiased, name in ((True, "linear CKA (debiased)"), (False, "linear CKA")):
        found = hookcli.compare(features=_features(12), debiased=debiased)
        assert method_name(read_comparison(found)) == name
