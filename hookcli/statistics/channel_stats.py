"""What ``hookcli stats`` gathers: each layer's :class:`~hookcli.statistics.layer.LayerStats`, shard by shard, and
the statistics file they make (:mod:`hookcli.storage.stats_format`).

>>> gathering = StatsGathering(StatsChoice(top=1, quantiles=(0.5,), pca=False))
>>> shard = gathering.start(0)
>>> shard.update({"x": torch.arange(8.0).reshape(2, 4)}, torch.tensor([0, 1]))
>>> sorted(shard.result(torch.tensor([0, 1])))[:3], shard.describe()["x"]["layout"]
(['x@count', 'x@max', 'x@mean'], 'flat')
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Mapping, Sequence

import torch

from hookcli.errors import CaptureError
from hookcli.statistics.components import check_basis, component_layout, read_basis
from hookcli.statistics.layer import LayerStats, StatsChoice
from hookcli.statistics.units import UnitLayout, is_gradient, width_of
from hookcli.storage.gathering import Made
from hookcli.storage.stats_format import (
    MOST_CHANNELS,
    MOST_POSITIONS,
    component_key,
    is_component_key,
    stats_key,
    stats_metadata,
)

__all__ = ["GatheredStats", "StatsGathering"]


class StatsGathering:
    """Each layer's statistics (``choice``: what of them; with ``choice.components``, each layer's principal
    components too, :mod:`hookcli.statistics.components`). ``prefix_tokens`` and ``square`` (the model's inputs
    are square) say how rows are read as channels (:class:`~hookcli.statistics.units.UnitLayout`), and so do
    ``widths``, each key's channels where its module says them."""

    def __init__(
        self,
        choice: StatsChoice,
        *,
        prefix_tokens: int | None = None,
        square: bool = False,
        widths: Mapping[str, int | None] | None = None,
    ) -> None:
        self.choice, self.prefix_tokens, self.square = choice, prefix_tokens, square
        self.widths = dict(widths or {})  # each key's channels, where its module says them
        self.layouts: dict[str, UnitLayout] = {}  # each key's, from the first rows seen (or a part's metadata)
        self.basis = read_basis(choice.components) if choice.components is not None else {}
        self.checked = False  # whether the basis was checked against the run's layers
        self.without: list[str] = []  # the run's layers the basis has no components of

    fewest = 1  # rows a shard needs at least
    merges_on_device = True  # where the rows are: sorting the sketches and summing the moments at GPU speed

    def check_layers(self, channels: Mapping[str, int | None]) -> None:
        """Refuse, before any work, layers (``channels`` of each key, None where not known yet) that the
        components asked for cannot be gathered of."""
        if self.basis:
            check_basis(self.basis, channels, str(self.choice.components))
            self.without = [key for key in channels if key not in self.basis]

    def start(self, number: int) -> GatheredStats:
        return GatheredStats(self, number)

    def layout(self, key: str, row_shape) -> UnitLayout:
        if key not in self.layouts:
            layout = (
                component_layout(row_shape)
                if is_component_key(key)
                else UnitLayout.of(
                    row_shape,
                    prefix_tokens=self.prefix_tokens,
                    channels_last=self.square,
                    key=key,
                    width=width_of(self.widths, key),
                )
            )
            if layout.channels > MOST_CHANNELS or math.prod(layout.spatial) > MOST_POSITIONS:
                raise CaptureError(
                    f"'{key}' has rows of shape {list(layout.row_shape)}: {layout.channels:,} channels over "
                    f"{math.prod(layout.spatial):,} positions, more than statistics keep ({MOST_CHANNELS:,} channels "
                    f"and {MOST_POSITIONS:,} positions at most)",
                    hint="choose another layer (hookcli layers lists their shapes)",
                )
            self.layouts[key] = layout
        return self.layouts[key]

    def read(self, state: Mapping[str, torch.Tensor], described: Mapping, rows: Sequence[int]) -> GatheredStats:
        gathered = GatheredStats(self, 0)
        if not isinstance(described, Mapping):
            raise ValueError("its description of what it gathered is not a JSON object")
        for key, units in described.items():
            shape = units.get("row_shape") if isinstance(units, Mapping) else None
            if not isinstance(shape, list) or not all(type(n) is int for n in shape):
                raise ValueError(f"its description of '{key}' has no row shape")
            try:
                layout = self.layout(key, shape)
            except CaptureError as err:
                raise ValueError(err.message) from None
            own = {name.rpartition("@")[2]: value for name, value in state.items() if name.rpartition("@")[0] == key}
            layer = LayerStats.from_state(own, layout, self.choice)
            layer.check_part(rows)
            gathered.layers[key] = layer
        return gathered

    def notes(self, gathered: GatheredStats, tensors: Mapping[str, torch.Tensor], *, inputs: int) -> list[str]:
        """Layers the components asked for do not cover, and layers whose channels' examples tie at their largest
        value (an activation's ceiling, as ReLU6's): the ties go to the first rows, which ``--top-by mean`` tells
        apart."""
        said = [
            f"'{key}' has no components in '{self.choice.components}': its channels are gathered, not its components"
            for key in self.without
        ]
        if self.choice.top_by != "max":
            return said
        for key, layout in self.layouts.items():
            if is_component_key(key):
                continue  # components have no ceiling: tied examples are components the inputs do not reach
            values, low = tensors.get(stats_key(key, "top_values")), tensors.get(stats_key(key, "min"))
            if values is None or low is None or values.shape[1] < 2:
                continue
            tied = int(((values[:, -1] == values[:, 0]) & (values[:, 0] > low)).sum())
            if tied:
                why = "" if is_gradient(key) else " (an activation's ceiling, as ReLU6's)"  # a gradient has none
                said.append(
                    f"'{key}': the {values.shape[1]} examples of {tied:,} of its {layout.channels:,} channels tie at "
                    f"their largest value{why}: they are the first inputs to reach it; --top-by mean ranks them by "
                    "their maps' means"
                )
        return said

    def metadata(self, run: Mapping[str, str], made: Made) -> dict[str, str]:
        return stats_metadata(
            run,
            options=self.choice.describe(),
            units={key: _describe(layout) for key, layout in self.layouts.items()},
            inputs=made.inputs,
            skipped=made.skipped,
            identity=made.identity,
        )


