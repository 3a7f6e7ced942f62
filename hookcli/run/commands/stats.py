"""``hookcli stats``: each channel's statistics, dataset examples and principal components over every input."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import TYPE_CHECKING

from hookcli.families import square_input
from hookcli.run.commands.base import Asked, Parts, Planned
from hookcli.run.commands.gathering import Gathers
from hookcli.run.settings import RunSettings

if TYPE_CHECKING:
    from hookcli.models.loaded import LoadedModel
    from hookcli.storage.rows_writer import RowsWriter

__all__ = ["Stats"]


class Stats(Gathers):
    """Gathers each layer's channels (:class:`~hookcli.statistics.channel_stats.StatsGathering`)."""

    name = "stats"
    named = ".stats"

    def plan(self, asked: Asked, loaded: LoadedModel, settings: RunSettings) -> Parts:
        from hookcli.statistics.layer import StatsChoice

        choice = StatsChoice.from_options(asked.opts)
        # A statistics run records what it gathers: a run continued with other choices would mix them.
        entries = {"stats": json.dumps(choice.describe())}
        return dataclasses.replace(super().plan(asked, loaded, settings), entries=entries, extras={"stats": choice})

    def writer(self, run: Planned, note: Callable[[str], None]) -> RowsWriter:
        from hookcli.statistics.channel_stats import StatsGathering
        from hookcli.statistics.units import layer_widths
        from hookcli.storage.gathering_writer import GatheringWriter

        assert run.stats is not None, "a statistics run says what it gathers"
        gathering = StatsGathering(
            run.stats,
            prefix_tokens=run.record.prefix_tokens,
            square=square_input(run.settings.preprocess),
            widths=layer_widths(run.loaded.module, run.layers),
        )
        gathering.check_layers(dict.fromkeys(run.layers.values()))  # the channels come with the first rows
        return GatheringWriter.of(run, gathering, note)
