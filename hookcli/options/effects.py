"""What ``ablate`` and ``patch`` ask of the units and positions they change, each option declared once as a typed
field of :class:`EffectOptions` (a run's options, :class:`~hookcli.options.run.RunOptions`, take them too)."""

from __future__ import annotations

from dataclasses import dataclass

from hookcli.options.declaring import option
from hookcli.options.stats import StatsOptions

__all__ = ["EffectOptions", "split_how"]


@dataclass(frozen=True)
class EffectOptions(StatsOptions):
    """Which units ``ablate`` ablates and how, what it measures, and whether ``patch`` patches position by position."""

    units: str | None = option(
        ("--units",),
        "The units to ablate, each alone: K, A:B, K,L,M or * [every unit of the layer].",
        ("ablate",),
        metavar="UNITS",
    )
    how: str = option(
        ("--how",),
        "How a unit is ablated: zero, mean:FILE (its @mean in a stats file of the same model and layer) or "
        "resample (its value in a partner row of the batch).",
        ("ablate",),
        default="zero",
        metavar="zero|mean:FILE|resample",
        show_default=True,
    )
    effect_on: str = option(
        ("--effect-on",),
        "The output whose change is measured: . (the model's: a classifier's logits) or a layer, its output "
        "flattened to a row of values an input (an embedding, a head's scores).",
        ("ablate",),
        default=".",
        metavar="LAYER",
        show_default=True,
    )
    positions: bool = option(
        ("--positions",),
        "Patch each position of a layer's output alone (a map's pixels, a sequence's tokens, the class token "
        "included), not the whole output: the file holds a map of effects a layer and pair. A layer whose output is "
        "a vector has no positions and is patched whole. The part after the layer runs once a position.",
        ("patch",),
        kind="flag",
        default=False,
    )


def split_how(how: str | None) -> tuple[str, str]:
    """``--how`` as ``(kind, file)``: ``mean:FILE`` is ``("mean", "FILE")``, ``zero`` (the default) ``("zero", "")``.

    >>> split_how("mean:a:b.safetensors"), split_how(None)
    (('mean', 'a:b.safetensors'), ('zero', ''))
    """
    kind, _, file = (how or "zero").partition(":")
    return kind, file
