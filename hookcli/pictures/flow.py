"""Optical-flow fields in colour: the hue is the direction, white to full colour the length (the colour wheel of
Baker et al.'s Middlebury benchmark), with a legend.

>>> import numpy as np
>>> flow_colours(np.zeros((2, 3, 4), dtype=np.float32)).shape
(3, 4, 3)
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from PIL import Image, ImageDraw

from hookcli.pictures.render import stacked
from hookcli.pictures.text import caption_font, fitted

__all__ = ["add_flow_legend", "flow_colours", "FLOW_NAN_COLOR", "flow_wheel", "longest_flow"]


#: Flow vectors with NaN or ±inf are drawn black, a colour the flow code never gives (each of its colours is pale or
#: has a full channel).
FLOW_NAN_COLOR = (0, 0, 0)


def _wheel_segment(count: int, start: tuple[int, int, int], end: tuple[int, int, int]) -> np.ndarray:
    """``count`` colours from ``start`` towards ``end`` (channels moving by whole steps of 255 / count, floored)."""
    steps = np.floor(255 * np.arange(count) / count)[:, None]
    return np.asarray(start) + np.sign(np.subtract(end, start)) * steps


#: The 55 hues of the Middlebury flow colour code (Baker et al., 2011), red through yellow, green, cyan, blue and
#: magenta, each segment as long as its colours are told apart.
_FLOW_WHEEL = np.concatenate(
    [
        _wheel_segment(15, (255, 0, 0), (255, 255, 0)),
        _wheel_segment(6, (255, 255, 0), (0, 255, 0)),
        _wheel_segment(4, (0, 255, 0), (0, 255, 255)),
        _wheel_segment(11, (0, 255, 255), (0, 0, 255)),
        _wheel_segment(13, (0, 0, 255), (255, 0, 255)),
        _wheel_segment(6, (255, 0, 255), (255, 0, 0)),
    ]
)


def longest_flow(flow: np.ndarray) -> float | None:
    """The length of the longest finite vector of a ``[2, H, W]`` flow field, or None when there is none."""
    flow = np.asarray(flow, dtype=np.float64)
    finite = np.isfinite(flow).all(axis=0)
    return float(np.hypot(flow[0], flow[1])[finite].max()) if finite.any() else None


def flow_colours(flow: np.ndarray) -> np.ndarray:
    """A ``[2, H, W]`` flow field (dx, dy; y runs down the picture) as ``uint8 [H, W, 3]`` in the Middlebury code.

    The hue is the direction, as on :func:`flow_wheel` (motion to the right
    is red, down orange-yellow, left blue-cyan, up violet), and the length
    over the field's longest vector goes from white (still) to full colour
    (the longest). Vectors with NaN or ±inf are :data:`FLOW_NAN_COLOR`.

    >>> flow_colours(np.array([[[3.0, -3.0, 0.0]], [[0.0, 0.0, 0.0]]]))[0].tolist()
    [[255, 0, 0], [0, 209, 255], [255, 255, 255]]
    """
    flow = np.asarray(flow, dtype=np.float64)
    finite = np.isfinite(flow).all(axis=0)
    dx, dy = np.where(finite, flow, 0.0) + 0.0  # + 0.0: a negative zero is zero, so +x is red whatever dy's sign
    longest = longest_flow(flow)
    length = np.hypot(dx, dy) / (longest or 1.0)
    position = (np.arctan2(-dy, -dx) / np.pi + 1) / 2 * (len(_FLOW_WHEEL) - 1)
    low = np.floor(position).astype(np.intp)
    share = (position - low)[..., None]
    hue = (1 - share) * _FLOW_WHEEL[low] + share * _FLOW_WHEEL[(low + 1) % len(_FLOW_WHEEL)]
    pixels = np.floor(255 - length[..., None] * (255 - hue)).astype(np.uint8)
    pixels[~finite] = FLOW_NAN_COLOR
    return pixels


def flow_wheel(side: int = 64) -> np.ndarray:
    """The key to :func:`flow_colours`: a disc ``side`` pixels across, each point coloured as the motion from the
    centre to it, full colour on the rim; white around it."""
    centre = (side - 1) / 2
    y, x = (np.mgrid[0:side, 0:side] - centre) / max(centre, 1.0)
    inside = x * x + y * y <= 1
    return flow_colours(np.where(inside, np.stack([x, y]), 0.0))


def add_flow_legend(pixels: np.ndarray, lines: Sequence[str]) -> np.ndarray:
    """Put the flow colour wheel (:func:`flow_wheel`) under the picture, with ``lines`` of text beside it."""
    width = pixels.shape[1]
    font = caption_font(width)
    line_h = font.getbbox("Ag")[3] + 4
    side = max(32, line_h * len(lines))
    left = 6 + side + 10
    strip = Image.new("RGB", (max(width, left + 64), side + 12), (255, 255, 255))
    strip.paste(Image.fromarray(flow_wheel(side)), (6, 6))
    draw = ImageDraw.Draw(strip)
    room = strip.width - left - 4
    for i, words in enumerate(lines):
        draw.text((left, 6 + i * line_h), fitted(words, font, room), fill=(0, 0, 0), font=font)
    return stacked(pixels, np.asarray(strip))
