"""``hookcli grad``: the gradients of a target (a class, a unit) with respect to the layers, a row an input."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from hookcli.options.run import RunOptions
from hookcli.run.commands.base import Command, named_model, refuse_unsupported, selectors
from hookcli.run.selectors import resolve_layers
from hookcli.run.settings import RunSettings
from hookcli.run.targets import parse_target

if TYPE_CHECKING:
    from hookcli.families import FamilyTraits
    from hookcli.models.loaded import LoadedModel
    from hookcli.run.targets import Target

__all__ = ["Grad", "NO_GRADIENTS"]

#: Why a family has no gradients (or no CAM pictures), said as the hint.
NO_GRADIENTS = {
    "video": "a clip has no one photo to draw a map over; 'hookcli grad' gives the gradients of a video model",
    "optical_flow": "a flow field is not a class score; extract the layers instead",
    "quantized": "quantized kernels have no backward; use the float model (the name without quantized_)",
}


class Grad(Command):
    """Runs the forward and a backward from the target; keeps the layers' output gradients."""

    name = "grad"
    named = ".grad"
    captures_as_asked = False
    fuses = False

    def check_family(self, family: str, traits: FamilyTraits) -> None:
        if not traits.gradients:
            raise refuse_unsupported(self.name, family, NO_GRADIENTS[family])

    def compile_notes(self, loaded: LoadedModel, settings: RunSettings, opts: RunOptions) -> tuple[str, ...]:
        return ("--compile: gradients need the eager graph with hooks; running eagerly",) if opts.compile else ()

    def target(self, loaded: LoadedModel, opts: RunOptions) -> tuple[Target | None, tuple[str, ...]]:
        from hookcli.models.loading import num_classes

        target = parse_target(
            opts.target,
            loaded.categories,
            loaded.classes or num_classes(loaded.module),
            region=opts.region,
            family=loaded.family,
        )
        notes: tuple[str, ...] = ()
        if loaded.scores not in (None, "logits"):
            notes += (
                f"{loaded.name} has no classifier: targets are units of its "
                f"{'image embedding' if loaded.scores == 'embedding' else loaded.scores}",
            )
        return target, notes

    def parts(
        self, loaded: LoadedModel, layers: Any, settings: RunSettings, opts: RunOptions, target: Target | None
    ) -> tuple[dict[str, str], Callable[..., Any], dict[str, str]]:
        from hookcli.run.gradients import GradientForward

        assert target is not None, "a gradient run has a target"
        return (
            resolve_layers(loaded.module, selectors(layers), model_name=named_model(loaded)),
            functools.partial(GradientForward, target=target, categories=loaded.categories, scores=loaded.scores),
            {"target": target.describe()},
        )
