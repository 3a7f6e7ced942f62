"""Runs against hostile paths and values: each is refused before the model loads, with one exact Error line, or
survives it (FIFOs among the inputs, abandoned temporary files, broken links). Where a FIFO could block a run
forever, the run is a subprocess with a timeout, so that a hang fails the test instead of the suite."""

import fcntl
import json
import os
import subprocess
import sys
import time

import pytest

import hookcli
from hookcli.cli import main

EXTRACT = ["extract", "-m", "resnet18", "-w", "none", "--resize", "32", "--crop", "32", "-l", "layer1"]
CAM = ["cam", "-m", "resnet18", "-w", "none", "--resize", "32", "--crop", "32", "-l", "layer1"]
NORMALISATION_HINT = "Hint: see --help for --mean and --std"
LOADED = "Error: AssertionError: the model was loaded. Hint: rerun with --debug for the traceback\n"


def _files(folder) -> list[str]:
    return sorted(os.listdir(folder))


def _hookcli(*args, cwd, seconds=60) -> subprocess.CompletedProcess:
    """``python -m hookcli ARGS`` in a subprocess (TORCH_HOME and HOOKCLI_OFFLINE come from os.environ)."""
    try:
        return subprocess.run(
            [sys.executable, "-m", "hookcli", *args],
            cwd=cwd,
            env=dict(os.environ),
            capture_output=True,
            text=True,
            timeout=seconds,
            check=False,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"hookcli {' '.join(args)} still ran after {seconds} s (blocked on a FIFO?)")


# -- 1, 9: option values ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("--std", "0", f"std must be finite numbers above 0, not 0.0, 0.0, 0.0. {NORMALISATION_HINT}"),
        ("--std", "1,0,1", f"std must be finite numbers above 0, not 1.0, 0.0, 1.0. {NORMALISATION_HINT}"),
        ("--std", "inf", f"std must be finite numbers above 0, not inf, inf, inf. {NORMALISATION_HINT}"),
        ("--mean", "nan", f"mean must be finite numbers, not nan, nan, nan. {NORMALISATION_HINT}"),
        (  # the declared bound reaches the command line itself (hookcli.options)
            "--resize",
            "9000",
            "Invalid value for '--resize': 9000 is not in the range 1<=x<=8192. Hint: see 'hookcli extract --help'",
        ),
        (
            "--crop",
            "8193",
            "Invalid value for '--crop': 8193 is not in the range 1<=x<=8192. Hint: see 'hookcli extract --help'",
        ),
    ],
)
def test_normalisation_and_sizes_out_of_bounds_are_refused_before_the_model_loads(
    runner, images, tmp_path, monkeypatch, no_model, option, value, message
):
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(main, [*EXTRACT, option, value, "-o", "out.safetensors", "imgs/a.png"])
    assert (result.exit_code, result.stderr, result.stdout) == (2, f"Error: {message}\n", "")
    assert _files(tmp_path) == ["imgs"]


@pytest.mark.parametrize(
    ("crop", "message"),
    [
        (
            0,
            "crop must be a whole number of at least 1, not 0. Hint: see --help for the values each option takes",
        ),  # neighbouring: the lower bound held before too
        (9000, "crop must be at most 8192, not 9000. Hint: see --help for the values each option takes"),
    ],
)
def test_python_api_refuses_a_crop_out_of_bounds_as_a_usage_error(images, no_model, crop, message):
    with pytest.raises(hookcli.HookcliError) as raised:
        hookcli.extract("resnet18", "layer1", images[0], weights="none", resize=32, crop=crop)
    assert (str(raised.value), raised.value.exit_code) == (message, 2)


# -- 2-6: outputs ----------------------------------------------------------------------------------


def test_forced_output_that_is_an_input_is_refused_and_the_image_kept(runner, images, tmp_path, monkeypatch, no_model):
    monkeypatch.chdir(tmp_path)
    before = images[0].read_bytes()
    result = runner.invoke(main, [*EXTRACT, "-o", "imgs/a.png", "--force", "imgs/a.png", "imgs/b.png"])
    assert (result.exit_code, result.stderr) == (
        2,
        "Error: output 'imgs/a.png' is the input 'imgs/a.png'. Hint: write the output somewhere else with -o\n",
    )
    assert images[0].read_bytes() == before
    assert _files(tmp_path / "imgs") == ["a.png", "b.png", "c.png"]


