"""Saved features whose metadata, tensors or kind are not what hookcli writes, given to ``stats`` and ``compare``;
comparison files whose matrix no method gives; parts whose state no run could have left: each is one line.

The features here are written by safetensors itself with metadata as hookcli writes it, then one entry changed.
"""

import json

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.numpy import save_file

from hookcli.cli import main
from hookcli.statistics.channel_stats import StatsGathering
from hookcli.statistics.comparison import CompareChoice, CompareGathering
from hookcli.statistics.layer import StatsChoice
from hookcli.storage.recorded_run import bounded_json
from hookcli.storage.shards import open_features

_LAYERS = {
    "layer1": {"key": "layer1", "type": "Sequential", "calls": 1, "keys": ["layer1"]},
    "layer2": {"key": "layer2", "type": "Sequential", "calls": 1, "keys": ["layer2"]},
}
_METADATA = {
    "format": "1",
    "producer": "hookcli",
    "model": "resnet18",
    "weights": json.dumps({"source": "none", "seed": 0}),
    "layers": json.dumps(_LAYERS),
    "capture": "output",
    "preprocess": json.dumps({"resize": 32, "crop": 32}),
    "pool": "none",
    "dtype": "float32",
    "fused": "0",
    "inputs": json.dumps([f"/photos/{n}.jpg" for n in range(4)]),
}
_DEEP_LIST = "[" * 5000 + "]" * 5000
_DEEP_OBJECT = '{"a":' * 20 + "1" + "}" * 20


def _tensors():
    generator = np.random.default_rng(0)
    return {
        "layer1": generator.normal(size=(4, 3, 2, 2)).astype("float32"),
        "layer2": generator.normal(size=(4, 5)).astype("float32"),
    }


def _layers(change):
    layers = json.loads(json.dumps(_LAYERS))
    change(layers)
    return json.dumps(layers)


def _unreadable(entry: str, what: str) -> str:
    return (
        f"Error: 'crafted.safetensors' has metadata hookcli cannot read: its '{entry}' metadata is not {what}. "
        "Hint: save the features again with hookcli extract, or remove the entry"
    )


_INPUTS = _unreadable("inputs", "a list of input names")
_TABLE = _unreadable("layers", "a table of layers (key, type, calls, keys, units)")


@pytest.mark.parametrize(
    ("entry", "value", "message"),
    [
        ("inputs", "[1", _INPUTS),
        ("inputs", "[1, 2, 3, 4]", _INPUTS),
        ("inputs", _DEEP_LIST, _INPUTS),
        ("inputs", '{"a": "b"}', _INPUTS),
        ("layers", "[1, 2]", _TABLE),
        ("layers", _DEEP_OBJECT, _TABLE),
        ("layers", _layers(lambda t: t.update(layer1=[1, 2])), _TABLE),
        ("layers", _layers(lambda t: t["layer1"].update(key=["layer1"])), _TABLE),
        ("layers", _layers(lambda t: t["layer1"].update(keys="layer1")), _TABLE),
        ("layers", _layers(lambda t: t["layer1"].update(calls="many")), _TABLE),
        ("layers", _layers(lambda t: t["layer1"].update(calls=-3)), _TABLE),
        ("layers", _layers(lambda t: t["layer1"].update(type=[1])), _TABLE),
        ("layers", _layers(lambda t: t["layer1"].update(units=-1)), _TABLE),
        ("layers", _layers(lambda t: t["layer1"].update(units="64")), _TABLE),
        ("preprocess", "[1]", _unreadable("preprocess", "what hookcli writes (it is not a JSON object)")),
        ("preprocess", '{"resize": 32}', _unreadable("preprocess", "what hookcli writes (it lacks resize or crop)")),
        ("categories", _DEEP_LIST, _unreadable("categories", "a list of class names")),
        ("categories", "[1, 2]", _unreadable("categories", "a list of class names")),
        ("weights", "[1]", _unreadable("weights", "a JSON object")),
        ("weights", _DEEP_OBJECT, _unreadable("weights", "a JSON object")),
        ("fused", "lots", _unreadable("fused", "a count of convolutions")),
        ("fused", "-1", _unreadable("fused", "a count of convolutions")),
        ("prefix_tokens", "9" * 50, _unreadable("prefix_tokens", "a count of tokens")),
    ],
    ids=[
        "inputs not JSON",
        "inputs numbers",
        "inputs deep",
        "inputs an object",
        "layers a list",
        "layers deep",
        "layer a list",
        "key a list",
        "keys a name",
        "calls a word",
        "calls negative",
        "type a list",
        "units negative",
        "units a word",
        "preprocess a list",
        "preprocess without crop",
        "categories deep",
        "categories numbers",
        "weights a list",
        "weights deep",
        "fused a word",
        "fused negative",
        "prefix tokens huge",
    ],
)
@pytest.mark.parametrize("command", ["stats", "compare"])
def test_metadata_no_run_writes_is_refused_naming_the_entry(
    runner, one_error, tmp_path, monkeypatch, command, entry, value, message
):
    monkeypatch.chdir(tmp_path)
    save_file(_tensors(), "crafted.safetensors", metadata={**_METADATA, entry: value})
    assert one_error(runner.invoke(main, [command, "crafted.safetensors", "-o", "out.safetensors"])) == message
    assert sorted(p.name for p in tmp_path.iterdir()) == ["crafted.safetensors"]  # nothing written, no parts


