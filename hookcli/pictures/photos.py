"""Photos under pictures: an input image as the model saw it (resized, cropped, upright), and a heat map
drawn over it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from PIL import Image

from hookcli.inputs.images import RESAMPLE as resample
from hookcli.inputs.images import load_rgb, model_view, open_input
from hookcli.inputs.preprocess import Preprocess
from hookcli.pictures.boxes import CAM_BOX_COLOUR, draw_boxes
from hookcli.pictures.render import add_colorbar, overlay, value_range
from hookcli.pictures.text import number

__all__ = [
    "OVERLAY_MIN",
    "OVERLAY_SIDE",
    "THUMBNAIL_SIDE",
    "ModelPhotos",
    "heat_picture",
    "model_photo",
    "model_photo_scaled",
    "model_thumbnail",
]

#: Overlays are drawn at least OVERLAY_MIN and at most OVERLAY_SIDE pixels a side.
OVERLAY_MIN, OVERLAY_SIDE = 512, 2048
#: A photo is reduced to at most this many pixels a side before its view is resampled from it.
PHOTO_SIDE = 2 * OVERLAY_SIDE


#: A report's thumbnail of an input is at most this many pixels a side.
THUMBNAIL_SIDE = 192


def model_photo(path, preprocess, *, enlarge: bool = True) -> np.ndarray:
    """The part of the photo at ``path`` the model saw (its resize and centre crop), drawn larger.

    The view, resampled from the original photo, is at least :data:`OVERLAY_MIN` pixels a side and at most
    :data:`OVERLAY_SIDE`, so a heat map over it is large enough to see (``enlarge=False``: the crop's own size, at
    most :data:`OVERLAY_SIDE`). Without a crop (segmentation, detection) it is the whole photo, its shorter side at
    the resize when there is one; a detection model's maps and boxes cover the whole photo however it resizes inside.
    Without preprocessing facts the whole photo is used.
    """
    return model_photo_scaled(path, preprocess, enlarge=enlarge)[0]


def model_thumbnail(path, preprocess, side: int = THUMBNAIL_SIDE) -> np.ndarray:
    """:func:`model_photo` at most ``side`` pixels a side: what a report shows first of each input.

    Reduced from the enlarged view, which is resampled from the original photo, so that a small crop is not
    blurred up from its own few pixels.
    """
    image = Image.fromarray(model_photo(path, preprocess))
    image.thumbnail((side, side), Image.Resampling.LANCZOS)
    return np.asarray(image)


def model_photo_scaled(path, preprocess, *, enlarge: bool = True) -> tuple[np.ndarray, float]:
    """:func:`model_photo`, and its pixels to one pixel of the image the model was given (the unit of boxes)."""
    return _view(load_rgb(path, max_side=PHOTO_SIDE), lambda: _upright_size(path), preprocess, enlarge)


@dataclass(frozen=True)
class ModelPhotos:
    """:func:`model_photo_scaled` of an image as a run decodes it for the model, from that one decode (a
    :class:`~hookcli.inputs.images.PictureMaker`: the decode workers call it, and what it returns crosses back
    with the image's row).

    The pixels are those :func:`model_photo_scaled` gives for the same image, but for JPEGs it decodes at another
    scale than a run does: under ``fast_decode`` the photo is drawn from the reduced decode the model was given,
    and a photo of 8192 pixels or more on both sides is reduced from the whole one the model was given, where
    :func:`model_photo_scaled` decodes it at a reduced scale.
    """

    preprocess: Preprocess
    enlarge: bool = True
    side: int = PHOTO_SIDE

    def __call__(self, picture: Image.Image, size: tuple[int, int]) -> tuple[np.ndarray, float]:
        return _view(picture, lambda: size, self.preprocess, self.enlarge)


def _view(photo: Image.Image, upright_size, preprocess, enlarge: bool) -> tuple[np.ndarray, float]:
    """The photo as the model saw it and its scale (see :func:`model_photo_scaled`), from ``photo`` (decoded, and
    reduced to at most :data:`PHOTO_SIDE` a side), which is left unchanged. ``upright_size()`` is the size of the
    image the model was given before any resize, asked only where it is needed."""
    if preprocess is None:
        width = upright_size()[0]
        photo = photo.copy()
        photo.thumbnail((OVERLAY_SIDE, OVERLAY_SIDE))
        return np.asarray(photo), photo.width / width
    if isinstance(preprocess.resize, tuple) and preprocess.kind == "classification":
        return _squashed_photo(photo, preprocess, enlarge)
    resize = preprocess.resize if isinstance(preprocess.resize, int) else None
    # Without a resize the model was given the photo at its own size, which the reduced loading of a large one hides.
    if preprocess.crop is not None:
        short = resize or min(upright_size())
        side = min(OVERLAY_SIDE, max(OVERLAY_MIN, 2 * preprocess.crop) if enlarge else preprocess.crop)
        scale = side / preprocess.crop
        return np.asarray(
            model_view(
                photo, resize=max(1, round(short * scale)), crop=max(1, side), interpolation=preprocess.interpolation
            )
        ), scale
    size = upright_size()
    short = resize or min(size)
    # The resized photo as torchvision makes it: shorter side `short`, the longer one in proportion, rounded down.
    given_size = [short if n == min(size) else int(short * n / min(size)) for n in size]
    scale = min(max(OVERLAY_MIN, 2 * short) / short if enlarge else 1.0, OVERLAY_SIDE / max(given_size))
    drawn_width, drawn_height = (max(1, round(n * scale)) for n in given_size)
    return np.asarray(photo.resize((drawn_width, drawn_height), resample[preprocess.interpolation])), scale


def _squashed_photo(photo, preprocess, enlarge: bool) -> tuple[np.ndarray, float]:
    """The view of a model that squashes the photo to ``[height, width]`` (then centre-crops it, if it crops)."""

    height, width = preprocess.resize
    crop_h, crop_w = (preprocess.crop, preprocess.crop) if preprocess.crop else (height, width)
    longest = max(crop_h, crop_w)
    scale = min(OVERLAY_SIDE, max(OVERLAY_MIN, 2 * longest) if enlarge else longest) / longest
    squashed = photo.resize(
        (max(1, round(width * scale)), max(1, round(height * scale))), resample[preprocess.interpolation]
    )
    left, top = round(int(round((width - crop_w) / 2.0)) * scale), round(int(round((height - crop_h) / 2.0)) * scale)
    box = (left, top, left + max(1, round(crop_w * scale)), top + max(1, round(crop_h * scale)))
    return np.asarray(squashed.crop(box)), scale


def _upright_size(path) -> tuple[int, int]:
    """The width and height of the image at ``path`` as it is decoded upright (its EXIF orientation applied), read
    from its header: the size of what the model was given when nothing resized it."""
    with open_input(path) as handle, Image.open(handle) as image:
        width, height = image.size
        turned = image.getexif().get(0x0112) in (5, 6, 7, 8)  # a quarter turn, as ImageOps.exif_transpose makes
    return (height, width) if turned else (width, height)


def heat_picture(
    photo: np.ndarray,
    heat: np.ndarray,
    *,
    cmap: str,
    alpha: float,
    what: str,
    legend: bool = True,
    boxes: np.ndarray | None = None,
) -> tuple[np.ndarray, str | None]:
    """``heat`` over ``photo`` with a colour bar giving the map's range; ``(pixels, note)``, a note when it is flat.

    A map with no spread (all zero, as a CAM is when no position raises the
    class's score) is not drawn: the photo is shown as it is, and the bar and
    the note say why. ``legend=False`` leaves the bar out. ``boxes``
    (``[K, 4]`` in ``photo``'s pixels) are outlined over the map, as a
    detection's CAM shows the detection it explains.
    """
    span = value_range(np.asarray(heat))
    flat = (
        "has no finite values" if span is None else f"is {number(span[0])} everywhere" if span[0] == span[1] else None
    )
    pixels = overlay(photo, heat, cmap=cmap, alpha=alpha)  # a flat map leaves the photo as it is
    if boxes is not None:
        pixels = draw_boxes(pixels, boxes, [CAM_BOX_COLOUR] * len(boxes))[0]
    if legend:
        ends, said = (
            (("low", "high"), f"the map {flat}: nothing to overlay")
            if flat or span is None
            else ((number(span[0]), number(span[1])), f"{what}, this image's range")
        )
        pixels = add_colorbar(pixels, cmap, *ends, said)
    return pixels, (f"the {what} map {flat}: the photo is drawn without it" if flat else None)
