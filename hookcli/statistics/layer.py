"""One layer's statistics: its accumulators, fed the same batches, merged together, and written out under the
statistics file's names (:mod:`hookcli.storage.stats_format`).

>>> choice = StatsChoice(top=2, quantiles=(0.5,), pca=False)
>>> stats = LayerStats(UnitLayout.of((3, 2, 2)), choice)
>>> stats.update(torch.arange(24.0).reshape(2, 3, 2, 2), torch.tensor([0, 1]))
>>> result = stats.result(torch.tensor([0, 1]))
>>> sorted(result), result["top_rows"][0].tolist(), result["top_at"][0, 0].tolist(), result["quantiles"].shape
(['count', 'max', 'mean', 'min', 'quantiles', 'std', 'top_at', 'top_maps', 'top_rows', 'top_values', 'zeros'], \
[1, 0], [1, 1], torch.Size([3, 1]))
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields

import torch

from hookcli.errors import CaptureError
from hookcli.inputs.archives import file_stamp
from hookcli.options.stats import StatsOptions
from hookcli.statistics.base import Accumulator
from hookcli.statistics.covariance import MAX_CHANNELS, Covariance
from hookcli.statistics.examples import SCORES, TopExamples
from hookcli.statistics.moments import Moments
from hookcli.statistics.sketch import DEFAULT_K, QuantileSketch
from hookcli.statistics.units import UnitBatch, UnitLayout
from hookcli.storage.stats_format import layer_fields

__all__ = ["LayerStats", "StatsChoice"]


@dataclass(frozen=True)
class StatsChoice(StatsOptions):
    """What statistics gather besides the moments (:class:`hookcli.options.stats.StatsOptions`): ``top`` examples a
    channel ranked by ``top_by``, the quantile ``levels``, the covariance and its components (``pca``), and the
    components of another file gathered as layers of their own (``components``)."""

    @classmethod
    def from_options(cls, options) -> StatsChoice:
        """The choice a run's options (:class:`hookcli.options.run.RunOptions`) make."""
        return cls(**{f.name: getattr(options, f.name) for f in fields(cls)})

    def describe(self) -> dict:
        """The choice as the statistics file's ``stats`` metadata records it (``components``: the file and its stamp,
        when given; left out when not, as runs made before the choice existed record it)."""
        found = {**asdict(self), "quantiles": list(self.quantiles)}
        if self.components is None:
            del found["components"]
        else:
            found["components"] = {"source": str(self.components), "stamp": file_stamp(self.components)}
        return found


