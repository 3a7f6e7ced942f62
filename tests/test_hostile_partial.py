"""Statistics and comparisons of shard folders that are not whole, or hold a shard of another run: refused, or
taken as they are only when asked (--incomplete), the file then saying what it covers."""

import json
import shutil

from safetensors import safe_open

from hookcli.cli import main


def _stats_of(runner, source, out, *extra):
    return runner.invoke(main, ["stats", str(source), "-o", str(out), "-q", *extra])


def test_a_folder_missing_its_last_shard_is_refused_unless_asked_and_then_recorded(
    runner, one_error, extract_into, tmp_path, five_inputs
):
    folder = tmp_path / "feats"
    assert extract_into(folder, five_inputs).exit_code == 0
    (folder / "features-00002.safetensors").unlink()
    out = tmp_path / "s.safetensors"
    for command in (["stats"], ["compare"]):
        error = one_error(runner.invoke(main, [*command, str(folder), "-o", str(out), "-q"]))
        assert error == (
            f"Error: '{folder}' holds 4 of its 5 inputs: what is gathered of it would leave the rest out. Hint: run "
            "the same extract command again to complete it, or add --incomplete to take what it holds"
        )
        assert not out.exists()
    done = _stats_of(runner, folder, out, "--incomplete")
    assert done.exit_code == 0, done.output
    assert done.stderr == f"Note: '{folder}' holds 4 of its 5 inputs: taking those (--incomplete)\n"
    with safe_open(out, "np") as opened:
        metadata = opened.metadata()
    assert json.loads(metadata["inputs"]) == five_inputs[:4]
    assert json.loads(metadata["stats_of"])["incomplete"] == {"inputs": 4, "of": 5}


def test_a_folder_missing_a_shard_in_the_middle_is_refused(runner, one_error, extract_into, tmp_path, five_inputs):
    folder = tmp_path / "feats"
    assert extract_into(folder, five_inputs).exit_code == 0
    (folder / "features-00001.safetensors").unlink()
    error = one_error(_stats_of(runner, folder, tmp_path / "s.safetensors"))
    assert error.startswith(
        f"Error: '{folder}' holds 2 of its 5 inputs (shard 1 is missing, so the one listed after it is left out): "
    )


def test_a_model_run_takes_no_incomplete(runner, one_error, resnet18_args, tmp_path, five_inputs):
    error = one_error(runner.invoke(main, resnet18_args("stats", "-l", "fc", "--incomplete", *five_inputs)))
    assert error == (
        "Error: --incomplete takes saved features from a shard folder, and a model runs here. Hint: see "
        "'hookcli stats --help'"
    )


def test_a_shard_of_another_run_is_refused_by_its_identity(runner, one_error, extract_into, tmp_path, five_inputs):
    folder, other = tmp_path / "feats", tmp_path / "seed1"
    assert extract_into(folder, five_inputs).exit_code == 0
    assert extract_into(other, five_inputs, "--seed", "1").exit_code == 0
    shutil.copy(other / "features-00001.safetensors", folder / "features-00001.safetensors")
    error = one_error(_stats_of(runner, folder, tmp_path / "s.safetensors"))
    assert error == (
        f"Error: shard '{folder}/features-00001.safetensors' does not match its index line: it was made by another "
        "run than the index's (it differs in: weights). Hint: run the same extract command again to write it again"
    )
    again = extract_into(folder, five_inputs)  # the run itself computes that shard again
    assert again.exit_code == 0 and "Continuing: 3 of 5 inputs" in again.stderr
    assert _stats_of(runner, folder, tmp_path / "s.safetensors").exit_code == 0


def test_a_single_part_of_a_gathering_run_is_refused_as_its_folder_is(runner, one_error, tmp_path):
    import torch
    from safetensors.torch import save_file

    part = tmp_path / "features-00000.safetensors"
    tensors = {"@rows": torch.arange(4), "x@moments.mean": torch.zeros(8, dtype=torch.float64)}
    save_file(tensors, str(part), metadata={"kind": "stats-part", "inputs": json.dumps(["a", "b", "c", "d"])})
    commands = [
        ["info"],
        ["grid", "-o", str(tmp_path / "g")],
        ["report", "-o", str(tmp_path / "r")],
        ["stats", "-o", str(tmp_path / "s.safetensors")],
        ["compare", "-o", str(tmp_path / "c.safetensors")],
    ]
    for command in commands:
        error = one_error(runner.invoke(main, [command[0], str(part), *command[1:]]))
        assert error == (
            f"Error: '{part}' is a part of a stats or compare run, which merge into one file when it completes. "
            "Hint: run the same command again to complete it, and read the file it writes"
        ), command
    assert sorted(path.name for path in tmp_path.iterdir()) == ["features-00000.safetensors"]


def test_a_key_with_glob_characters_is_taken_literally_when_it_exists(runner, tmp_path):
    import torch
    from safetensors.torch import save_file

    source = tmp_path / "glob.safetensors"
    tensors = {"a[1]": torch.zeros(2, 3), "a1": torch.ones(2, 3), "b[": torch.ones(2, 3)}
    save_file(tensors, str(source), metadata={"inputs": json.dumps(["x.png", "y.png"])})
    drawn = runner.invoke(main, ["grid", str(source), "-k", "a[1]", "-o", str(tmp_path / "g")])
    assert drawn.exit_code == 0, drawn.output
    assert [line.rsplit("/", 1)[1] for line in drawn.stdout.splitlines()] == ["a_1___00000_x.png", "a_1___00001_y.png"]
    both = runner.invoke(main, ["grid", str(source), "-k", "a[[1]", "-o", str(tmp_path / "h")])  # "[" or "1": a1 only
    assert both.exit_code == 0 and both.stderr == "", both.output
    assert [line.rsplit("/", 1)[1] for line in both.stdout.splitlines()] == ["a1__00000_x.png", "a1__00001_y.png"]
