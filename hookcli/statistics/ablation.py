"""What ``hookcli ablate`` gathers: for each unit, sums over the inputs of its effects on the output (the rows of
:mod:`hookcli.run.ablation`'s forward), merged shard by shard and turned into the file of
:mod:`hookcli.storage.ablation_format`.

>>> import torch
>>> gathering = AblationGathering("fc", units=None, described={"layer": "fc"})
>>> sums = gathering.start(0)
>>> rows = {"logit_change": torch.tensor([[1.0, -2.0], [3.0, 0.0]]), "prob_change": torch.zeros(2, 2),
...         "flips": torch.tensor([[True, False], [False, False]]), "kl": torch.ones(2, 2),
...         "class_delta": torch.ones(2, 2, 3)}
>>> sums.update(rows, torch.tensor([0, 1]))
>>> found = sums.result(torch.tensor([0, 1]))
>>> found["fc@logit_change"].tolist(), found["fc@logit_change_std"].tolist(), found["fc@flips"].tolist()
([2.0, -1.0], [1.0, 1.0], [0.5, 0.0])
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from hookcli.storage.ablation_format import ablation_key, ablation_metadata
from hookcli.storage.gathering import Made

__all__ = ["AblationGathering", "AblationSums"]

#: The sums a part holds, each ``[U]`` but ``count`` (``[]``) and ``class`` (``[U, classes]``).
_SUMS = ("count", "logit", "logit_squares", "prob", "prob_squares", "flips", "kl", "class")


class AblationGathering:
    """The effects of ablating each unit of layer ``key`` (``units``: the ones chosen, None: every one), recorded
    as ``described`` says (the ``ablate`` metadata)."""

    fewest = 1
    merges_on_device = False  # its sums are kept on the CPU

    def __init__(self, key: str, *, units: Sequence[int] | None, described: Mapping[str, Any]) -> None:
        self.key, self.units, self.described = key, None if units is None else list(units), dict(described)

    def start(self, number: int) -> AblationSums:
        return AblationSums(self)

    def read(
        self, state: Mapping[str, torch.Tensor], described: Mapping[str, Any], rows: Sequence[int]
    ) -> AblationSums:
        """A part's sums, checked against the inputs it has rows of (ValueError where they cannot be theirs)."""
        if set(state) - set(_SUMS) or "count" not in state:
            raise ValueError("its sums are not an ablation's")
        count = state["count"]
        if count.dtype != torch.int64 or count.dim() != 0 or int(count) != len(rows):
            raise ValueError(f"its count is not the {len(rows)} inputs it has rows of")
        sums = AblationSums(self)
        if int(count) == 0:
            return sums
        if set(state) != set(_SUMS):
            raise ValueError("it lacks some of an ablation's sums")
        units = state["logit"].shape
        for name in _SUMS[1:-1]:
            value = state[name]
            expected = torch.int64 if name == "flips" else torch.float64
            if value.dim() != 1 or value.shape != units or value.dtype != expected:
                raise ValueError(f"its '{name}' is not one {str(expected).removeprefix('torch.')} value a unit")
        classes = state["class"]
        if classes.dim() != 2 or classes.shape[0] != units[0] or classes.dtype != torch.float64:
            raise ValueError("its 'class' is not a float64 row of classes a unit")
        if self.units is not None and units[0] != len(self.units):
            raise ValueError(f"it holds {units[0]} units, and the run ablates {len(self.units)}")
        sums.sums = {name: state[name].clone() for name in _SUMS}
        return sums

    def metadata(self, run: Mapping[str, str], made: Made) -> dict[str, str]:
        return ablation_metadata(
            run, ablate=self.described, inputs=made.inputs, skipped=made.skipped, identity=made.identity
        )

    def notes(self, gathered: Any, tensors: Mapping[str, torch.Tensor], *, inputs: int) -> list[str]:
        """A spread over fewer than two inputs is no spread."""
        return [f"'{self.key}': one input measured, so each spread is 0"] if inputs == 1 else []


class AblationSums:
    """One shard's sums (or several, merged) of each unit's effects."""

    def __init__(self, gathering: AblationGathering) -> None:
        self.gathering = gathering
        self.sums: dict[str, torch.Tensor] = {"count": torch.tensor(0, dtype=torch.int64)}

    def update(self, features: Mapping[str, Any], rows: torch.Tensor) -> None:
        """Add a batch's rows of effects (``[N, U]`` each, ``class_delta`` ``[N, U, classes]``)."""
        logit, prob = features["logit_change"], features["prob_change"]

        def summed(values: torch.Tensor) -> torch.Tensor:  # over the rows, in float64, where they are; then here
            return torch.sum(values, dim=0, dtype=torch.float64).cpu()

        added = {
            "count": torch.tensor(logit.shape[0], dtype=torch.int64),
            "logit": summed(logit),
            "logit_squares": summed(logit.double().square()),
            "prob": summed(prob),
            "prob_squares": summed(prob.double().square()),
            "flips": torch.sum(features["flips"], dim=0, dtype=torch.int64).cpu(),
            "kl": summed(features["kl"]),
            "class": summed(features["class_delta"]),
        }
        self._add(added)

    def merge(self, other: AblationSums) -> None:
        self._add(other.sums)

    def _add(self, added: Mapping[str, torch.Tensor]) -> None:
        if len(self.sums) == 1:  # nothing but the count yet
            self.sums = {name: value.clone() for name, value in added.items()}
            return
        if len(added) == 1:
            return
        for name, value in added.items():
            self.sums[name] = self.sums[name] + value

    def seal(self) -> None:
        pass

    def state(self) -> dict[str, torch.Tensor]:
        return dict(self.sums)

    def describe(self) -> dict[str, Any]:
        return {"kind": "ablate"}

    def result(self, positions: torch.Tensor) -> dict[str, torch.Tensor]:
        """The file's tensors (:mod:`hookcli.storage.ablation_format`)."""
        key, sums = self.gathering.key, self.sums
        count = int(sums["count"])
        units = len(sums["logit"]) if "logit" in sums else len(self.gathering.units or ())
        chosen = self.gathering.units if self.gathering.units is not None else list(range(units))
        found = {
            ablation_key(key, "units"): torch.tensor(chosen, dtype=torch.int64),
            ablation_key(key, "count"): torch.tensor(count, dtype=torch.int64),
        }
        if "logit" not in sums:
            return found
        for name, field in (("logit", "logit_change"), ("prob", "prob_change")):
            mean = sums[name] / count
            found[ablation_key(key, field)] = mean
            spread = (sums[f"{name}_squares"] / count - mean.square()).clamp_min(0).sqrt()
            found[ablation_key(key, f"{field}_std")] = spread
        found[ablation_key(key, "flips")] = sums["flips"].to(torch.float64) / count
        found[ablation_key(key, "kl")] = sums["kl"] / count
        found[ablation_key(key, "class_effect")] = sums["class"] / count
        return found
