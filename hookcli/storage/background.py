"""One thread doing a writer's work in order while the caller computes the next piece: the first failure stops it
and is raised in the caller's thread.

>>> done = []
>>> worker = Background(done.append, name="example")
>>> worker.submit(1); worker.submit(2); worker.close()
>>> done
[1, 2]
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["Background"]

_STOP = object()


class Background:
    """Calls ``work(item)`` for each submitted item, in order, on a thread of its own, started with the first item
    (after a run's decode workers have started: see :mod:`hookcli.run.batches`).

    :meth:`submit` waits while ``depth`` items are queued (so memory holds at
    most that many beside the one being worked on). A failure of ``work``
    drops the items after it and is raised by the next :meth:`submit` or by
    :meth:`close`, in the caller's thread.
    """

    def __init__(self, work: Callable[[Any], None], *, name: str, depth: int = 1) -> None:
        self._work = work
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._failure: BaseException | None = None
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)

    def submit(self, item: Any) -> None:
        """Queue ``item``; raise an earlier failure of ``work`` instead."""
        self.raise_failure()
        if self._thread.ident is None:
            self._thread.start()
        self._queue.put(item)

    def close(self) -> None:
        """Wait for the queued items to be done, then raise a failure of ``work`` if there was one."""
        if self._thread.is_alive():
            self._queue.put(_STOP)
            self._thread.join()
        self.raise_failure()

    def raise_failure(self) -> None:
        """Raise a failure of ``work`` not raised yet."""
        if self._failure is not None:
            failure, self._failure = self._failure, None
            raise failure

    def _loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            if self._failure is not None:
                continue  # drain: one failure stops the work
            try:
                self._work(item)
            except BaseException as err:  # handed to the caller's thread
                self._failure = err
            del item  # done with: not kept alive while the next is awaited
