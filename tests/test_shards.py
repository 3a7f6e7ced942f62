"""Folder output: shards and index, resume after a crash, skipping unreadable images, pooling and dtypes."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from hookcli.cli import main
from hookcli.storage.index import read_index
from hookcli.storage.shards import INDEX_NAME, ShardedFeatures

ARGS = [
    "extract",
    "-m",
    "resnet18",
    "-w",
    "none",
    "-l",
    "layer2",
    "-l",
    "fc",
    "--resize",
    "32",
    "--crop",
    "32",
    "-b",
    "2",
    "-q",
]


@pytest.fixture
def many(tmp_path, make_image):
    folder = tmp_path / "many"
    folder.mkdir()
    return [make_image(folder / f"{i:02d}.png", size=(40, 36), seed=i) for i in range(7)]


def _single_file(runner, tmp_path, paths, *extra):
    out = tmp_path / "single.safetensors"
    result = runner.invoke(main, [*ARGS, *extra, "-o", str(out), *map(str, paths)])
    assert result.exit_code == 0, result.output
    with safe_open(str(out), "pt") as handle:
        return {k: handle.get_tensor(k) for k in handle.keys()}, json.loads(handle.metadata()["inputs"])


def test_shards_and_index_round_trip(runner, tmp_path, many):
    folder = tmp_path / "feats"
    # Batches of 3: a batch never spans two shards, so the rows are the same bits as one file's.
    result = runner.invoke(main, [*ARGS, "-b", "3", "--shard-size", "3", "-o", f"{folder}/", *map(str, many)])
    assert result.exit_code == 0, result.output
    assert result.stdout == f"{folder / INDEX_NAME}\n"
    assert sorted(p.name for p in folder.iterdir()) == [
        "features-00000.safetensors",
        "features-00001.safetensors",
        "features-00002.safetensors",
        INDEX_NAME,
    ]
    header, shards = read_index(folder)
    assert (header["shard_size"], header["inputs"]) == (3, 7)
    assert header["metadata"]["model"] == "resnet18" and "inputs" not in header["metadata"]
    assert [(s["shard"], s["first"], s["count"], len(s["inputs"])) for s in shards] == [
        (0, 0, 3, 3),
        (1, 3, 3, 3),
        (2, 6, 1, 1),
    ]
    assert [p for s in shards for p in s["inputs"]] == [str(p) for p in many]
    with safe_open(str(folder / "features-00001.safetensors"), "pt") as handle:  # each shard is a whole file
        metadata = handle.metadata()
        assert json.loads(metadata["inputs"]) == [str(p) for p in many[3:6]]
        assert metadata["shard"] == "1" and metadata["format"] == "1"
        assert handle.get_tensor("layer2").shape == (3, 128, 4, 4)

    expected, inputs = _single_file(runner, tmp_path, many, "-b", "3")
    for source in (folder, folder / INDEX_NAME):
        with ShardedFeatures(source) as features:
            assert features.keys() == ["layer2", "fc"]
            assert features.shape("layer2") == [7, 128, 4, 4]
            for row in range(7):
                assert torch.equal(torch.from_numpy(features.read("layer2", row).copy()), expected["layer2"][row])
            assert json.loads(features.metadata["inputs"]) == inputs


def test_grid_and_info_read_a_folder(runner, tmp_path, many):
    folder = tmp_path / "feats"
    assert runner.invoke(main, [*ARGS, "--shard-size", "2", "-o", f"{folder}/", *map(str, many)]).exit_code == 0
    result = runner.invoke(main, ["info", str(folder), "--json"])
    assert result.exit_code == 0, result.output
    described = json.loads(result.stdout)
    assert [(t["key"], t["shape"]) for t in described["tensors"]] == [("layer2", [7, 128, 4, 4]), ("fc", [7, 1000])]
    assert described["metadata"]["shards"] == {"count": 4, "inputs_done": 7, "inputs": 7, "complete": True}
    result = runner.invoke(
        main, ["grid", str(folder / INDEX_NAME), "-k", "layer2", "-i", "4", "-i", "06.png", "-o", str(tmp_path / "g")]
    )
    assert result.exit_code == 0, result.output
    assert [Path(p).name for p in result.stdout.split()] == ["layer2__00004_04.png", "layer2__00006_06.png"]


class _Crash(Exception):
    pass


def test_resume_after_an_interruption_computes_nothing_twice(runner, tmp_path, many, monkeypatch):
    import hookcli.run.capture

    folder = tmp_path / "feats"
    args = [*ARGS, "--shard-size", "2", "-o", f"{folder}/", *map(str, many)]
    real = hookcli.run.capture.FeatureCapture.run
    seen = []

    def crash_on_fourth_batch(self, batch):
        seen.append(len(batch))
        if len(seen) == 4:
            raise KeyboardInterrupt
        return real(self, batch)

    monkeypatch.setattr(hookcli.run.capture.FeatureCapture, "run", crash_on_fourth_batch)
    result = runner.invoke(main, args)
    assert result.exit_code == 130 and result.stderr.strip() == "Aborted."
    assert [s["shard"] for s in read_index(folder)[1]] == [0, 1, 2]  # batches 1-3 = inputs 0-5, all written

    seen.clear()
    monkeypatch.setattr(hookcli.run.capture.FeatureCapture, "run", real)
    counted = []
    monkeypatch.setattr(
        hookcli.run.capture.FeatureCapture,
        "run",
        lambda self, batch: (counted.append(len(batch)), real(self, batch))[1],
    )
    result = runner.invoke(main, args)
    assert result.exit_code == 0, result.output
    assert result.stderr == f"Continuing: 6 of 7 inputs are already in {folder}/\n"
    assert counted == [1]  # only the last input was computed again
    expected, _ = _single_file(runner, tmp_path, many)
    with ShardedFeatures(folder) as features:
        assert json.loads(features.metadata["inputs"]) == [str(p) for p in many]
        for row in range(7):
            assert torch.equal(torch.from_numpy(features.read("fc", row).copy()), expected["fc"][row])

    before = len(counted)
    result = runner.invoke(main, args)  # a third time: all done, nothing to compute
    assert result.exit_code == 0 and len(counted) == before
    assert result.stderr == f"Continuing: 7 of 7 inputs are already in {folder}/\n"


def test_resume_after_kill_9_in_a_subprocess(tmp_path, make_image):
    folder = tmp_path / "imgs"
    folder.mkdir()
    paths = [make_image(folder / f"{i:03d}.png", size=(64, 64), seed=i) for i in range(40)]
    out = tmp_path / "feats"
    common = [
        sys.executable,
        "-m",
        "hookcli",
        "extract",
        "-m",
        "vgg11",
        "-w",
        "none",
        "-l",
        "features.15",
        "--resize",
        "64",
        "--crop",
        "64",
        "-b",
        "1",
        "-j",
        "0",
        "-q",
        str(folder),
    ]
    command = [*common, "--shard-size", "4", "-o", f"{out}/"]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    index = out / INDEX_NAME
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not (index.exists() and index.read_text().count("\n") >= 3):
        time.sleep(0.01)
    process.send_signal(signal.SIGKILL)
    process.wait()
    _, before = read_index(out)
    assert 2 <= len(before) < 10, "the run was not interrupted part-way"
    assert subprocess.run(command, capture_output=True).returncode == 0
    _, after = read_index(out)
    assert [s["shard"] for s in after] == list(range(10))
    assert after[: len(before)] == before  # finished shards were kept, not rewritten
    assert [p for s in after for p in s["inputs"]] == [str(p) for p in paths]
    assert not [p for p in out.iterdir() if p.name.startswith(".")]  # no temporary files left
    clean = tmp_path / "clean.safetensors"
    subprocess.run([*common, "-o", str(clean)], check=True, capture_output=True)
    with safe_open(str(clean), "pt") as handle, ShardedFeatures(out) as features:
        whole = handle.get_tensor("features.15")
        for row in range(40):
            assert torch.equal(torch.from_numpy(features.read("features.15", row).copy()), whole[row])


def test_a_different_run_in_the_same_folder_is_refused_unless_forced(runner, tmp_path, many):
    folder = tmp_path / "feats"
    assert runner.invoke(main, [*ARGS, "-o", f"{folder}/", *map(str, many)]).exit_code == 0
    result = runner.invoke(main, [*ARGS, "--pool", "avg", "-o", f"{folder}/", *map(str, many[:3])])
    assert result.exit_code == 2
    assert result.stderr == (
        f"Error: '{folder}/' holds a different run (it differs in: inputs (the folder's 7, this command's 3), "
        "inputs_sha256, pool (the folder's none, this command's avg)). Hint: run the same command to continue it, "
        "add --force to replace it, or use another folder\n"
    )
    result = runner.invoke(main, [*ARGS, "--pool", "avg", "--force", "-o", f"{folder}/", *map(str, many[:3])])
    assert result.exit_code == 0, result.output
    with ShardedFeatures(folder) as features:
        assert features.shape("layer2") == [3, 128]


#: The header of an index of 4 inputs in shards of 2, its identity saying the same.
_HEADER = {"hookcli_index": 1, "identity": {"inputs": 4, "shard_size": 2}, "shard_size": 2, "inputs": 4, "metadata": {}}


def test_torn_last_index_line_is_ignored(tmp_path):
    header = dict(_HEADER)
    (tmp_path / INDEX_NAME).write_text(json.dumps(header) + '\n{"shard": 0, "fi')
    assert read_index(tmp_path) == (header, [])


def test_an_index_cut_shorter_while_it_is_read_is_read_to_where_it_ends(tmp_path, monkeypatch):
    header = dict(_HEADER)
    index = tmp_path / INDEX_NAME
    index.write_text(json.dumps(header) + "\n")
    real, ours = os.fstat, os.lstat(index).st_ino

    def longer_when_looked_at(descriptor):  # the size taken before a writer cut a torn last line off
        found = real(descriptor)
        return os.stat_result((*found[:6], found.st_size + 100, *found[7:10])) if found.st_ino == ours else found

    monkeypatch.setattr(os, "fstat", longer_when_looked_at)
    assert read_index(tmp_path) == (header, [])


def _broken(tmp_path, paths):
    broken = paths[0].parent / "02b.jpg"
    broken.write_text("not an image")
    return sorted([*paths, broken])


def test_skip_mode_lists_unreadable_images_and_extracts_the_rest(runner, tmp_path, many):
    inputs = _broken(tmp_path, many)
    folder = tmp_path / "feats"
    result = runner.invoke(
        main, [*ARGS, "--on-error", "skip", "--shard-size", "3", "-o", f"{folder}/", *map(str, inputs)]
    )
    assert result.exit_code == 0, result.output
    broken = inputs[3]
    assert result.stderr == (
        f"Skipped: '{broken}' is not an image Pillow can read. Hint: check the file type; text "
        "or corrupt files cannot be used\n"
    )
    _, shards = read_index(folder)
    assert shards[1]["skipped"] == [{"input": str(broken), "error": result.stderr[len("Skipped: ") : -1]}]
    assert [p for s in shards for p in s["inputs"]] == [str(p) for p in many]
    with ShardedFeatures(folder) as features:
        assert features.shape("fc") == [7, 1000]

    out = tmp_path / "one.safetensors"
    result = runner.invoke(main, [*ARGS, "--on-error", "skip", "-o", str(out), *map(str, inputs)])
    assert result.exit_code == 0, result.output
    with safe_open(str(out), "pt") as handle:
        assert handle.get_tensor("fc").shape == (7, 1000)
        assert json.loads(handle.metadata()["skipped"])[0]["input"] == str(broken)
    result = runner.invoke(main, [*ARGS, "-o", str(tmp_path / "fail.safetensors"), *map(str, inputs)])
    assert result.exit_code == 1 and not (tmp_path / "fail.safetensors").exists()


def test_pool_and_dtype(runner, tmp_path, many):
    full, _ = _single_file(runner, tmp_path, many[:2])
    os.remove(tmp_path / "single.safetensors")
    pooled, _ = _single_file(runner, tmp_path, many[:2], "--pool", "avg", "--dtype", "bfloat16")
    assert pooled["layer2"].shape == (2, 128) and pooled["layer2"].dtype == torch.bfloat16
    assert torch.equal(pooled["layer2"], full["layer2"].mean(dim=(2, 3)).bfloat16())
    assert pooled["fc"].shape == (2, 1000)  # already flat: stored as is
    os.remove(tmp_path / "single.safetensors")
    maxed, _ = _single_file(runner, tmp_path, many[:2], "--pool", "max", "--dtype", "float16")
    assert torch.equal(maxed["layer2"], full["layer2"].amax(dim=(2, 3)).half())


def test_worker_processes_give_the_same_rows(runner, tmp_path, many):
    serial, _ = _single_file(runner, tmp_path, many, "-j", "0")
    os.remove(tmp_path / "single.safetensors")
    parallel, inputs = _single_file(runner, tmp_path, many, "-j", "2")
    assert inputs == [str(p) for p in many]
    for key in serial:  # the model gets one thread fewer next to a worker: other rounding, same values
        torch.testing.assert_close(serial[key], parallel[key], rtol=1e-5, atol=1e-5)


def test_a_single_file_too_big_for_memory_is_refused_before_allocating(runner, tmp_path, many, monkeypatch):
    real = os.sysconf
    page = real("SC_PAGE_SIZE")
    monkeypatch.setattr(os, "sysconf", lambda name: 2**16 // page if name == "SC_PHYS_PAGES" else real(name))
    out = tmp_path / "big.safetensors"
    result = runner.invoke(main, [*ARGS, "-o", str(out), *map(str, many)])
    assert result.exit_code == 1
    assert result.stderr == (
        "Error: 7 images x 11.9 KiB of features = 83.3 KiB, more than half of this machine's 64.0 KiB, and one "
        "output file is built in memory. Hint: write shards with -o DIR/ (memory stays flat), or use --pool / "
        "--dtype to store less\n"
    )
    assert not out.exists()
    assert runner.invoke(main, [*ARGS, "-o", f"{tmp_path / 'shards'}/", *map(str, many)]).exit_code == 0


def test_only_the_missing_shard_is_computed_again_and_its_line_goes_back_in_order(runner, tmp_path, many):
    folder = tmp_path / "feats"
    args = [*ARGS, "--shard-size", "2", "-o", f"{folder}/", *map(str, many)]
    assert runner.invoke(main, args).exit_code == 0
    before = read_index(folder)[1]
    kept = {n: (folder / f"features-0000{n}.safetensors").stat().st_mtime_ns for n in (0, 2, 3)}
    (folder / "features-00001.safetensors").unlink()  # shards 2 and 3 are still listed after the gap
    with ShardedFeatures(folder) as features:
        assert features.shape("fc")[0] == 2  # only shard 0 reads as rows
    result = runner.invoke(main, args)
    assert result.exit_code == 0, result.output
    assert result.stderr == f"Continuing: 5 of 7 inputs are already in {folder}/\n"
    header, after = read_index(folder)
    assert [s["shard"] for s in after] == [0, 1, 2, 3]  # no line twice
    assert after == before
    lines = (folder / "index.jsonl").read_text().splitlines()
    assert [json.loads(line)["shard"] for line in lines[1:]] == [0, 1, 2, 3]  # in shard order on disk too
    assert {n: (folder / f"features-0000{n}.safetensors").stat().st_mtime_ns for n in (0, 2, 3)} == kept
    with ShardedFeatures(folder) as features:
        assert json.loads(features.metadata["inputs"]) == [str(p) for p in many]


def test_rows_read_in_ranges_across_shards(runner, tmp_path, many):
    expected, _ = _single_file(runner, tmp_path, many, "--dtype", "bfloat16")
    folder = tmp_path / "feats"
    result = runner.invoke(
        main, [*ARGS, "--dtype", "bfloat16", "--shard-size", "2", "-o", f"{folder}/", *map(str, many)]
    )
    assert result.exit_code == 0, result.output
    reference = expected["layer2"].float().numpy()
    with ShardedFeatures(folder) as features:
        assert len(features.shards) == 4
        for start, stop in [(0, 7), (1, 2), (1, 6), (3, 4), (5, 99), (-3, -1), (4, 4), (6, 2)]:
            rows = features.read_rows("layer2", start, stop)
            assert rows.dtype == "float32" and rows.shape == reference[start:stop].shape
            assert (rows == reference[start:stop]).all(), (start, stop)
        assert (features.read("layer2") == reference).all()


def test_a_run_stopped_by_an_unreadable_input_continues_with_on_error_skip_as_its_hint_says(runner, tmp_path, many):
    inputs = _broken(tmp_path, many)
    folder = tmp_path / "feats"
    command = [*ARGS, "--shard-size", "3", "-o", f"{folder}/", *map(str, inputs)]
    stopped = runner.invoke(main, command)
    assert stopped.exit_code == 1 and stopped.stderr.endswith("or add --on-error skip to leave unreadable images out\n")
    _, shards = read_index(folder)
    assert [s["shard"] for s in shards] == [0]  # the first shard, before the unreadable image, is kept
    continued = runner.invoke(main, [*command[: -len(inputs)], "--on-error", "skip", *map(str, inputs)])
    assert continued.exit_code == 0, continued.output
    assert continued.stderr.startswith("Continuing: 3 of 8 inputs are already in")
    _, shards = read_index(folder)
    assert [p for s in shards for p in s["inputs"]] == [str(p) for p in many]


def test_a_small_run_without_a_shard_size_still_has_several_shards_to_resume_from(runner, tmp_path, make_image):
    folder = tmp_path / "imgs"
    folder.mkdir()
    paths = [str(make_image(folder / f"{i:02d}.png", size=(36, 36), seed=i)) for i in range(33)]
    result = runner.invoke(main, [*ARGS[:-3], "-b", "4", "-q", "-o", f"{tmp_path}/feats/", *paths])
    assert result.exit_code == 0, result.output
    header, shards = read_index(tmp_path / "feats")
    assert header["shard_size"] == 8  # an eighth of 33 inputs, rounded up to whole batches of 4
    assert [s["count"] for s in shards] == [8, 8, 8, 8, 1]


def test_an_input_replaced_under_the_same_name_is_named_when_the_run_continues(runner, tmp_path, many, make_image):
    folder = tmp_path / "feats"
    command = [*ARGS, "--shard-size", "3", "-o", f"{folder}/", *map(str, many)]
    assert runner.invoke(main, command).exit_code == 0
    index = folder / INDEX_NAME
    index.write_text("".join(index.read_text().splitlines(keepends=True)[:-1]))  # the last shard is to do again
    make_image(many[1], size=(40, 36), seed=99)  # another picture under the name of a stored one
    os.utime(many[1], ns=(1, 1))
    result = runner.invoke(main, command)
    assert (result.exit_code, result.stderr) == (
        2,
        f"Error: input '{many[1]}' changed after shard 0 of '{folder}/' was computed from it (its size or "
        "modification time differ). Hint: put the original back to continue, or add --force to compute its shards "
        "again\n",
    )
    redone = runner.invoke(main, [*command, "--force"])
    assert redone.exit_code == 0 and redone.stderr.startswith("Continuing: 3 of 7 inputs are already in")
    _, shards = read_index(folder)
    assert [s["stamps"][str(many[1])] for s in shards if str(many[1]) in s["inputs"]] == [[many[1].stat().st_size, 1]]
