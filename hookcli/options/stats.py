"""What ``stats`` gathers besides the moments, each option declared once as a typed field of :class:`StatsOptions`
(a run's options, :class:`~hookcli.options.run.RunOptions`, take them too)."""

from __future__ import annotations

from dataclasses import dataclass

from hookcli.options.declaring import option
from hookcli.parsing import parse_levels

__all__ = ["TOP_BY", "StatsOptions"]

#: What ranks a channel's dataset examples (``stats --top-by``): the largest value of its map, or the map's mean.
TOP_BY = ("max", "mean")


@dataclass(frozen=True)
class StatsOptions:
    """What statistics gather besides the moments (``stats``' own options)."""

    top: int = option(
        ("--top",),
        "Dataset examples kept for each channel: the inputs that drive it hardest, with where and their maps.",
        ("stats",),
        kind="int",
        default=9,
        low=1,
        high=1000,
        show_default=True,
    )
    top_by: str = option(
        ("--top-by",),
        "What ranks an input for a channel: the largest value of the channel's map, or the map's mean.",
        ("stats",),
        kind="choice",
        choices=TOP_BY,
        default="max",
        show_default=True,
    )
    quantiles: tuple[float, ...] = option(
        ("--quantiles",),
        "Quantile levels of each channel's values, from 0 to 1, within 0.1% of the count in rank (0.995 is "
        "NetDissect's threshold). [0.5,0.99,0.995]",
        ("stats",),
        kind="parsed",
        default=(0.5, 0.99, 0.995),
        metavar="Q,Q,...",
        parser=parse_levels,
    )
    pca: bool = option(
        ("--pca/--no-pca",),
        "The covariance of the channels pooled over positions, and its principal components (a C x C matrix: "
        "--no-pca for layers of more than a few thousand channels).",
        ("stats",),
        kind="flag",
        default=True,
        show_default=True,
    )
    components: str | None = option(
        ("--components",),
        "A statistics file with PCA of these layers (an earlier run's): also gather each layer's first 16 "
        "principal components as a layer of their own, KEY#pc, a channel a component (the channels less the "
        "file's means, projected at each position): their dataset examples are the inputs that drive each "
        "component hardest (--top-by mean: by the projection of their pooled channels).",
        ("stats",),
        metavar="FILE",
    )
