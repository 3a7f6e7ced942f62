"""Damaged shard folders: torn index lines, foreign and cut-short shards, a second writer, paths out of the folder."""

import fcntl
import json
import os
import subprocess
import sys

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

import hookcli.storage.index
from hookcli.cli import main
from hookcli.errors import FeatureFileError
from hookcli.storage.claims import LOCK_NAME
from hookcli.storage.fileformat import INDEX_NAME
from hookcli.storage.index import read_index
from hookcli.storage.shards import ShardedFeatures


def _rows(folder):
    with ShardedFeatures(folder) as features:
        return features.read("fc"), json.loads(features.metadata["inputs"])


@pytest.mark.parametrize(
    "tail", [b'{"shard": 2, "fi', b'{"shard": 2, "file": "features-00002.safetensors"}', b"\x00\x00\x00\x00\n"]
)
def test_a_torn_or_garbled_last_index_line_is_cut_off_before_the_next_run_appends(
    extract_into, tmp_path, five_inputs, tail
):
    folder = tmp_path / "feats"
    assert extract_into(folder, five_inputs).exit_code == 0
    expected, names = _rows(folder)
    index = folder / INDEX_NAME
    lines = index.read_bytes().splitlines(keepends=True)
    index.write_bytes(b"".join(lines[:3]) + tail)  # shards 0 and 1 listed, then a crash while appending shard 2
    (folder / "features-00002.safetensors").unlink()
    assert read_index(folder)[1][-1]["shard"] == 1  # readers leave the torn line out
    result = extract_into(folder, five_inputs)
    assert result.exit_code == 0, result.output
    assert index.read_bytes() == b"".join(lines)  # cut back, then shard 2 appended: as if nothing had happened
    rows, again = _rows(folder)
    assert again == names and torch.equal(torch.from_numpy(rows), torch.from_numpy(expected))
    assert extract_into(folder, five_inputs).exit_code == 0  # and the run after that finds nothing damaged


def test_a_whole_last_line_that_is_wrong_is_an_error_not_a_torn_line(
    runner, one_error, extract_into, tmp_path, five_inputs
):
    folder = tmp_path / "feats"
    assert extract_into(folder, five_inputs).exit_code == 0
    index = folder / INDEX_NAME
    line = json.loads(index.read_text().splitlines()[1])
    line.update(shard=50, file="features-00050.safetensors")
    index.write_text(index.read_text() + json.dumps(line) + "\n")  # what a crash cannot leave: JSON and its newline
    message = (
        f"Error: index '{index}' is damaged: line 5 is wrong: it describes shard 50, and the run has 3. Hint: "
        "run the same extraction again with --force to start over"
    )
    assert one_error(runner.invoke(main, ["info", str(folder)])) == message
    assert one_error(extract_into(folder, five_inputs)) == message


def _forced_run_starts_over(extract_into, tmp_path, folder, inputs):
    """``--force`` on a damaged folder: it ends as a fresh run's folder."""
    fresh = tmp_path / "fresh"
    assert extract_into(fresh, inputs).exit_code == 0
    result = extract_into(folder, inputs, "--force")
    assert result.exit_code == 0, result.output
    (rows, names), (expected, fresh_names) = _rows(folder), _rows(fresh)
    assert names == fresh_names and torch.equal(torch.from_numpy(rows), torch.from_numpy(expected))
    assert sorted(p.name for p in folder.iterdir()) == sorted(p.name for p in fresh.iterdir())


@pytest.mark.parametrize("content", ["", '{"rows": 3}\n'])
def test_an_index_that_is_no_hookcli_index_is_refused_and_replaced_with_force(
    runner, one_error, extract_into, tmp_path, five_inputs, content
):
    folder = tmp_path / "feats"
    folder.mkdir()
    index = folder / INDEX_NAME
    index.write_text(content)
    assert one_error(extract_into(folder, five_inputs)) == (
        f"Error: '{index}' is not a hookcli index. Hint: add --force to replace it, or use another folder"
    )
    assert one_error(runner.invoke(main, ["info", str(folder)])) == (
        f"Error: '{index}' is not a hookcli index. Hint: give a folder written by hookcli extract -o DIR/"
    )
    _forced_run_starts_over(extract_into, tmp_path, folder, five_inputs)


