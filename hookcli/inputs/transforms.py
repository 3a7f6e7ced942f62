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
from torchvision.transforms import InterpolationMode
from torchvision.transforms import functional as F
from torchvision.transforms._presets import ImageClassification, VideoClassification

from hookcli.inputs.preprocess import DEVICE_DECODE_KINDS, Preprocess

__all__ = [
    "ImageSteps",
    "VideoSteps",
    "to_tensor_steps",
    "to_transform",
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
    """An image → float tensor ``[..., 3, H, W]``: resize (shorter side, or to ``[height, width]``) and crop when
    set, scale to [0, 1], normalise when set; a PIL image, or uint8 tensors ``[..., 3, H, W]`` on any device.

    With only ``resize`` and normalisation this is torchvision's ``SemanticSegmentation``; with neither,
    ``ObjectDetection``; with mean = std = 0.5, ``OpticalFlow`` on one frame. The two steps are apart so that
    :mod:`hookcli.inputs.decoding` resizes a batch of many sizes a size at a time and scales it at once:
    :meth:`geometry`, then :meth:`scaled`, which reads nothing back to the host, so a GPU's queue is never waited
    on. Nearest neighbour is torch's ``nearest-exact``, which is Pillow's own on PIL images (torch's ``nearest``
    picks pixels shifted by half of one); on tensors, bilinear and bicubic round a little differently from
    Pillow's (see the measurements in ``docs/benchmarks.md``).
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
        """Resize and crop as the preprocessing says; PIL in, PIL out, or uint8 tensors in and out."""
        spec = self.spec
        if spec.resize is not None:
            size = list(spec.resize) if isinstance(spec.resize, tuple) else [spec.resize]
            image = F.resize(image, size, interpolation=self.mode, antialias=spec.antialias)
        if spec.crop is not None:
            image = F.center_crop(image, [spec.crop])
        return image

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
