"""The transforms a :class:`~hookcli.inputs.preprocess.Preprocess` describes: a decoded input → the model's tensor.

Classification uses torchvision's ``ImageClassification`` itself, video its
``VideoClassification``, so the numbers are exactly torchvision's; the other
image kinds run :class:`ImageSteps`, equal to torchvision's presets of them.

>>> import torch
>>> steps = to_tensor_steps(Preprocess(resize=8, crop=6))
>>> tuple(steps.scaled(steps.geometry(torch.zeros(2, 3, 10, 12, dtype=torch.uint8))).shape)
(2, 3, 6, 6)
"""

from __future__ import annotations

import torch
from PIL import Image
from torchvision.transforms import InterpolationMode
from torchvision.transforms import functional as F
from torchvision.transforms._presets import ImageClassification, VideoClassification

from hookcli.inputs.preprocess import DEVICE_DECODE_KINDS, Preprocess
from hookcli.inputs.resampling import resized_windows

__all__ = [
    "ImageSteps",
    "VideoSteps",
    "to_tensor_steps",
    "to_transform",
    "window_resized",
]


def to_transform(spec: Preprocess):
    """The transform of one decoded input: a PIL image (a ``[T, H, W, 3]`` uint8 array for video) → tensor.
    Image kinds take uint8 tensors ``[..., 3, H, W]`` too (a batch of one size at once), as
    :mod:`hookcli.inputs.decoding` gives them.
    """
    if (
        spec.kind == "classification"
        and isinstance(spec.resize, int)
        and spec.crop is not None
        and spec.mean is not None
        and not spec.fast_decode
    ):
        return ImageClassification(
            crop_size=spec.crop,
            resize_size=spec.resize,
            mean=spec.mean,
            std=spec.std,
            interpolation=InterpolationMode(spec.interpolation),
            antialias=spec.antialias,
        )
    if spec.kind == "video":
        return VideoSteps(spec)
    return ImageSteps(spec)


def to_tensor_steps(spec: Preprocess) -> ImageSteps:
    """The preprocessing of an image kind in its two steps, for uint8 tensors on any device, as
    :mod:`hookcli.inputs.decoding` runs it: :meth:`ImageSteps.geometry` on each batch of images of one size,
    :meth:`ImageSteps.scaled` once on all."""
    if spec.kind not in DEVICE_DECODE_KINDS:
        raise ValueError(f"{spec.kind.replace('_', ' ')} inputs are not preprocessed as tensors of images")
    return ImageSteps(spec)


class ImageSteps:
    """An image → float tensor ``[..., 3, H, W]``: resize and crop when set, scale to [0, 1], normalise when set.

    Takes a PIL image, or uint8 tensors ``[..., 3, H, W]`` on any device; ``resize`` is the shorter side or
    ``[height, width]``. With only ``resize`` and normalisation this is torchvision's ``SemanticSegmentation``; with
    neither, ``ObjectDetection``; with mean = std = 0.5, ``OpticalFlow`` on one frame. The geometry and :meth:`scaled`
    are apart so that :mod:`hookcli.inputs.decoding` can resize a batch of many sizes together
    (:meth:`geometry_each`), then scale it at once; :meth:`scaled` reads nothing back to the host, so a GPU's queue is
    never waited on. Tensors resize as Pillow resizes the PIL image (:mod:`hookcli.inputs.resampling`), to the same
    values.
    """

    def __init__(self, spec: Preprocess) -> None:
        self.spec = spec
        self.mode = (
            InterpolationMode.NEAREST_EXACT
            if spec.interpolation == "nearest"
            else InterpolationMode(spec.interpolation)
        )
        self._normalisation: dict = {}  # device -> (mean, std) tensors

    def __call__(self, image):
        image = self.geometry(image)
        return self.scaled(image if isinstance(image, torch.Tensor) else F.pil_to_tensor(image))

    def geometry(self, image):
        """Resize and crop as the preprocessing says; PIL in, PIL out, or uint8 tensors in and out. With
        ``fast_decode`` a PIL image's shorter side to ``resize`` and its centre ``crop`` are one resize of the window
        the crop keeps (:func:`window_resized`)."""
        spec = self.spec
        if (
            spec.fast_decode
            and isinstance(spec.resize, int)
            and spec.crop is not None
            and spec.interpolation in _PIL_FILTERS
            and not torch.is_tensor(image)
        ):
            found = window_resized(image, spec.resize, spec.crop, _PIL_FILTERS[spec.interpolation])
            if found is not None:
                return found
        if torch.is_tensor(image):
            return self.geometry_each([image])[0]  # a batch of one size: resized as one
        if spec.resize is not None:
            size = list(spec.resize) if isinstance(spec.resize, tuple) else [spec.resize]
            image = F.resize(image, size, interpolation=self.mode, antialias=spec.antialias)
        if spec.crop is not None:
            image = F.center_crop(image, [spec.crop])
        return image

    def geometry_each(self, images: list) -> list:
        """uint8 tensors ``[..., 3, H, W]`` of any sizes, each resized and cropped as :meth:`geometry` does, those
        whose windows share a size together (:func:`resized_windows`): a batch of photos of many sizes in a few
        passes, not a few for each size."""
        placed = [self._placed(*image.shape[-2:]) for image in images]
        by_shape: dict[tuple, list[int]] = {}
        for k, (_, window) in enumerate(placed):
            by_shape.setdefault(window[2:], []).append(k)
        made: list = [None] * len(images)
        for shape, members in by_shape.items():
            sizes, windows = [placed[k][0] for k in members], [placed[k][1] for k in members]
            rows = resized_windows([images[k] for k in members], sizes, windows, self.spec.interpolation)
            if self.spec.crop is not None and self.spec.crop > min(shape):  # a side shorter than the crop: padded
                rows = F.center_crop(rows, [self.spec.crop])
            for k, row in zip(members, rows):
                made[k] = row
        return made

    def _placed(self, height: int, width: int) -> tuple[tuple[int, int], tuple[int, int, int, int]]:
        """The size an image of ``height`` and ``width`` is resized to, and the window of it that the crop keeps: all
        of it where there is no crop; where the crop is larger than a side, all of that side (torchvision pads it to
        the crop) and the centre of the other, as torchvision crops it once padded."""
        spec = self.spec
        if spec.resize is None:
            size = (height, width)
        elif isinstance(spec.resize, tuple):
            size = spec.resize
        else:
            size = _resized_size(height, width, spec.resize)
        if spec.crop is None:
            return size, (0, 0, *size)
        spans = [(0, side) if spec.crop > side else (int(round((side - spec.crop) / 2.0)), spec.crop) for side in size]
        return size, (spans[0][0], spans[1][0], spans[0][1], spans[1][1])

    def scaled(self, images):
        """uint8 tensors to floats in [0, 1], then normalised when the preprocessing normalises: the arithmetic of
        torchvision's ``convert_image_dtype`` and ``normalize``, with the mean and std kept on the images' device."""
        values = images.to(torch.float) / 255
        if self.spec.mean is None:
            return values
        if values.device not in self._normalisation:
            self._normalisation[values.device] = tuple(
                torch.tensor(v, dtype=torch.float, device=values.device).view(-1, 1, 1)
                for v in (self.spec.mean, self.spec.std)
            )
        mean, std = self._normalisation[values.device]
        return values.sub_(mean).div_(std)


