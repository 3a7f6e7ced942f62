"""Who this process is among many: ``--part K/N``, torchrun, Slurm tasks and Slurm job arrays.

hookcli has no scheduler of its own: the processes a launcher starts share
one shard folder through claims (:mod:`hookcli.storage.claims`), and a
:class:`Part` only says which block of shards a process takes first and
which GPU it uses. Under torchrun the processes also join a process group
(:class:`Team`, gloo on any device) for what needs one: agreeing
that every process runs the same command, handing rank 0's stdin list to
the others, and a final barrier, so that every process returns when the
folder is complete.

Joining waits for every process at ``MASTER_ADDR:MASTER_PORT`` for at most
:func:`join_timeout` seconds (:data:`DEFAULT_JOIN_TIMEOUT`, or
``$HOOKCLI_JOIN_TIMEOUT``), says so after a few seconds, and stops on
Ctrl-C or SIGTERM; only the final barrier waits without a limit a run could
reach.

>>> parse_part("3/8")
Part(index=2, count=8, local_index=0, local_count=1, launcher='--part')
>>> detect_part({"RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"})
Part(index=1, count=4, local_index=1, local_count=2, launcher='torchrun')
>>> detect_part({"SLURM_ARRAY_TASK_ID": "7", "SLURM_ARRAY_TASK_COUNT": "10", "SLURM_ARRAY_TASK_MIN": "1"}).index
6
"""

from __future__ import annotations

import datetime
import os
import re
import socket
import threading
import time
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from hookcli.console import Terminated
from hookcli.errors import HookcliError, UsageProblem, first_line, seconds_from_environment
from hookcli.storage.fileformat import identity_differences

__all__ = [
    "DEFAULT_JOIN_TIMEOUT",
    "JOIN_TIMEOUT_RANGE",
    "MAX_NODES",
    "MAX_TASKS_PER_NODE",
    "Part",
    "Team",
    "TeamError",
    "cpu_threads",
    "detect_part",
    "join_team",
    "join_timeout",
    "local_device",
    "parse_part",
]

#: Seconds torchrun's processes wait for each other to join their group.
DEFAULT_JOIN_TIMEOUT = 300.0
#: The seconds ``$HOOKCLI_JOIN_TIMEOUT`` may say: from one second to a day.
JOIN_TIMEOUT_RANGE = (1.0, 86400.0)
#: The most nodes, and tasks on one node, that ``SLURM_TASKS_PER_NODE`` may say (far above any cluster's).
MAX_NODES = 1_000_000
MAX_TASKS_PER_NODE = 100_000
#: A long run leaves early finishers waiting at the final barrier: no timeout a run could reach.
_BARRIER_TIMEOUT = datetime.timedelta(days=30)
#: Seconds of waiting to join before saying so.
_WAIT_NOTE_AFTER = 3.0
#: Seconds past the join timeout after which the wait ends even if torch has not given up (a hung connection).
_JOIN_GRACE = 10.0


@dataclass(frozen=True)
class Part:
    """Process ``index`` (from 0) of ``count``; ``local_index`` of ``local_count`` on this machine."""

    index: int
    count: int
    local_index: int = 0
    local_count: int = 1
    launcher: str = "--part"


_PART = re.compile(r"\s*(\d+)\s*/\s*(\d+)\s*")


def parse_part(text: str) -> Part:
    """``K/N`` (the K-th of N parts, from 1) as a :class:`Part`; :class:`UsageProblem` when it is not one."""
    found = _PART.fullmatch(str(text))
    if not found or not 1 <= int(found.group(1)) <= int(found.group(2)):
        raise UsageProblem(
            f"--part takes K/N with 1 <= K <= N (the K-th of N processes), not '{text}'",
            hint="for example --part 1/4 … --part 4/4 for four processes",
        )
    return Part(int(found.group(1)) - 1, int(found.group(2)))


