"""hookcli compare: each method against a direct float64 implementation on the same features (linear CKA as
Kornblith et al. write it, the minibatch estimator of Nguyen et al., RSA with scipy), its invariances, the same
file from one process and several, and what it refuses."""

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors import safe_open
from safetensors.torch import save_file
from scipy import stats
from scipy.spatial.distance import pdist, squareform

import hookcli
from hookcli.cli import main
from hookcli.errors import UsageProblem
from hookcli.statistics.similarity import hsic_unbiased
from hookcli.storage.features import Features
from hookcli.storage.shards import open_features

ROWS = 24


def _features(seed=0, rows=ROWS):
    """Saved features in memory: maps, tokens and vectors, one related to another by a rotation and a scale."""
    rng = np.random.default_rng(seed)
    maps = rng.normal(size=(rows, 6, 3, 3)).astype(np.float32) + rng.normal(size=(1, 6, 1, 1)).astype(np.float32)
    vectors = rng.normal(size=(rows, 5)).astype(np.float32) * np.array([1, 2, 3, 4, 100], dtype=np.float32)
    rotation = np.linalg.qr(rng.normal(size=(6, 6)))[0]
    turned = maps.astype(np.float64).mean(axis=(2, 3)) @ rotation * 7  # an orthogonal map and a scale of "maps"
    inputs = [f"/photos/{n:03d}.jpg" for n in range(rows)]
    tensors = {"maps": torch.from_numpy(maps), "vectors": torch.from_numpy(vectors), "turned": torch.from_numpy(turned)}
    return Features(tensors, {"inputs": json.dumps(inputs), "model": "m"})


def _pooled(features, key):
    values = np.asarray(features[key], dtype=np.float64)
    return values.reshape(len(values), values.shape[1], -1).mean(axis=2) if values.ndim > 2 else values


def _linear_cka(x, y):
    """Kornblith et al. (2019), feature space: ‖YᵀX‖²_F / (‖XᵀX‖_F ‖YᵀY‖_F) of centred X, Y."""
    x, y = x - x.mean(axis=0), y - y.mean(axis=0)
    return np.linalg.norm(y.T @ x) ** 2 / (np.linalg.norm(x.T @ x) * np.linalg.norm(y.T @ y))


KEYS = ["maps", "turned", "vectors"]  # as the reader orders them


def test_linear_cka_equals_kornblith_feature_space_cka_and_keeps_its_invariances():
    features = _features()
    found = hookcli.compare(features=features, batch_size=5, shard_size=10)
    assert json.loads(found.metadata["rows"]) == KEYS and json.loads(found.metadata["columns"]) == KEYS
    pooled = {key: _pooled(features, key) for key in KEYS}
    expected = np.array([[_linear_cka(pooled[a], pooled[b]) for b in KEYS] for a in KEYS])
    np.testing.assert_allclose(found["linear-cka"].numpy(), expected, rtol=1e-9, atol=1e-12)
    assert np.abs(np.diag(found["linear-cka"].numpy()) - 1).max() < 1e-12
    # An orthogonal transform and an isotropic scale leave CKA as it was.
    assert abs(float(found["linear-cka"][0, 1]) - 1) < 1e-9
    assert abs(float(found["linear-cka"][0, 2]) - float(found["linear-cka"][1, 2])) < 1e-9
    assert found["linear-cka@count"].item() == ROWS and found["linear-cka@widths"].tolist() == [6, 6, 5]


def test_the_minibatch_estimator_equals_nguyen_et_al_on_the_same_batches():
    features = _features(1)
    found = hookcli.compare(features=features, keys=["maps", "vectors"], keys2=["turned"], method="minibatch-cka",
                            batch_size=5, shard_size=10)  # fmt: skip
    # Batches: 0-4, 5-9 | 10-14, 15-19 | 20-23 (each shard's, whole maps flattened).
    batches = [range(0, 5), range(5, 10), range(10, 15), range(15, 20), range(20, 24)]

    def flat(key):
        values = np.asarray(features[key], dtype=np.float64)
        return values.reshape(len(values), -1)

    def hsic(k, ell):
        n = len(k)
        k, ell = k.copy(), ell.copy()
        np.fill_diagonal(k, 0)
        np.fill_diagonal(ell, 0)
        ones = np.ones(n)
        return (
            np.trace(k @ ell)
            + (ones @ k @ ones) * (ones @ ell @ ones) / ((n - 1) * (n - 2))
            - 2 / (n - 2) * ones @ k @ ell @ ones
        ) / (n * (n - 3))

    def estimate(a, b):
        x, y = flat(a), flat(b)
        grams = [(x[list(r)] @ x[list(r)].T, y[list(r)] @ y[list(r)].T) for r in batches]
        cross = np.mean([hsic(k, ell) for k, ell in grams])
        return cross / np.sqrt(np.mean([hsic(k, k) for k, _ in grams]) * np.mean([hsic(ell, ell) for _, ell in grams]))

    expected = np.array([[estimate("maps", "turned")], [estimate("vectors", "turned")]])
    np.testing.assert_allclose(found["minibatch-cka"].numpy(), expected, rtol=1e-9)
    a, b = torch.randn(6, 3, dtype=torch.float64), torch.randn(6, 9, dtype=torch.float64)
    assert abs(float(hsic_unbiased(a @ a.T, b @ b.T)) - hsic((a @ a.T).numpy(), (b @ b.T).numpy())) < 1e-12