def test_a_run_that_fails_before_any_row_leaves_no_folder_it_made_and_keeps_one_it_found(
    one_error, extract_into, tmp_path, five_inputs
):
    (tmp_path / "text.png").write_text("not a picture\n")
    made, found = tmp_path / "deep" / "feats", tmp_path / "found"
    found.mkdir()
    for folder in (made, found):
        line = one_error(extract_into(folder, [str(tmp_path / "text.png")]), 1)
        assert line.startswith(f"Error: '{tmp_path / 'text.png'}' is not an image Pillow can read.")
    assert not made.exists() and (tmp_path / "deep").is_dir()  # the run's own folder goes, not the ones above it
    assert found.is_dir() and not list(found.iterdir())  # the user's folder stays, as empty as it was
    assert extract_into(made, five_inputs).exit_code == 0 and len(_rows(made)[1]) == 5


def test_a_damaged_line_before_the_last_is_an_error_naming_it(runner, one_error, extract_into, tmp_path, five_inputs):
    folder = tmp_path / "feats"
    assert extract_into(folder, five_inputs).exit_code == 0
    lines = (folder / INDEX_NAME).read_text().splitlines(keepends=True)
    (folder / INDEX_NAME).write_text(lines[0] + "garbage\n" + "".join(lines[2:]))
    message = (
        f"Error: index '{folder / INDEX_NAME}' is damaged: line 2 is not JSON. Hint: run the same extraction "
        "again with --force to start over"
    )
    assert one_error(runner.invoke(main, ["info", str(folder)])) == message
    assert one_error(extract_into(folder, five_inputs)) == message
    _forced_run_starts_over(extract_into, tmp_path, folder, five_inputs)  # as the hint says


@pytest.mark.parametrize("file", ["/etc/passwd", "../outside.safetensors", "features-00001.safetensors"])
def test_an_index_line_must_name_its_own_shard_file_inside_the_folder(
    runner, one_error, extract_into, tmp_path, five_inputs, file
):
    folder = tmp_path / "feats"
    assert extract_into(folder, five_inputs).exit_code == 0
    (tmp_path / "outside.safetensors").write_bytes((folder / "features-00000.safetensors").read_bytes())
    lines = (folder / INDEX_NAME).read_text().splitlines(keepends=True)
    first = json.loads(lines[1])
    first["file"] = file
    (folder / INDEX_NAME).write_text(lines[0] + json.dumps(first) + "\n" + "".join(lines[2:]))
    for command in (["info", str(folder)], ["grid", str(folder), "-o", str(tmp_path / "g")]):
        assert one_error(runner.invoke(main, command)) == (
            f"Error: index '{folder / INDEX_NAME}' is damaged: line 2 is wrong: it does not describe shard 0 "
            "(features-00000.safetensors). Hint: run the same extraction again with --force to start over"
        )


def test_shard_files_no_index_lists_are_kept_unless_forced(one_error, extract_into, tmp_path, five_inputs):
    folder = tmp_path / "feats"
    folder.mkdir()
    (folder / "features-00000.safetensors").write_bytes(b"someone else's shard")
    (folder / "features-00007.safetensors").write_bytes(b"and another")
    assert one_error(extract_into(folder, five_inputs)) == (
        f"Error: '{folder}/' holds features-00000.safetensors and 1 more but no index of a run. Hint: move those "
        "files away, choose another folder, or add --force to delete them"
    )
    assert (folder / "features-00000.safetensors").read_bytes() == b"someone else's shard"
    assert sorted(p.name for p in folder.iterdir()) == ["features-00000.safetensors", "features-00007.safetensors"]
    assert extract_into(folder, five_inputs, "--force").exit_code == 0
    assert sorted(p.name for p in folder.iterdir()) == [f"features-{i:05d}.safetensors" for i in range(3)] + [
        INDEX_NAME
    ]


