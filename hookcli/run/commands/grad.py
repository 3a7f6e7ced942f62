"""``hookcli grad``: the gradients of a target (a class, a unit) with respect to the layers, a row an input."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

from hookcli.families import FamilyTraits
from hookcli.options.run import RunOptions
from hookcli.run.commands.base import Asked, Command, Parts, refuse_unsupported
from hookcli.run.selectors import selected_layers
from hookcli.run.settings import RunSettings
from hookcli.run.targets import parse_target

if TYPE_CHECKING:
    from hookcli.models.loaded import LoadedModel
    from hookcli.run.targets import Target

__all__ = ["Grad", "NO_GRADIENTS", "gradient_target"]

#: Why a family has no gradients (or no CAM pictures), said as the hint.
NO_GRADIENTS = {
    "video": "a clip has no one photo to draw a map over; 'hookcli grad' gives the gradients of a video model",
    "optical_flow": "a flow field is not a class score; extract the layers instead",
    "quantized": "quantized kernels have no backward; use the float model (the name without quantized_)",
}

#: What a gradient run says of ``--compile``.
EAGER = ("--compile: gradients need the eager graph with hooks; running eagerly",)


class Grad(Command):
    """Runs the forward and a backward from the target; keeps the layers' output gradients."""

    name = "grad"
    named = ".grad"
    captures_as_asked = False
    fuses = False

    def check(self, family: str, traits: FamilyTraits, opts: RunOptions) -> None:
        if not traits.gradients:
            raise refuse_unsupported(self.name, family, NO_GRADIENTS[family])

    def plan(self, asked: Asked, loaded: LoadedModel, settings: RunSettings) -> Parts:
        from hookcli.run.gradients import GradientForward

        target, notes = gradient_target(loaded, asked.opts)
        return Parts(
            selected_layers(loaded, asked.layers),
            functools.partial(GradientForward, target=target, categories=loaded.categories, scores=loaded.scores),
            {"target": target.describe()},
            target=target,
            notes=notes,
            compiled=EAGER if asked.opts.compile else (),
        )


def gradient_target(loaded: LoadedModel, opts: RunOptions) -> tuple[Target, tuple[str, ...]]:
    """What gradients are taken of, read against the model, and what is said of it."""
    from hookcli.models.loading import num_classes

    # A module handed in may return its logits beside other outputs, after layers of other widths: its scores are
    # counted when it runs.
    classes = loaded.classes or (None if loaded.source in ("module", "factory") else num_classes(loaded.module))
    target = parse_target(opts.target, loaded.categories, classes, region=opts.region, family=loaded.family)
    notes: tuple[str, ...] = ()
    if loaded.scores not in (None, "logits"):
        what = "image embedding" if loaded.scores == "embedding" else loaded.scores
        notes = (f"{loaded.name} has no classifier: targets are units of its {what}",)
    return target, notes
