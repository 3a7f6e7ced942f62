"""Decode input images (files and tar archives' members, :mod:`hookcli.inputs.discovery` finds them) to 8-bit
RGB, upright, within Pillow's pixel limit.

>>> photo = __import__("matplotlib.cbook").cbook.get_sample_data("grace_hopper.jpg", asfileobj=False)
>>> image = load_rgb(photo)
>>> image.mode, image.size
('RGB', (512, 600))
"""

from __future__ import annotations

import contextlib
import io
import math
import os
import re
from dataclasses import dataclass
from typing import Any, BinaryIO, Protocol

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from hookcli.errors import ImageError, InputError
from hookcli.files import NotRegularFile, open_regular
from hookcli.inputs import archives
from hookcli.inputs.limits import pixel_limit

__all__ = [
    "JpegBytes",
    "PictureMaker",
    "RESAMPLE",
    "load_rgb",
    "load_with_picture",
    "model_view",
    "open_input",
    "read_encoded",
]

#: Pillow's resampling filter for each interpolation name of :data:`hookcli.options.INTERPOLATIONS`.
RESAMPLE = {
    "bilinear": Image.Resampling.BILINEAR,
    "bicubic": Image.Resampling.BICUBIC,
    "nearest": Image.Resampling.NEAREST,
}

#: Background that transparent pixels are composited onto.
_BACKGROUND = (255, 255, 255)


def load_rgb(
    path: str | os.PathLike,
    *,
    min_size: int | None = None,
    max_side: int | None = None,
    data: bytes | memoryview | None = None,
) -> Image.Image:
    """Decode an image and return it as 8-bit RGB, upright.

    EXIF orientation is applied, transparency composited onto white, and 16- and 32-bit grayscale scaled (not clipped)
    to 8 bits. A truncated or undecodable file raises :class:`ImageError` naming the file. With ``min_size`` a JPEG is
    decoded at the smallest libjpeg scale (1, 1/2, 1/4, 1/8) that keeps both sides at least ``min_size``: several times
    faster, with slightly different pixels. With ``max_side`` a larger image is reduced by a whole factor before it is
    converted, so a huge photo costs its decoded size once; one over Pillow's decompression-bomb limit (89 megapixels,
    after any JPEG reduction) is refused. ``data``: the file's bytes, already read (``path`` then names it in errors).
    """
    with _read_errors(path), _opened(path, data) as handle:
        return _decoded(path, handle, min_size=min_size, max_side=max_side)[0]


class PictureMaker(Protocol):
    """Makes a picture (a CAM's photo, say) from an image as it is decoded for the model, in the process that
    decodes it, so that the image is decoded once for both.

    It is called with the decoded image reduced by a whole factor to at most ``side`` pixels a side (as
    :func:`load_rgb` reduces it for ``max_side``; the model's own image when it is no larger, which the maker must
    leave unchanged) and the size of the model's image. What it returns travels with the image's row.
    """

    @property
    def side(self) -> int: ...

    def __call__(self, picture: Image.Image, size: tuple[int, int]) -> Any: ...


def load_with_picture(path, picture: PictureMaker, *, min_size: int | None = None) -> tuple[Image.Image, Any]:
    """The image :func:`load_rgb` (with ``min_size``) decodes, and what ``picture`` makes of the same decode.

    >>> import numpy as np
    >>> class Thumb:
    ...     side = 256
    ...     def __call__(self, picture, size):
    ...         return picture.size, size
    >>> photo = __import__("matplotlib.cbook").cbook.get_sample_data("grace_hopper.jpg", asfileobj=False)
    >>> image, made = load_with_picture(photo, Thumb())
    >>> np.array_equal(np.asarray(image), np.asarray(load_rgb(photo))), made
    (True, ((171, 200), (512, 600)))
    """
    with _read_errors(path), open_input(path) as handle:
        image, reduced = _decoded(path, handle, min_size=min_size, picture_side=picture.side)
    return image, picture(reduced, image.size)