@pytest.mark.parametrize("link", [os.link, os.symlink], ids=["hard-link", "symlink"])
def test_forced_output_that_is_a_link_to_an_input_is_refused(runner, images, tmp_path, monkeypatch, no_model, link):
    monkeypatch.chdir(tmp_path)
    link("imgs/b.png", "alias.png")
    before = images[1].read_bytes()
    result = runner.invoke(main, [*EXTRACT, "-o", "alias.png", "--force", "imgs/b.png"])
    assert (result.exit_code, result.stderr) == (
        2,
        "Error: output 'alias.png' is the input 'imgs/b.png'. Hint: write the output somewhere else with -o\n",
    )
    assert images[1].read_bytes() == before
    assert (tmp_path / "alias.png").read_bytes() == before


def test_broken_symbolic_link_as_output_is_refused_before_the_run(runner, images, tmp_path, monkeypatch, no_model):
    monkeypatch.chdir(tmp_path)
    os.symlink("nowhere.safetensors", "out.safetensors")
    result = runner.invoke(main, [*EXTRACT, "-o", "out.safetensors", "imgs/a.png"])
    assert (result.exit_code, result.stderr) == (
        2,
        (
            "Error: output 'out.safetensors' is a broken symbolic link. Hint: remove it, add --force to replace the "
            "link with the file, or choose another name\n"
        ),
    )
    assert os.readlink("out.safetensors") == "nowhere.safetensors"
    assert _files(tmp_path) == ["imgs", "out.safetensors"]


def test_forced_broken_symbolic_link_is_replaced_by_the_file(runner, images, tmp_path, monkeypatch):
    """Neighbouring behaviour (held before too): --force replaces the link itself and creates no link target."""
    monkeypatch.chdir(tmp_path)
    os.symlink("nowhere.safetensors", "out.safetensors")
    result = runner.invoke(main, [*EXTRACT, "-o", "out.safetensors", "--force", "imgs/a.png"])
    assert (result.exit_code, result.stdout, result.stderr) == (0, "out.safetensors\n", "")
    assert not (tmp_path / "out.safetensors").is_symlink()
    with hookcli.open_features("out.safetensors") as written:
        assert (json.loads(written.metadata["inputs"]), written.shape("layer1")) == ([str(images[0])], [1, 64, 8, 8])
    assert _files(tmp_path) == ["imgs", "out.safetensors"]


def test_name_too_long_for_the_temporary_suffix_is_refused_before_the_run(
    runner, images, tmp_path, monkeypatch, no_model
):
    monkeypatch.chdir(tmp_path)
    limit = os.pathconf(tmp_path, "PC_NAME_MAX")  # 255 on common file systems
    name = "a" * (limit - 25) + ".safetensors"  # fits a name, not with the 15 bytes a temporary name adds
    result = runner.invoke(main, [*EXTRACT, "-o", name, "imgs/a.png"])
    assert (result.exit_code, result.stderr) == (
        2,
        (
            f"Error: the name '{'a' * 40}...' is too long ({limit - 13} bytes). Hint: file names here hold at most "
            f"{limit - 15} bytes; choose a shorter one\n"
        ),
    )
    assert _files(tmp_path) == ["imgs"]


def test_unwritable_output_folder_is_refused_before_the_run(runner, images, tmp_path, monkeypatch, no_model):
    # Tests run as root, where permissions do not stop writes: the folder is unwritable as os.access reports it.
    folder = tmp_path / "locked"
    folder.mkdir()
    access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode, **kw: str(path) != str(folder) and access(path, mode, **kw))
    result = runner.invoke(main, [*EXTRACT, "-o", str(folder / "out.safetensors"), str(images[0])])
    assert (result.exit_code, result.stderr) == (
        2,
        f"Error: cannot write to folder '{folder}'. Hint: check its permissions, or choose another place with -o\n",
    )
    assert _files(folder) == []