@pytest.mark.parametrize("damage", ["truncate", "empty", "rows", "kind"])
def test_a_damaged_shard_is_redone_on_resume_and_reported_by_readers(
    runner, one_error, extract_into, tmp_path, five_inputs, damage
):
    folder = tmp_path / "feats"
    assert extract_into(folder, five_inputs).exit_code == 0
    expected, _ = _rows(folder)
    shard = folder / "features-00001.safetensors"
    data, before = shard.read_bytes(), _contents(shard)
    if damage == "truncate":
        shard.write_bytes(data[:-100])
        problem = f"is truncated: tensor 'fc' ends at byte {len(data)} but the file has {len(data) - 100}"
    elif damage == "empty":
        shard.write_bytes(b"")
        problem = "is empty"
    elif damage == "kind":  # its own rows, but saying it is a gathering run's part, whose rows go unchecked
        with safe_open(str(shard), "pt") as found:
            tensors, metadata = {key: found.get_tensor(key) for key in found.keys()}, found.metadata()
        save_file(tensors, str(shard), metadata={**metadata, "kind": "stats-part"})
        problem = "it is a part of a stats or compare run"
    else:  # a complete file, but with other rows than its index line lists
        shard.write_bytes((folder / "features-00002.safetensors").read_bytes())
        problem = "it is not shard 1 of the inputs its index line lists (its own metadata disagrees)"
    result = runner.invoke(main, ["info", str(folder)])
    if damage in ("rows", "kind"):
        assert one_error(result) == (
            f"Error: shard '{shard}' does not match its index line: {problem}. Hint: run the same extract command "
            "again to write it again"
        )
    else:
        assert one_error(result) == (
            f"Error: '{shard}' {problem}. Hint: "
            + ("it holds no safetensors data" if damage == "empty" else "the file was cut short; write it again")
        )
    result = extract_into(folder, five_inputs)
    assert result.exit_code == 0, result.output
    rows, _ = _rows(folder)
    assert torch.equal(torch.from_numpy(rows), torch.from_numpy(expected))
    assert _contents(shard) == before  # the same file again (safetensors orders metadata keys as it likes)


def test_names_are_read_from_the_index_opened_when_asked_for_and_a_line_changed_since_is_refused(
    extract_into, tmp_path, five_inputs
):
    inputs = five_inputs
    folder = tmp_path / "feats"
    assert extract_into(folder, inputs).exit_code == 0
    index = folder / INDEX_NAME
    text = index.read_text()
    with ShardedFeatures(folder) as features:
        other = tmp_path / "other.jsonl"
        other.write_text("not an index\n")
        os.replace(other, index)  # a writer replacing the index (the last shard's, in shard order) makes a new file
        assert (features.inputs, json.loads(features.metadata["inputs"])) == (inputs, inputs)
    index.write_text(text)
    with ShardedFeatures(folder) as features:
        with open(index, "r+b") as edited:  # the same file, another name in shard 1's line
            edited.write(text.replace("imgs/2.png", "imgs/9.png").encode())
        with pytest.raises(FeatureFileError) as raised:
            json.loads(features.metadata["inputs"])
        assert (raised.value.message, raised.value.hint) == (
            f"index '{index}' changed while it was read (the line of shard 1)",
            "open the folder again",
        )
        assert features.read("fc").shape == (5, 1000)


@pytest.mark.parametrize("meanwhile", [None, "drops the damaged line"])
def test_a_joining_writer_checks_the_shards_with_the_lock_let_go_and_still_finds_a_damaged_one(
    extract_into, tmp_path, five_inputs, monkeypatch, meanwhile
):
    inputs = five_inputs
    folder = tmp_path / "feats"
    assert extract_into(folder, inputs).exit_code == 0
    expected, _ = _rows(folder)
    index = folder / INDEX_NAME
    good = index.read_text().splitlines(keepends=True)
    shard = folder / "features-00001.safetensors"
    shard.write_bytes((folder / "features-00002.safetensors").read_bytes())  # whole, but not shard 1
    checked, real = [], hookcli.storage.index.check_shard

    def check_shard(shard, line, layout=None, parts=False, run=None):
        probe = os.open(folder / LOCK_NAME, os.O_RDWR | os.O_CREAT)
        try:
            fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)  # refused while the writer holds the lock
        finally:
            os.close(probe)
        checked.append(line.shard)
        if meanwhile and len(checked) == 1:  # another process, finding shard 1 damaged, rewrites the index first
            rewritten = tmp_path / "rewritten"
            rewritten.write_text("".join(line for line in good if '"shard": 1,' not in line))
            os.replace(rewritten, index)
        return real(shard, line, layout, parts=parts, run=run)

    monkeypatch.setattr(hookcli.storage.index, "check_shard", check_shard)
    result = extract_into(folder, inputs)
    assert result.exit_code == 0, result.output
    assert checked == [0, 1, 2]  # each shard once, also when the index changed meanwhile and was read again
    monkeypatch.undo()
    rows, names = _rows(folder)
    assert torch.equal(torch.from_numpy(rows), torch.from_numpy(expected)) and names == inputs
    assert index.read_text().splitlines(keepends=True) == good


def _contents(path):
    with safe_open(str(path), "np") as handle:
        return handle.metadata(), handle.get_tensor("fc").tobytes()


