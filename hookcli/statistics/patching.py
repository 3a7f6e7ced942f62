"""What ``hookcli patch`` gathers: each pair's measures and each patched layer's changes (the rows of
:mod:`hookcli.run.patching`'s forward), kept pair by pair, merged shard by shard and turned into the file of
:mod:`hookcli.storage.patch_format`.

>>> import torch
>>> gathering = PatchGathering({"fc": "fc"}, described={"layers": ["fc"]})
>>> pairs = gathering.start(0)
>>> pairs.update({"source_class": torch.tensor([1, 2]), "target_class": torch.tensor([0, 2]),
...               "source_metric": torch.tensor([3.0, 0.0]), "target_metric": torch.tensor([-1.0, 0.0]),
...               "fc": torch.tensor([2.0, 0.0])}, torch.tensor([0, 1, 2, 3]))
>>> found = pairs.result(torch.arange(4))
>>> found["fc@effect"].tolist(), found["fc@mean_effect"].item()
([0.5, nan], 0.5)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from hookcli.storage.gathering import Made
from hookcli.storage.patch_format import PAIR_FIELDS, patch_key, patch_metadata

__all__ = ["PatchGathering", "PatchRows"]

_CLASSES = ("source_class", "target_class")


class PatchGathering:
    """The pairs' measures and the changes patching each layer makes (``keys``: layer path → key), recorded as
    ``described`` says (the ``patch`` metadata)."""

    fewest = 2  # a pair
    merges_on_device = False  # its rows are kept on the CPU

    def __init__(self, keys: Mapping[str, str], *, described: Mapping[str, Any]) -> None:
        self.keys, self.described = dict(keys), dict(described)
        #: Each key's change shape after the pairs' axis, once a batch or a part has shown it.
        self.shapes: dict[str, tuple[int, ...]] = {}

    def start(self, number: int) -> PatchRows:
        return PatchRows(self)

    def read(self, state: Mapping[str, torch.Tensor], described: Mapping[str, Any], rows: Sequence[int]) -> PatchRows:
        """A part's rows, checked against the inputs it has rows of (ValueError where they cannot be theirs)."""
        expected = {"first", *PAIR_FIELDS, *(_state_name(key) for key in self.keys.values())}
        if set(state) != expected:
            raise ValueError("its tensors are not a patching run's")
        pairs = len(rows) // 2
        if len(rows) % 2 or any(rows[i + 1] != rows[i] + 1 or rows[i] % 2 for i in range(0, len(rows), 2)):
            raise ValueError("its inputs are not whole pairs")
        for name in ("first", *PAIR_FIELDS):
            value = state[name]
            dtype = torch.int64 if name in ("first", *_CLASSES) else torch.float64
            if value.dim() != 1 or value.shape[0] != pairs or value.dtype != dtype:
                raise ValueError(f"its '{name}' is not one {str(dtype).removeprefix('torch.')} value a pair")
        if sorted(state["first"].tolist()) != sorted(rows[::2]):
            raise ValueError("its pairs are not the inputs it has rows of")
        found = PatchRows(self)
        for key in self.keys.values():
            value = state[_state_name(key)]
            if value.dim() < 1 or value.shape[0] != pairs or value.dtype != torch.float64:
                raise ValueError(f"its changes of '{key}' are not float64 values a pair")
            found.check_shape(key, tuple(value.shape[1:]))
        found.rows = {name: value.clone() for name, value in state.items()}
        return found

    def metadata(self, run: Mapping[str, str], made: Made) -> dict[str, str]:
        described = {**self.described, "positions_of": {key: list(shape) for key, shape in self.shapes.items()}}
        return patch_metadata(run, patch=described, inputs=made.inputs, skipped=made.skipped, identity=made.identity)

    def notes(self, gathered: Any, tensors: Mapping[str, torch.Tensor], *, inputs: int) -> list[str]:
        """Pairs whose source and target the model gives the same class have no effect to speak of."""
        same = int((tensors["pairs@source_class"] == tensors["pairs@target_class"]).sum())
        if not same:
            return []
        total = len(tensors["pairs@source_class"])
        return [
            f"{same:,} of {total:,} pairs {'has' if same == 1 else 'have'} a source and a target of the same class, so "
            "their effects are NaN (and m, the logit of one class less itself, is 0 whatever the patch)"
        ]