@pytest.mark.parametrize("distance", ["correlation", "euclidean"])
@pytest.mark.parametrize("ranking", ["spearman", "pearson", "kendall"])
def test_rsa_equals_scipy_on_the_same_rows(distance, ranking):
    features = _features(2)
    found = hookcli.compare(features=features, method="rsa", rsa_rows=15, rsa_distance=distance, rsa_compare=ranking,
                            save_rdms=True, batch_size=4, shard_size=8)  # fmt: skip
    rdms = {}
    for key in KEYS:
        rows = _pooled(features, key)[:15]
        rdms[key] = squareform(pdist(rows, "correlation" if distance == "correlation" else "euclidean"))
        np.testing.assert_allclose(found[f"rdm@{key}"].numpy(), rdms[key], rtol=1e-5, atol=1e-5)
    upper = np.triu_indices(15, 1)
    measure = {"spearman": stats.spearmanr, "pearson": stats.pearsonr, "kendall": stats.kendalltau}[ranking]
    expected = [[measure(rdms[a][upper], rdms[b][upper]).statistic for b in KEYS] for a in KEYS]
    np.testing.assert_allclose(found["rsa"].numpy(), expected, rtol=1e-9, atol=1e-12)
    assert json.loads(found.metadata["settings"]) == {
        "pool": "avg",
        "rows": 15,
        "distance": distance,
        "ranking": ranking,
    }


def test_a_representation_without_spread_has_no_cka_and_a_note_says_so():
    features = _features(3)
    constant = Features({**{k: features[k] for k in KEYS}, "flat": torch.ones(ROWS, 4)}, features.metadata)
    heard = []
    found = hookcli.compare(features=constant, progress=heard.append)
    flat = json.loads(found.metadata["rows"]).index("flat")
    assert torch.isnan(found["linear-cka"][flat]).all() and torch.isnan(found["linear-cka"][:, flat]).all()
    others = [n for n in range(4) if n != flat]
    assert not torch.isnan(found["linear-cka"][others][:, others]).any()
    assert json.loads(found.metadata["undefined"]) == ["flat"]
    notes = [event.text for event in heard if hasattr(event, "text")]
    assert notes == [
        "'flat' has no spread (every row alike, or values that are not finite): its similarities are undefined, NaN "
        "in the file",
        "24 inputs are too few to read the matrix: give 100 at least, and more than the 6 values a row of 'maps' "
        "(with fewer, similarities are high even between unrelated representations)",
    ]


def test_sources_with_other_rows_or_another_order_are_refused(runner, tmp_path):
    features = _features()
    metadata = dict(features.metadata)
    path = tmp_path / "a.safetensors"
    from safetensors.torch import save_file

    save_file({key: features[key].contiguous() for key in KEYS}, str(path), metadata=metadata)
    shuffled = json.loads(metadata["inputs"])
    shuffled[3], shuffled[4] = shuffled[4], shuffled[3]
    other = tmp_path / "b.safetensors"
    save_file(
        {key: features[key].contiguous() for key in KEYS},
        str(other),
        metadata={**metadata, "inputs": json.dumps(shuffled)},
    )
    done = runner.invoke(main, ["compare", str(path), str(other), "-o", str(tmp_path / "c.safetensors")])
    assert done.exit_code == 2
    assert done.output == (
        f"Error: '{path}' and '{other}' hold different rows: row 3 is '/photos/003.jpg' in one and '/photos/004.jpg' "
        "in the other. Hint: extract both from the same inputs, in the same order\n"
    )
    shorter = tmp_path / "s.safetensors"
    save_file({key: features[key][:10].contiguous() for key in KEYS}, str(shorter),
              metadata={**metadata, "inputs": json.dumps(json.loads(metadata["inputs"])[:10])})  # fmt: skip
    done = runner.invoke(main, ["compare", str(path), str(shorter)])
    assert done.exit_code == 2 and f"'{path}' holds 24 rows and '{shorter}' 10" in done.output
    with pytest.raises(UsageProblem, match=r"^'features \(in memory\)' holds 24 rows and 'features2 \(in memory\)' 10"):
        short = Features({key: features[key][:10] for key in KEYS}, {**metadata, "inputs": json.dumps(shuffled[:10])})
        hookcli.compare(features=features, features2=short)


