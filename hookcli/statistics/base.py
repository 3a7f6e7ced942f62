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

__all__ = ["Accumulator", "stored"]


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


def stored(state: Mapping[str, torch.Tensor], name: str, dims: int, *, length: int | None = None) -> torch.Tensor:
    """Tensor ``name`` of a state read back (a part is untrusted), which must be there, of a real number type, with
    ``dims`` dimensions (and ``length`` values along the first, when given); ValueError saying what it is not.

    >>> stored({"count": torch.tensor(3)}, "count", 0).item()
    3
    >>> stored({"info": torch.tensor(3)}, "info", 1, length=2)
    Traceback (most recent call last):
    ...
    ValueError: its state's 'info' is int64 [], not 1-dimensional with 2 values
    """
    found = state.get(name)
    if found is None:
        raise ValueError(f"its state has no '{name}'")
    wanted = "one number" if not dims else f"{dims}-dimensional" + (f" with {length} values" if length else "")
    real = not found.dtype.is_complex and found.dtype != torch.bool
    if not real or found.dim() != dims or (length is not None and found.shape[0] != length):
        dtype = str(found.dtype).removeprefix("torch.")
        raise ValueError(f"its state's '{name}' is {dtype} {list(found.shape)}, not {wanted}")
    return found
