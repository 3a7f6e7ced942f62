"""Boxes over photos: a detection model's boxes, each with a tab of text placed where it covers no other tab, and
the box of the detection a class-activation map explains.

>>> place_tabs(np.array([[10.0, 30.0, 50.0, 60.0], [12.0, 32.0, 52.0, 62.0]]), [(20, 10), (20, 10)], 100, 100)
[(10, 50), (12, 22)]
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from PIL import Image, ImageDraw

from hookcli.pictures.text import caption_font, shortened

__all__ = ["BOX_COLOURS", "CAM_BOX_COLOUR", "draw_boxes", "place_tabs"]


#: Colours of detection boxes, one a class label (its index modulo ten): matplotlib's tab10, which stand out on photos.
BOX_COLOURS = (
    (31, 119, 180),
    (255, 127, 14),
    (44, 160, 44),
    (214, 39, 40),
    (148, 103, 189),
    (140, 86, 75),
    (227, 119, 194),
    (127, 127, 127),
    (188, 189, 34),
    (23, 190, 207),
)


#: The most characters a box's tab shows.
_MOST_TAB = 60
#: The box of the detection a CAM explains: cyan, which the heat maps' colormaps seldom use.
CAM_BOX_COLOUR = (0, 255, 255)


def draw_boxes(
    photo: np.ndarray, boxes: np.ndarray, colours: Sequence[tuple[int, int, int]], texts: Sequence[str] | None = None
) -> tuple[np.ndarray, int]:
    """``boxes`` (``[K, 4]``: x1, y1, x2, y2 in ``photo``'s pixels, finite) outlined on a copy of a ``uint8 [H, W, 3]``
    photo, each in its colour, later boxes over earlier ones; ``(pixels, texts left out)``.

    Each box's text (None: none) is on a tab of its colour, at a corner :func:`place_tabs` finds where it covers
    no other tab, the later boxes' first (given lowest score first, the best keep theirs); a text with no such
    corner is left out, and counted. Tabs are drawn over every box line. Lines are about a 300th of the picture's
    longer side thick, and the type grows with the picture as a caption's does.

    >>> photo = np.zeros((40, 60, 3), dtype=np.uint8)
    >>> pixels, _ = draw_boxes(photo, np.array([[10.0, 5.0, 30.0, 20.0]]), [(255, 0, 0)])
    >>> pixels[5, 10].tolist(), pixels[12, 20].tolist()
    ([255, 0, 0], [0, 0, 0])
    """
    image = Image.fromarray(np.asarray(photo, dtype=np.uint8))
    draw = ImageDraw.Draw(image)
    line = max(2, round(max(image.size) / 300))
    # Far-off corners clipped near the picture: PIL draws with C integers, and a box's visible part is all that shows.
    limits = np.array([image.width, image.height, image.width, image.height]) + line
    boxes = np.clip(np.asarray(boxes, dtype=np.float64).reshape(-1, 4), -line, limits)
    for (x1, y1, x2, y2), colour in zip(boxes.tolist(), colours):
        draw.rectangle((x1, y1, max(x1, x2), max(y1, y2)), outline=tuple(colour), width=line)
    if not texts:
        return np.asarray(image), 0
    font = caption_font(image.width)
    texts = [shortened(text, _MOST_TAB) for text in texts]
    extents = [draw.textbbox((0, 0), text, font=font) for text in texts]
    sizes = [(round(right - left) + 6, round(bottom - top) + 6) for left, top, right, bottom in extents]
    places = place_tabs(boxes, sizes, image.width, image.height)
    for place, text, (left, top, _, _), (tab_w, tab_h), colour in zip(places, texts, extents, sizes, colours):
        if place is None:
            continue
        x, y = place
        draw.rectangle((x, y, x + tab_w - 1, y + tab_h - 1), fill=tuple(colour))
        light = 0.299 * colour[0] + 0.587 * colour[1] + 0.114 * colour[2] > 150
        draw.text((x + 3 - left, y + 3 - top), text, fill=(0, 0, 0) if light else (255, 255, 255), font=font)
    return np.asarray(image), places.count(None)


def place_tabs(
    boxes: np.ndarray, sizes: Sequence[tuple[int, int]], width: int, height: int
) -> list[tuple[int, int] | None]:
    """The top-left corner of each box's tab (``sizes``: its width and height) in a ``width × height`` picture, or
    None for a tab that would cover another whichever corner of its box it took.

    Boxes are taken last first (the best, when given lowest score first). A tab goes above the box's top-left
    corner where there is room, else inside it; failing that, the same at its top-right, then inside its
    bottom-left and under it; each moved into the picture.
    """
    placed = np.empty((0, 4), dtype=np.int64)
    places: list[tuple[int, int] | None] = [None] * len(sizes)
    for number in reversed(range(len(sizes))):
        x1, y1, x2, y2 = (round(v) for v in boxes[number])
        tab_w, tab_h = sizes[number]
        above, below = ([y1 - tab_h] if y1 >= tab_h else []), ([y2] if y2 + tab_h <= height else [])
        corners = [(x1, y) for y in (*above, y1)] + [(x2 - tab_w, y) for y in (*above, y1)]
        corners += [(x1, y) for y in (y2 - tab_h, *below)]
        for x, y in corners:
            x, y = min(max(x, 0), max(width - tab_w, 0)), min(max(y, 0), max(height - tab_h, 0))
            covers = (placed[:, 0] < x + tab_w) & (x < placed[:, 2]) & (placed[:, 1] < y + tab_h) & (y < placed[:, 3])
            if not covers.any():
                places[number] = (x, y)
                placed = np.vstack([placed, [x, y, x + tab_w, y + tab_h]])
                break
    return places