def _digest(path) -> str:
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def test_models_compared_in_one_pass_by_one_process_and_by_parts(runner, tmp_path, make_image):
    folder = tmp_path / "imgs"
    folder.mkdir()
    inputs = [str(make_image(folder / f"{i:02d}.png", size=(44, 40), seed=i)) for i in range(12)]
    args = ["compare", "-m", "resnet18", "-w", "none", "-l", "layer3", "-l", "layer4", "--model2", "resnet34",
            "--layer2", "layer4", "--resize", "40", "--crop", "32", "-b", "4", "--shard-size", "4", "-q"]  # fmt: skip
    one = tmp_path / "one.safetensors"
    assert (
        subprocess.run([sys.executable, "-m", "hookcli", *args, "-o", str(one), *inputs], timeout=300).returncode == 0
    )
    with open_features(one) as found:
        assert json.loads(found.metadata["rows"]) == ["layer3", "layer4"]
        assert json.loads(found.metadata["columns"]) == ["layer4"]
        assert found.shape("linear-cka") == [2, 1] and 0 < float(found["linear-cka"][1, 0]) <= 1
    two = tmp_path / "two.safetensors"
    runs = [
        subprocess.Popen(
            [sys.executable, "-m", "hookcli", *args, "--part", f"{k}/2", "-o", str(two), *inputs],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        for k in (1, 2)
    ]
    results = [(run.wait(timeout=300), run.stdout.read(), run.stderr.read()) for run in runs]
    assert [code for code, _, _ in results] == [0, 0], results
    assert _digest(two) == _digest(one)
    # torchrun's two processes, a thread each: the file one process of one thread writes (the first one's, where a
    # fresh process has one thread: a test worker's share of the cores).
    single = one
    if torch.get_num_threads() != 1:
        single = tmp_path / "single.safetensors"
        alone = subprocess.run([sys.executable, "-m", "hookcli", *args, "-o", str(single), *inputs], timeout=300,
                               env={**os.environ, "OMP_NUM_THREADS": "1"})  # fmt: skip
        assert alone.returncode == 0
    team = tmp_path / "team.safetensors"
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m", "hookcli",
         *args, "-o", str(team), *inputs],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"{team}\n" and _digest(team) == _digest(single)
    # The same two models' features saved first, then compared: the same matrix.
    for model, layers, name in (("resnet18", ["layer3", "layer4"], "a"), ("resnet34", ["layer4"], "b")):
        extract = ["extract", "-m", model, "-w", "none", *(x for layer in layers for x in ("-l", layer)), "--resize",
                   "40", "--crop", "32", "-b", "4", "-q", "-o", str(tmp_path / f"{name}.safetensors"),
                   *inputs]  # fmt: skip  # the comparison's batches: a GPU's convolutions round by batch size
        assert runner.invoke(main, extract).exit_code == 0
    saved = hookcli.compare(features=str(tmp_path / "a.safetensors"), features2=str(tmp_path / "b.safetensors"),
                            batch_size=4, shard_size=4)  # fmt: skip
    with open_features(one) as found:
        np.testing.assert_allclose(saved["linear-cka"].numpy(), found["linear-cka"], rtol=1e-12)


def test_what_compare_refuses_before_any_work(runner, tmp_path, make_image):
    image = str(make_image(tmp_path / "a.png"))
    model = ["compare", "-m", "resnet18", "-w", "none", "-q"]
    cases = [
        ([*model, image], "Error: --layer is needed with --model (repeat it for more layers)"),
        ([*model, "-l", "fc", "-k", "x", image], "Error: -k and --key2 choose tensors of saved features"),
        ([*model, "-l", "fc", "--method", "minibatch-cka", "-b", "3", image],
         "Error: minibatch-cka takes the run's batches, and a batch of 3 rows is too few"),
        ([*model, "-l", "fc", "-o", "-", image], "Error: compare writes a file (its parts are kept beside it"),
        ([*model, "-l", "fc", "--method", "cka", image], "Error: Invalid value for '--method'"),
        (["compare", image, image, image], "Error: give one or two sources of saved features"),
        (["compare", image, "--crop", "3"], "Error: --crop applies when --model runs a model"),
    ]  # fmt: skip
    for args, message in cases:
        done = runner.invoke(main, args)
        assert done.exit_code == 2 and message in done.output and "Traceback" not in done.output, (args, done.output)