class LayerStats:
    """The accumulators of one layer of ``layout`` (see the module), on ``device`` (the rows' own: a GPU run's
    statistics are gathered on the GPU). ``seed`` draws the quantile sketch's random choices."""

    def __init__(
        self, layout: UnitLayout, choice: StatsChoice, *, seed: int = 0, key: str = "the layer", device=None
    ) -> None:
        self.layout, self.choice = layout, choice
        channels = layout.channels
        if choice.pca and channels > MAX_CHANNELS:
            raise CaptureError(
                f"'{key}' has {channels} channels: its covariance would take {channels**2 * 8 / 2**30:.1f} GiB "
                f"(at most {MAX_CHANNELS} channels are covered)",
                hint="add --no-pca to gather the other statistics",
            )
        self.moments = Moments(channels, device=device)
        self.sketch = QuantileSketch(channels, seed=seed, device=device)
        self.examples = TopExamples(channels, choice.top, positions=layout.positions, by=choice.top_by, device=device)
        self.covariance = Covariance(channels, device=device) if choice.pca else None

    @property
    def _parts(self) -> dict[str, Accumulator]:
        parts: dict[str, Accumulator] = {"moments": self.moments, "sketch": self.sketch, "examples": self.examples}
        if self.covariance is not None:
            parts["covariance"] = self.covariance
        return parts

    def update(self, rows: torch.Tensor, inputs: torch.Tensor) -> None:
        """Add a batch: ``rows`` ``[n, *row_shape]`` came from the inputs numbered ``inputs``."""
        batch = UnitBatch(rows, inputs, self.layout)
        for part in self._parts.values():
            part.update(batch)

    def merge(self, other: LayerStats) -> None:
        for name, part in self._parts.items():
            part.merge(other._parts[name])

    def state(self) -> dict[str, torch.Tensor]:
        """Every accumulator's state, named ``<accumulator>.<name>``."""
        return {f"{name}.{key}": value for name, part in self._parts.items() for key, value in part.state().items()}

    @classmethod
    def from_state(cls, state: Mapping[str, torch.Tensor], layout: UnitLayout, choice: StatsChoice) -> LayerStats:
        made = cls(layout, choice)
        for name, part in made._parts.items():
            own = {key.partition(".")[2]: value for key, value in state.items() if key.partition(".")[0] == name}
            setattr(made, name, type(part).from_state(own))
        return made

    def check_part(self, rows: Sequence[int]) -> None:
        """Refuse (ValueError, saying what is wrong) a state read from a part that the part's inputs ``rows`` could
        not have made: every count, shape, choice and input named is checked against the layout and the rows."""
        state, channels, positions = self.state(), self.layout.channels, self.layout.positions
        values = len(rows) * positions

        def shaped(name: str, *expected: int) -> torch.Tensor:
            found = state.get(name)
            if found is None or tuple(found.shape) != expected:
                raise ValueError(f"its {name} is not of shape {list(expected)}")
            return found

        for name in ("mean", "squares", "min", "max"):
            shaped(f"moments.{name}", channels)
        counted = int(state["moments.count"])
        if counted != values:
            raise ValueError(f"its moments count {counted} values, and its {len(rows)} inputs have {values}")
        zeros = shaped("moments.zeros", channels)
        if int(zeros.min()) < 0 or int(zeros.max()) > values:
            raise ValueError("its moments count zeros that are not among its values")
        count, k, seed, compactions = (int(n) for n in shaped("sketch.info", 4).tolist())
        levels = [state[f"sketch.level{height}"] for height in range(len(self.sketch.levels))]
        if count != values or k != DEFAULT_K or seed < 0 or compactions < 0:
            raise ValueError(f"its quantile sketch (count {count}, k {k}) is not one of {values} values")
        if any(level.dim() != 2 or level.shape[0] != channels for level in levels):
            raise ValueError(f"its quantile sketch has levels that are not of {channels} channels")
        if sum(level.shape[1] << height for height, level in enumerate(levels)) != values:
            raise ValueError(f"the weights of its quantile sketch do not add up to its {values} values")
        top, by = (int(n) for n in shaped("examples.info", 2).tolist())
        if top != self.choice.top or by != SCORES.index(self.choice.top_by):
            raise ValueError(
                f"its dataset examples are not the run's (--top {self.choice.top} by {self.choice.top_by})"
            )
        kept = min(top, len(rows))
        for name in ("values", "rows", "at"):
            shaped(f"examples.{name}", channels, kept)
        shaped("examples.maps", channels, kept, positions)
        if not set(state["examples.rows"].unique().tolist()) <= set(rows):
            raise ValueError("its dataset examples name inputs it has no rows of")
        at = state["examples.at"]
        if at.numel() and (int(at.min()) < 0 or int(at.max()) >= positions):
            raise ValueError(f"its dataset examples name positions outside the {positions} of a map")
        if self.covariance is not None:
            if int(state["covariance.count"]) != len(rows):
                raise ValueError(f"its covariance counts {int(state['covariance.count'])} inputs, not {len(rows)}")
            if "covariance.rows" in state:
                shaped("covariance.rows", len(rows), channels)
            else:
                shaped("covariance.mean", channels)
                shaped("covariance.comoment", channels, channels)

    def result(self, positions: torch.Tensor) -> dict[str, torch.Tensor]:
        """The layer's tensors as a statistics file holds them, by field. ``positions`` gives each input's row in
        the file's ``inputs`` (the examples are numbered by row, not by input). On the CPU, wherever gathered."""
        moments, examples, layout = self.moments, self.examples, self.layout
        levels = torch.tensor(self.choice.quantiles, dtype=torch.float64, device=moments.mean.device)
        quantiles = self.sketch.quantiles(self.choice.quantiles)
        quantiles = torch.where(levels == 0, moments.min[:, None], quantiles)  # the ends are known exactly
        quantiles = torch.where(levels == 1, moments.max[:, None], quantiles)
        quantiles = torch.where(moments.max.isnan()[:, None], moments.max[:, None], quantiles)  # a NaN taints them all
        kept = examples.values.shape[1]
        found = {
            "count": torch.tensor(moments.count, dtype=torch.int64),
            "mean": moments.mean,
            "std": moments.std,
            "min": moments.min,
            "max": moments.max,
            "zeros": moments.zeros,
            "quantiles": quantiles,
            "top_values": examples.values,
            "top_rows": positions[examples.rows.cpu()],
            "top_maps": examples.maps.reshape(layout.channels, kept, *layout.spatial),
        }
        if layout.spatial:
            found["top_at"] = torch.stack(torch.unravel_index(examples.at, layout.spatial), dim=-1)
        if self.covariance is not None:
            found["pca_values"], found["pca_vectors"] = self.covariance.components()
            found["cov"] = self.covariance.matrix  # made after the components: not held while they are found
        wanted = layer_fields(pca=self.choice.pca, spatial=layout.spatial)
        return {name: found[name].cpu().contiguous() for name in wanted}
