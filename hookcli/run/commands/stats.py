"""``hookcli stats``: each channel's statistics, dataset examples and principal components over every input."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from hookcli.families import square_input
from hookcli.options.run import RunOptions
from hookcli.run.commands.base import Planned
from hookcli.run.commands.gathering import Gathers
from hookcli.run.settings import RunSettings

if TYPE_CHECKING:
    from hookcli.models.loaded import LoadedModel
    from hookcli.run.targets import Target
    from hookcli.storage.rows_writer import RowsWriter

__all__ = ["Stats"]


class Stats(Gathers):
    """Gathers each layer's channels (:class:`~hookcli.statistics.channel_stats.StatsGathering`)."""

    name = "stats"
    named = ".stats"

    def parts(
        self, loaded: LoadedModel, layers: Any, settings: RunSettings, opts: RunOptions, target: Target | None
    ) -> tuple[dict[str, str], Callable[..., Any], dict[str, str]]:
        from hookcli.statistics.layer import StatsChoice

        selected, forward, _ = super().parts(loaded, layers, settings, opts, target)
        # A statistics run records what it gathers: a run continued with other choices would mix them.
        return selected, forward, {"stats": json.dumps(StatsChoice.from_options(opts).describe())}

    def extras(self, opts: RunOptions) -> Mapping[str, Any]:
        from hookcli.statistics.layer import StatsChoice

        return {"stats": StatsChoice.from_options(opts)}

    def writer(self, run: Planned, note: Callable[[str], None]) -> RowsWriter:
        from hookcli.statistics.channel_stats import StatsGathering

        assert run.stats is not None, "a statistics run says what it gathers"
        gathering = StatsGathering(
            run.stats, prefix_tokens=run.record.prefix_tokens, square=square_input(run.settings.preprocess)
        )
        gathering.check_layers(dict.fromkeys(run.layers.values()))  # the channels come with the first rows
        return self.gathering_writer(run, gathering, note)