def test_linear_cka_files_over_disjoint_inputs_merge_into_the_whole(runner, tmp_path):
    features = _features(4)
    whole = hookcli.compare(features=features, batch_size=4, shard_size=8)
    halves = []
    for name, rows in (("a", slice(0, 12)), ("b", slice(12, 24))):
        inputs = json.loads(features.metadata["inputs"])[rows]
        half = Features({key: features[key][rows] for key in KEYS}, {"inputs": json.dumps(inputs), "model": "m"})
        halves.append(str(hookcli.compare(features=half, batch_size=4, output=str(tmp_path / f"{name}.safetensors"))))
    out = tmp_path / "merged.safetensors"
    done = runner.invoke(main, ["compare", "--merge", *halves, "-o", str(out)])
    assert done.exit_code == 0 and done.stdout == f"{out}\n", done.output
    assert done.stderr.startswith("Note: 24 inputs are too few to read the matrix: give 100 at least")
    with open_features(out) as merged:
        np.testing.assert_allclose(merged["linear-cka"], whole["linear-cka"].numpy(), rtol=1e-12)
        assert json.loads(merged.metadata["inputs"]) == json.loads(features.metadata["inputs"])
        assert json.loads(merged.metadata["merged_from"]) == halves
    done = runner.invoke(main, ["compare", "--merge", halves[0], halves[0], "-o", str(tmp_path / "twice.safetensors")])
    assert done.exit_code == 2 and "has inputs an earlier file has too ('/photos/000.jpg')" in done.output
    rsa = hookcli.compare(features=features, method="rsa", output=str(tmp_path / "rsa.safetensors"))
    done = runner.invoke(main, ["compare", "--merge", halves[0], str(rsa), "-o", str(tmp_path / "x.safetensors")])
    assert done.exit_code == 2 and f"Error: '{rsa}' is not a linear-cka comparison file" in done.output


def test_files_to_merge_are_checked_by_their_widths_before_any_sums_are_read(tmp_path, monkeypatch):
    from safetensors.torch import load_file

    from hookcli.storage.features import FeatureFile

    features = _features(4)
    halves = []
    for name, rows in (("a", slice(0, 12)), ("b", slice(12, 24))):
        inputs = json.loads(features.metadata["inputs"])[rows]
        half = Features({key: features[key][rows] for key in KEYS}, {"inputs": json.dumps(inputs), "model": "m"})
        halves.append(hookcli.compare(features=half, output=str(tmp_path / f"{name}.safetensors")))
    with safe_open(halves[1], "pt") as found:
        metadata = found.metadata()
    tensors = load_file(halves[1])
    tensors["linear-cka@widths"] = torch.tensor([5, 7, 5])  # as many columns, cut otherwise: a crafted file
    save_file(tensors, str(halves[1]), metadata=metadata)
    reads, read = [], FeatureFile.read
    monkeypatch.setattr(FeatureFile, "read", lambda self, key, *rest: reads.append(key) or read(self, key, *rest))
    with pytest.raises(UsageProblem) as refused:
        hookcli.compare(merge=halves)
    assert refused.value.message == (
        f"'{halves[1]}' holds representations of other widths than '{halves[0]}' ([5, 7, 5] against [6, 6, 5])"
    )
    assert "linear-cka@comoment" not in reads  # neither file's co-moments: the widest of its sums


def test_a_second_sides_rdm_whose_label_the_first_has_is_kept_apart(runner, tmp_path, monkeypatch):
    features = _features(5)
    out = tmp_path / "rsa.safetensors"
    reads, read_rows = [], type(features).read_rows

    def counted(self, key, *args):
        reads.append(key)
        return read_rows(self, key, *args)

    monkeypatch.setattr(type(features), "read_rows", counted)
    hookcli.compare(features=features, features2=features, keys=["maps", "vectors"], keys2=["maps"], method="rsa",
                    save_rdms=True, rsa_rows=10, output=str(out))  # fmt: skip
    assert reads and reads.count("maps") == reads.count("vectors")  # the tensor both sides name is read once
    monkeypatch.chdir(tmp_path)
    (tmp_path / "memory").write_text("a file named as features in memory are")  # two sources in memory stay two
    reads.clear()
    hookcli.compare(features=features, features2=features, keys=["maps"], keys2=["maps"])
    once = len(reads)
    reads.clear()
    other = hookcli.compare(features=features, features2=_features(6), keys=["maps"], keys2=["maps"])
    assert once > 0 and len(reads) == 2 * once and float(other["linear-cka"][0, 0]) < 0.99
    with open_features(out) as found:
        assert sorted(found.keys()) == ["rdm@2:maps", "rdm@maps", "rdm@vectors", "rsa"]
        assert np.array_equal(found["rdm@2:maps"], found["rdm@maps"])
    assert runner.invoke(main, ["info", str(out)]).exit_code == 0


