"""Text in pictures: channel numbers stamped from a small bitmap font drawn once per size, other text (labels)
inked in the caption font, caption fonts, and numbers short enough for a colour bar's end.

>>> number(0.000123456), number(1234567.0)
('0.000123', '1.23e+06')
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np
from PIL import Image, ImageDraw, ImageFont

__all__ = [
    "MOST_CHARACTERS",
    "caption_font",
    "glyphs",
    "ink",
    "label_band",
    "label_size",
    "number",
    "fitted",
    "shortened",
    "stamp",
    "text_bitmap",
    "text_width",
    "tick_step",
    "wrapped",
]


def tick_step(cells: int) -> int:
    """The smallest of 1, 2, 5, 10, 20, 50, … that is at least ``cells``."""
    step = 1
    while True:
        for m in (1, 2, 5):
            if m * step >= cells:
                return m * step
        step *= 10


def label_size(tile_width: int) -> int:
    return max(9, min(16, tile_width // 5))


def label_band(labels: Sequence[int] | None, tile_width: int) -> int:
    """Height of the label band over tiles ``tile_width`` wide: 0 when the longest label would not fit."""
    if not labels:
        return 0
    size = label_size(tile_width)
    longest = max((str(n) for n in labels), key=len)
    return glyphs(size)[1] + 2 if text_width(longest, size) + 2 <= tile_width else 0


@functools.lru_cache(maxsize=8)
def glyphs(size: int) -> tuple[dict[str, np.ndarray], int]:
    """Coverage bitmaps (0-255) of the characters used in labels, each one advance wide, and their height."""
    font = _font(size)
    _, top, _, bottom = font.getbbox("0123456789-.e+")
    height = bottom - top
    drawn = {}
    for char in "0123456789-.e+":
        advance = max(1, round(font.getlength(char)))
        image = Image.new("L", (advance, height), 0)
        ImageDraw.Draw(image).text((0, -top), char, fill=255, font=font)
        drawn[char] = np.asarray(image)
    return drawn, height


def text_width(text: str, size: int) -> int:
    drawn = glyphs(size)[0]
    return sum(drawn[c].shape[1] for c in text)


def stamp(canvas: np.ndarray, text: str, size: int, top: int, left: int, *, light: bool = False) -> None:
    """Write ``text`` (digits, sign, point) in black (``light``: in white) on ``canvas`` at (top, left), clipped to
    its edges."""
    ink(canvas, 255 - _label_bitmap(text, size), top, left, light=light)


@functools.lru_cache(maxsize=8192)
def _label_bitmap(text: str, size: int) -> np.ndarray:
    """``text`` as dark-on-white pixels (255 where there is no ink)."""
    drawn = glyphs(size)[0]
    return 255 - np.concatenate([drawn[c] for c in text], axis=1)


@functools.lru_cache(maxsize=1024)
def text_bitmap(text: str, size: int) -> np.ndarray:
    """Any ``text``'s coverage (0-255) in the caption font of ``size``, one line of the font's full height (so
    that lines of other text align) and as wide as it advances."""
    font = _font(size)
    ascent, descent = font.getmetrics()
    image = Image.new("L", (max(1, round(font.getlength(text))), ascent + descent), 0)
    ImageDraw.Draw(image).text((0, 0), text, fill=255, font=font)
    return np.asarray(image)


def ink(canvas: np.ndarray, coverage: np.ndarray, top: int, left: int, *, light: bool = False) -> None:
    """Ink ``coverage`` (0-255, as :func:`text_bitmap` gives) onto ``canvas`` at (top, left), black (``light``:
    white), clipped to its edges."""
    top_clip, left_clip = max(0, -top), max(0, -left)
    top, left = max(0, top), max(0, left)
    h = min(coverage.shape[0] - top_clip, canvas.shape[0] - top)
    w = min(coverage.shape[1] - left_clip, canvas.shape[1] - left)
    if h <= 0 or w <= 0:
        return
    region = canvas[top : top + h, left : left + w]
    shown = coverage[top_clip : top_clip + h, left_clip : left_clip + w, None]
    if light:
        np.maximum(region, shown, out=region)
    else:
        np.minimum(region, 255 - shown, out=region)


#: The most characters of one part of a caption, or of a label, that a picture shows: a longer one (a file's
#: crafted name, a name of hundreds of kB) loses its middle before anything is measured or laid out.
MOST_CHARACTERS = 200


def shortened(text: str, limit: int = MOST_CHARACTERS) -> str:
    """``text``, or its two ends around an ellipsis when it is longer than ``limit`` characters.

    >>> shortened("abcdefghij", 5)
    'ab…ij'
    """
    if len(text) <= limit:
        return text
    head = (limit - 1) // 2
    return f"{text[:head]}…{text[len(text) - (limit - 1 - head) :]}"


def fitted(text: str, font, room: float) -> str:
    """``text`` (:func:`shortened`) cut with an ellipsis to fit ``room`` pixels in ``font``: the longest start that
    fits, found by halving, so that a name of hundreds of kB is measured a few dozen times, not once a character.

    >>> fitted("a long name", caption_font(100), 1000), fitted("a long name", caption_font(100), 20)
    ('a long name', 'a …')
    """
    text = shortened(text)
    if font.getlength(text) <= room:
        return text
    low, high = 0, len(text)  # text[:low] + "…" fits (or low is 0); text[:high] + "…" does not
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if font.getlength(text[:middle] + "…") <= room else (low, middle)
    return text[:low] + "…"


def wrapped(font, parts: Sequence[str], width: int, joiner: str) -> list[str]:
    """``parts`` (each :func:`shortened`) joined by ``joiner`` into lines that fit ``width`` pixels in ``font``
    with 4 pixels either side; a part too wide for that alone is a line of its own (the picture is widened to
    hold it).

    >>> wrapped(caption_font(100), ["one", "two", "three", "four"], 100, " ")
    ['one two three', 'four']
    """
    lines: list[str] = []
    for part in map(shortened, parts):
        joined = f"{lines[-1]}{joiner}{part}" if lines else part
        if lines and font.getlength(joined) + 8 <= width:
            lines[-1] = joined
        else:
            lines.append(part)
    return lines


def caption_font(width: int):
    return _font(max(12, min(28, round(width / 45))))


@functools.lru_cache(maxsize=32)
def _font(size: int):
    return ImageFont.load_default(size=size)


def number(value: float) -> str:
    """A value short enough for a colour bar's end: three significant digits."""
    return f"{value:.3g}"
