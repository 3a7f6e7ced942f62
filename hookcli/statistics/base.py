"""The interface every statistic offers, so that a run can gather any of them batch by batch and combine the
results of shards and processes.

>>> from hookcli.statistics.moments import Moments
>>> isinstance(Moments(3), Accumulator)
True
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol, runtime_checkable

import torch

from hookcli.statistics.units import UnitBatch

__all__ = ["Accumulator"]


@runtime_checkable
class Accumulator(Protocol):
    """A statistic of ``C`` channels gathered a batch at a time.

    ``update(batch)`` adds a batch of a layer's units; ``merge(other)`` adds what another
    accumulator of the same kind gathered over other inputs (the result is
    that of one accumulator given both, in that order); ``state()`` is
    everything it holds as named tensors, which ``from_state`` turns back into
    an accumulator, so that a state written to disk merges later.
    """

    def update(self, batch: UnitBatch) -> None: ...

    def merge(self, other) -> None: ...

    def state(self) -> dict[str, torch.Tensor]: ...

    @classmethod
    def from_state(cls, state: Mapping[str, torch.Tensor]): ...
