"""Hostile launcher environments: a torchrun rendezvous nobody comes to (bounded, said, stoppable), absurd Slurm
task lists (counted without being written out), and bad join settings (refused before any work)."""

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from datetime import timedelta

import pytest

from hookcli.cli import main
from hookcli.errors import UsageProblem
from hookcli.run.launch import MAX_NODES, Part, detect_part
from hookcli.run.team import join_team

HINT = (
    "Hint: every process needs the same MASTER_ADDR, MASTER_PORT and WORLD_SIZE, and a RANK of its own from 0 to 1 "
    "(torchrun sets them); HOOKCLI_JOIN_TIMEOUT sets how many seconds to wait"
)


@pytest.fixture
def image(tmp_path, make_image):
    return make_image(tmp_path / "a.png", size=(40, 40))


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def extract_command(resnet18_args, tmp_path, image) -> list[str]:
    """``hookcli extract`` of ``image`` into tmp_path/feats/, as a process started by hand runs it."""
    return [
        sys.executable,
        "-m",
        "hookcli",
        *resnet18_args("extract", "-l", "fc", "-q", "-o", f"{tmp_path}/feats/", image),
    ]


def _rank(rank: int, port: int, timeout: str, command: list[str]) -> subprocess.Popen:
    """``command`` as process ``rank`` of 2 of a torchrun group at ``127.0.0.1:port`` that no other joins."""
    env = dict(
        os.environ,
        RANK=str(rank),
        WORLD_SIZE="2",
        LOCAL_RANK="0",
        LOCAL_WORLD_SIZE="1",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        HOOKCLI_JOIN_TIMEOUT=timeout,
    )
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


@pytest.mark.parametrize("rank", [0, 1])  # 0: hosts the rendezvous, nobody comes; 1: nothing listens
def test_a_rendezvous_nobody_comes_to_ends_after_the_join_timeout_with_one_line(tmp_path, extract_command, rank):
    port, started = _free_port(), time.monotonic()
    process = _rank(rank, port, "1", extract_command)
    out, err = process.communicate(timeout=120)
    assert time.monotonic() - started < 60  # a second of waiting, after the imports: not 30 days
    assert (process.returncode, out) == (1, "")
    assert err == (
        f"Error: rank {rank} of 2 waited 1 s for torchrun's other processes at 127.0.0.1:{port}, and not "
        f"all joined. {HINT}\n"
    )
    assert not (tmp_path / "feats").exists()


@pytest.mark.parametrize(("rank", "stop", "said"), [(0, signal.SIGTERM, "SIGTERM"), (1, signal.SIGINT, "Ctrl-C")])
def test_the_wait_is_said_within_seconds_and_a_signal_ends_it_with_one_line(
    extract_command, next_line, rank, stop, said
):
    port = _free_port()
    process = _rank(rank, port, "600", extract_command)
    try:
        note = next_line(process.stderr, 60)
        assert note == (
            f"Note: waiting for torchrun's other 1 process at 127.0.0.1:{port} (this is rank {rank} of 2), "
            "for up to 600 s (HOOKCLI_JOIN_TIMEOUT)\n"
        )
        sent = time.monotonic()
        process.send_signal(stop)
        out, err = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
    assert time.monotonic() - sent < 10
    assert (process.returncode, out) == (1, "")
    assert err == (
        f"Error: stopped ({said}) while rank {rank} of 2 waited for torchrun's other processes at "
        f"127.0.0.1:{port}. {HINT}\n"
    )


def test_two_processes_started_by_hand_join_and_share_the_folder(tmp_path, extract_command):
    port = _free_port()
    processes = [_rank(rank, port, "120", extract_command) for rank in (1, 0)]  # the client first: it waits
    results = [(p.communicate(timeout=300), p.returncode) for p in processes]
    assert results == [(("", ""), 0), ((f"{tmp_path}/feats/index.jsonl\n", ""), 0)]  # nothing logged by torch