def test_grid_folder_that_is_a_file_is_refused_before_the_run(runner, images, tmp_path, monkeypatch, no_model):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "grids").write_bytes(b"not a folder")
    result = runner.invoke(main, [*EXTRACT, "-o", "out.safetensors", "--grid", "grids", "imgs/a.png"])
    assert (result.exit_code, result.stderr) == (
        2,
        "Error: output 'grids' is a file, not a folder. Hint: give a folder name, or remove the file\n",
    )
    assert _files(tmp_path) == ["grids", "imgs"]
    assert (tmp_path / "grids").read_bytes() == b"not a folder"


def test_cam_folder_that_is_a_file_is_refused_before_the_run(runner, images, tmp_path, monkeypatch, no_model):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "cams").write_bytes(b"not a folder")
    result = runner.invoke(main, [*CAM, "-o", "cams", "imgs/a.png"])
    assert (result.exit_code, result.stderr) == (
        2,
        "Error: output 'cams' is a file, not a folder. Hint: give a folder name, or remove the file\n",
    )
    assert (tmp_path / "cams").read_bytes() == b"not a folder"


# -- 7: FIFOs --------------------------------------------------------------------------------------


def test_fifo_named_as_an_input_is_refused_at_once(images, tmp_path):
    os.mkfifo(tmp_path / "pipe.jpg")
    done = _hookcli(*EXTRACT, "-o", "out.safetensors", "pipe.jpg", cwd=tmp_path)
    assert (done.returncode, done.stderr, done.stdout) == (
        2,
        (
            "Error: input 'pipe.jpg' is a FIFO (named pipe), not an image file. Hint: images are read from regular "
            "files; '-' reads a list of paths from stdin\n"
        ),
        "",
    )
    assert _files(tmp_path) == ["imgs", "pipe.jpg"]


def test_fifo_in_a_folder_is_skipped_with_on_error_skip(images, tmp_path):
    os.mkfifo(tmp_path / "imgs" / "x.jpg")
    done = _hookcli(*EXTRACT, "-r", "--on-error", "skip", "-o", "out.safetensors", "imgs", cwd=tmp_path)
    assert (done.returncode, done.stdout, done.stderr) == (
        0,
        "out.safetensors\n",
        "Skipped: 'imgs/x.jpg' is a FIFO (named pipe), not a regular file. Hint: inputs must be image files\n",
    )
    with hookcli.open_features(tmp_path / "out.safetensors") as written:
        assert json.loads(written.metadata["inputs"]) == [str(p) for p in images]
        assert [entry["input"] for entry in json.loads(written.metadata["skipped"])] == [str(tmp_path / "imgs/x.jpg")]
        assert written.shape("layer1") == [3, 64, 8, 8]


def test_fifo_in_a_folder_fails_the_run_by_default(runner, images, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    os.mkfifo(tmp_path / "imgs" / "x.jpg")
    result = runner.invoke(main, [*EXTRACT, "-o", "out.safetensors", "imgs"])
    assert (result.exit_code, result.stdout, result.stderr) == (
        1,
        "",
        "Error: 'imgs/x.jpg' is a FIFO (named pipe), not a regular file. Hint: inputs must be image files; "
        "or add --on-error skip to leave unreadable images out\n",
    )
    assert _files(tmp_path) == ["imgs"]


def test_fifo_config_preset_is_refused_without_blocking(images, tmp_path):
    os.mkfifo(tmp_path / "preset.toml")
    done = _hookcli(*EXTRACT, "--config", "preset.toml", "-o", "out.safetensors", "imgs/a.png", cwd=tmp_path)
    assert (done.returncode, done.stdout, done.stderr) == (
        2,
        "",
        (
            "Error: cannot read config 'preset.toml': 'preset.toml' is a FIFO (named pipe), not a regular "
            "file. Hint: give a .toml file\n"
        ),
    )
    assert _files(tmp_path) == ["imgs", "preset.toml"]


# -- 8: temporary files left by a killed run -------------------------------------------------------


@pytest.mark.parametrize("name", ["out.safetensors", "run[1]*.safetensors"])
def test_abandoned_temporary_files_go_at_once_and_locked_ones_stay(runner, images, tmp_path, monkeypatch, name):
    """Every writer writes into the temporary file it holds locked, so an unlocked one is abandoned, however new."""
    monkeypatch.chdir(tmp_path)
    abandoned, locked = tmp_path / f".{name}.abcd1234.part", tmp_path / f".{name}.wxyz5678.part"
    fresh = tmp_path / f".{name}.justmade.part"  # left a moment ago by a process killed while writing it
    other = tmp_path / ".other.safetensors.abcd1234.part"  # another output's: not this run's to remove
    for path in (abandoned, locked, other, fresh):
        path.write_bytes(b"half written")
        if path != fresh:
            os.utime(path, (time.time() - 61, time.time() - 61))
    with open(locked, "rb") as held:
        # flock belongs to the open file description: the run's own open() of the file conflicts with it.
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)
        result = runner.invoke(main, [*EXTRACT, "-o", name, "imgs/a.png"])
    assert (result.exit_code, result.stdout, result.stderr) == (0, f"{name}\n", "")
    assert _files(tmp_path) == sorted([".other.safetensors.abcd1234.part", locked.name, "imgs", name])
    assert locked.read_bytes() == b"half written"