def test_the_same_features_with_metadata_as_written_are_taken(runner, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    save_file(_tensors(), "crafted.safetensors", metadata=_METADATA)
    done = runner.invoke(main, ["stats", "crafted.safetensors", "-o", "out.safetensors", "--top", "2"])
    assert done.exit_code == 0, done.output
    with open_features("out.safetensors") as found:
        assert json.loads(found.metadata["inputs"]) == [f"/photos/{n}.jpg" for n in range(4)]
        layer = json.loads(found.metadata["layers"])["layer2"]
        assert (layer["key"], layer["type"], layer["calls"], found.read("layer1@count").item()) == (
            "layer2",
            "Sequential",
            1,
            16,
        )


@pytest.mark.parametrize(
    ("tensors", "args", "message", "code"),
    [
        (
            {"layer1": np.zeros((0, 3), "float32"), "layer2": np.zeros((0, 5), "float32")},
            [],
            "Error: 'crafted.safetensors' holds no rows: its tensors have no input. Hint: extract some first",
            1,
        ),
        (
            {"layer1": np.zeros((4, 3), "float32"), "layer2": np.zeros((3, 5), "float32")},
            [],
            "Error: 'layer1' has 4 rows and 'layer2' 3 in 'crafted.safetensors': a run's tensors have one row an "
            "input. Hint: choose tensors of one run with -k",
            1,
        ),
        (
            {"layer1": np.array(1.0, "float32"), "layer2": np.zeros((4, 5), "float32")},
            ["-k", "layer1"],
            "Error: 'layer1' is one number, with no rows: statistics need every row of a tensor in one shape. "
            "Hint: choose other keys with -k ('hookcli info' lists them)",
            1,
        ),
    ],
    ids=["no rows", "rows that differ", "one number"],
)
def test_tensors_no_run_saves_are_refused(runner, one_error, tmp_path, monkeypatch, tensors, args, message, code):
    monkeypatch.chdir(tmp_path)
    save_file(tensors, "crafted.safetensors", metadata={**_METADATA, "inputs": "[]"})
    refused = runner.invoke(main, ["stats", "crafted.safetensors", *args, "-o", "out.safetensors"])
    assert one_error(refused, code) == message


def test_a_tensor_of_one_number_is_left_out_with_a_note(runner, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    tensors = {"layer1": np.array(1.0, "float32"), "layer2": _tensors()["layer2"]}
    save_file(tensors, "crafted.safetensors", metadata=_METADATA)
    done = runner.invoke(main, ["compare", "crafted.safetensors", "-o", "out.safetensors"])
    assert done.exit_code == 0, done.output
    assert done.stderr.splitlines()[0] == (
        "Note: left out layer1: only tensors of rows of one shape have channels in common"
    )


def test_statistics_and_comparison_files_are_not_taken_for_features(runner, one_error, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    save_file(_tensors(), "crafted.safetensors", metadata=_METADATA)
    assert runner.invoke(main, ["stats", "crafted.safetensors", "-o", "s.safetensors"]).exit_code == 0
    assert runner.invoke(main, ["compare", "crafted.safetensors", "-o", "c.safetensors"]).exit_code == 0
    for command in ("stats", "compare"):
        for given, what in (("s.safetensors", "a statistics file"), ("c.safetensors", "a comparison file")):
            refused = runner.invoke(main, [command, given, "-o", "again.safetensors"])
            assert one_error(refused, 1) == (
                f"Error: '{given}' is {what}, not saved features. Hint: give what hookcli extract saves; grid, report "
                "and info read this file"
            )


def test_a_comparison_matrix_no_method_gives_is_refused_by_every_reader(runner, one_error, tmp_path, monkeypatch):
    from safetensors import safe_open
    from safetensors.numpy import load_file

    monkeypatch.chdir(tmp_path)
    save_file(_tensors(), "crafted.safetensors", metadata=_METADATA)
    assert runner.invoke(main, ["compare", "crafted.safetensors", "-o", "c.safetensors"]).exit_code == 0
    tensors = load_file("c.safetensors")
    with safe_open("c.safetensors", "np") as opened:
        metadata = opened.metadata()
    tensors["linear-cka"][0, 1], tensors["linear-cka"][1, 0] = np.inf, -1e308
    save_file(tensors, "inf.safetensors", metadata=metadata)
    message = (
        "Error: 'inf.safetensors' is a damaged comparison file: 'linear-cka' holds inf at row 'layer1', column "
        "'layer2' (2 such), and its similarities are between -1 and 1. Hint: write it again with hookcli compare"
    )
    for args in (
        ["grid", "inf.safetensors", "-o", "grid/"],
        ["report", "inf.safetensors"],
        ["info", "inf.safetensors"],
    ):
        assert one_error(runner.invoke(main, args)) == message
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.safetensors", "crafted.safetensors", "inf.safetensors"]


def _stats_part():
    gathering = StatsGathering(StatsChoice(top=2, quantiles=(0.5,), pca=True))
    shard = gathering.start(0)
    shard.update({"x": torch.arange(24.0).reshape(3, 2, 2, 2)}, torch.tensor([0, 1, 2]))
    return gathering, shard.state(), shard.describe()


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("x@moments.count", None, "its state has no 'count'"),
        ("x@moments.mean", torch.tensor(3.0), "its state's 'mean' is float32 [], not 1-dimensional"),
        ("x@sketch.info", torch.tensor(3), "its state's 'info' is int64 [], not 1-dimensional with 4 values"),
        ("x@sketch.level0", None, "its state has no 'level0'"),
        ("x@examples.info", torch.tensor([2, 1000]), "its examples are ranked by score 1000, and there are 2"),
        (
            "x@examples.maps",
            torch.zeros(2, 2, dtype=torch.bool),
            "its state's 'maps' is bool [2, 2], not 3-dimensional",
        ),
        ("x@covariance.comoment", torch.zeros(2), "its state's 'comoment' is float32 [2], not 2-dimensional"),
    ],
)
def test_a_statistics_part_of_the_wrong_kinds_is_refused_naming_the_tensor(name, value, message):
    gathering, state, described = _stats_part()
    if value is None:
        del state[name]
    else:
        state[name] = value
    with pytest.raises(ValueError) as refused:
        gathering.read(state, described, [0, 1, 2])
    assert str(refused.value) == message


@pytest.mark.parametrize(
    ("method", "name", "value", "message"),
    [
        (
            "linear-cka",
            "linear-cka/widths",
            torch.tensor(3),
            "its state's 'widths' is int64 [], not 1-dimensional with 2 values",
        ),
        ("linear-cka", "linear-cka/count", None, "its state has no 'count'"),
        (
            "minibatch-cka",
            "minibatch-cka/cross",
            torch.zeros(2),
            "its state's 'cross' is float32 [2], not 2-dimensional",
        ),
        ("rsa", "rsa/1", None, "its state has no '1'"),
    ],
)
def test_a_comparison_part_of_the_wrong_kinds_is_refused_naming_the_tensor(method, name, value, message):
    gathering = CompareGathering(CompareChoice(method=method), first=["a", "b"], labels=(["a", "b"], ["a", "b"]))
    shard = gathering.start(0)
    generator = torch.Generator().manual_seed(0)
    shard.update(
        {"a": torch.randn(5, 3, generator=generator), "b": torch.randn(5, 4, generator=generator)}, torch.arange(5)
    )
    state = shard.state()
    if value is None:
        del state[name]
    else:
        state[name] = value
    with pytest.raises(ValueError) as refused:
        gathering.read(state, {}, range(5))
    assert str(refused.value) == message


def test_json_deeper_than_the_bound_is_refused_as_a_value():
    assert bounded_json('[["a"], {"b": [1]}]') == [["a"], {"b": [1]}]
    for text in (_DEEP_OBJECT, "[" * 9 + "]" * 9):
        with pytest.raises(ValueError, match="it nests deeper than 8 levels"):
            bounded_json(text)
    assert bounded_json("[" * 8 + "]" * 8) == [[[[[[[[]]]]]]]]
    with pytest.raises(ValueError, match="it is not JSON"):
        bounded_json("[" * 100_000)


def test_inputs_that_do_not_name_each_row_are_said_and_the_rows_numbered(runner, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    save_file(_tensors(), "crafted.safetensors", metadata={**_METADATA, "inputs": '["/photos/only.jpg"]'})
    done = runner.invoke(main, ["stats", "crafted.safetensors", "-o", "out.safetensors", "--top", "1"])
    assert done.exit_code == 0, done.output
    assert done.stderr == "Note: 'crafted.safetensors' lists 1 inputs for its 4 rows: its rows are named by number\n"
    with open_features("out.safetensors") as found:
        assert json.loads(found.metadata["inputs"]) == ["row 0", "row 1", "row 2", "row 3"]


@pytest.mark.parametrize(("value", "off"), [("", False), ("0", False), ("false", False), ("Off", False), ("1", True)])
def test_downloads_are_off_for_any_value_but_the_words_for_no(monkeypatch, value, off):
    from hookcli.models.weights import downloads_off

    monkeypatch.setenv("HOOKCLI_OFFLINE", value)
    assert downloads_off() is off


def _cka_state(widths=(3, 4), seed=0, rows=5):
    gathering = CompareGathering(CompareChoice(), first=["a", "b"], labels=(["a", "b"], ["a", "b"]))
    shard = gathering.start(0)
    generator = torch.Generator().manual_seed(seed)
    shard.update({k: torch.randn(rows, w, generator=generator) for k, w in zip("ab", widths)}, torch.arange(rows))
    return gathering, shard.state()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"linear-cka/count": torch.tensor(2**60)}, "its linear-cka sums count 1152921504606846976 inputs, not its 5"),
        ({"linear-cka/count": torch.tensor(-5)}, "its linear-cka sums count -5 inputs, not its 5"),
        (
            {"linear-cka/widths": torch.tensor([7])},
            "its state's 'widths' is int64 [1], not 1-dimensional with 2 values",
        ),
        ({"linear-cka/widths": torch.tensor([0, 7])}, "its widths [0, 7] are not those of 2 representations"),
        (
            {"linear-cka/comoment": -torch.eye(7, dtype=torch.float64)},
            "its co-moments give a column a negative variance",
        ),
    ],
)
def test_an_impossible_comparison_part_is_refused_before_it_is_merged(change, message):
    gathering, state = _cka_state()
    state.update(change)
    with pytest.raises(ValueError) as refused:
        gathering.read(state, {}, range(5))
    assert str(refused.value) == message