def detect_part(environ: Mapping[str, str] | None = None) -> Part | None:
    """The part a launcher gave this process (torchrun's ``RANK``/``WORLD_SIZE``; Slurm's ``SLURM_PROCID``/
    ``SLURM_NTASKS`` and job arrays' ``SLURM_ARRAY_TASK_ID``/``SLURM_ARRAY_TASK_COUNT``), or None for one process.

    A task of a job array run with several tasks is part ``array index × tasks + task``.
    """
    env = os.environ if environ is None else environ
    if "RANK" in env and "WORLD_SIZE" in env:
        rank, world = _number(env, "RANK"), _number(env, "WORLD_SIZE")
        local = _number(env, "LOCAL_RANK", 0)
        part = Part(rank, world, local, _number(env, "LOCAL_WORLD_SIZE", local + 1), "torchrun")
    else:
        task, tasks = _number(env, "SLURM_PROCID", 0), _number(env, "SLURM_NTASKS", 1)
        local, local_count = _number(env, "SLURM_LOCALID", 0), _tasks_on_this_node(env)
        launcher = "srun"
        if "SLURM_ARRAY_TASK_ID" in env and "SLURM_ARRAY_TASK_COUNT" in env:
            step = max(1, _number(env, "SLURM_ARRAY_TASK_STEP", 1))
            position = (_number(env, "SLURM_ARRAY_TASK_ID") - _number(env, "SLURM_ARRAY_TASK_MIN", 0)) // step
            task, tasks = position * tasks + task, _number(env, "SLURM_ARRAY_TASK_COUNT") * tasks
            launcher = "a Slurm job array"
        part = Part(task, tasks, local, local_count, launcher)
    if part.count <= 1:
        return None
    if not 0 <= part.index < part.count:
        raise UsageProblem(
            f"{part.launcher} says this is process {part.index} (counted from 0) of {part.count}, which cannot be",
            hint="check the launcher's environment variables",
        )
    if not 0 <= part.local_index < part.local_count:
        raise UsageProblem(
            f"{part.launcher} says this is process {part.local_index} (counted from 0) of the "
            f"{part.local_count} on this machine, which cannot be",
            hint="check the launcher's environment variables",
        )
    return part


def _number(env: Mapping[str, str], name: str, default: int | None = None) -> int:
    text = env.get(name)
    if text is None and default is not None:
        return default
    try:
        return int(str(text).strip())
    except ValueError:
        raise UsageProblem(
            f"${name} is '{text}', not a whole number", hint="hookcli reads it to know which process it is"
        ) from None


def _tasks_on_this_node(env: Mapping[str, str]) -> int:
    """Slurm's tasks on this node, from ``SLURM_TASKS_PER_NODE`` (``2(x3),1``: 2 on each of 3 nodes, then 1) and
    ``SLURM_NODEID``, counted along the list without writing it out (it may say any number of nodes)."""
    name = "SLURM_STEP_TASKS_PER_NODE" if "SLURM_STEP_TASKS_PER_NODE" in env else "SLURM_TASKS_PER_NODE"
    text = env.get(name, "")
    node = _number(env, "SLURM_NODEID", 0)
    found_tasks = None
    for piece in text.split(","):
        found = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", piece)
        if not found:
            continue
        tasks, nodes = found.group(1), found.group(2) or "1"
        if not (_at_most(tasks, MAX_TASKS_PER_NODE) and _at_most(nodes, MAX_NODES)):
            shown = piece.strip() if len(piece.strip()) <= 40 else piece.strip()[:40] + "…"
            raise UsageProblem(
                f"${name} says '{shown}', more than hookcli takes (at most {MAX_TASKS_PER_NODE:,} "
                f"tasks on each of at most {MAX_NODES:,} nodes)",
                hint="check the launcher's environment variables",
            )
        if found_tasks is None and 0 <= node < int(nodes):
            found_tasks = int(tasks)
        node -= int(nodes)
    if found_tasks is not None:
        return found_tasks
    return _number(env, "SLURM_LOCALID", 0) + 1  # not said: at least as many as this task's local number


def _at_most(digits: str, limit: int) -> bool:
    # Counted digits first: int() refuses thousands of them, and is slow on fewer.
    return len(digits.lstrip("0")) <= len(str(limit)) and int(digits) <= limit


