"""Many processes on one shard folder: torchrun, --part, plain shells, a killed process, claims and parts."""

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from hookcli.cli import main
from hookcli.errors import UsageProblem
from hookcli.run.launch import Part, cpu_threads, detect_part, parse_part
from hookcli.storage.claims import CLAIMS, Claims, FolderLock
from hookcli.storage.index import read_index
from hookcli.storage.shards import INDEX_NAME, ShardedFeatures

ARGS = [
    "extract",
    "-m",
    "resnet18",
    "-w",
    "none",
    "-l",
    "layer4",
    "-l",
    "fc",
    "--resize",
    "40",
    "--crop",
    "32",
    "-b",
    "2",
    "-q",
    "--shard-size",
    "2",
]


@pytest.fixture
def inputs(tmp_path, make_image):
    folder = tmp_path / "imgs"
    folder.mkdir()
    return [str(make_image(folder / f"{i:02d}.png", size=(44, 40), seed=i)) for i in range(11)]


def _one_process(runner, tmp_path, inputs, threads=None, batch="2"):
    """The rows one process writes into one file (with ``threads`` CPU threads: sums taken in another order round
    differently, so processes sharing the cores are compared with one process using as many threads as each)."""
    path = tmp_path / "one.safetensors"
    before = torch.get_num_threads()
    torch.set_num_threads(threads or before)
    try:
        args = [*ARGS[:-5], "-b", batch, "-q", "--force", "-o", str(path), *inputs]  # without --shard-size
        result = runner.invoke(main, args)
    finally:
        torch.set_num_threads(before)
    assert result.exit_code == 0, result.output
    with safe_open(str(path), "pt") as handle:
        return {key: handle.get_tensor(key) for key in ("layer4", "fc")}


@pytest.fixture
def expected(runner, tmp_path, inputs):
    return _one_process(runner, tmp_path, inputs)


