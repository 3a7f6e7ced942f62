"""torchrun's processes as one group (:class:`Team`, gloo on any device), and the GPU each process of a machine uses.

What needs a group: agreeing that every process runs the same command,
handing rank 0's stdin list to the others, and a final barrier, so that every
process returns when the folder is complete. Who a process is comes from
:mod:`hookcli.run.launch`, which needs no torch.

Joining waits for every process at ``MASTER_ADDR:MASTER_PORT`` for at most
:func:`~hookcli.run.launch.join_timeout` seconds (300 by default, or
``$HOOKCLI_JOIN_TIMEOUT``), says so after a few seconds, and stops on
Ctrl-C or SIGTERM; only the final barrier waits without a limit a run could
reach.

>>> join_team(None) is None, local_device(None, "auto")
(True, 'auto')
"""

from __future__ import annotations

import contextlib
import datetime
import re
import socket
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
import torch.distributed as dist

from hookcli.console import Terminated
from hookcli.errors import HookcliError, UsageProblem, first_line
from hookcli.run.launch import Part, join_timeout, joins_team
from hookcli.storage.fileformat import identity_differences

__all__ = [
    "Team",
    "TeamError",
    "join_team",
    "left_on_error",
    "local_device",
]


#: A long run leaves early finishers waiting at the final barrier: no timeout a run could reach.
_BARRIER_TIMEOUT = datetime.timedelta(days=30)


#: Seconds of waiting to join before saying so.
_WAIT_NOTE_AFTER = 3.0


#: Seconds past the join timeout after which the wait ends even if torch has not given up (a hung connection).
_JOIN_GRACE = 10.0


@contextlib.contextmanager
def left_on_error(team: Team | None) -> Iterator[None]:
    """Leave ``team``'s process group when what runs inside fails (a run that succeeds leaves it when it ends)."""
    try:
        yield
    except BaseException:
        if team is not None:
            team.close()
        raise


def local_device(part: Part | None, device: str) -> str:
    """The device this process uses: ``auto`` or ``cuda`` become ``cuda:<local index>`` (modulo the GPUs it
    sees, so one visible GPU per task also works) when several processes share a machine with GPUs."""
    if part is None or part.local_count <= 1 or device not in ("auto", "cuda"):
        return device
    if not torch.cuda.is_available():
        return device
    return f"cuda:{part.local_index % torch.cuda.device_count()}"


class TeamError(HookcliError):
    """torchrun's processes could not form their group: not all came in time, or the wait was stopped (exit 1)."""


class Team:
    """torchrun's processes in one gloo process group, for agreeing on the run and the final barrier.

    gloo whatever the device: the group only passes small objects and waits at a barrier, which gloo does over the
    network without tying a process to a GPU. NCCL would refuse two processes on one GPU, and processes that chose
    backends by their own machine's GPUs could disagree and wait for each other forever.

    Joining waits at most :func:`~hookcli.run.launch.join_timeout` seconds for every process at
    ``MASTER_ADDR:MASTER_PORT``, and raises :class:`TeamError` when not all came, or on Ctrl-C or SIGTERM meanwhile.
    """

    def __init__(self, part: Part) -> None:
        assert part.address is not None, "a part that joins a team has its address (launch.joins_team)"
        self.part = part
        self._address, self._port = part.address  # MASTER_PORT refused, if need be, before torch loaded
        self._timeout = join_timeout()
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
        """``compute()`` on rank 0, its value (or its error) on every rank.

        Whatever ``compute()`` raises is broadcast too, Ctrl-C and a bug alike: the other ranks wait in the broadcast
        with the barrier's timeout (days), so a rank 0 that raised without saying so would leave them hanging. A
        :class:`HookcliError` is raised again as itself everywhere; anything else is raised as itself on rank 0 and
        as a one-line :class:`TeamError` on the others.
        """
        box: list[Any] = [None]  # rank 0's ("value", value), ("error", kind, message, hint) or ("failed", line)
        failure: BaseException | None = None
        if self.part.index == 0:
            try:
                box = [("value", compute())]
            except HookcliError as err:
                box = [("error", type(err), err.message, err.hint)]
            except BaseException as err:
                failure, box = err, [("failed", _described(err))]
        self._dist.broadcast_object_list(box, src=0)
        if failure is not None:
            raise failure
        if box[0][0] == "error":
            _, kind, message, hint = box[0]
            raise kind(message, hint=hint)
        if box[0][0] == "failed":
            raise TeamError(
                f"rank 0 of {self.part.count} failed before handing rank {self.part.index} its share: {box[0][1]}",
                hint="rank 0's own error says more",
            )
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
        """Wait for every process at the run's end; :class:`TeamError` when one ended before it (killed: gloo's
        connection to it closed)."""
        try:
            self._dist.barrier()
        except RuntimeError as err:
            heard = re.sub(r"^\[[^\]]*\]\s*", "", first_line(err))  # gloo's source file and line go
            raise TeamError(
                f"one of torchrun's {self.part.count} processes ended before the run's end (rank {self.part.index} "
                f"heard: {heard})",
                hint="its own output says why; the same command run again continues what is not done",
            ) from None

    def close(self) -> None:
        if self._dist.is_initialized():
            self._dist.destroy_process_group()


def join_team(part: Part | None) -> Team | None:
    """Join torchrun's process group (:class:`Team`); None for other launchers, and where the caller's own program
    has a group already (hookcli leaves it alone)."""
    if part is None or not joins_team(part) or dist.is_initialized():
        return None
    return Team(part)


def _described(err: BaseException) -> str:
    """``Type: first line`` of an error that is not hookcli's, as the ranks that did not see it are told."""
    line = first_line(err)
    return line if line == type(err).__name__ else f"{type(err).__name__}: {line}"


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