@pytest.mark.parametrize("where", ["output", "grid", "cam", "input"])
def test_names_beyond_the_file_systems_limit_are_usage_errors(runner, images, tmp_path, monkeypatch, no_model, where):
    monkeypatch.chdir(tmp_path)
    limit = os.pathconf(tmp_path, "PC_NAME_MAX")
    long = "b" * (limit + 5)
    args = {
        "output": [*EXTRACT, "-o", f"{long}.safetensors", "imgs/a.png"],
        "grid": [*EXTRACT, "-o", "out.safetensors", "--grid", long, "imgs/a.png"],
        "cam": [*CAM, "-o", long, "imgs/a.png"],
        "input": [*EXTRACT, "-o", "out.safetensors", f"imgs/{long}.png"],
    }[where]
    result = runner.invoke(main, args)
    shown = f"{long}.safetensors" if where == "output" else long
    expected = (
        f"Error: cannot read input 'imgs/{long}.png': File name too long. Hint: check the path\n"
        if where == "input"
        else f"Error: the name '{shown[:40]}...' is too long ({len(shown)} bytes). Hint: file names here hold at "
        f"most {limit - (15 if where == 'output' else 0)} bytes; choose a shorter one\n"
    )
    assert (result.exit_code, result.stderr) == (2, expected)
    assert _files(tmp_path) == ["imgs"]


@pytest.mark.parametrize(
    ("line", "shown"),
    [
        ("batch_size = {x = 1}", "{'x': 1}"),
        ("batch_size = 1.5", "1.5"),
        ("force = 1.5", "1.5"),
        ("resize = inf", "inf"),
        ('output = ["a", "b"]', "['a', 'b']"),
    ],
)
def test_preset_values_of_the_wrong_kind_are_the_presets_usage_error(
    runner, images, tmp_path, monkeypatch, no_model, line, shown
):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "p.toml").write_text(f'model = "resnet18"\nlayer = ["layer1"]\n{line}\n')
    name = line.split(" =")[0]
    result = runner.invoke(main, ["extract", "-w", "none", "-c", "p.toml", "imgs/a.png"])
    assert (result.exit_code, result.stderr) == (
        2,
        f"Error: config 'p.toml' has a bad value for '{name}': {shown}. Hint: give what "
        f"--{name.replace('_', '-')} takes (see --help)\n",
    )
    assert _files(tmp_path) == ["imgs", "p.toml"]


def test_a_preset_may_give_one_layer_as_a_string(runner, images, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "p.toml").write_text('model = "resnet18"\nlayer = "layer1"\nresize = 32\ncrop = 32\n')
    result = runner.invoke(main, ["extract", "-w", "none", "-c", "p.toml", "-o", "out.safetensors", "imgs/a.png"])
    assert result.exit_code == 0, result.output
    with hookcli.open_features("out.safetensors") as written:
        assert written.keys() == ["layer1"]