def test_parts_whose_widths_differ_are_not_merged():
    gathering, state = _cka_state()
    first = gathering.read(state, {}, range(5))
    _, reversed_state = _cka_state(widths=(4, 3), seed=1)
    second = gathering.read(reversed_state, {}, range(5))
    with pytest.raises(ValueError) as refused:
        first.merge(second)
    assert str(refused.value) == "its representations' widths [4, 3] are not the other parts' [3, 4]"


def test_a_file_of_a_format_no_hookcli_wrote_is_refused_by_every_reader(runner, one_error, tmp_path):
    from hookcli.storage import ablation_format, compare_format, fileformat, patch_format, stats_format

    versions = [fileformat.FORMAT_VERSION, fileformat.RAGGED_FORMAT_VERSION, fileformat.FLAT_FORMAT_VERSION]
    versions += [stats_format.STATS_FORMAT_VERSION, compare_format.COMPARE_FORMAT_VERSION]
    versions += [ablation_format.ABLATION_FORMAT_VERSION, patch_format.PATCH_FORMAT_VERSION]
    assert versions == [str(n) for n in range(1, fileformat.NEWEST_FORMAT + 1)]
    path = tmp_path / "later.safetensors"
    save_file({"x": np.ones((2, 3), dtype=np.float32)}, str(path), metadata={"format": "8", "kind": "probe"})
    for command in (["info", str(path)], ["grid", str(path), "-o", str(tmp_path / "g")], ["report", str(path)]):
        assert one_error(runner.invoke(main, command)) == (
            f"Error: '{path}' is of format \"8\", and this hookcli reads formats 1 to 7. Hint: read it with the "
            "hookcli that wrote it, or make it again"
        )
    for other in ({"format": "1"}, {"format": "pt"}, {}):  # ours, or other tools' (safetensors' own "pt"): rows
        save_file({"x": np.ones((2, 3), dtype=np.float32)}, str(path), metadata=other)
        assert runner.invoke(main, ["info", str(path)]).exit_code == 0, other


def test_a_shard_of_a_later_format_makes_its_folder_refused(runner, one_error, shard_run, five_inputs, tmp_path):
    from safetensors.numpy import load_file

    folder = tmp_path / "sharded"
    assert runner.invoke(main, [*shard_run, "-o", f"{folder}/", *five_inputs]).exit_code == 0
    shard = folder / "features-00001.safetensors"
    with safe_open(str(shard), "np") as read:
        metadata = read.metadata()
    save_file(load_file(str(shard)), str(shard), metadata={**metadata, "format": "99"})
    for command in (["info", str(folder)], ["grid", str(folder), "-o", str(tmp_path / "g")]):
        assert one_error(runner.invoke(main, command)) == (
            f"Error: '{shard}' is of format \"99\", and this hookcli reads formats 1 to 7. Hint: read it with the "
            "hookcli that wrote it, or make it again"
        )
    assert not (tmp_path / "g").exists()