def _decoded(
    path, handle, *, min_size: int | None = None, max_side: int | None = None, picture_side: int | None = None
) -> tuple[Image.Image, Image.Image]:
    """The image in ``handle`` as :func:`load_rgb` gives it, and a copy of it reduced to at most ``picture_side``
    pixels a side (the image itself when it is no larger, or no side is given)."""
    image: Image.Image  # the file's, then perhaps a reduced copy
    with Image.open(handle) as image:
        bomb = Image.MAX_IMAGE_PIXELS  # None: a caller turned Pillow's check off
        if min_size is not None and image.format == "JPEG":
            image.draft(image.mode, (min_size, min_size))
        elif max_side is not None and image.format == "JPEG":
            image.draft(image.mode, (max_side, max_side))
        if max_side is not None and bomb is not None and image.width * image.height > bomb:
            raise ImageError(
                f"image '{path}' is too large to draw over ({image.width}x{image.height}, more than "
                f"{bomb // 1_000_000} megapixels)",
                hint="draw without --overlay, or over a smaller copy of the image",
            )
        image.load()
        if max_side is not None and max(image.size) > max_side:
            image = _reduced(image, math.ceil(max(image.size) / max_side))
        # Reduced before it is turned and converted, as load_rgb reduces for max_side, so its pixels are the same.
        reduced = image
        if picture_side is not None and max(image.size) > picture_side:
            reduced = _reduced(image, math.ceil(max(image.size) / picture_side))
        upright = _upright_rgb(image)
        return upright, upright if reduced is image else _upright_rgb(reduced)


def _upright_rgb(image: Image.Image) -> Image.Image:
    ImageOps.exif_transpose(image, in_place=True)
    return _to_rgb(image)


@dataclass(frozen=True)
class JpegBytes:
    """A JPEG's bytes, to be decoded elsewhere (batched, on a GPU), its ``size`` (width, height) as its header
    gives it, and the EXIF orientation to apply afterwards (1 to 8, as Pillow's ``ImageOps.exif_transpose`` reads
    it)."""

    path: str
    data: bytes | memoryview  # a view of a batch's bytes once they crossed from a worker (decoding.Encoded)
    size: tuple[int, int]
    orientation: int = 1


#: What a JPEG file starts with: the start-of-image marker and the lead byte of the marker after it.
_JPEG_START = b"\xff\xd8\xff"
#: The end-of-image marker a whole JPEG ends with.
_JPEG_END = b"\xff\xd9"
#: The tag EXIF keeps the orientation under.
_ORIENTATION = 0x0112
#: The most bytes a JPEG handed to the device may hold for each byte of its pixels, beside :data:`_JPEG_EXTRAS` of
#: metadata (ICC profiles, thumbnails, an MPO's further pictures): a file larger than that holds something else
#: too, which would cross to the device with it, and Pillow, which reads only the picture, decodes it instead.
_JPEG_BYTES_A_PIXEL_BYTE = 8
_JPEG_EXTRAS = 16 << 20


def read_encoded(path: str | os.PathLike, picture: PictureMaker | None = None) -> tuple[JpegBytes | Image.Image, Any]:
    """What a decode worker leaves for the device (``--decode device``), the file opened once: the bytes of an 8-bit
    RGB or grayscale JPEG (or of the first picture of an MPO, as cameras write them), its header checked but its
    pixels not decoded; any other image (PNG, CMYK JPEG…), a JPEG file far larger than its pixels, and a JPEG that
    does not end with its end-of-image marker (cut short, or followed by other data), decoded as :func:`load_rgb`
    decodes it. With ``picture``, second, what it makes (see :func:`load_with_picture`; a JPEG is decoded here for
    it alone), else None.

    Errors are those of :func:`load_rgb` for a file that cannot be opened or whose header is not an image's;
    damage after a JPEG's header shows when its pixels are decoded.

    >>> photo = __import__("matplotlib.cbook").cbook.get_sample_data("grace_hopper.jpg", asfileobj=False)
    >>> found, _ = read_encoded(photo)
    >>> len(found.data), found.size, found.orientation
    (61306, (512, 600), 1)
    """
    with _read_errors(path), open_input(path) as handle:
        jpeg, data = _whole_jpeg(path, handle)
        if jpeg is not None and picture is None:
            return jpeg, None
        source = io.BytesIO(data) if data is not None else handle
        source.seek(0)
        image, reduced = _decoded(path, source, picture_side=None if picture is None else picture.side)
    return (image if jpeg is None else jpeg), (None if picture is None else picture(reduced, image.size))