def local_device(part: Part | None, device: str) -> str:
    """The device this process uses: ``auto`` or ``cuda`` become ``cuda:<local index>`` (modulo the GPUs it
    sees, so one visible GPU per task also works) when several processes share a machine with GPUs."""
    if part is None or part.local_count <= 1 or device not in ("auto", "cuda"):
        return device
    import torch

    if not torch.cuda.is_available():
        return device
    return f"cuda:{part.local_index % torch.cuda.device_count()}"


def cpu_threads(part: Part | None) -> int | None:
    """Threads for each of the processes sharing this machine's cores on the CPU (None: leave torch's choice)."""
    if part is None or part.local_count <= 1:
        return None
    return max(1, (os.cpu_count() or 1) // part.local_count)


class TeamError(HookcliError):
    """torchrun's processes could not form their group: not all came in time, or the wait was stopped (exit 1)."""


def join_timeout() -> float:
    """Seconds torchrun's processes wait for all of them to join their group (``$HOOKCLI_JOIN_TIMEOUT``)."""
    return seconds_from_environment("HOOKCLI_JOIN_TIMEOUT", DEFAULT_JOIN_TIMEOUT, *JOIN_TIMEOUT_RANGE)


class Team:
    """torchrun's processes in one gloo process group, for agreeing on the run and the final barrier.

    gloo whatever the device: the group only passes small objects and waits at a barrier, which gloo does over the
    network without tying a process to a GPU. NCCL would refuse two processes on one GPU, and processes that chose
    backends by their own machine's GPUs could disagree and wait for each other forever.

    Joining waits at most :func:`join_timeout` seconds for every process at ``MASTER_ADDR:MASTER_PORT``, and raises
    :class:`TeamError` when not all came, or on Ctrl-C or SIGTERM meanwhile.
    """

    def __init__(self, part: Part) -> None:
        self.part = part
        # Checked before torch loads.
        self._address, self._port = os.environ.get("MASTER_ADDR", ""), _master_port(os.environ)
        self._timeout = join_timeout()
        import torch.distributed as dist

        self._dist = dist
        self._join()

    def _join(self) -> None:
        """Join in a thread: torch's rendezvous blocks in C++, where neither Ctrl-C nor SIGTERM reaches this process's
        Python handlers; this (main) thread waits for it, says why it waits, and hears them."""
        deadline = time.monotonic() + self._timeout
        outcome: list[BaseException | None] = []
        worker = threading.Thread(
            target=self._rendezvous, args=(deadline, outcome), name="hookcli-join", daemon=True
        )  # left blocked in torch when the wait is given up
        worker.start()
        try:
            worker.join(_WAIT_NOTE_AFTER)
            if worker.is_alive():
                others = self.part.count - 1
                warnings.warn(
                    f"waiting for torchrun's other {others} process{'es' if others > 1 else ''} at "
                    f"{self._address}:{self._port} (this is rank {self.part.index} of {self.part.count}), "
                    f"for up to {self._timeout:g} s (HOOKCLI_JOIN_TIMEOUT)",
                    stacklevel=2,
                )
                worker.join(max(0.0, deadline + _JOIN_GRACE - time.monotonic()))
        except (KeyboardInterrupt, Terminated) as stop:
            signal_name = "SIGTERM" if isinstance(stop, Terminated) else "Ctrl-C"
            raise TeamError(
                f"stopped ({signal_name}) while rank {self.part.index} of {self.part.count} waited for "
                f"torchrun's other processes at {self._address}:{self._port}",
                hint=self._variables_hint(),
            ) from None
        failure = outcome[0] if outcome else TimeoutError()  # still in torch past the grace: given up on
        if failure is None:
            return
        if isinstance(failure, TimeoutError) or time.monotonic() >= deadline:
            raise TeamError(
                f"rank {self.part.index} of {self.part.count} waited {self._timeout:g} s for torchrun's "
                f"other processes at {self._address}:{self._port}, and not all joined",
                hint=self._variables_hint(),
            ) from None
        raise TeamError(
            f"rank {self.part.index} of {self.part.count} cannot join torchrun's other processes at "
            f"{self._address}:{self._port}: {first_line(failure)}",
            hint=self._variables_hint(),
        ) from None

    def _rendezvous(self, deadline: float, outcome: list) -> None:
        """Meet every process through the store at ``MASTER_ADDR:MASTER_PORT`` (rank 0 hosts it unless torchrun's
        agent does), then form the gloo group; ``outcome`` gets None, or what went wrong."""
        dist = self._dist
        try:
            if self.part.index > 0:
                _wait_until_listening(self._address, self._port, deadline)
            left = datetime.timedelta(seconds=max(1.0, deadline - time.monotonic()))
            store, rank, count = next(dist.rendezvous("env://", self.part.index, self.part.count, timeout=left))
            # The store's keys are shared with torchrun's agent (and the caller's own groups): the prefix torch uses.
            dist.init_process_group(
                "gloo",
                store=dist.PrefixStore("default_pg", store),
                rank=rank,
                world_size=count,
                timeout=_BARRIER_TIMEOUT,
            )
            store.set_timeout(_BARRIER_TIMEOUT)
            outcome.append(None)
        except BaseException as err:  # handed to the waiting thread, which raises it as one line
            outcome.append(err)

    def _variables_hint(self) -> str:
        last = self.part.count - 1
        return (
            f"every process needs the same MASTER_ADDR, MASTER_PORT and WORLD_SIZE, and a RANK of its own from 0 "
            f"to {last} (torchrun sets them); HOOKCLI_JOIN_TIMEOUT sets how many seconds to wait"
        )

    def share(self, compute: Callable[[], object]):
        """``compute()`` on rank 0, its value (or its error) on every rank."""
        box: list[Any] = [None]  # rank 0's ("value", value) or ("error", kind, message, hint), once broadcast
        if self.part.index == 0:
            try:
                box = [("value", compute())]
            except HookcliError as err:
                box = [("error", type(err), err.message, err.hint)]
        self._dist.broadcast_object_list(box, src=0)
        if box[0][0] == "error":
            _, kind, message, hint = box[0]
            raise kind(message, hint=hint)
        return box[0][1]

    def check_same(self, identity: Mapping) -> None:
        """Raise :class:`UsageProblem` on every rank unless every rank runs the same command on the same inputs."""
        everyone: list = [None] * self.part.count
        self._dist.all_gather_object(everyone, dict(identity))
        for rank, other in enumerate(everyone):
            differ = identity_differences(everyone[0], other)
            if differ:
                raise UsageProblem(
                    f"torchrun's process {rank} runs another command than process 0 (it differs in: "
                    f"{', '.join(differ)})",
                    hint="give every process the same command and inputs",
                )

    def barrier(self) -> None:
        self._dist.barrier()

    def close(self) -> None:
        if self._dist.is_initialized():
            self._dist.destroy_process_group()


def join_team(part: Part | None) -> Team | None:
    """Join torchrun's process group (:class:`Team`); None for other launchers, and where the caller's own program
    has a group already (hookcli leaves it alone)."""
    if part is None or part.launcher != "torchrun" or "MASTER_ADDR" not in os.environ:
        return None
    import torch.distributed as dist

    if dist.is_initialized():
        return None
    return Team(part)


def _master_port(env: Mapping[str, str]) -> int:
    if not env.get("MASTER_PORT", "").strip():
        raise UsageProblem(
            "MASTER_ADDR is set but MASTER_PORT is not",
            hint="torchrun sets both; by hand, give every process the same port of rank 0's machine",
        )
    port = _number(env, "MASTER_PORT")
    if not 1 <= port <= 65535:
        raise UsageProblem(
            f"$MASTER_PORT is {port}, not a port (1 to 65535)",
            hint="torchrun sets it; by hand, give every process the same port of rank 0's machine",
        )
    return port


def _wait_until_listening(address: str, port: int, deadline: float) -> None:
    """Return once something listens at ``address:port``; TimeoutError at ``deadline``. Tried here rather than by
    torch, whose every failed try logs a C++ traceback."""
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"nothing listens at {address}:{port}")
        try:
            socket.create_connection((address, port), timeout=min(left, 2.0)).close()
            return
        except OSError:  # refused, unreachable, a name not resolved yet: the master may still be starting
            time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))