class GatheredStats:
    """The statistics of shard ``number`` (or of shards merged): a :class:`LayerStats` a key."""

    def __init__(self, gathering: StatsGathering, number: int) -> None:
        self.gathering, self.number = gathering, number
        self.layers: dict[str, LayerStats] = {}

    def update(self, features: Mapping, rows: torch.Tensor) -> None:
        features = self._with_components(features)
        for key, value in features.items():
            if key not in self.layers:
                if isinstance(value, list):
                    raise CaptureError(
                        f"'{key}' has rows of their own shapes (a detection or segmentation model's images differ "
                        "in size): statistics need every row of a layer in one shape",
                        hint="give a segmentation model inputs of one size (--resize and --crop); a detector sizes "
                        "each image itself: choose another layer or model",
                    )
                # Each shard and key draws its own random choices, the same whichever process computes it and
                # whichever other layers it gathers with.
                layout = self.gathering.layout(key, value.shape[1:])
                seed = self.number << 32 | zlib.crc32(key.encode())
                self.layers[key] = LayerStats(layout, self.gathering.choice, seed=seed, key=key, device=value.device)
            self.layers[key].update(value, rows)

    def _with_components(self, features: Mapping) -> Mapping:
        """``features`` and, after each layer the basis has components of, their projections onto them."""
        gathering = self.gathering
        if not gathering.basis:
            return features
        layouts = {
            key: gathering.layout(key, value.shape[1:])
            for key, value in features.items()
            if not isinstance(value, list)
        }
        if not gathering.checked:
            gathering.check_layers({key: layout.channels for key, layout in layouts.items()})
            gathering.checked = True
        found = {}
        for key, value in features.items():
            found[key] = value
            if key in gathering.basis and key in layouts:
                derived, projected = gathering.basis[key].project(value, layouts[key])
                gathering.layouts.setdefault(component_key(key), derived)
                found[component_key(key)] = projected
        return found

    def seal(self) -> None:
        pass  # every batch is gathered as it comes

    def merge(self, other: GatheredStats) -> None:
        for key, layer in other.layers.items():
            if key in self.layers:
                if layer.layout != self.layers[key].layout:
                    raise ValueError(
                        f"its '{key}' has rows of shape {list(layer.layout.row_shape)}, and the shards before it "
                        f"{list(self.layers[key].layout.row_shape)}"
                    )
                self.layers[key].merge(layer)
            else:
                self.layers[key] = layer

    def state(self) -> dict[str, torch.Tensor]:
        return {
            stats_key(key, name): value for key, layer in self.layers.items() for name, value in layer.state().items()
        }

    def describe(self) -> dict:
        return {key: _describe(layer.layout) for key, layer in self.layers.items()}

    def result(self, positions: torch.Tensor) -> dict[str, torch.Tensor]:
        return {
            stats_key(key, name): value
            for key, layer in self.layers.items()
            for name, value in layer.result(positions).items()
        }


def _describe(layout: UnitLayout) -> dict:
    return {
        "channels": layout.channels,
        "spatial": list(layout.spatial),
        "layout": layout.kind,
        "skip": layout.skip,
        "row_shape": list(layout.row_shape),
    }