def test_only_torchrun_processes_join_a_gloo_group_waiting_the_join_timeout_then_no_limit(monkeypatch):
    import torch.distributed as dist

    for name, text in {"MASTER_ADDR": "localhost", "MASTER_PORT": "29500", "HOOKCLI_JOIN_TIMEOUT": "42"}.items():
        monkeypatch.setenv(name, text)
    calls = []

    class Store:
        def set_timeout(self, timeout):
            calls.append(("store", timeout))

    def rendezvous(url, rank, world_size, timeout):
        calls.append(("rendezvous", url, rank, world_size, timedelta(seconds=41) < timeout <= timedelta(seconds=42)))
        return iter([(Store(), rank, world_size)])

    monkeypatch.setattr(dist, "rendezvous", rendezvous)
    monkeypatch.setattr(dist, "PrefixStore", lambda prefix, store: store)
    monkeypatch.setattr(
        dist, "init_process_group", lambda backend, **options: calls.append((backend, options["timeout"]))
    )
    assert join_team(Part(0, 2, launcher="srun")) is None
    assert join_team(Part(0, 2, launcher="torchrun")) is None  # no address: started by hand without MASTER_ADDR
    team = join_team(Part(0, 2, local_index=0, local_count=2, launcher="torchrun", address=("localhost", 29500)))
    assert team.part.index == 0
    assert calls == [("rendezvous", "env://", 0, 2, True), ("gloo", timedelta(days=30)), ("store", timedelta(days=30))]


def test_a_process_that_ends_before_the_final_barrier_is_said_in_hookclis_words(monkeypatch):
    import torch.distributed as dist

    from hookcli.run.team import Team, TeamError

    def closed():
        raise RuntimeError(
            "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:561] Connection closed by peer "
            "[127.0.0.1]:17610\nThis is typically caused by a remote worker crashing."
        )

    monkeypatch.setattr(Team, "_join", lambda self: None)
    monkeypatch.setenv("HOOKCLI_JOIN_TIMEOUT", "42")
    team = Team(Part(0, 2, local_index=0, local_count=2, launcher="torchrun", address=("localhost", 29500)))
    monkeypatch.setattr(dist, "barrier", closed)
    with pytest.raises(TeamError) as caught:
        team.barrier()
    assert str(caught.value) == (
        "one of torchrun's 2 processes ended before the run's end (rank 0 heard: Connection closed by peer "
        "[127.0.0.1]:17610). Hint: its own output says why; the same command run again continues what is not done"
    )


_SHARE = textwrap.dedent("""
    from hookcli.run.launch import detect_part
    from hookcli.run.team import Team

    def read_stdin():
        raise OSError("stdin went away")

    team = Team(detect_part())
    try:
        team.share(read_stdin)
    except BaseException as err:
        print(type(err).__name__, err, sep=": ")
    finally:
        team.close()
""")


def test_an_error_of_rank_0_while_it_computes_what_it_shares_ends_every_rank(tmp_path):
    env = dict(
        os.environ, WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), HOOKCLI_JOIN_TIMEOUT="120"
    )
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", _SHARE],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**env, "RANK": str(rank)},
        )
        for rank in (1, 0)
    ]
    try:
        results = [(p.communicate(timeout=120), p.returncode) for p in processes]
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
    assert results == [
        (
            (
                "TeamError: rank 0 of 2 failed before handing rank 1 its share: OSError: stdin went away. "
                "Hint: rank 0's own error says more\n",
                "",
            ),
            0,
        ),
        (("OSError: stdin went away\n", ""), 0),
    ]


@pytest.mark.parametrize("value", ["0", "0.5", "-3", "soon", "nan", "inf", "86401"])
def test_a_join_timeout_out_of_range_is_refused_before_the_model_loads(
    runner, resnet18_args, image, tmp_path, monkeypatch, no_model, value
):
    for name, text in {
        "RANK": "0",
        "WORLD_SIZE": "2",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "1",
        "HOOKCLI_JOIN_TIMEOUT": value,
    }.items():
        monkeypatch.setenv(name, text)
    result = runner.invoke(main, resnet18_args("extract", "-l", "fc", "-o", f"{tmp_path}/feats/", str(image)))
    assert (result.exit_code, result.stderr) == (
        2,
        (
            f"Error: HOOKCLI_JOIN_TIMEOUT must be a number of seconds from 1 to 86400, not '{value}'. "
            "Hint: unset it for "
            "the default of 300 s\n"
        ),
    )