def _whole_jpeg(path, handle: BinaryIO) -> tuple[JpegBytes | None, bytes | None]:
    """``(JpegBytes, its bytes)`` for a whole 8-bit RGB or grayscale JPEG; ``(None, bytes)`` when the file was read
    to find out it is none, ``(None, None)`` when its start, header or size told."""
    if handle.read(len(_JPEG_START)) != _JPEG_START:
        return None, None
    handle.seek(0)
    with Image.open(handle) as image:  # the header only: its size passes Pillow's decompression-bomb check
        if image.format not in ("JPEG", "MPO") or image.mode not in ("RGB", "L"):
            return None, None
        orientation, size = image.getexif().get(_ORIENTATION, 1), image.size
        most = _JPEG_BYTES_A_PIXEL_BYTE * size[0] * size[1] * len(image.getbands()) + _JPEG_EXTRAS
    if handle.seek(0, io.SEEK_END) > most:
        return None, None
    handle.seek(0)
    data = handle.read()
    if not data.rstrip(b"\0\r\n ").endswith(_JPEG_END):  # nvJPEG may pass a cut-short file that Pillow refuses
        return None, data
    return JpegBytes(os.fspath(path), data, size, orientation if orientation in range(1, 9) else 1), data


@contextlib.contextmanager
def _opened(path, data: bytes | memoryview | None):
    if data is not None:
        yield io.BytesIO(data)
    else:
        with open_input(path) as handle:
            yield handle


@contextlib.contextmanager
def _read_errors(path):
    """Reading or decoding the image at ``path``: what goes wrong raised as one :class:`ImageError` naming it."""
    try:
        yield
    except FileNotFoundError:
        raise ImageError(f"image not found: '{path}'", hint="check the path") from None
    except NotRegularFile as err:
        raise ImageError(str(err), hint="inputs must be image files") from None
    except UnidentifiedImageError:
        if _is_empty(path):
            raise ImageError(f"image '{path}' is empty (0 bytes)", hint="the file may not have been written") from None
        raise ImageError(
            f"'{path}' is not an image Pillow can read",
            hint="check the file type; text or corrupt files cannot be used",
        ) from None
    except Image.DecompressionBombError as err:
        size = re.search(r"\((\d+) pixels\)", str(err))
        pixels = f"{int(size.group(1)):,} pixels" if size else "too many pixels"
        raise ImageError(
            f"image '{path}' has {pixels}, more than Pillow decodes ({pixel_limit():,})", hint="shrink it first"
        ) from None
    except (OSError, ValueError, SyntaxError) as err:
        raise ImageError(f"cannot decode image '{path}': {err}", hint="the file may be truncated or corrupt") from None


def _is_empty(path) -> bool:
    if isinstance(path, archives.TarMember):
        return path.size == 0
    try:
        return os.stat(path).st_size == 0
    except (OSError, TypeError, ValueError):  # a name that no longer stats
        return False