def _check_folder(folder, inputs, expected):
    """Every input exactly once, in order, with the values one process computes; nothing of the writers left."""
    header, shards = read_index(folder)
    count = -(-len(inputs) // 2)  # shards of 2
    assert [entry["shard"] for entry in shards] == list(range(count))
    assert [p for entry in shards for p in entry["inputs"]] == inputs
    lines = (folder / INDEX_NAME).read_text().splitlines()
    assert [json.loads(line)["shard"] for line in lines[1:]] == list(range(count))  # in shard order on disk
    with ShardedFeatures(folder) as features:
        assert json.loads(features.metadata["inputs"]) == inputs and not features.reading_notes
        for key, rows in expected.items():
            assert torch.equal(torch.from_numpy(features.read(key)), rows), key
    assert sorted(os.listdir(folder)) == [*(f"features-{n:05d}.safetensors" for n in range(count)), INDEX_NAME]


def test_torchrun_processes_write_what_one_process_writes(runner, tmp_path, inputs):
    processes = 3  # 10 inputs over 3 processes: uneven shares (two processes are run reading stdin, below)
    expected = _one_process(runner, tmp_path, inputs, threads=cpu_threads(Part(0, processes, 0, processes)))
    folder = tmp_path / "feats"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            str(processes),
            "-m",
            "hookcli",
            *ARGS,
            "-o",
            f"{folder}/",
            *inputs,
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"{folder}/index.jsonl\n"  # said once, by the first process, when the folder is complete
    assert "Error" not in done.stderr and "Continuing" not in done.stderr, done.stderr
    _check_folder(folder, inputs, expected)


def test_torchrun_processes_given_different_inputs_are_refused_by_each(tmp_path, inputs):
    script = tmp_path / "ranks.py"
    script.write_text(
        "import os, sys\n"
        "from hookcli.cli import main\n"
        "inputs = sys.argv[1:] if os.environ['RANK'] == '0' else sys.argv[2:]\n"
        f"main([*{ARGS!r}, '-o', {str(tmp_path / 'feats')!r} + '/', *inputs])\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(script), *inputs],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode != 0
    assert (
        "Error: torchrun's process 1 runs another command than process 0 (it differs in: inputs, "
        "inputs_sha256). Hint: give every process the same command and inputs"
    ) in done.stderr, done.stderr
    assert not (tmp_path / "feats" / INDEX_NAME).exists()


def test_torchrun_processes_share_the_list_rank_0_reads_from_stdin(runner, tmp_path, inputs):
    expected = _one_process(runner, tmp_path, inputs, threads=cpu_threads(Part(0, 2, 0, 2)))
    folder = tmp_path / "feats"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "2",
            "-m",
            "hookcli",
            *ARGS,
            "-o",
            f"{folder}/",
            "-",
        ],
        input="\n".join(inputs) + "\n",
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    _check_folder(folder, inputs, expected)


def test_parts_and_plain_shells_on_one_folder_write_what_one_process_writes(tmp_path, inputs, expected):
    folder = tmp_path / "feats"
    commands = [[*ARGS, "--part", "1/2"], [*ARGS, "--part", "2/2"], ARGS]
    runs = [
        subprocess.Popen(
            [sys.executable, "-m", "hookcli", *args, "-o", f"{folder}/", *inputs],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for args in commands
    ]
    results = [(run.wait(timeout=300), run.stdout.read(), run.stderr.read()) for run in runs]
    assert [code for code, _, _ in results] == [0, 0, 0], results
    # The last to finish says where the rows are; one that leaves others working says so instead.
    for _, out, err in results:
        assert out in ("", f"{folder}/index.jsonl\n")
        assert (out == "") == ("other processes are writing the rest" in err), (out, err)
    assert any(out for _, out, _ in results)
    _check_folder(folder, inputs, expected)


def test_killed_processes_lose_only_their_unfinished_shards_and_another_count_finishes(
    runner, tmp_path, inputs, make_image
):
    # 16 shards: a busy machine may be slow to see the second listed, and the processes must not finish meanwhile.
    inputs = inputs + [
        str(make_image(tmp_path / "imgs" / f"{i:02d}.png", size=(44, 40), seed=i)) for i in range(11, 31)
    ]
    folder = tmp_path / "feats"
    slow = [*ARGS[:-5], "-b", "1", "-q", "--shard-size", "2"]  # one image a batch: the processes are mid-run for longer
    first = [
        subprocess.Popen(
            [sys.executable, "-m", "hookcli", *slow, "--part", f"{k}/2", "-o", f"{folder}/", *inputs],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        for k in (1, 2)
    ]
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and len(read_index(folder)[1] if (folder / INDEX_NAME).exists() else []) < 2:
        assert all(run.poll() is None for run in first), [run.stderr.read() for run in first]
        time.sleep(0.02)
    for run in first:
        run.send_signal(signal.SIGKILL)
        run.wait(timeout=60)
    listed = [entry["shard"] for entry in read_index(folder)[1]]
    assert 2 <= len(listed) < 16, listed
    relaunched = [
        subprocess.Popen(
            [sys.executable, "-m", "hookcli", *slow, "-o", f"{folder}/", *inputs],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    results = [(run.wait(timeout=300), run.stderr.read()) for run in relaunched]
    assert [code for code, _ in results] == [0, 0, 0], results
    # The killed processes held claims on the shards they were computing: the new ones took them over, saying so.
    assert re.search(
        r"Note: shard \d+ was claimed by process \d+ on .+, which has ended: this process computes it",
        "".join(err for _, err in results),
    ), results
    _check_folder(folder, inputs, _one_process(runner, tmp_path, inputs, batch="1"))


# -- claims ------------------------------------------------------------------------------------------


def _claim_file(folder, number, host, pid, age, since=None):
    path = folder / CLAIMS / f"{number:05d}"
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps({"host": host, "pid": pid, "since": time.time() - age if since is None else since}))
    os.utime(path, (time.time() - age, time.time() - age))


def test_a_claim_is_taken_over_only_from_a_gone_or_silent_owner(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    here = socket.gethostname()
    _claim_file(tmp_path, 0, here, dead.pid, 1)  # its process has ended
    _claim_file(tmp_path, 1, "elsewhere", 12345, 1)  # alive as far as anyone here can tell
    _claim_file(tmp_path, 2, "elsewhere", 12345, 121)  # silent past the timeout
    _claim_file(tmp_path, 3, here, os.getppid(), 1)  # a live process on this host
    (tmp_path / CLAIMS / "00004").write_text("{not json")  # unreadable, and fresh
    notes = []
    lock, claims = FolderLock(tmp_path, str(tmp_path)), Claims(tmp_path, timeout=120, on_note=notes.append)
    with lock.held():
        assert [claims.take(n) for n in range(6)] == [True, False, True, False, False, True]
    assert notes == [
        f"shard 0 was claimed by process {dead.pid} on {here}, which has ended: this process computes it",
        "shard 2 was claimed by process 12345 on elsewhere, silent for 121 s: this process computes it",
    ]
    assert json.loads((tmp_path / CLAIMS / "00000").read_text())["pid"] == os.getpid()
    claims.release_all(lock)
    lock.close()
    assert sorted(p.name for p in (tmp_path / CLAIMS).iterdir()) == ["00001", "00003", "00004"]


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="start times are read from Linux's /proc")
def test_a_claim_whose_process_id_another_process_has_now_is_taken_over(tmp_path):
    here, alive = socket.gethostname(), subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        time.sleep(0.5)
        _claim_file(tmp_path, 0, here, os.getpid(), 1, since=0)  # this process's id, made long before it started
        _claim_file(tmp_path, 1, here, alive.pid, 1, since=time.time() - 60)  # made before that process started
        _claim_file(tmp_path, 2, here, alive.pid, 1, since=time.time())  # made by it
        notes = []
        lock, claims = FolderLock(tmp_path, str(tmp_path)), Claims(tmp_path, timeout=120, on_note=notes.append)
        with lock.held():
            assert [claims.take(n) for n in range(3)] == [True, True, False]
            assert claims.take(0)  # its own, now
        assert notes == [
            f"shard 0 was claimed by process {os.getpid()} on {here}, which has ended (its id is now another "
            "process's): this process computes it",
            f"shard 1 was claimed by process {alive.pid} on {here}, which has ended (its id is now another "
            "process's): this process computes it",
        ]
        claims.release_all(lock)
        lock.close()
    finally:
        alive.kill()
        alive.wait()


def test_the_heartbeat_keeps_a_claim_fresh(tmp_path):
    lock, claims = FolderLock(tmp_path, str(tmp_path)), Claims(tmp_path, timeout=0.4)
    with lock.held():
        claims.take(7)
    path = tmp_path / CLAIMS / "00007"
    os.utime(path, (time.time() - 100, time.time() - 100))
    claims.start()
    deadline = time.monotonic() + 30  # a beat comes every 0.1 s; a loaded machine may run the thread late
    while time.monotonic() < deadline and time.time() - path.stat().st_mtime > 1:
        time.sleep(0.05)
    claims.stop()
    assert time.time() - path.stat().st_mtime < 1
    claims.release_all(lock)
    lock.close()


@pytest.mark.parametrize("value", ["0", "-3", "soon", "nan", "1e9"])
def test_a_claim_timeout_that_is_not_a_positive_number_is_refused(monkeypatch, tmp_path, value):
    monkeypatch.setenv("HOOKCLI_CLAIM_TIMEOUT", value)
    with pytest.raises(UsageProblem) as caught:
        Claims(tmp_path)
    assert str(caught.value) == (
        f"HOOKCLI_CLAIM_TIMEOUT must be a number of seconds from 1 to 86400, not '{value}'. "
        "Hint: unset it for the default of 120 s"
    )


# -- parts -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("environ", "part"),
    [
        ({}, None),
        ({"RANK": "0", "WORLD_SIZE": "1"}, None),
        ({"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4"}, Part(5, 8, 1, 4, "torchrun")),
        (
            {
                "SLURM_PROCID": "3",
                "SLURM_NTASKS": "6",
                "SLURM_LOCALID": "0",
                "SLURM_TASKS_PER_NODE": "3(x2)",
                "SLURM_NODEID": "1",
            },
            Part(3, 6, 0, 3, "srun"),
        ),
        (
            {
                "SLURM_ARRAY_TASK_ID": "12",
                "SLURM_ARRAY_TASK_COUNT": "4",
                "SLURM_ARRAY_TASK_MIN": "10",
                "SLURM_ARRAY_TASK_STEP": "1",
                "SLURM_NTASKS": "1",
            },
            Part(2, 4, 0, 1, "a Slurm job array"),
        ),
        (
            {
                "SLURM_ARRAY_TASK_ID": "1",
                "SLURM_ARRAY_TASK_COUNT": "3",
                "SLURM_ARRAY_TASK_MIN": "0",
                "SLURM_PROCID": "1",
                "SLURM_NTASKS": "2",
                "SLURM_LOCALID": "1",
                "SLURM_TASKS_PER_NODE": "2",
            },
            Part(3, 6, 1, 2, "a Slurm job array"),
        ),
    ],
)
def test_the_part_comes_from_the_launcher(environ, part):
    assert detect_part(environ) == part


@pytest.mark.parametrize(
    ("environ", "part"),
    [
        ({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1"}, Part(1, 2, 1, 2, "torchrun")),
        ({"SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_LOCALID": "1"}, Part(1, 2, 1, 2, "srun")),
    ],
)
def test_a_local_count_left_unsaid_is_at_least_the_local_number(environ, part):
    assert detect_part(environ) == part


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        ({"RANK": "2", "WORLD_SIZE": "2"}, "torchrun says this is process 2 (counted from 0) of 2, which cannot be"),
        (
            {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "3", "LOCAL_WORLD_SIZE": "2"},
            "torchrun says this is process 3 (counted from 0) of the 2 on this machine, which cannot be",
        ),
        ({"SLURM_PROCID": "1", "SLURM_NTASKS": "two"}, "$SLURM_NTASKS is 'two', not a whole number"),
    ],
)
def test_a_launcher_environment_that_cannot_be_is_refused(environ, message):
    with pytest.raises(UsageProblem) as caught:
        detect_part(environ)
    assert caught.value.message == message


def test_a_bad_claim_timeout_is_refused_before_the_model_loads(runner, tmp_path, inputs, monkeypatch, no_model):
    monkeypatch.setenv("HOOKCLI_CLAIM_TIMEOUT", "abc")
    result = runner.invoke(main, [*ARGS, "-o", f"{tmp_path}/feats/", *inputs])
    assert (result.exit_code, result.stderr) == (
        2,
        "Error: HOOKCLI_CLAIM_TIMEOUT must be a number of seconds from 1 "
        "to 86400, not 'abc'. Hint: unset it for the default of 120 s\n",
    )
    assert not (tmp_path / "feats").exists()


@pytest.mark.parametrize("text", ["0/4", "5/4", "1", "a/b", "1/0", "-1/2"])
def test_a_part_out_of_range_is_refused(runner, tmp_path, inputs, text):
    result = runner.invoke(main, [*ARGS, "--part", text, "-o", f"{tmp_path}/feats/", *inputs])
    assert (result.exit_code, result.stderr) == (
        2,
        (
            f"Error: --part takes K/N with 1 <= K <= N (the K-th of N processes), not '{text}'. Hint: for example "
            "--part 1/4 … --part 4/4 for four processes\n"
        ),
    )


def test_a_part_needs_a_folder_output(runner, tmp_path, inputs):
    result = runner.invoke(main, [*ARGS[:-2], "--part", "1/2", "-o", f"{tmp_path}/x.safetensors", *inputs])
    assert (result.exit_code, result.stderr) == (
        2,
        "Error: --part applies to a shard folder output (-o DIR/). Hint: the processes share the work of one folder\n",
    )


def test_launched_processes_refuse_to_each_write_one_whole_file(runner, tmp_path, inputs, monkeypatch, no_model):
    monkeypatch.setenv("SLURM_PROCID", "1")
    monkeypatch.setenv("SLURM_NTASKS", "4")
    result = runner.invoke(main, [*ARGS[:-2], "-o", f"{tmp_path}/x.safetensors", *inputs])
    assert (result.exit_code, result.stderr) == (
        2,
        (
            f"Error: 4 processes started by srun would each write all of '{tmp_path}/x.safetensors'. "
            "Hint: write a shard "
            "folder (-o DIR/): they share its work\n"
        ),
    )


def test_parse_part_and_cpu_threads():
    assert parse_part(" 2 / 3 ") == Part(1, 3)
    assert cpu_threads(None) is None and cpu_threads(Part(0, 2)) is None
    assert cpu_threads(Part(0, 8, 0, 2)) == max(1, len(os.sched_getaffinity(0)) // 2)


def test_a_process_pinned_to_cores_of_its_own_takes_them_all(monkeypatch):
    def unknown(pid):
        raise PermissionError(1, "Operation not permitted")

    cores = {0: set(range(4, 8)), os.getppid(): set(range(16))}  # the launcher had 16 cores and gave this rank 4
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: cores[pid] if pid in cores else unknown(pid))
    assert cpu_threads(Part(1, 4, 1, 4)) == 4
    cores[0] = set(range(16))  # unpinned: the 4 processes on this machine share its 16 cores
    assert cpu_threads(Part(1, 4, 1, 4)) == 4
    cores[0] = cores[os.getppid()] = set(range(8))  # a job's 8 cores, both alike: shared
    assert cpu_threads(Part(1, 4, 1, 4)) == 2
    cores[0] = set(range(2))
    assert cpu_threads(Part(1, 4, 1, 4)) == 2  # pinned to 2 of the launcher's 8

    from hookcli.run import launch

    cores[0] = cores[os.getppid()] = set(range(4, 8))  # a shell between: srun bash -c '…', pinned alike
    cores[4242] = set(range(16))  # the launcher above it
    monkeypatch.setattr(launch, "_parent_of", lambda pid: 4242 if pid == os.getppid() else None)
    assert cpu_threads(Part(1, 4, 1, 4)) == 4
    cores[0] = set(range(2))
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: cores[0] if pid == 0 else unknown(pid))
    assert cpu_threads(Part(1, 4, 1, 4)) == 1  # the launcher's cores unknown: the process's 2 are shared by 4


def test_decode_workers_forked_while_the_lock_is_held_do_not_keep_it(tmp_path, inputs):
    # A worker inherits the lock's open file; releasing by closing alone left the flock held and the run waited forever.
    run = subprocess.run(
        [sys.executable, "-m", "hookcli", *ARGS, "-j", "1", "-o", f"{tmp_path}/feats/", *inputs],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert (run.returncode, run.stderr) == (0, "")
    assert [entry["shard"] for entry in read_index(tmp_path / "feats")[1]] == list(range(6))


_FORKS_THEN_DIES = """
import os, sys, time
from pathlib import Path
from hookcli.storage.claims import FolderLock
from hookcli.run.batches import _die_with_run
folder = Path(sys.argv[1])
run = os.getpid()
lock = FolderLock(folder, "x")
lock.acquire()
for dies_with_parent in (False, True):
    if os.fork() == 0:
        if dies_with_parent:
            _die_with_run(run)
        (folder / f"child-{int(dies_with_parent)}").write_text(str(os.getpid()))
        time.sleep(60)
        os._exit(0)
while len(list(folder.glob("child-*"))) < 2:
    time.sleep(0.01)
os.kill(os.getpid(), 9)  # holding the lock, as a run killed while it records a shard
"""


def test_children_of_a_killed_process_neither_keep_its_folder_lock_nor_outlive_it_as_decode_workers(tmp_path):
    import fcntl

    from hookcli.storage.claims import LOCK_NAME

    subprocess.run([sys.executable, "-c", _FORKS_THEN_DIES, str(tmp_path)], timeout=60)
    survivor, worker = (int((tmp_path / f"child-{k}").read_text()) for k in (0, 1))

    def alive(pid):
        try:
            return "\tZ" not in Path(f"/proc/{pid}/status").read_text().split("State:")[1].splitlines()[0]
        except FileNotFoundError:
            return False

    try:
        with open(tmp_path / LOCK_NAME, "a") as handle:  # free, though a child forked while it was held lives on
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert alive(survivor)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and alive(worker):
            time.sleep(0.05)
        assert not alive(worker)  # a decode worker ends with the process that started it
    finally:
        for pid in (survivor, worker):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_a_late_process_of_a_run_with_grid_prints_the_folder_and_draws_nothing(extract_into, tmp_path, five_inputs):
    folder, pictures = tmp_path / "feats", tmp_path / "pictures"
    first = extract_into(folder, five_inputs, "--part", "1/2", "--grid", str(pictures))
    assert first.exit_code == 0, first.output
    drawn = {path.name: path.stat().st_mtime_ns for path in pictures.iterdir()}
    assert drawn and all(name.endswith(".png") for name in drawn)
    late = extract_into(folder, five_inputs, "--part", "2/2", "--grid", str(pictures))
    assert (late.exit_code, late.stdout) == (0, f"{folder}/index.jsonl\n"), late.output
    assert {path.name: path.stat().st_mtime_ns for path in pictures.iterdir()} == drawn
    alone = extract_into(folder, five_inputs, "--grid", str(pictures))  # the command run again by itself: refused
    assert alone.exit_code == 2 and "already holds pictures of these layers" in alone.stderr