def test_merging_refuses_files_of_another_run_and_writing_over_an_input(runner, tmp_path, images):
    def made(name, model="resnet18", photos=images[:2], **options):
        out = str(tmp_path / f"{name}.safetensors")
        options = {"weights": "none", "resize": 40, "crop": 32, **options}
        return str(hookcli.compare(model, ["layer3", "layer4"], [str(p) for p in photos], output=out, **options))

    first = made("first")
    others = {
        "model": made("model", model="resnet34", photos=images[2:]),
        "weights (seed)": made("seed", photos=images[2:], seed=1),
        "preprocess (crop, resize)": made("crop", photos=images[2:], resize=48, crop=40),
    }
    for differ, other in others.items():
        done = runner.invoke(main, ["compare", "--merge", first, other, "-o", str(tmp_path / "m.safetensors")])
        assert (done.exit_code, done.stderr) == (
            2,
            f"Error: '{other}' comes from another run than '{first}' (it differs in: {differ}). Hint: merge "
            "comparisons made by one command over different inputs\n",
        )
    second = made("second", photos=images[2:])
    done = runner.invoke(main, ["compare", "--merge", first, second, "-o", first, "--force"])
    assert (done.exit_code, done.stderr) == (
        2,
        f"Error: '{first}' is one of the files to merge: merging would write over it. Hint: give another -o\n",
    )
    merged = runner.invoke(main, ["compare", "--merge", first, second, "-o", str(tmp_path / "all.safetensors")])
    assert merged.exit_code == 0, merged.output
    # A merged file is one more part of the run: it merges again, with the run's files alone.
    fourth = tmp_path / "d.png"
    Image.fromarray(np.random.default_rng(4).integers(0, 256, (40, 44, 3), dtype=np.uint8)).save(fourth)
    third = made("third", photos=[fourth])
    again = hookcli.compare(merge=[str(tmp_path / "all.safetensors"), third])
    at_once = hookcli.compare(merge=[first, second, third])
    assert torch.equal(again["linear-cka"], at_once["linear-cka"])
    assert json.loads(again.metadata["identity"]) == json.loads(at_once.metadata["identity"])
    assert json.loads(again.metadata["identity"])["inputs"] == 4
    done = runner.invoke(main, ["compare", "--merge", str(tmp_path / "all.safetensors"), others["weights (seed)"],
                                "-o", str(tmp_path / "m.safetensors")])  # fmt: skip
    assert done.exit_code == 2 and "(it differs in: weights (seed))" in done.stderr
    unnamed = tmp_path / "unnamed.safetensors"
    with safe_open(third, "pt") as read:
        save_file({key: read.get_tensor(key) for key in read.keys()}, str(unnamed),
                  {key: value for key, value in read.metadata().items() if key != "identity"})  # fmt: skip
    done = runner.invoke(main, ["compare", "--merge", first, str(unnamed), "-o", str(tmp_path / "m.safetensors")])
    assert (done.exit_code, done.stderr) == (
        2,
        f"Error: '{unnamed}' records no run identity, so the run that made it cannot be checked against the others. "
        "Hint: merge the files it was made from (its merged_from), or compute it again with hookcli compare\n",
    )


def test_representations_too_wide_together_for_linear_cka_are_refused_before_their_co_moments(runner, tmp_path):
    inputs = [f"/photos/{i}.jpg" for i in range(8)]
    wide = Features({key: torch.ones(8, 6000) for key in ("a", "b", "c")}, {"inputs": json.dumps(inputs), "model": "m"})
    with pytest.raises(hookcli.errors.UsageProblem) as refused:
        hookcli.compare(features=wide, batch_size=4)
    assert str(refused.value) == (
        "the representations give 18,000 values a row together (a 6,000, b 6,000, c 6,000): linear CKA keeps the "
        "co-moments of at most 16,384 (a 16,384² matrix). Hint: pool them (--pool avg), compare fewer at once, or "
        "use --method minibatch-cka"
    )
    assert hookcli.compare(features=wide, batch_size=4, method="minibatch-cka")["minibatch-cka"].shape == (3, 3)


