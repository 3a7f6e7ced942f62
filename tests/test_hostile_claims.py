"""Hostile claims, locks and writes in a shard folder: links out of it, FIFOs, clocks in the future, a full disk.

Whatever is put in the folder, hookcli writes, renews and deletes files inside it only, never waits forever, and
says what is wrong in one line.
"""

import contextlib
import errno
import io
import json
import os
import re
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from hookcli.cli import main
from hookcli.errors import FeatureFileError, HookcliError, UsageProblem
from hookcli.files import atomic_path
from hookcli.storage.claims import CLAIMS, LOCK_NAME, Claims, FolderLock, claim_timeout
from hookcli.storage.features import FeatureFile
from hookcli.storage.saving import write_safetensors
from hookcli.storage.shards import INDEX_NAME, ShardedFeatures

SHARDS = [f"features-0000{n}.safetensors" for n in range(3)]
REMOVE_IT = "Hint: remove it, then run again"
#: 2100-01-01, as `touch -d 2100-01-01` dates a file.
YEAR_2100 = 4102444800


@pytest.fixture
def resumable(extract_into, tmp_path, five_inputs):
    """A finished shard folder whose shard 1 is gone: running the command again claims shard 1 and writes it."""
    folder = tmp_path / "feats"
    assert extract_into(folder, five_inputs).exit_code == 0
    (folder / SHARDS[1]).unlink()
    return folder


@pytest.fixture
def victim(tmp_path):
    """A folder beside the output, with old claim-like files in it, that hookcli must never touch."""
    folder = tmp_path / "victim"
    folder.mkdir()
    for name, text in [
        ("00001", "precious 1"),
        ("00004", "precious 4"),
        ("00010", "precious 10"),
        ("notes.txt", "keep me"),
    ]:
        (folder / name).write_text(text)
        os.utime(folder / name, (1_000_000_000, 1_000_000_000))
    return folder


def _tree(root, skip=None):
    """Every entry under ``root`` and ``root`` itself, links not followed, ``skip`` left out: kind, content (bytes,
    or a link's target) and modification time. Equal before and after: nothing there was written or deleted."""
    found = {".": (stat.S_IFMT(os.lstat(root).st_mode), None, os.lstat(root).st_mtime_ns)}
    for here, folders, files in os.walk(root):
        folders[:] = [name for name in folders if os.path.join(here, name) != str(skip)]
        for name in folders + files:
            path = os.path.join(here, name)
            status = os.lstat(path)
            content = (
                os.readlink(path)
                if stat.S_ISLNK(status.st_mode)
                else (Path(path).read_bytes() if stat.S_ISREG(status.st_mode) else None)
            )
            found[os.path.relpath(path, root)] = (stat.S_IFMT(status.st_mode), content, status.st_mtime_ns)
    return found