class PatchRows:
    """One shard's pairs (or several shards', merged), in the order of their inputs."""

    def __init__(self, gathering: PatchGathering) -> None:
        self.gathering = gathering
        self.rows: dict[str, torch.Tensor] = {}

    def check_shape(self, key: str, shape: tuple[int, ...]) -> None:
        known = self.gathering.shapes.setdefault(key, shape)
        if known != shape:
            raise ValueError(f"its changes of '{key}' are of shape {list(shape)}, and the others' {list(known)}")

    def update(self, features: Mapping[str, Any], rows: torch.Tensor) -> None:
        """Add a batch of pairs: the :data:`~hookcli.storage.patch_format.PAIR_FIELDS` ``[P]`` and each key's
        changes, from the inputs numbered ``rows`` (a source, then its target)."""
        numbers = rows.tolist()
        if len(numbers) % 2 or any(
            numbers[i] % 2 or numbers[i + 1] != numbers[i] + 1 for i in range(0, len(numbers), 2)
        ):
            raise ValueError("a batch of patching holds whole pairs, a source then its target")
        added = {"first": torch.tensor(numbers[::2], dtype=torch.int64)}
        for name in PAIR_FIELDS:
            value = features[name].cpu()
            added[name] = value.to(torch.int64 if name in _CLASSES else torch.float64)
        for key in self.gathering.keys.values():
            value = features[key].to(torch.float64).cpu()
            self.check_shape(key, tuple(value.shape[1:]))
            added[_state_name(key)] = value
        self._add(added)

    def merge(self, other: PatchRows) -> None:
        if other.rows:
            self._add(other.rows)

    def _add(self, added: Mapping[str, torch.Tensor]) -> None:
        if not self.rows:
            self.rows = {name: value.clone() for name, value in added.items()}
            return
        for name, value in added.items():
            self.rows[name] = torch.cat([self.rows[name], value])

    def seal(self) -> None:
        pass

    def state(self) -> dict[str, torch.Tensor]:
        if self.rows:
            return dict(self.rows)
        empty = {"first": torch.zeros(0, dtype=torch.int64)}
        for name in PAIR_FIELDS:
            empty[name] = torch.zeros(0, dtype=torch.int64 if name in _CLASSES else torch.float64)
        for key in self.gathering.keys.values():
            empty[_state_name(key)] = torch.zeros(0, *self.gathering.shapes.get(key, ()), dtype=torch.float64)
        return empty

    def describe(self) -> dict[str, Any]:
        return {"kind": "patch"}

    def result(self, positions: torch.Tensor) -> dict[str, torch.Tensor]:
        """The file's tensors (:mod:`hookcli.storage.patch_format`), the pairs in the order of their inputs."""
        rows = self.state()
        order = torch.argsort(rows["first"], stable=True)
        found = {f"pairs@{name}": rows[name][order] for name in PAIR_FIELDS}
        span = found["pairs@source_metric"] - found["pairs@target_metric"]
        for key in self.gathering.keys.values():
            change = rows[_state_name(key)][order]
            scale = span.reshape(-1, *[1] * (change.dim() - 1))
            effect = torch.where(scale != 0, change / scale.where(scale != 0, 1.0), torch.nan)
            found[patch_key(key, "change")] = change
            found[patch_key(key, "effect")] = effect
            found[patch_key(key, "mean_effect")] = torch.nanmean(effect, dim=0)
        return found


def _state_name(key: str) -> str:
    return f"change@{key}"