#: Pillow's resampling filter for the interpolations resized by window (what torchvision's resize of a PIL image
#: uses).
_PIL_FILTERS = {"bilinear": Image.Resampling.BILINEAR, "bicubic": Image.Resampling.BICUBIC}


def window_resized(image: Image.Image, resize: int, crop: int, resample) -> Image.Image | None:
    """``image`` with its shorter side resized to ``resize`` and centre-cropped to ``crop``², as torchvision sizes
    and places them, by resizing only the window the crop keeps (Pillow's ``box``): about 30% less work than the
    whole resize for a 500x375 photo. The two passes are asked for one at a time, across first, as Pillow makes
    the whole resize (given both at once it may go down first, which moves 15% of the values by a level): the
    pixels are the same but for about one value in 2,000, one level off (a filter window whose rounded start
    moves by one). None where the crop is larger than the resized image.

    >>> photo = Image.new("RGB", (500, 375), (200, 30, 90))
    >>> window_resized(photo, 232, 224, Image.Resampling.BILINEAR).getpixel((0, 0))
    (200, 30, 90)
    """
    width, height = image.size
    new_height, new_width = _resized_size(height, width, resize)
    if crop > new_width or crop > new_height:
        return None
    top, left = _crop_corner((new_height, new_width), crop)
    across, down = width / new_width, height / new_height
    rows = image.resize((crop, height), resample, box=(left * across, 0, (left + crop) * across, height))
    return rows.resize((crop, crop), resample, box=(0, top * down, crop, (top + crop) * down))


def _resized_size(height: int, width: int, resize: int) -> tuple[int, int]:
    """``(height, width)`` of an image whose shorter side torchvision resizes to ``resize``."""
    short, long = sorted((width, height))
    new_short, new_long = resize, int(resize * long / short)
    return (new_long, new_short) if width <= height else (new_short, new_long)


def _crop_corner(size: tuple[int, int], crop: int) -> tuple[int, int]:
    """The top left corner ``(top, left)`` of torchvision's centre crop of ``crop``² from an image of ``size``."""
    return int(round((size[0] - crop) / 2.0)), int(round((size[1] - crop) / 2.0))


class VideoSteps:
    """Frames ``[T, H, W, 3]`` uint8 → a clip ``[3, T, crop, crop]``, through torchvision's ``VideoClassification``."""

    def __init__(self, spec: Preprocess) -> None:
        size = list(spec.resize) if isinstance(spec.resize, tuple) else [spec.resize]
        self.preset = VideoClassification(
            crop_size=[spec.crop, spec.crop],
            resize_size=size,
            mean=spec.mean,
            std=spec.std,
            interpolation=InterpolationMode(spec.interpolation),
        )

    def __call__(self, frames):
        return self.preset(torch.from_numpy(frames).permute(0, 3, 1, 2).contiguous())