def test_more_decoding_workers_than_the_limit_are_refused(runner, images, tmp_path, monkeypatch, no_model):
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(main, [*EXTRACT, "-j", "1000", "-o", "out.safetensors", "imgs/a.png"])
    assert (result.exit_code, result.stderr) == (
        2,
        "Error: workers must be at most 128, not 1000. Hint: see --help for the values each option takes\n",
    )


def test_cam_on_a_module_that_runs_twice_per_forward_says_so(runner, images, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(main, [*CAM[:-2], "--layer", "layer4.0.relu", "-o", "cams", "imgs/a.png"])
    assert (result.exit_code, result.stderr) == (
        2,
        "Error: cam needs a layer that runs once per forward, and 'layer4.0.relu' runs 2 times. Hint: choose the "
        "block around it (layer4.0) or another layer; 'hookcli layers' shows each module's calls\n",
    )
    assert not (tmp_path / "cams").exists()  # the folder this run made goes with it


def test_a_cam_run_that_fails_takes_its_pictures_away_and_one_forced_takes_an_earlier_runs(runner, images, tmp_path,
                                                                                           monkeypatch):  # fmt: skip
    monkeypatch.chdir(tmp_path)
    (tmp_path / "cut.png").write_bytes((tmp_path / "imgs" / "c.png").read_bytes()[:200])
    failed = runner.invoke(main, [*CAM, "-b", "1", "-o", "cams", "imgs/a.png", "imgs/b.png", "cut.png"])
    assert failed.exit_code == 1 and failed.stderr.startswith("Error: cannot decode image 'cut.png'")
    assert not (tmp_path / "cams").exists()  # two pictures were drawn before the third image failed: gone
    assert runner.invoke(main, [*CAM, "-o", "cams", "imgs/a.png", "imgs/b.png"]).exit_code == 0
    before = {p.name: p.read_bytes() for p in (tmp_path / "cams").iterdir()}
    kept = runner.invoke(main, [*CAM, "-b", "1", "-o", "cams", "-f", "imgs/a.png", "imgs/c.png", "cut.png"])
    assert kept.exit_code == 1  # a forced run that fails: the earlier run's folder as it was, 00000_a.png too
    assert {p.name: p.read_bytes() for p in (tmp_path / "cams").iterdir()} == before
    assert sorted(before) == ["00000_a.png", "00001_b.png", "cams.safetensors"]
    (tmp_path / "cams" / "00001_holiday.png").write_bytes(b"the user's own, named like a CAM picture")
    forced = runner.invoke(main, [*CAM, "-o", "cams", "-f", "imgs/c.png"])
    assert forced.exit_code == 0, forced.output
    assert sorted(p.name for p in (tmp_path / "cams").iterdir()) == [
        "00000_c.png",
        "00001_holiday.png",  # of no input of the earlier run: left
        "cams.safetensors",
    ]
    assert forced.stderr == (
        "Note: removed 2 pictures of an earlier run from 'cams' ('00000_a.png', …), whose maps cams.safetensors no "
        "longer holds\n"
    )
    standard_output = runner.invoke(main, [*CAM, "-o", "-", "imgs/a.png"])
    assert (standard_output.exit_code, standard_output.stderr) == (
        2,
        "Error: cam writes a folder (its maps and a picture an image), and '-' is standard output. Hint: give -o DIR; "
        "hookcli grad -o - writes the gradients to standard output\n",
    )
    assert not (tmp_path / "-").exists()


def test_a_second_run_writing_the_same_file_stops_before_its_work(runner, images, tmp_path, monkeypatch):
    from hookcli.files import hold_output, release_output

    monkeypatch.chdir(tmp_path)
    held = hold_output("out.safetensors")  # what the first of two identical runs holds while it works
    try:
        result = runner.invoke(main, [*EXTRACT, "-o", "out.safetensors", "imgs/a.png"])
    finally:
        release_output("out.safetensors", held)
    assert (result.exit_code, result.stdout, result.stderr) == (
        2,
        "",
        "Error: another hookcli process is writing 'out.safetensors'. Hint: wait for it to finish, or write to "
        "another file\n",
    )
    assert _files(tmp_path) == ["imgs"]
    again = runner.invoke(main, [*EXTRACT, "-o", "out.safetensors", "imgs/a.png"])
    assert (again.exit_code, _files(tmp_path)) == (0, ["imgs", "out.safetensors"])


def test_a_lock_file_removed_between_its_opening_and_its_locking_is_not_taken(tmp_path, monkeypatch):
    """A finishing run removes its lock file; a run that opened the old one must not hold it beside a third run
    that made and locked the new one."""
    import hookcli.files
    from hookcli.errors import OutputExistsError
    from hookcli.files import hold_output

    lock, target, real_flock, third = tmp_path / ".out.safetensors.lock", tmp_path / "out.safetensors", fcntl.flock, []

    def meanwhile(descriptor, operation):
        if not third:  # between this run's open and lock: the first run finishes, a third one starts
            lock.unlink()
            third.append(os.open(lock, os.O_RDWR | os.O_CREAT))
            real_flock(third[0], fcntl.LOCK_EX)
        return real_flock(descriptor, operation)

    monkeypatch.setattr(hookcli.files.fcntl, "flock", meanwhile)
    with pytest.raises(OutputExistsError, match="another hookcli process is writing"):
        hold_output(target)
    os.close(third[0])


def test_a_temporary_file_a_sweeper_takes_before_its_writer_locks_it_is_made_again(tmp_path, monkeypatch):
    """Another process sweeping abandoned files (``remove_abandoned``) may lock a temporary file between its making
    and its writer's lock, and remove it: the writer makes another, rather than fail."""
    import tempfile

    import hookcli.files
    from hookcli.files import atomic_path

    real_mkstemp, made, sweeper = tempfile.mkstemp, [], []

    def swept(**kwargs):
        handle, name = real_mkstemp(**kwargs)
        made.append(name)
        if len(made) == 1:  # the sweeper comes between the making and the locking
            sweeper.append(os.open(name, os.O_RDONLY))
            fcntl.flock(sweeper[0], fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.unlink(name)
        return handle, name

    monkeypatch.setattr(hookcli.files.tempfile, "mkstemp", swept)
    try:
        with atomic_path(tmp_path / "out.txt") as temporary:
            temporary.write_text("whole")
    finally:
        for descriptor in sweeper:
            os.close(descriptor)
    assert (tmp_path / "out.txt").read_text() == "whole" and len(made) == 2
    assert sorted(os.listdir(tmp_path)) == ["out.txt"]


def test_two_processes_taking_a_shared_output_at_once_take_it_in_turn_and_leave_no_lock_file(tmp_path):
    """Both processes of a run may find its parts complete and take the output to merge them: neither waits for the
    other forever, one holds it at a time, and the lock file goes with the last (flock is the open file's, so two
    descriptors of one process stand for two processes). Linux's local flock lets go of a shared lock before it
    waits to turn it whole, so this checks the turns and the lock file, not an flock that upgrades in place."""
    import threading

    from hookcli.files import release_output, share_output, take_output

    target, turns = tmp_path / "out.safetensors", []

    def merge(shared: int, name: str) -> None:
        mine = take_output(target, shared)
        turns.append(name)
        time.sleep(0.3)  # the other waits meanwhile
        turns.append(name)
        release_output(target, mine)

    shared = [share_output(target), share_output(target)]
    both = [threading.Thread(target=merge, args=pair, daemon=True) for pair in zip(shared, "ab")]
    for thread in both:
        thread.start()
    for thread in both:
        thread.join(timeout=60)
    assert not any(thread.is_alive() for thread in both)
    assert turns in (list("aabb"), list("bbaa"))
    assert os.listdir(tmp_path) == []


def test_a_second_run_on_a_file_being_written_is_refused_before_a_model_loads(runner, images, tmp_path, no_model):
    from hookcli.files import hold_output, release_output

    target = tmp_path / "out.safetensors"
    held = hold_output(target)
    try:
        result = runner.invoke(main, [*EXTRACT, "-o", str(target), str(images[0])])
    finally:
        release_output(target, held)
    assert (result.exit_code, result.stderr) == (
        2,
        f"Error: another hookcli process is writing '{target}'. Hint: wait for it to finish, or write to another "
        "file\n",
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["imgs"]