@contextlib.contextmanager
def _within(seconds):
    """Fail instead of hanging: a blocking ``open`` (of a FIFO, say) is interrupted and raises TimeoutError."""

    def expire(*_):
        raise TimeoutError(f"still waiting after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _rows(folder):
    with ShardedFeatures(folder) as features:
        return torch.from_numpy(features.read("fc"))


# -- links out of the folder -------------------------------------------------------------------------


def test_a_claims_folder_that_is_a_link_is_refused_and_what_it_points_to_is_untouched(
    refuse_models, one_error, extract_into, tmp_path, five_inputs, resumable, victim
):
    (resumable / CLAIMS).symlink_to(victim)
    before = _tree(tmp_path, skip=resumable)
    refuse_models()
    for extra in ([], ["--force"]):
        assert one_error(extract_into(resumable, five_inputs, *extra)) == (
            f"Error: '{resumable / CLAIMS}' is a symbolic link, not the folder of claims hookcli made. {REMOVE_IT}"
        )
    assert _tree(tmp_path, skip=resumable) == before
    assert os.readlink(resumable / CLAIMS) == str(victim)


def test_claims_never_follow_a_link_put_in_place_of_their_folder_while_a_run_works(tmp_path, victim):
    folder = tmp_path / "feats"
    folder.mkdir()
    lock, claims = FolderLock(folder, str(folder)), Claims(folder, timeout=0.4)
    with lock.held():
        assert claims.take(1) and claims.take(4)
    (folder / CLAIMS).rename(folder / "moved")
    (folder / CLAIMS).symlink_to(victim)
    before = _tree(tmp_path, skip=folder)
    claims.start()
    time.sleep(0.3)  # three heartbeats, each finding the link
    claims.stop()
    message = f"'{folder / CLAIMS}' is a symbolic link, not the folder of claims hookcli made. {REMOVE_IT}"
    with lock.held():
        for step in (lambda: claims.take(10), claims.clear, lambda: claims.release(4)):
            with pytest.raises(UsageProblem) as caught:
                step()
            assert str(caught.value) == message
    lock.close()
    assert _tree(tmp_path, skip=folder) == before


def test_a_lock_file_that_is_a_link_is_refused_and_what_it_points_to_is_untouched(
    refuse_models, one_error, extract_into, tmp_path, five_inputs, resumable, victim
):
    (resumable / LOCK_NAME).symlink_to(victim / "notes.txt")
    before = _tree(tmp_path, skip=resumable)
    refuse_models()
    message = f"'{resumable / LOCK_NAME}' is a symbolic link, not a lock file hookcli made. {REMOVE_IT}"
    assert one_error(extract_into(resumable, five_inputs)) == f"Error: {message}"
    with pytest.raises(UsageProblem) as caught:  # the lock itself refuses it too, whoever asks
        FolderLock(resumable, str(resumable)).acquire()
    assert str(caught.value) == message
    assert _tree(tmp_path, skip=resumable) == before


@pytest.mark.parametrize("target", ["notes.txt", "."], ids=["to-a-file", "to-a-folder"])
def test_a_shard_that_is_a_link_is_refused_by_readers_and_replaced_by_a_resume(
    runner, one_error, extract_into, tmp_path, five_inputs, resumable, victim, target
):
    expected = _rows_of_a_fresh_run(extract_into, tmp_path, five_inputs)
    shard = resumable / SHARDS[1]
    shard.symlink_to(victim / target)
    before = _tree(tmp_path, skip=resumable)
    assert one_error(runner.invoke(main, ["info", str(resumable)])) == (
        f"Error: '{shard}' is a symbolic link, not a regular file. Hint: give a .safetensors file"
    )
    result = extract_into(resumable, five_inputs)  # the link itself is replaced, as any damaged shard is
    assert result.exit_code == 0, result.output
    assert not shard.is_symlink() and torch.equal(_rows(resumable), expected)
    assert sorted(os.listdir(resumable)) == [*SHARDS, INDEX_NAME]
    assert _tree(tmp_path, skip=resumable) == before


def _rows_of_a_fresh_run(extract_into, tmp_path, inputs):
    fresh = tmp_path / "fresh"
    assert extract_into(fresh, inputs).exit_code == 0
    return _rows(fresh)


def test_an_index_that_is_a_link_is_refused_by_a_writer_and_what_it_points_to_is_untouched(
    one_error, extract_into, tmp_path, five_inputs, resumable
):
    elsewhere = tmp_path / "elsewhere.jsonl"
    (resumable / INDEX_NAME).rename(elsewhere)
    (resumable / INDEX_NAME).symlink_to(elsewhere)
    before = _tree(tmp_path, skip=resumable)
    assert one_error(extract_into(resumable, five_inputs)) == (
        f"Error: '{resumable / INDEX_NAME}' is a symbolic link, not a regular file. {REMOVE_IT}"
    )
    assert _tree(tmp_path, skip=resumable) == before
    result = extract_into(resumable, five_inputs, "--force")  # --force starts over: the link goes, not its target
    assert result.exit_code == 0, result.output
    assert sorted(os.listdir(resumable)) == [*SHARDS, INDEX_NAME] and not (resumable / INDEX_NAME).is_symlink()
    assert _tree(tmp_path, skip=resumable) == before


# -- FIFOs, folders and files where claims go --------------------------------------------------------


def _make(path, kind, victim):
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "folder":
        path.mkdir()
    elif kind == "file":
        path.write_text("not a folder")
    else:
        path.symlink_to(victim / path.name)


_KINDS = {"fifo": "a FIFO (named pipe)", "folder": "a folder", "file": "a regular file", "link": "a symbolic link"}


@pytest.mark.parametrize(
    ("name", "kind", "expected"),
    [
        (f"{CLAIMS}/00001", "fifo", "a claim file"),
        (f"{CLAIMS}/00001", "folder", "a claim file"),
        (f"{CLAIMS}/00001", "link", "a claim file"),
        (CLAIMS, "file", "the folder of claims"),
        (CLAIMS, "fifo", "the folder of claims"),
    ],
)
def test_what_is_no_claim_or_claims_folder_is_refused_without_waiting(
    refuse_models, one_error, extract_into, tmp_path, five_inputs, resumable, victim, name, kind, expected
):
    path = resumable / name
    path.parent.mkdir(exist_ok=True)
    _make(path, kind, victim)
    os.utime(path, (1_000_000_000, 1_000_000_000), follow_symlinks=False)  # long silent: once, it was deleted
    before = _tree(tmp_path, skip=resumable)
    refuse_models()
    message = f"'{path}' is {_KINDS[kind]}, not {expected} hookcli made. {REMOVE_IT}"
    with _within(60):
        assert one_error(extract_into(resumable, five_inputs)) == f"Error: {message}"
        # Where a run finds it only when claiming (it appeared after the run began), the same.
        lock = FolderLock(resumable, str(resumable))
        with lock.held(), pytest.raises(UsageProblem) as caught:
            Claims(resumable, timeout=120).take(1)
        lock.close()
    assert str(caught.value) == message
    assert os.path.lexists(path) and _tree(tmp_path, skip=resumable) == before


# -- clocks ------------------------------------------------------------------------------------------


def _claim(folder, number, dated, content=None):
    path = folder / CLAIMS / f"{number:05d}"
    path.parent.mkdir(exist_ok=True)
    path.write_text(content if content is not None else json.dumps({"host": "elsewhere", "pid": 12345, "since": 0}))
    os.utime(path, (dated, dated))
    return path


def test_a_claim_dated_in_the_future_is_taken_over_and_the_folder_completes(
    extract_into, tmp_path, five_inputs, resumable, monkeypatch
):
    expected = _rows_of_a_fresh_run(extract_into, tmp_path, five_inputs)
    _claim(resumable, 1, YEAR_2100)
    monkeypatch.setenv("HOOKCLI_CLAIM_TIMEOUT", "1")
    result = extract_into(resumable, five_inputs)
    assert result.exit_code == 0, result.output
    continuing, note = result.stderr.splitlines()
    assert continuing == f"Continuing: 3 of 5 inputs are already in {resumable}/"
    assert re.fullmatch(
        r"Note: shard 1 was claimed by process 12345 on elsewhere, whose heartbeat is dated \d+ s in "
        r"the future: this process computes it",
        note,
    ), note
    assert result.stdout == f"{resumable}/index.jsonl\n"
    assert torch.equal(_rows(resumable), expected)
    assert sorted(os.listdir(resumable)) == [*SHARDS, INDEX_NAME]


#: A process that takes the folder's lock and claims shard 1, killed (SIGKILL) as it writes its owner into the claim.
_KILLED_WHILE_CLAIMING = """
import os, signal, socket, sys
from pathlib import Path
from hookcli.storage.claims import Claims, FolderLock

folder = Path(sys.argv[1])
socket.gethostname = lambda: os.kill(os.getpid(), signal.SIGKILL)  # asked for as the owner is written
with FolderLock(folder, str(folder)).held():
    Claims(folder).take(1)
"""


def test_a_process_killed_while_it_claims_a_shard_leaves_no_claim_and_the_folder_completes(
    extract_into, tmp_path, five_inputs, resumable
):
    expected = _rows_of_a_fresh_run(extract_into, tmp_path, five_inputs)
    killed = subprocess.run([sys.executable, "-c", _KILLED_WHILE_CLAIMING, str(resumable)], check=False)
    assert killed.returncode == -signal.SIGKILL
    assert "00001" not in os.listdir(resumable / CLAIMS)  # a claim naming no owner would hold the shard for minutes
    result = extract_into(resumable, five_inputs)
    assert result.exit_code == 0, result.output
    assert result.stderr == f"Continuing: 3 of 5 inputs are already in {resumable}/\n"
    assert torch.equal(_rows(resumable), expected)
    assert sorted(os.listdir(resumable)) == [*SHARDS, INDEX_NAME]


def test_a_heartbeat_ahead_by_less_than_the_timeout_still_holds_its_claim(tmp_path):
    now = time.time()
    _claim(tmp_path, 0, now + 30)  # another machine's clock a little ahead
    _claim(tmp_path, 1, now + 300)
    _claim(tmp_path, 2, now + 300, content="{not json")
    notes = []
    lock, claims = FolderLock(tmp_path, str(tmp_path)), Claims(tmp_path, timeout=120, on_note=notes.append)
    with lock.held():
        assert [claims.take(n) for n in range(3)] == [False, True, True]
    claims.release_all(lock)
    lock.close()
    assert [re.sub(r"\d+ s", "N s", note) for note in notes] == [
        "shard 1 was claimed by process 12345 on elsewhere, whose heartbeat is dated N s in the future: this process "
        "computes it",
        "shard 2 was claimed by an unreadable claim: this process computes it",
    ]


@pytest.mark.parametrize("value", ["1e-300", "0.5"])
def test_a_claim_timeout_under_a_second_is_refused_before_the_model_loads(
    no_model, one_error, extract_into, tmp_path, five_inputs, monkeypatch, value
):
    monkeypatch.setenv("HOOKCLI_CLAIM_TIMEOUT", value)
    assert one_error(extract_into(tmp_path / "feats", five_inputs)) == (
        f"Error: HOOKCLI_CLAIM_TIMEOUT must be a number of seconds from 1 to 86400, not '{value}'. Hint: unset it "
        "for the default of 120 s"
    )
    assert not (tmp_path / "feats").exists()
    monkeypatch.setenv("HOOKCLI_CLAIM_TIMEOUT", "1")
    assert claim_timeout() == 1.0


# -- a full disk -------------------------------------------------------------------------------------


def _disk_full_after(monkeypatch, size):
    """Files the safetensors writer opens take ``size`` bytes, then the device is full."""
    from hookcli.storage import saving

    class Filling(io.FileIO):
        def write(self, data):
            left = size - self.tell()
            if len(data) > left:
                super().write(bytes(memoryview(data)[: max(left, 0)]))
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return super().write(data)

    monkeypatch.setattr(saving, "open", lambda name, mode: Filling(name, "r+"), raising=False)


def test_a_full_disk_while_a_shard_is_written_is_named_in_one_line(
    one_error, extract_into, tmp_path, five_inputs, monkeypatch
):
    _disk_full_after(monkeypatch, 100)  # a shard is written in place: the space runs out part-way through its bytes
    folder = tmp_path / "feats"
    before = _tree(tmp_path)
    assert one_error(extract_into(folder, five_inputs), code=1) == (
        f"Error: no space left on the device holding '{folder / SHARDS[0]}'. Hint: free some space there, or write "
        "to another place"
    )
    assert sorted(os.listdir(folder)) == [CLAIMS, LOCK_NAME, INDEX_NAME]  # no part-written file left behind
    assert _tree(tmp_path, skip=folder) == {**before, ".": _tree(tmp_path)["."]}


def test_a_full_disk_while_one_file_is_written_is_named_in_one_line(
    runner, shard_run, one_error, tmp_path, five_inputs, monkeypatch
):
    _disk_full_after(monkeypatch, 10)
    target = tmp_path / "out.safetensors"
    result = runner.invoke(main, [*shard_run[:-2], "-o", str(target), *five_inputs])  # one file: no --shard-size
    assert one_error(result, code=1) == (
        f"Error: no space left on the device holding '{target}'. Hint: free some space there, or write to another place"
    )
    assert not target.exists() and not list(tmp_path.glob(".out.safetensors.*"))


def test_a_full_disk_under_any_atomic_write_is_named_and_leaves_nothing(tmp_path):
    target = tmp_path / "out.bin"
    with pytest.raises(HookcliError) as caught, atomic_path(target) as temporary:
        temporary.write_bytes(b"some")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    assert str(caught.value) == (
        f"no space left on the device holding '{target}'. Hint: free some space there, or write to another place"
    )
    assert os.listdir(tmp_path) == []
    with pytest.raises(OSError) as other, atomic_path(target):  # other failures pass through as they are
        raise OSError(errno.EIO, os.strerror(errno.EIO))
    assert other.value.errno == errno.EIO


# -- crafted @shape companions -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("maps", "shapes", "wrong"),
    [
        (torch.zeros(3, 2, 5), torch.ones(3, 2), "it holds F32, where row shapes are whole numbers (I64 or I32)"),
        (
            torch.zeros(3, 2, 5),
            torch.ones(3, 3, dtype=torch.int64),
            "its shape is [3, 3], where 3 rows of 2 dimensions need [3, 2]",
        ),
        (torch.zeros(3), torch.ones(3, 0, dtype=torch.int64), "a key of shape [3] has no row shapes to give"),
    ],
    ids=["dtype", "shape", "no-rows"],
)
def test_a_shape_companion_that_cannot_be_one_says_what_is_wrong_with_it(tmp_path, maps, shapes, wrong):
    path = tmp_path / "crafted.safetensors"
    write_safetensors({"maps": maps, "maps@shape": shapes}, {}, path)
    with pytest.raises(FeatureFileError) as caught:
        FeatureFile(path)
    assert str(caught.value) == (
        f"'{path}' is damaged: 'maps@shape' is not the row shapes of 'maps' "
        f"{list(maps.shape)}. Hint: {wrong}; write the file again"
    )


