"""Who this process is among many: ``--part K/N``, torchrun, Slurm tasks and Slurm job arrays.

hookcli has no scheduler of its own: the processes a launcher starts share
one shard folder through claims (:mod:`hookcli.claims`), and a
:class:`Part` only says which block of shards a process takes first and
which GPU it uses. Under torchrun the processes also join a process group
(:class:`Team`, gloo on any device) for what needs one: agreeing
that every process runs the same command, handing rank 0's stdin list to
the others, and a final barrier, so that every process returns when the
folder is complete.

>>> parse_part("3/8")
Part(index=2, count=8, local_index=0, local_count=1, launcher='--part')
>>> detect_part({"RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"})
Part(index=1, count=4, local_index=1, local_count=2, launcher='torchrun')
>>> detect_part({"SLURM_ARRAY_TASK_ID": "7", "SLURM_ARRAY_TASK_COUNT": "10", "SLURM_ARRAY_TASK_MIN": "1"}).index
6
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from hookcli.errors import HookcliError, UsageProblem

__all__ = ["Part", "Team", "cpu_threads", "detect_part", "join_team", "local_device", "parse_part"]


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
        raise UsageProblem(f"--part takes K/N with 1 <= K <= N (the K-th of N processes), not '{text}'",
                           hint="for example --part 1/4 … --part 4/4 for four processes")
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
        raise UsageProblem(f"{part.launcher} says this is process {part.index} (counted from 0) of {part.count}, "
                           "which cannot be", hint="check the launcher's environment variables")
    if not 0 <= part.local_index < part.local_count:
        raise UsageProblem(f"{part.launcher} says this is process {part.local_index} (counted from 0) of the "
                           f"{part.local_count} on this machine, which cannot be",
                           hint="check the launcher's environment variables")
    return part


def _number(env: Mapping[str, str], name: str, default: int | None = None) -> int:
    text = env.get(name)
    if text is None and default is not None:
        return default
    try:
        return int(str(text).strip())
    except ValueError:
        raise UsageProblem(f"${name} is '{text}', not a whole number",
                           hint="hookcli reads it to know which process it is") from None


def _tasks_on_this_node(env: Mapping[str, str]) -> int:
    """Slurm's tasks on this node, from ``SLURM_TASKS_PER_NODE`` (``2(x3),1``) and ``SLURM_NODEID``."""
    counts: list[int] = []
    for piece in env.get("SLURM_STEP_TASKS_PER_NODE", env.get("SLURM_TASKS_PER_NODE", "")).split(","):
        found = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", piece)
        if found:
            counts += [int(found.group(1))] * int(found.group(2) or 1)
    node = _number(env, "SLURM_NODEID", 0)
    if 0 <= node < len(counts):
        return counts[node]
    return _number(env, "SLURM_LOCALID", 0) + 1  # not said: at least as many as this task's local number


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


class Team:
    """torchrun's processes in one gloo process group, for agreeing on the run and the final barrier.

    gloo whatever the device: the group only passes small objects and waits at a barrier, which gloo does over the
    network without tying a process to a GPU. NCCL would refuse two processes on one GPU, and processes that chose
    backends by their own machine's GPUs could disagree and wait for each other forever.
    """

    def __init__(self, part: Part) -> None:
        import datetime

        import torch.distributed as dist

        self.part = part
        # A long run leaves early finishers waiting at the barrier: no timeout a run could reach.
        dist.init_process_group("gloo", timeout=datetime.timedelta(days=30))
        self._dist = dist

    def share(self, compute: Callable[[], object]):
        """``compute()`` on rank 0, its value (or its error) on every rank."""
        box = [None]
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
        from hookcli.fileformat import identity_differences

        everyone: list = [None] * self.part.count
        self._dist.all_gather_object(everyone, dict(identity))
        for rank, other in enumerate(everyone):
            differ = identity_differences(everyone[0], other)
            if differ:
                raise UsageProblem(f"torchrun's process {rank} runs another command than process 0 (it differs in: "
                                   f"{', '.join(differ)})", hint="give every process the same command and inputs")

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
