"""How many pixels an input may have: images and video frames are held to the limit Pillow decodes to.

>>> pixel_limit() == 2 * Image.MAX_IMAGE_PIXELS
True
"""

from __future__ import annotations

import sys

from PIL import Image

__all__ = [
    "pixel_limit",
]


def pixel_limit() -> int:
    """The most pixels an image (or a video's frame) may have: beyond it Pillow refuses to decode (twice its
    ``Image.MAX_IMAGE_PIXELS``, which a caller may change; no limit when a caller set it to None)."""
    return sys.maxsize if Image.MAX_IMAGE_PIXELS is None else 2 * Image.MAX_IMAGE_PIXELS