@pytest.mark.parametrize(
    ("given", "message"),
    [
        (
            {},
            "MASTER_ADDR is set but MASTER_PORT is not. Hint: torchrun sets both; by hand, give every process the same "
            "port of rank 0's machine",
        ),
        (
            {"MASTER_PORT": "70000"},
            "$MASTER_PORT is 70000, not a port (1 to 65535). Hint: torchrun sets it; by hand, give every process the "
            "same port of rank 0's machine",
        ),
        (
            {"MASTER_PORT": "29500", "HOOKCLI_JOIN_TIMEOUT": "soon"},
            "HOOKCLI_JOIN_TIMEOUT must be a number of seconds from 1 to 86400, not 'soon'. Hint: unset it for the "
            "default of 300 s",
        ),
    ],
)
def test_a_rendezvous_setting_that_is_wrong_is_refused_before_torch_is_imported(
    resnet18_args, image, tmp_path, given, message
):
    env = dict(os.environ, RANK="1", WORLD_SIZE="2", MASTER_ADDR="127.0.0.1")
    env.pop("MASTER_PORT", None)
    env.pop("HOOKCLI_JOIN_TIMEOUT", None)
    script = (
        "import sys\nfrom hookcli.cli import main\n"
        "try:\n    main(sys.argv[1:])\nexcept SystemExit as end:\n    print('torch' in sys.modules, end.code)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, *resnet18_args("extract", "-l", "fc", "-o", f"{tmp_path}/f/", image)],
        capture_output=True,
        text=True,
        env={**env, **given},
        timeout=120,
    )
    assert (done.stdout, done.stderr) == ("False 2\n", f"Error: {message}\n")


# -- Slurm's task lists ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "piece"),
    [
        ("2(x999999999999)", "2(x999999999999)"),
        ("2(x200000000)", "2(x200000000)"),
        ("1,999999999(x2)", "999999999(x2)"),
        ("4(x" + "9" * 5000 + ")", "4(x" + "9" * 37 + "…"),
    ],
)
def test_an_absurd_slurm_task_list_is_refused_naming_the_variable(
    runner, resnet18_args, image, tmp_path, monkeypatch, no_model, text, piece
):
    message = (
        f"$SLURM_TASKS_PER_NODE says '{piece}', more than hookcli takes (at most 100,000 tasks on each of at "
        "most 1,000,000 nodes)"
    )
    with pytest.raises(UsageProblem) as caught:
        detect_part({"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_TASKS_PER_NODE": text})
    assert caught.value.message == message
    for name, value in {"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_TASKS_PER_NODE": text}.items():
        monkeypatch.setenv(name, value)
    result = runner.invoke(main, resnet18_args("extract", "-l", "fc", "-o", f"{tmp_path}/feats/", str(image)))
    assert (result.exit_code, result.stderr) == (
        2,
        f"Error: {message}. Hint: check the launcher's environment variables\n",
    )


_COUNT = textwrap.dedent("""
    import resource, sys
    resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))  # a list written out would need tens of GB
    from hookcli.run.launch import detect_part
    part = detect_part({"SLURM_PROCID": "1", "SLURM_NTASKS": "4", "SLURM_LOCALID": "1", "SLURM_NODEID": sys.argv[2],
                        "SLURM_TASKS_PER_NODE": sys.argv[1]})
    print(part.local_count)
""")


def test_a_long_slurm_task_list_is_counted_without_being_written_out():
    many = ",".join([f"2(x{MAX_NODES})"] * 3000)  # three billion nodes
    for node, tasks in [(0, 2), (3000 * MAX_NODES - 1, 2), (3000 * MAX_NODES, 7)]:
        done = subprocess.run(
            [sys.executable, "-c", _COUNT, f"{many},7(x2)", str(node)], capture_output=True, text=True, timeout=120
        )
        assert (done.returncode, done.stdout, done.stderr) == (0, f"{tasks}\n", "")
