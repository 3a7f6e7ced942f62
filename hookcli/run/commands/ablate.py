"""``hookcli ablate``: each unit of a layer ablated alone, and what that does to the model's output over every input
(:mod:`hookcli.run.ablation`, gathered by :class:`~hookcli.statistics.ablation.AblationGathering`)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from hookcli.errors import UsageProblem
from hookcli.families import FamilyTraits, square_input
from hookcli.files import regular_file_problem
from hookcli.options.effects import split_how
from hookcli.options.interventions import Intervention, parse_units
from hookcli.options.run import RunOptions
from hookcli.run.commands.base import Asked, Parts, Planned, refuse_unsupported
from hookcli.run.commands.gathering import Gathers
from hookcli.run.selectors import selected_layers
from hookcli.run.settings import RunSettings

if TYPE_CHECKING:
    from hookcli.models.loaded import LoadedModel
    from hookcli.storage.rows_writer import RowsWriter

__all__ = ["Ablate", "ablation_choice"]

#: How a unit may be ablated (``--how``): set to 0, to its mean over a dataset (``mean:FILE``, a stats file), or to
#: its value in another row of the batch.
HOWS = ("zero", "mean", "resample")


class Ablate(Gathers):
    """Gathers each unit's effect on the output when it alone is ablated."""

    name = "ablate"
    named = ".ablate"

    def check(self, family: str, traits: FamilyTraits, opts: RunOptions) -> None:
        if traits.output in ("detections", "flow"):
            raise refuse_unsupported(
                self.name, family, "ablate measures outputs that are one tensor a row (classifiers, embeddings)"
            )
        ablation_choice(opts)  # refused before the inputs are looked for

    def plan(self, asked: Asked, loaded: LoadedModel, settings: RunSettings) -> Parts:
        from hookcli.run.ablation import ablation_forward
        from hookcli.run.edits import read_otherwise, resampled_alone, resolve_edits

        opts = asked.opts
        selected = selected_layers(loaded, asked.layers)
        if len(selected) != 1 or "" in selected:
            raise UsageProblem(
                f"ablate takes one layer, and {', '.join(selected) or 'the model itself'} "
                f"{'were' if len(selected) > 1 else 'was'} given",
                hint="give one module path with -l (hookcli layers lists them)",
            )
        (layer,) = selected
        how, units, file = ablation_choice(opts)
        effect_on = _effect_layer(loaded, opts.effect_on)
        # Units and a mean's file are checked as --intervene's are: before the model runs.
        spec = Intervention(layer, units, "mean" if how == "mean" else "zero", file=file, said=self.name)
        (edit,) = resolve_edits(
            loaded.module, [spec], model_name=loaded.name, weights=loaded.weights, seed=opts.seed or 0
        )
        described = {
            "layer": layer,
            "key": selected[layer],
            "how": how,
            "units": None if units is None else list(units),
            "effect_on": opts.effect_on,
            **({"file": os.path.abspath(file), "stamp": edit.stamp} if file else {}),  # as --intervene's are
            # resample pairs the rows of a batch: its seed and the batch size are part of what it means
            **({"seed": opts.seed or 0, "batch_size": settings.batch_size} if how == "resample" else {}),
        }
        forward = ablation_forward(
            how=how,
            effect_on=effect_on,
            units=units,
            mean=edit.vector,
            seed=opts.seed or 0,
            prefix_tokens=loaded.prefix_tokens,
            square=square_input(settings.preprocess),
        )
        said = read_otherwise(edit, settings.preprocess)
        said += resampled_alone([self.name] if how == "resample" else [], settings.batch_size)
        return Parts(selected, forward, {"ablate": json.dumps(described)}, notes=said)

    def writer(self, run: Planned, note: Callable[[str], None]) -> RowsWriter:
        from hookcli.statistics.ablation import AblationGathering
        from hookcli.storage.gathering_writer import GatheringWriter

        described = json.loads(run.record.command["ablate"])
        gathering = AblationGathering(described["key"], units=described["units"], described=described)
        return GatheringWriter.of(run, gathering, note)


def ablation_choice(opts: RunOptions) -> tuple[str, tuple[int, ...] | None, str | None]:
    """``(how, units, the file of a mean ablation)`` of the options; refused in one line when they are not one."""
    how, file = split_how(opts.how)
    if how not in HOWS or (how == "mean") != bool(file):
        raise UsageProblem(
            f"--how takes zero, mean:FILE or resample, not '{opts.how}'",
            hint="mean:FILE reads each unit's mean from a stats file of the same model and layer",
        )
    problem = regular_file_problem(Path(file)) if file else None
    if problem is not None:
        raise UsageProblem(
            f"--how '{opts.how}': '{file}' {problem}", hint="give the stats file of the same model and layer"
        )
    try:
        units = None if opts.units is None else parse_units(opts.units)
    except ValueError as err:
        raise UsageProblem(f"--units '{opts.units}': {err}", hint="give K, A:B, K,L,M or * (every unit)") from None
    return how, units, file or None


def _effect_layer(loaded: LoadedModel, effect_on: str) -> str:
    """The module path whose output the effects are measured on (``.``: the model's own)."""
    if effect_on != "." and effect_on not in dict(loaded.module.named_modules()):
        raise UsageProblem(
            f"--effect-on '{effect_on}': the model has no layer '{effect_on}'",
            hint="give a module path as hookcli layers lists it, or leave it out for the model's output",
        )
    return effect_on