def test_the_second_side_takes_weights_and_a_seed_of_its_own(runner, tmp_path, images):
    out = tmp_path / "seeds.safetensors"
    args = ["compare", "-m", "resnet18", "-w", "none", "-l", "layer4", "--resize", "40", "--crop", "32"]
    done = runner.invoke(main, [*args, "--seed2", "1", "--weights2", "none", "-o", str(out), *map(str, images)])
    assert done.exit_code == 0, done.output
    with open_features(out) as found:
        assert (json.loads(found.metadata["rows"]), json.loads(found.metadata["columns"])) == (["layer4"], ["layer4"])
        second_run = json.loads(found.metadata["compare_with"])
        assert second_run["weights"] == {"source": "none", "seed": 1} and "inputs" not in second_run
        assert json.loads(found.metadata["weights"]) == {"source": "none", "seed": 0}
        different = float(found["linear-cka"][0, 0])
    told = runner.invoke(main, ["info", str(out)])
    assert told.output.splitlines()[1] == "rows: resnet18 (random, seed 0); columns: resnet18 (random, seed 1)"
    same = hookcli.compare("resnet18", "layer4", [str(p) for p in images], weights="none", seed2=0, resize=40, crop=32)
    assert float(same["linear-cka"][0, 0]) == pytest.approx(1.0, abs=1e-9) and different < 0.999
    refused = runner.invoke(main, [*args, "--seed2", "1", "--weights2", "DEFAULT", *map(str, images)])
    assert (refused.exit_code, refused.stderr) == (
        2,
        "Error: --seed2 only applies to a second side of random weights (pretrained and file weights are fixed). "
        "Hint: give --weights2 none, or leave --seed2 out\n",
    )


def test_a_crafted_comparison_part_whose_sums_count_other_inputs_is_refused():
    from hookcli.statistics.comparison import CompareChoice, CompareGathering

    gathering = CompareGathering(CompareChoice(), first=["a", "b"], labels=(["a", "b"], ["a", "b"]))
    shard = gathering.start(0)
    generator = torch.Generator().manual_seed(0)
    shard.update({"a": torch.randn(5, 3, generator=generator), "b": torch.randn(5, 4, generator=generator)}, None)
    state = shard.state()
    assert gathering.read(state, {}, range(5)).sums.sums.count == 5
    state["linear-cka/count"] = torch.tensor(7)
    with pytest.raises(ValueError) as refused:
        gathering.read(state, {}, range(5))
    assert str(refused.value) == "its linear-cka sums count 7 inputs, not its 5"


def test_weights2_is_refused_for_a_model_given_built_and_drops_the_first_sides_seed(tmp_path, images):
    from hookcli.errors import UsageProblem, WeightsError
    from hookcli.models.loading import load_model

    paths = [str(p) for p in images]
    with pytest.raises(UsageProblem) as refused:
        hookcli.compare(load_model("resnet18", "none"), "layer4", paths, weights2="none", seed2=3)
    assert str(refused.value).startswith("weights2 and seed2 choose the weights of a second side that hookcli builds")
    out = tmp_path / "own.safetensors"
    with pytest.raises(WeightsError) as pretrained:  # the second side's own weights, which cannot download here
        hookcli.compare("resnet18", "layer4", paths, weights="none", seed=3, weights2="DEFAULT", output=str(out))
    assert str(pretrained.value).startswith("pretrained weights ResNet18_Weights.IMAGENET1K_V1 are not cached")


def test_comparisons_of_saved_files_over_disjoint_inputs_merge(runner, tmp_path):
    from safetensors.torch import save_file

    features = _features(5)
    halves = []
    for name, rows in (("a", slice(0, 12)), ("b", slice(12, 24))):
        inputs = json.loads(features.metadata["inputs"])[rows]
        saved = tmp_path / f"{name}.safetensors"
        save_file(
            {key: features[key][rows].contiguous() for key in KEYS}, str(saved), metadata={"inputs": json.dumps(inputs)}
        )
        halves.append(
            str(hookcli.compare(features=str(saved), batch_size=4, output=str(tmp_path / f"{name}.cka.safetensors")))
        )
    merged = hookcli.compare(merge=halves)
    np.testing.assert_allclose(
        merged["linear-cka"].numpy(), hookcli.compare(features=features)["linear-cka"].numpy(), rtol=1e-12
    )
    other = tmp_path / "c.safetensors"
    save_file(
        {"maps": features["maps"][:12].contiguous()},
        str(other),
        metadata={"inputs": json.dumps([f"/x/{n}" for n in range(12)])},
    )
    fewer = str(hookcli.compare(features=str(other), output=str(tmp_path / "c.cka.safetensors")))
    with pytest.raises(Exception) as refused:
        hookcli.compare(merge=[halves[0], fewer])
    assert "compares other representations than the first file" in str(refused.value)


