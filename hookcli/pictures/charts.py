"""Small charts of a statistics file, as inline SVG for the report's pages: a channel's values from its quantiles
(:func:`quantiles_svg`) and a layer's principal components (:func:`scree_svg`).

Numbers are the only thing taken from the file, so nothing here needs escaping
but the tooltips' text, which is made of numbers too.

>>> svg = quantiles_svg(0.0, [0.5, 0.99], [1.0, 4.0], 5.0, mean=1.2)
>>> svg.startswith("<svg") and svg.count("<rect") == 3
True
>>> scree_svg(np.array([6.0, 3.0, 1.0])).count("<rect")
3
"""

from __future__ import annotations

import html
from collections.abc import Sequence

import numpy as np

from hookcli.pictures.text import number

__all__ = ["SCREE_COMPONENTS", "quantiles_svg", "scree_svg"]

#: The most components a scree plot shows.
SCREE_COMPONENTS = 64
#: The narrowest bar of a quantile chart, in pixels: a range of no width (every value alike) still shows.
_SPIKE = 2.0
_BAR, _SPIKE_BAR, _LINE, _MEAN = "#4c72b0", "#1b2a4a", "#dd8452", "#c44e52"


def quantiles_svg(low: float, levels: Sequence[float], quantiles: Sequence[float], high: float, *, mean: float) -> str:
    """A channel's values as a histogram of the ranges between its quantiles: from ``low`` (level 0) through each
    quantile (its level) to ``high`` (level 1), each range a bar whose area is the share of values in it (so its
    height is their density, the densest range's the chart's); a range too narrow to draw (many values alike: the
    zeros after a ReLU) is a dark spike instead, as high as its share of all values; the ``mean`` a line. Levels
    are sorted, and quantiles out of order (a crafted file's) are taken as the largest before them."""
    width, height, left, right, top, base = 280, 64, 6, 274, 4, 46
    order = np.argsort(np.asarray(levels, dtype=np.float64), kind="stable")
    points = np.array([low, *np.asarray(quantiles, dtype=np.float64)[order], high])
    shares = np.diff(np.array([0.0, *np.asarray(levels, dtype=np.float64)[order], 1.0]))
    if not np.isfinite(points).all():
        return '<p class="missing">No chart: the channel has values that are not finite.</p>'
    points = np.clip(np.maximum.accumulate(points), low, high)
    span = high - low
    xs = left + (points - low) / span * (right - left) if span > 0 else np.full(len(points), (left + right) / 2)
    spikes = np.diff(xs) < _SPIKE  # values alike, or nearly: their density would dwarf every other bar's
    widths = np.maximum(np.diff(xs), _SPIKE)
    density = np.where(spikes, 0.0, shares / widths)
    tallest = density.max() if density.max() > 0 else 1.0
    parts = [
        f'<svg class="quantiles" width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img" '
        f'aria-label="values between quantiles">',
        f'<line x1="{left}" y1="{base}" x2="{right}" y2="{base}" stroke="#999"/>',
    ]
    # A spike's height is its share of all values (at least a twentieth, to be seen), drawn over the bars.
    heights = np.where(spikes, np.maximum(shares, 0.05), density / tallest) * (base - top)
    for spike in (False, True):
        for start, stop, x, bar, share, tall, kind in zip(points, points[1:], xs, widths, shares, heights, spikes):
            if share <= 0 or kind != spike:
                continue
            what = f"{share:.1%} of values from {number(start)} to {number(stop)}"
            parts.append(
                f'<rect x="{min(x, right - bar):.2f}" y="{base - tall:.2f}" width="{bar:.2f}" height="{tall:.2f}" '
                f'fill="{_SPIKE_BAR if spike else _BAR}"><title>{html.escape(what)}</title></rect>'
            )
    if np.isfinite(mean) and span > 0:
        at = left + (min(max(mean, low), high) - low) / span * (right - left)
        parts.append(
            f'<line x1="{at:.2f}" y1="{top}" x2="{at:.2f}" y2="{base}" stroke="{_MEAN}" stroke-width="1.5">'
            f"<title>mean {number(mean)}</title></line>"
        )
    parts.append(
        f'<text x="{left}" y="{height - 4}" font-size="11">{number(low)}</text>'
        f'<text x="{right}" y="{height - 4}" font-size="11" text-anchor="end">{number(high)}</text></svg>'
    )
    return "".join(parts)


def scree_svg(variances: np.ndarray, shown: int = SCREE_COMPONENTS) -> str:
    """A scree plot of the first ``shown`` principal components: each one's share of the variance (bars, on the
    left axis) and the share of the components up to it (a line, on the right axis, 0 to 100%). Variances below
    zero (rounding) count as zero; without variance there is nothing to plot."""
    kept = np.clip(np.nan_to_num(np.asarray(variances, dtype=np.float64), nan=0.0, posinf=0.0), 0.0, None)
    total = kept.sum()
    if not total > 0 or not np.isfinite(total):
        return '<p class="missing">No plot: the channels do not vary.</p>'
    shares = kept / total
    cumulative = np.cumsum(shares)[:shown]
    shares = shares[:shown]
    width, height, left, right, top, base = 600, 220, 48, 552, 12, 186
    step = (right - left) / len(shares)
    tallest = max(float(shares.max()), 1e-12)
    parts = [
        f'<svg class="scree" width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img" '
        f'aria-label="explained variance of each principal component">',
        f'<line x1="{left}" y1="{base}" x2="{right}" y2="{base}" stroke="#999"/>',
        f'<line x1="{left}" y1="{top}" x2="{left}" y2="{base}" stroke="#999"/>',
        f'<line x1="{right}" y1="{top}" x2="{right}" y2="{base}" stroke="#999"/>',
    ]
    for k, (share, total_so_far) in enumerate(zip(shares, cumulative)):
        tall = share / tallest * (base - top)
        what = f"component {k + 1}: {share:.2%} of the variance ({total_so_far:.2%} with those before it)"
        parts.append(
            f'<rect x="{left + k * step + step * 0.1:.2f}" y="{base - tall:.2f}" width="{step * 0.8:.2f}" '
            f'height="{tall:.2f}" fill="{_BAR}"><title>{html.escape(what)}</title></rect>'
        )
    line = " ".join(
        f"{left + (k + 0.5) * step:.2f},{base - share * (base - top):.2f}" for k, share in enumerate(cumulative)
    )
    parts.append(f'<polyline points="{line}" fill="none" stroke="{_LINE}" stroke-width="2"/>')
    parts.append(
        f'<text x="{left - 4}" y="{top + 10}" font-size="11" text-anchor="end">{tallest:.1%}</text>'
        f'<text x="{left - 4}" y="{base}" font-size="11" text-anchor="end">0</text>'
        f'<text x="{right + 4}" y="{top + 10}" font-size="11" fill="{_LINE}">100%</text>'
        f'<text x="{right + 4}" y="{base}" font-size="11" fill="{_LINE}">0</text>'
        f'<text x="{(left + right) / 2}" y="{height - 8}" font-size="12" text-anchor="middle">principal component '
        f"(1 to {len(shares)}): its share of the variance (bars), and with those before it (line)</text></svg>"
    )
    return "".join(parts)
