"""Who this process is among many: ``--part K/N``, torchrun, Slurm tasks and Slurm job arrays.

hookcli has no scheduler of its own: the processes a launcher starts share
one shard folder through claims (:mod:`hookcli.storage.claims`), and a
:class:`Part` only says which block of shards a process takes first and
which GPU it uses. Under torchrun the processes also join a process group
(:class:`hookcli.run.team.Team`). Nothing here imports torch: a command
knows who it is, and refuses what a launcher makes wrong, before torch
loads.

>>> parse_part("3/8")
Part(index=2, count=8, local_index=0, local_count=1, launcher='--part', address=None)
>>> detect_part({"RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"})
Part(index=1, count=4, local_index=1, local_count=2, launcher='torchrun', address=None)
>>> detect_part({"RANK": "1", "WORLD_SIZE": "4", "MASTER_ADDR": "node0", "MASTER_PORT": "29500"}).address
('node0', 29500)
>>> detect_part({"SLURM_ARRAY_TASK_ID": "7", "SLURM_ARRAY_TASK_COUNT": "10", "SLURM_ARRAY_TASK_MIN": "1"}).index
6
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Mapping

from hookcli.errors import UsageProblem, seconds_from_environment
from hookcli.files import process_stat
from hookcli.parsing import Part, parse_part

__all__ = [
    "DEFAULT_JOIN_TIMEOUT",
    "JOIN_TIMEOUT_RANGE",
    "MAX_NODES",
    "MAX_TASKS_PER_NODE",
    "Part",
    "cpu_threads",
    "detect_part",
    "join_timeout",
    "joins_team",
    "number_from",
    "parse_part",
    "run_part",
]

#: The most nodes, and tasks on one node, that ``SLURM_TASKS_PER_NODE`` may say (far above any cluster's).
MAX_NODES = 1_000_000
MAX_TASKS_PER_NODE = 100_000

#: Seconds torchrun's processes wait for each other to join their group.
DEFAULT_JOIN_TIMEOUT = 300.0

#: The seconds ``$HOOKCLI_JOIN_TIMEOUT`` may say: from one second to a day.
JOIN_TIMEOUT_RANGE = (1.0, 86400.0)


def detect_part(environ: Mapping[str, str] | None = None) -> Part | None:
    """The part a launcher gave this process (torchrun's ``RANK``/``WORLD_SIZE``; Slurm's ``SLURM_PROCID``/
    ``SLURM_NTASKS`` and job arrays' ``SLURM_ARRAY_TASK_ID``/``SLURM_ARRAY_TASK_COUNT``), or None for one process.

    A task of a job array run with several tasks is part ``array index × tasks + task``.
    """
    env = os.environ if environ is None else environ
    if "RANK" in env and "WORLD_SIZE" in env:
        rank, world = number_from(env, "RANK"), number_from(env, "WORLD_SIZE")
        local = number_from(env, "LOCAL_RANK", 0)
        address = (env["MASTER_ADDR"], _master_port(env)) if "MASTER_ADDR" in env else None
        if address is not None:
            join_timeout(env)  # refused before torch loads, not as the group forms
        part = Part(rank, world, local, number_from(env, "LOCAL_WORLD_SIZE", local + 1), "torchrun", address)
    else:
        task, tasks = number_from(env, "SLURM_PROCID", 0), number_from(env, "SLURM_NTASKS", 1)
        local, local_count = number_from(env, "SLURM_LOCALID", 0), _tasks_on_this_node(env)
        launcher = "srun"
        if "SLURM_ARRAY_TASK_ID" in env and "SLURM_ARRAY_TASK_COUNT" in env:
            step = max(1, number_from(env, "SLURM_ARRAY_TASK_STEP", 1))
            position = (number_from(env, "SLURM_ARRAY_TASK_ID") - number_from(env, "SLURM_ARRAY_TASK_MIN", 0)) // step
            task, tasks = position * tasks + task, number_from(env, "SLURM_ARRAY_TASK_COUNT") * tasks
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


def number_from(env: Mapping[str, str], name: str, default: int | None = None) -> int:
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
    node = number_from(env, "SLURM_NODEID", 0)
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
    return number_from(env, "SLURM_LOCALID", 0) + 1  # not said: at least as many as this task's local number


def _at_most(digits: str, limit: int) -> bool:
    # Counted digits first: int() refuses thousands of them, and is slow on fewer.
    return len(digits.lstrip("0")) <= len(str(limit)) and int(digits) <= limit


def usable_cores() -> int:
    """The cores this process may run on: its CPU affinity where the system has one (a container's or a job's
    share), not every core of the machine."""
    return len(_affinity(0) or ()) or os.cpu_count() or 1


def cpu_threads(part: Part | None) -> int | None:
    """Threads for each of the processes sharing this machine's cores on the CPU (None: leave torch's choice): the
    cores ÷ the processes on this machine; or this process's own cores where the launcher pinned each process to
    some of the cores it had itself (Slurm's ``--cpu-bind``, ``taskset`` per rank)."""
    if part is None or part.local_count <= 1:
        return None
    own = _affinity(0)
    if own and any(own < cores for cores in _launchers_cores(own)):
        return len(own)
    return max(1, usable_cores() // part.local_count)


def _launchers_cores(own: frozenset[int]) -> Iterator[frozenset[int]]:
    """The cores of this process's parent, and of its parent's parents while they have the same as this one (a
    shell or a script between the launcher and hookcli: ``srun bash -c …``), up to the first that has other cores
    or cannot be read."""
    pid: int | None = os.getppid()
    for _ in range(_ANCESTORS):
        cores = None if pid is None or pid <= 0 else _affinity(pid)
        if pid is None or cores is None:
            return
        yield cores
        if cores != own or pid == 1:
            return
        pid = _parent_of(pid)


#: How many of its ancestors a process looks through for the one that pinned it.
_ANCESTORS = 8


def _parent_of(pid: int) -> int | None:
    """Process ``pid``'s parent, where the system says (Linux's /proc); else None."""
    fields = process_stat(pid)
    return int(fields[1]) if fields and len(fields) > 1 and fields[1].isdigit() else None


def _affinity(pid: int) -> frozenset[int] | None:
    """The cores process ``pid`` may run on; None where the system does not say."""
    try:
        return frozenset(os.sched_getaffinity(pid))
    except (AttributeError, OSError):
        return None


def join_timeout(environ: Mapping[str, str] | None = None) -> float:
    """Seconds torchrun's processes wait for all of them to join their group (``$HOOKCLI_JOIN_TIMEOUT``, read from
    ``environ`` or the process's environment).

    >>> join_timeout({"HOOKCLI_JOIN_TIMEOUT": "42"}), join_timeout({})
    (42.0, 300.0)
    """
    return seconds_from_environment("HOOKCLI_JOIN_TIMEOUT", DEFAULT_JOIN_TIMEOUT, *JOIN_TIMEOUT_RANGE, environ)


def run_part(given: Part | None, output: object, *, shared: bool, memory: bool, alone: str) -> Part | None:
    """This process's part of an ``output`` that many write (``shared``: a shard folder, or a file gathered in
    parts): ``given`` (``--part``), or what a launcher says; None for a caller's own loop in ``memory``. Refused when
    the output cannot be shared, with ``alone`` as the hint when a launcher started the processes."""
    if given is not None and not shared:
        raise UsageProblem(
            "--part applies to a shard folder output (-o DIR/)", hint="the processes share the work of one folder"
        )
    if given is not None or memory:
        return given  # --part as given; or a caller's own loop, which decides who computes what
    part = detect_part()
    if part is not None and not shared:
        raise UsageProblem(
            f"{part.count} processes started by {part.launcher} would each write all of '{output}'", hint=alone
        )
    return part


def joins_team(part: Part) -> bool:
    """Whether ``part``'s processes form a group (:mod:`hookcli.run.team`): torchrun's, with a rendezvous address."""
    return part.launcher == "torchrun" and part.address is not None


def _master_port(env: Mapping[str, str]) -> int:
    """``$MASTER_PORT``, refused when it is missing or not a port: said before torch loads, not as the group forms."""
    if not env.get("MASTER_PORT", "").strip():
        raise UsageProblem(
            "MASTER_ADDR is set but MASTER_PORT is not",
            hint="torchrun sets both; by hand, give every process the same port of rank 0's machine",
        )
    port = number_from(env, "MASTER_PORT")
    if not 1 <= port <= 65535:
        raise UsageProblem(
            f"$MASTER_PORT is {port}, not a port (1 to 65535)",
            hint="torchrun sets it; by hand, give every process the same port of rank 0's machine",
        )
    return port