def test_a_row_shape_outside_the_padding_says_so(tmp_path):
    path = tmp_path / "crafted.safetensors"
    write_safetensors({"maps": torch.zeros(2, 2, 5), "maps@shape": torch.tensor([[2, 5], [2, 9]])}, {}, path)
    with FeatureFile(path) as features, pytest.raises(FeatureFileError) as caught:
        features.read("maps", 1)
    assert str(caught.value) == (
        f"'{path}' is damaged: row 1 of 'maps' claims shape [2, 9], outside the stored "
        "[2, 5]. Hint: each row's shape in 'maps@shape' runs from 0 to the stored [2, 5]; "
        "write the file again"
    )


def test_a_folder_that_goes_away_while_a_run_writes_in_it_is_said_so(tmp_path):
    import shutil

    from hookcli.errors import UsageProblem
    from hookcli.storage.claims import FolderLock

    folder = tmp_path / "gone"
    folder.mkdir()
    lock = FolderLock(folder, str(folder))
    shutil.rmtree(folder)
    with pytest.raises(UsageProblem) as caught, lock.held():
        pass
    assert str(caught.value) == (
        f"folder '{folder}' went away while this run was writing in it. Hint: run the same command again (it makes "
        "the folder anew), and leave the folder be while it runs"
    )
