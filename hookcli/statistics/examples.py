"""Dataset examples: the inputs that drive each channel hardest, where, and the channel's whole map on each.

Each input is scored per channel by the largest value of the channel's map
(``by="max"``), or by the map's mean (``by="mean"``, computed in float64 and
kept as float32); a channel keeps its ``count`` highest scores, highest first,
ties going to the lower input index: exactly what sorting every input's score
would give. With each example it keeps where the map is largest (the first
such position in C order) and the map itself, so that pictures of the examples
need no second forward.

>>> from hookcli.statistics.units import UnitBatch, UnitLayout
>>> top = TopExamples(1, 2, positions=3)
>>> layout = UnitLayout.of((1, 1, 3))
>>> top.update(UnitBatch(torch.tensor([[[[0.0, 5, 1]]], [[[2, 2, 2]]]]), torch.tensor([0, 1]), layout))
>>> top.update(UnitBatch(torch.tensor([[[[5.0, 0, 0]]]]), torch.tensor([2]), layout))
>>> top.values.tolist(), top.rows.tolist(), top.at.tolist(), top.maps[0, 1].tolist()
([[5.0, 5.0]], [[0, 2]], [[1, 0]], [5.0, 0.0, 0.0])
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from hookcli.statistics.base import stored
from hookcli.statistics.units import UnitBatch

__all__ = ["SCORES", "TopExamples"]

#: What ranks an input for a channel (``--top-by``): the largest value of its map, or the map's mean.
SCORES = ("max", "mean")


class TopExamples:
    """Each of ``channels`` channels' ``count`` top inputs over maps of ``positions`` values (see the module)."""

    def __init__(self, channels: int, count: int, *, positions: int, by: str = "max", device=None) -> None:
        if by not in SCORES:
            raise ValueError(f"by must be one of {', '.join(SCORES)}, not {by!r}")
        self.count, self.by = count, by
        self.values = torch.empty(channels, 0, device=device)
        self.rows = torch.empty(channels, 0, dtype=torch.int64, device=device)
        # The flat position of each example's largest value.
        self.at = torch.empty(channels, 0, dtype=torch.int64, device=device)
        self.maps = torch.empty(channels, 0, positions, device=device)

    def update(self, batch: UnitBatch) -> None:
        maps = batch.maps.to(torch.float32)  # [n, C, P]
        peaks, at = maps.max(dim=2)  # the index of the first largest value
        scores = peaks if self.by == "max" else batch.pooled.to(torch.float32)
        channels = maps.shape[1]
        rows = batch.rows.to(maps.device)[None].expand(channels, -1)
        self._keep(scores.T, rows, at.T, maps.transpose(0, 1))

    def merge(self, other: TopExamples) -> None:
        device = self.values.device
        self._keep(*(tensor.to(device) for tensor in (other.values, other.rows, other.at, other.maps)))

    def _keep(self, values, rows, at, maps) -> None:
        """Keep the best of the examples held and the candidates (``[C, m]`` values, rows and positions, and
        ``[C, m, P]`` maps): only the maps of candidates that make it are copied."""
        held = self.values.shape[1]
        values, rows = torch.cat([self.values, values], dim=1), torch.cat([self.rows, rows], dim=1)
        by_row = rows.argsort(dim=1, stable=True)  # ties go to the lower input: sort by input, then stably by score
        ranked = values.gather(1, by_row).nan_to_num(nan=float("-inf"))
        order = by_row.gather(1, ranked.argsort(dim=1, descending=True, stable=True))[:, : self.count]
        self.values, self.rows = values.gather(1, order), rows.gather(1, order)
        self.at = torch.cat([self.at, at], dim=1).gather(1, order)
        if held:
            kept = self.maps.gather(1, order.clamp(max=held - 1)[:, :, None].expand(-1, -1, self.maps.shape[2]))
        else:
            kept = torch.empty(order.shape[0], order.shape[1], maps.shape[2], device=maps.device)
        new = order >= held
        channel, place = new.nonzero(as_tuple=True)
        kept[channel, place] = maps[channel, order[channel, place] - held]
        self.maps = kept

    def state(self) -> dict[str, torch.Tensor]:
        return {
            "values": self.values.cpu(),
            "rows": self.rows.cpu(),
            "at": self.at.cpu(),
            "maps": self.maps.cpu(),
            "info": torch.tensor([self.count, SCORES.index(self.by)], dtype=torch.int64),
        }

    @classmethod
    def from_state(cls, state: Mapping[str, torch.Tensor]) -> TopExamples:
        count, by = (int(n) for n in stored(state, "info", 1, length=2).tolist())
        if not 0 <= by < len(SCORES):
            raise ValueError(f"its examples are ranked by score {by}, and there are {len(SCORES)}")
        maps = stored(state, "maps", 3).to(torch.float32)
        made = cls(maps.shape[0], count, positions=maps.shape[2], by=SCORES[by])
        made.values, made.rows = stored(state, "values", 2).to(torch.float32), stored(state, "rows", 2).to(torch.int64)
        made.at, made.maps = stored(state, "at", 2).to(torch.int64), maps
        return made
