"""``hookcli patch``: activation patching over pairs of inputs (:mod:`hookcli.run.patching`, gathered by
:class:`~hookcli.statistics.patching.PatchGathering`). The inputs are the pairs in order, a source then its target."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING

from hookcli.errors import UsageProblem
from hookcli.families import FamilyTraits, square_input
from hookcli.options.run import RunOptions
from hookcli.run.commands.base import Asked, Parts, Planned, refuse_unsupported
from hookcli.run.commands.gathering import Gathers
from hookcli.run.selectors import selected_layers
from hookcli.run.settings import RunSettings

if TYPE_CHECKING:
    from hookcli.models.loaded import LoadedModel
    from hookcli.storage.rows_writer import RowsWriter

__all__ = ["Patch"]

_WHOLE_PAIRS = "patch runs pairs, a source then its target, and a batch or shard must hold whole pairs"


class Patch(Gathers):
    """Gathers, pair by pair, how far patching each layer of the target with the source's moves its output."""

    name = "patch"
    named = ".patch"
    fuses = False

    def check(self, family: str, traits: FamilyTraits, opts: RunOptions) -> None:
        if traits.output != "logits":
            raise refuse_unsupported(
                self.name, family, "patch measures the logit of the source's class less the target's (classifiers)"
            )
        if traits.videos:  # a video gives a row a clip, so rows would not keep to pairs
            raise refuse_unsupported(self.name, family, "patch pairs images: patch frames saved as images instead")
        if opts.batch_size % 2:
            raise UsageProblem(
                f"--batch-size {opts.batch_size}: {_WHOLE_PAIRS}", hint=f"give --batch-size {opts.batch_size + 1}"
            )
        if opts.shard_size is not None and opts.shard_size % 2:
            raise UsageProblem(
                f"--shard-size {opts.shard_size}: {_WHOLE_PAIRS}", hint=f"give --shard-size {opts.shard_size + 1}"
            )

    def plan(self, asked: Asked, loaded: LoadedModel, settings: RunSettings) -> Parts:
        from hookcli.run.patching import patch_forward

        opts = asked.opts
        selected = selected_layers(loaded, asked.layers)
        if "" in selected:
            raise UsageProblem(
                "patch: the model itself is not a layer to patch (its output is what is measured)",
                hint="give the module paths of layers inside it (hookcli layers lists them)",
            )
        described = {"layers": list(selected), "keys": dict(selected), "positions": opts.positions}
        forward = patch_forward(
            positions=opts.positions, prefix_tokens=loaded.prefix_tokens, square=square_input(settings.preprocess)
        )
        return Parts(selected, forward, {"patch": json.dumps(described)})

    def writer(self, run: Planned, note: Callable[[str], None]) -> RowsWriter:
        from hookcli.statistics.patching import PatchGathering
        from hookcli.storage.gathering_writer import GatheringWriter

        described = json.loads(run.record.command["patch"])
        return GatheringWriter.of(run, PatchGathering(described["keys"], described=described), note)