def test_a_key_named_like_the_second_sides_never_stands_for_it():
    rng = np.random.default_rng(3)
    y, marked = rng.normal(size=(ROWS, 8)), rng.normal(size=(ROWS, 8))
    tensors = {"y": torch.from_numpy(y), "2:y": torch.from_numpy(marked)}
    features = Features(tensors, {"inputs": json.dumps([f"/photos/{n}.jpg" for n in range(ROWS)])})
    found = hookcli.compare(features=features, keys=["2:y"], keys2=["y"])
    assert found["linear-cka"].item() == pytest.approx(_linear_cka(marked, y), rel=1e-9)
    assert _linear_cka(marked, y) < 0.6  # the two are unrelated: 1.0 would be 2:y with itself
    both = hookcli.compare(
        features=features, features2=features, keys=["y", "2:y"], keys2=["y", "2:y"], method="rsa", save_rdms=True
    )
    assert sorted(name for name in both.keys() if name.startswith("rdm@")) == [
        "rdm@2:2:2:y",
        "rdm@2:2:y",
        "rdm@2:y",
        "rdm@y",
    ]
    rdm = {name: both[name].numpy() for name in ("rdm@y", "rdm@2:y", "rdm@2:2:y", "rdm@2:2:2:y")}
    expected = {label: squareform(pdist(values, "correlation")) for label, values in (("y", y), ("2:y", marked))}
    for name, label in (("rdm@y", "y"), ("rdm@2:y", "2:y"), ("rdm@2:2:y", "y"), ("rdm@2:2:2:y", "2:y")):
        np.testing.assert_allclose(rdm[name], expected[label], atol=1e-5)


def test_a_comparisons_plan_run_alone_is_refused_with_where_to_run_it(images):
    from hookcli.api import plan
    from hookcli.errors import UsageProblem
    from hookcli.run.execute import execute

    planned = plan("compare", "resnet18", "layer1", [str(p) for p in images], weights="none", resize=32, crop=32)
    with pytest.raises(UsageProblem) as refused:
        execute(planned)
    assert str(refused.value) == (
        "a comparison's plan says what runs, not how to compare it. Hint: run it with hookcli.compare"
    )


def test_minibatch_cka_keeps_its_value_when_every_feature_shares_a_large_offset():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((64, 256)).astype(np.float32)
    tensors = {"x": torch.from_numpy(x), **{f"x+{o}": torch.from_numpy(x + np.float32(o)) for o in (1000, 10000)}}
    found = hookcli.compare(features=Features(tensors, {"inputs": json.dumps([f"/p/{i}.jpg" for i in range(64)])}),
                            method="minibatch-cka", batch_size=16)  # fmt: skip
    # float32 keeps x + 10000 - 10000 within 1e-3 of x: the estimate stays that close to 1 (it was 0.056 before the
    # batches' means came off their Gram matrices, and NaN at an offset of 3000)
    np.testing.assert_allclose(found["minibatch-cka"].numpy(), np.ones((3, 3)), atol=1e-6)
    assert "undefined" not in found.metadata or json.loads(found.metadata["undefined"]) == []


def test_a_representation_without_spread_is_undefined_for_minibatch_cka_whatever_the_batches():
    rng = np.random.default_rng(5)
    tensors = {"x": torch.from_numpy(rng.standard_normal((40, 6))), "c": torch.full((40, 5), 0.1),
               "c2": torch.full((40, 2, 3, 3), 1 / 3)}  # fmt: skip
    inputs = json.dumps([f"/photos/{i}.jpg" for i in range(40)])
    for batch in (5, 6, 7, 8):
        source = Features(tensors, {"inputs": inputs})
        found = hookcli.compare(features=source, method="minibatch-cka", batch_size=batch)
        matrix, x = found["minibatch-cka"], json.loads(found.metadata["rows"]).index("x")
        assert sorted(json.loads(found.metadata["undefined"])) == ["c", "c2"]
        assert matrix[x, x].item() == pytest.approx(1.0) and int(torch.isnan(matrix).sum()) == 8  # all but x with x