def test_a_writer_waits_while_another_process_holds_the_lock_and_says_so(shard_run, tmp_path, five_inputs):
    folder = tmp_path / "feats"
    folder.mkdir()
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            (
                "import fcntl, os, sys, time\n"
                f"fd = os.open({str(folder / LOCK_NAME)!r}, os.O_RDWR | os.O_CREAT)\n"
                "fcntl.flock(fd, fcntl.LOCK_EX)\n"
                "print('locked', flush=True)\n"
                "sys.stdin.read()\n"
            ),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline() == "locked\n"
        writer = subprocess.Popen(
            [sys.executable, "-m", "hookcli", *shard_run, "-o", f"{folder}/", *five_inputs],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert writer.stderr.readline() == (
            f"Note: waiting for another hookcli process writing '{folder}/' (it holds .hookcli.lock while it starts "
            "the run or records a shard)\n"
        )
        assert sorted(p.name for p in folder.iterdir()) == [LOCK_NAME]
    finally:
        holder.communicate("", timeout=30)
    out, err = writer.communicate(timeout=240)
    assert (writer.returncode, out, err) == (0, f"{folder}/index.jsonl\n", "")
    assert sorted(os.listdir(folder)) == [*(f"features-0000{n}.safetensors" for n in range(3)), INDEX_NAME]


def test_two_writers_started_together_share_the_work_and_leave_one_complete_index(shard_run, tmp_path, five_inputs):
    folder = tmp_path / "feats"
    command = [sys.executable, "-m", "hookcli", *shard_run, "-o", f"{folder}/", *five_inputs]
    runs = [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = [(run.wait(timeout=240), run.stdout.read(), run.stderr.read()) for run in runs]
    assert [code for code, _, _ in results] == [0, 0], results
    header, shards = read_index(folder)
    assert [s["shard"] for s in shards] == [0, 1, 2]
    assert [p for s in shards for p in s["inputs"]] == five_inputs
    with safe_open(str(folder / "features-00002.safetensors"), "np") as handle:
        assert handle.get_slice("fc").get_shape() == [1, 1000]
    assert sorted(os.listdir(folder)) == [*(f"features-0000{n}.safetensors" for n in range(3)), INDEX_NAME]


def test_a_lock_held_by_a_dead_process_is_free(extract_into, tmp_path, five_inputs):
    folder = tmp_path / "feats"
    folder.mkdir()
    subprocess.run(
        [
            sys.executable,
            "-c",
            (
                "import fcntl, os, signal\n"
                f"fd = os.open({str(folder / LOCK_NAME)!r}, os.O_RDWR | os.O_CREAT)\n"
                "fcntl.flock(fd, fcntl.LOCK_EX)\n"
                "os.kill(os.getpid(), signal.SIGKILL)\n"
            ),
        ],
        timeout=60,
    )
    assert (folder / LOCK_NAME).exists()
    assert extract_into(folder, five_inputs).exit_code == 0


def test_a_fifo_among_the_shards_is_refused_without_blocking(shard_run, tmp_path, five_inputs):
    folder = tmp_path / "feats"
    subprocess.run(
        [sys.executable, "-m", "hookcli", *shard_run, "-o", f"{folder}/", *five_inputs], check=True, timeout=240
    )
    shard = folder / "features-00001.safetensors"
    shard.unlink()
    os.mkfifo(shard)
    done = subprocess.run(
        [sys.executable, "-m", "hookcli", "info", str(folder)], capture_output=True, text=True, timeout=60
    )
    assert (done.returncode, done.stderr) == (
        2,
        f"Error: '{shard}' is a FIFO (named pipe), not a regular file. Hint: give a .safetensors file\n",
    )


def test_a_shard_that_is_a_link_out_of_the_folder_is_refused(runner, one_error, extract_into, tmp_path, five_inputs):
    folder = tmp_path / "feats"
    assert extract_into(folder, five_inputs).exit_code == 0
    shard = folder / "features-00001.safetensors"
    shard.rename(tmp_path / "outside.safetensors")
    shard.symlink_to(tmp_path / "outside.safetensors")
    assert one_error(runner.invoke(main, ["info", str(folder)])) == (
        f"Error: '{shard}' is a symbolic link, not a regular file. Hint: give a .safetensors file"
    )
    assert extract_into(folder, five_inputs).exit_code == 0  # resume writes the shard again, in the folder
    assert not shard.is_symlink() and (tmp_path / "outside.safetensors").exists()


@pytest.mark.parametrize(
    ("kind", "what"), [("folder", "a folder"), ("link", "a symbolic link"), ("fifo", "a FIFO (named pipe)")]
)
def test_a_lock_path_hookcli_did_not_make_is_refused_before_the_run(
    no_model, one_error, extract_into, tmp_path, five_inputs, kind, what
):
    folder = tmp_path / "feats"
    folder.mkdir()
    if kind == "folder":
        (folder / LOCK_NAME).mkdir()
    elif kind == "link":
        (folder / LOCK_NAME).symlink_to(tmp_path / "elsewhere")
    else:
        os.mkfifo(folder / LOCK_NAME)
    assert one_error(extract_into(folder, five_inputs)) == (
        f"Error: '{folder / LOCK_NAME}' is {what}, not a lock file hookcli made. Hint: remove it, then run again"
    )
    assert not (tmp_path / "elsewhere").exists()


def test_readers_say_when_a_folder_is_incomplete(runner, extract_into, tmp_path, five_inputs):
    folder = tmp_path / "feats"
    assert extract_into(folder, five_inputs).exit_code == 0
    (folder / "features-00001.safetensors").unlink()
    result = runner.invoke(main, ["grid", str(folder), "-o", str(tmp_path / "g")])
    assert result.exit_code == 0, result.output
    note = (
        f"Note: '{folder}' holds 2 of its 5 inputs (shard 1 is missing, so the one listed after it is left out); "
        "run the same extract command again to complete it\n"
    )
    assert result.stderr == note and len(result.stdout.split()) == 2
    result = runner.invoke(main, ["info", str(folder), "--no-stats"])
    assert result.exit_code == 0 and result.stderr == note


def test_index_numbers_must_be_whole_numbers_not_booleans_or_floats(
    runner, one_error, extract_into, tmp_path, five_inputs
):
    folder = tmp_path / "feats"
    assert extract_into(folder, five_inputs).exit_code == 0
    lines = (folder / INDEX_NAME).read_text().splitlines(keepends=True)
    entry = json.loads(lines[1])
    entry["first"] = False
    (folder / INDEX_NAME).write_text(lines[0] + json.dumps(entry) + "\n" + "".join(lines[2:]))
    assert one_error(runner.invoke(main, ["info", str(folder)])) == (
        f"Error: index '{folder / INDEX_NAME}' is damaged: line 2 is wrong: its shard, first and count are not whole "
        "numbers. Hint: run the same extraction again with --force to start over"
    )


@pytest.mark.parametrize("command", ["grid", "report", "info"])
def test_a_folder_whose_last_shard_is_damaged_is_refused_before_anything_is_written(
    runner, one_error, extract_into, tmp_path, five_inputs, command
):
    folder = tmp_path / "feats"
    assert extract_into(folder, five_inputs).exit_code == 0
    shard = folder / "features-00002.safetensors"
    shard.write_bytes(shard.read_bytes()[:-10])
    out = tmp_path / "out"
    extra = {"grid": ["-o", str(out)], "report": ["-o", str(out)], "info": ["--no-stats"]}[command]
    result = runner.invoke(main, [command, str(folder), *extra])
    assert one_error(result).startswith(f"Error: '{shard}' is truncated: tensor 'fc' ends at byte ")
    assert not out.exists()


#: A quick stats run of resnet18's fc from 32x32 crops, in shards of 2.
_QUICK_STATS = ["-m", "resnet18", "-w", "none", "-l", "fc", "--resize", "32", "--crop", "32", "-b", "2", "-q",
                "--shard-size", "2"]  # fmt: skip


def _tree(folder):
    """Every file under ``folder`` with its bytes."""
    return {path.relative_to(folder): path.read_bytes() for path in sorted(folder.rglob("*")) if path.is_file()}


@pytest.mark.parametrize("force", [False, True])
def test_a_parts_folder_that_is_a_link_is_refused_and_its_target_untouched(
    runner, one_error, extract_into, tmp_path, five_inputs, force
):
    user = tmp_path / "userfeats"
    assert extract_into(user, five_inputs).exit_code == 0
    before = _tree(user)
    out = tmp_path / "out.safetensors"
    (tmp_path / "out.safetensors.parts").symlink_to(user)
    args = ["stats", *_QUICK_STATS, "-o", str(out), *five_inputs] + (["--force"] if force else [])
    error = one_error(runner.invoke(main, args))
    assert error == (
        f"Error: '{out}.parts' is a symbolic link, not the folder hookcli keeps a file's parts in. "
        "Hint: hookcli never writes through a link there: remove it, then run again"
    )
    assert _tree(user) == before and not out.exists()


def test_a_parts_folder_that_is_a_dangling_link_or_a_file_is_refused(runner, one_error, tmp_path, five_inputs):
    out = tmp_path / "out.safetensors"
    (tmp_path / "out.safetensors.parts").symlink_to(tmp_path / "nowhere")
    error = one_error(runner.invoke(main, ["stats", *_QUICK_STATS, "-o", str(out), *five_inputs]))
    assert error.startswith(f"Error: '{out}.parts' is a symbolic link, not the folder")
    assert not (tmp_path / "nowhere").exists()
    (tmp_path / "out.safetensors.parts").unlink()
    (tmp_path / "out.safetensors.parts").write_bytes(b"mine")
    error = one_error(runner.invoke(main, ["stats", *_QUICK_STATS, "-o", str(out), *five_inputs]))
    assert error == (
        f"Error: '{out}.parts' is a regular file, not the folder hookcli keeps a file's parts in. Hint: remove it, "
        "then run again"
    )
    assert (tmp_path / "out.safetensors.parts").read_bytes() == b"mine"


def test_a_parts_link_made_after_the_checks_is_still_refused(tmp_path):
    from hookcli.errors import UsageProblem
    from hookcli.storage.shard_writer import ShardWriter

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "out.safetensors.parts").symlink_to(elsewhere)
    with pytest.raises(UsageProblem, match="is a symbolic link, not the folder hookcli keeps a file's parts in"):
        ShardWriter(tmp_path / "out.safetensors.parts", {"command": "stats"}, 4, parts=True)
    assert list(elsewhere.iterdir()) == []


def test_a_shard_folder_named_through_a_link_is_followed_and_a_dangling_one_refused(
    runner, one_error, extract_into, tmp_path, five_inputs
):
    disk = tmp_path / "disk"
    disk.mkdir()
    (tmp_path / "feats").symlink_to(disk)
    assert extract_into(tmp_path / "feats", five_inputs).exit_code == 0  # where the user asked the shards to go
    assert sorted(path.name for path in disk.iterdir()) == [f"features-0000{k}.safetensors" for k in range(3)] + [
        INDEX_NAME
    ]
    (tmp_path / "gone").symlink_to(tmp_path / "nowhere")
    error = one_error(extract_into(tmp_path / "gone", five_inputs))
    assert (
        error
        == f"Error: output folder '{tmp_path / 'gone'}' is a broken symbolic link. Hint: remove it or fix its target"
    )
    assert not (tmp_path / "nowhere").exists()


@pytest.mark.parametrize("entry, value", [("inputs", 6), ("shard_size", 3)])
def test_an_index_header_that_disagrees_with_its_run_identity_is_damaged(
    runner, one_error, extract_into, tmp_path, five_inputs, entry, value
):
    folder = tmp_path / "feats"
    assert extract_into(folder, five_inputs).exit_code == 0
    index = folder / INDEX_NAME
    lines = index.read_text().splitlines()
    header = json.loads(lines[0])
    header[entry] = value
    index.write_text("\n".join([json.dumps(header), *lines[1:]]) + "\n")
    assert one_error(extract_into(folder, five_inputs), 2) == (
        f"Error: '{index}' is not a hookcli index. Hint: add --force to replace it, or use another folder"
    )
    assert one_error(runner.invoke(main, ["info", str(folder)]), 2).startswith(f"Error: '{index}' is not a hookcli")
    assert extract_into(folder, five_inputs, "--force").exit_code == 0 and len(_rows(folder)[1]) == 5


def test_a_folder_without_an_index_names_the_file_it_holds(runner, tmp_path):
    empty, cams = tmp_path / "empty", tmp_path / "cams"
    empty.mkdir()
    cams.mkdir()
    save_file({"cam": torch.zeros(1, 2, 2)}, str(cams / "cams.safetensors"))  # what cam -o cams/ writes beside PNGs
    said = {folder.name: runner.invoke(main, ["info", str(folder)]) for folder in (empty, cams)}
    assert [(result.exit_code, result.stderr) for result in said.values()] == [
        (2, f"Error: no {INDEX_NAME} in folder '{empty}'. Hint: give a folder written by hookcli extract -o DIR/\n"),
        (
            2,
            f"Error: no {INDEX_NAME} in folder '{cams}'. Hint: it holds '{cams / 'cams.safetensors'}': give that "
            "file\n",
        ),
    ]