def open_input(path) -> BinaryIO:
    """An input's bytes as a binary file: a regular file (:func:`~hookcli.files.open_regular`), or a member of a
    tar (``archive.tar::member``, :mod:`hookcli.inputs.archives`) read from the archive as it is asked for."""
    try:
        member = archives.find_member(path)
    except InputError as err:
        raise ImageError(err.message, hint=err.hint) from None
    if member is not None:
        return member.open()
    return open_regular(path)


def _reduced(image: Image.Image, factor: int) -> Image.Image:
    """``image`` made ``factor`` times smaller (box filter), in whichever mode Pillow can reduce it."""
    if image.mode.startswith("I;16"):  # Pillow cannot reduce it: average blocks of the raw values instead
        values = np.asarray(image)
        height, width = (values.shape[0] // factor) * factor, (values.shape[1] // factor) * factor
        if not height or not width:
            return image
        blocks = values[:height, :width].reshape(height // factor, factor, width // factor, factor)
        return Image.fromarray(blocks.mean(axis=(1, 3), dtype=np.float32).astype(np.uint16))
    if image.mode not in ("RGB", "RGBA", "L", "LA", "I", "F", "CMYK"):
        image = image.convert("RGBA" if "transparency" in image.info else "RGB")
    return image.reduce(factor)


def _to_rgb(image: Image.Image) -> Image.Image:
    mode = image.mode
    if mode == "RGB":
        return image
    if mode.startswith("I") or mode == "F":
        return _wide_gray_to_rgb(image)
    if mode == "P" and "transparency" in image.info:
        image = image.convert("RGBA")
        mode = "RGBA"
    if mode in ("RGBA", "LA", "PA", "RGBa", "La"):
        rgba = image.convert("RGBA")
        background = Image.new("RGBA", rgba.size, _BACKGROUND + (255,))
        return Image.alpha_composite(background, rgba).convert("RGB")
    return image.convert("RGB")


def _wide_gray_to_rgb(image: Image.Image) -> Image.Image:
    # Pillow's own convert() clips 16-bit values at 255, turning most of a photo white.

    values = np.asarray(image, dtype=np.float64)
    if image.mode == "F":
        top = 1.0 if values.size and np.nanmax(values) <= 1.0 else 255.0
    elif image.mode.startswith("I;16") or (values.size and values.max() <= 65535):
        top = 65535.0
    else:
        top = float(2**32 - 1)
    scaled = np.clip(np.nan_to_num(values) / top * 255.0 + 0.5, 0, 255).astype(np.uint8)
    return Image.fromarray(scaled, mode="L").convert("RGB")


def model_view(image: Image.Image, *, resize: int, crop: int, interpolation: str = "bilinear") -> Image.Image:
    """The part of ``image`` the model saw: shorter side resized to ``resize``, then a centred ``crop``² square.

    Sizes and offsets follow torchvision's ``resize``/``center_crop`` on PIL
    images, so a feature map laid over this view lines up with the pixels it
    came from. Only the cropped region is resampled, so the cost is that of
    a ``crop``² picture however long the photo's other side.
    """
    width, height = image.size
    short, long = (width, height) if width <= height else (height, width)
    new_short, new_long = resize, int(resize * long / short)
    size = (new_short, new_long) if width <= height else (new_long, new_short)
    resample = RESAMPLE[interpolation]
    left = int(round((size[0] - crop) / 2.0))
    top = int(round((size[1] - crop) / 2.0))
    # The visible part of the crop window, in the resized picture's pixels; areas outside come out black,
    # as in torchvision.
    x0, y0, x1, y1 = max(left, 0), max(top, 0), min(left + crop, size[0]), min(top + crop, size[1])
    sx, sy = width / size[0], height / size[1]
    visible = image.resize((x1 - x0, y1 - y0), resample, box=(x0 * sx, y0 * sy, x1 * sx, y1 * sy))
    if (x0, y0, x1, y1) == (left, top, left + crop, top + crop):
        return visible
    view = Image.new("RGB", (crop, crop))
    view.paste(visible, (x0 - left, y0 - top))
    return view