def test_rsa_leaves_out_the_pairs_of_a_row_without_spread_not_the_whole_representation():
    rng = np.random.default_rng(6)
    x = rng.standard_normal((30, 8))
    y = np.maximum(x @ rng.standard_normal((8, 8)), 0)
    y[5] = 0  # one input whose ReLU output is all zero
    inputs = json.dumps([f"/photos/{i}.jpg" for i in range(30)])
    found = hookcli.compare(features=Features({"x": torch.from_numpy(x), "y": torch.from_numpy(y)}, {"inputs": inputs}),
                            method="rsa")  # fmt: skip
    upper = np.triu_indices(30, 1)
    kept = (upper[0] != 5) & (upper[1] != 5)
    rdms = [squareform(pdist(values, "correlation"))[upper][kept] for values in (x, y)]
    assert found["rsa"][0, 1].item() == pytest.approx(stats.spearmanr(*rdms).statistic, abs=1e-12)
    assert found["rsa"][1, 1].item() == pytest.approx(1.0) and "undefined" not in found.metadata
    y[4, 2] = np.inf  # a value that is not finite leaves the representation undefined, as linear CKA does
    found = hookcli.compare(features=Features({"x": torch.from_numpy(x), "y": torch.from_numpy(y)}, {"inputs": inputs}),
                            method="rsa")  # fmt: skip
    assert json.loads(found.metadata["undefined"]) == ["y"] and torch.isnan(found["rsa"][1]).all()


def test_a_file_to_merge_whose_sums_count_other_inputs_than_it_lists_is_refused(tmp_path):
    inputs = [f"/photos/{i}.jpg" for i in range(12)]
    made = []
    for name, listed in (("a", inputs), ("b", [f"{path}x" for path in inputs])):
        source = Features({"a": torch.randn(12, 4), "b": torch.randn(12, 3)}, {"inputs": json.dumps(listed)})
        made.append(hookcli.compare(features=source, output=str(tmp_path / f"{name}.safetensors")))
    with safe_open(made[0], "pt") as read:
        tensors, metadata = {key: read.get_tensor(key) for key in read.keys()}, read.metadata()
    tensors["linear-cka@count"] = torch.tensor(2**62)
    save_file(tensors, str(made[0]), metadata)
    with pytest.raises(hookcli.HookcliError) as caught:
        hookcli.compare(merge=[str(made[0]), str(made[1])])
    assert str(caught.value) == (
        f"'{made[0]}' holds linear-cka sums that do not fit: its linear-cka sums count 4611686018427387904 inputs, "
        "not its 12. Hint: write it again with hookcli compare"
    )


def test_files_of_the_same_images_reached_through_a_link_do_not_merge(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    made = []
    for name in ("real", "link"):
        listed = [str(tmp_path / name / f"{i}.png") for i in range(12)]
        for path in listed:
            Path(path).touch()
        source = Features({"a": torch.randn(12, 4), "b": torch.randn(12, 3)}, {"inputs": json.dumps(listed)})
        made.append(str(hookcli.compare(features=source, output=str(tmp_path / f"{name}.safetensors"))))
    with pytest.raises(UsageProblem) as caught:
        hookcli.compare(merge=made)
    assert str(caught.value) == (
        f"'{made[1]}' has inputs an earlier file has too ('{tmp_path / 'link' / '0.png'}'): merged runs must cover "
        "disjoint inputs. Hint: merge files made over different inputs"
    )


@pytest.mark.parametrize(
    ("weights", "weights2", "told"),
    [
        (
            {"source": "none", "seed": 0},
            {"source": "file", "path": "/ckpt/epoch9.pth", "sha256": "ab" * 32},
            ("m (random, seed 0)", "m (epoch9.pth)"),
        ),
        (
            {"source": "torchvision", "name": "ResNet18_Weights.IMAGENET1K_V1"},
            {"source": "none", "seed": 4},
            ("m (IMAGENET1K_V1)", "m (random, seed 4)"),
        ),
        ({"source": "factory"}, {"source": "factory"}, ("m", "m")),
        ({"source": "none", "seed": 2}, None, ("m", "m")),
    ],
)
def test_a_comparison_of_one_model_with_two_sets_of_weights_tells_the_sides_apart(weights, weights2, told):
    from hookcli.storage.compare_file import read_comparison
    from hookcli.storage.compare_format import compare_metadata

    other = {"model": "m"} if weights2 is None else {"model": "m", "weights": weights2}
    run = {"model": "m", "weights": json.dumps(weights), "compare_with": json.dumps(other)}
    metadata = compare_metadata(run, method="rsa", rows=["a"], columns=["a"], settings={}, inputs=["x", "y", "z"])
    assert read_comparison(Features({"rsa": np.eye(1)}, metadata)).sources() == told
