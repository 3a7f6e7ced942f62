"""The families of torchvision models, and what sets each apart: how it is built and what input it takes.

=================  ====================================  ===============================================
family             torchvision module                    a row is
=================  ====================================  ===============================================
``classification``  ``torchvision.models``               an image, ``[3, H, W]`` in a stacked batch
``quantized``       ``torchvision.models.quantization``  an image, as classification; CPU only
``segmentation``    ``torchvision.models.segmentation``  an image, in a stacked batch
``detection``       ``torchvision.models.detection``     an image of its own size, in a list
``video``           ``torchvision.models.video``         a clip ``[3, T, H, W]`` of a video
``optical_flow``    ``torchvision.models.optical_flow``  a pair of frames, the model's two arguments
=================  ====================================  ===============================================

Nothing here imports torch at import time.

>>> FAMILIES[:3]
('classification', 'detection', 'segmentation')
>>> [list(t.shape) for t in natural_input("optical_flow", size=64)]
[[1, 3, 64, 64], [1, 3, 64, 64]]
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "CPU_ONLY",
    "DEFAULT_CLIP_LENGTH",
    "FAMILIES",
    "MODULES",
    "FamilyTraits",
    "batch_device",
    "batch_length",
    "build_options",
    "call_model",
    "channels_last_output",
    "family_traits",
    "first_rows",
    "map_batch",
    "is_square",
    "natural_input",
    "ragged_rows",
    "rows_by_shape",
    "square_input",
]

FAMILIES = ("classification", "detection", "segmentation", "video", "optical_flow", "quantized")
#: The torchvision module whose ``list_models`` names each family's models.
MODULES = {
    "classification": "torchvision.models",
    "detection": "torchvision.models.detection",
    "segmentation": "torchvision.models.segmentation",
    "video": "torchvision.models.video",
    "optical_flow": "torchvision.models.optical_flow",
    "quantized": "torchvision.models.quantization",
}
#: Families whose models run on the CPU only (quantized kernels exist for the CPU alone).
CPU_ONLY = ("quantized",)


@dataclass(frozen=True)
class FamilyTraits:
    """What a family's models take, decided here once for every module that asks.

    ``fuses``: CPU fusion (:mod:`hookcli.run.fusion`; for detection, of the
    backbone's convolution stack); ``channels_last``: what ``auto`` memory
    format may pick; ``compiles``: ``--compile`` (one stacked image batch in,
    hooked tensors out); ``gradients`` and ``cams``: ``grad`` and ``cam``;
    ``videos``: inputs are videos, cut into clips or pairs of frames.
    ``row``: what one row is, ``image``, ``clip`` (``[3, T, H, W]``) or
    ``pair`` (of frames, the model's two arguments); ``output``: what the
    model's own output holds, and so what a target is and what may be stored
    beside the layers: ``logits``, ``masks`` (segmentation, where
    ``--region`` applies), ``detections`` (``--detections``, targets ``#N``)
    or ``flow`` (``--flow``).
    """

    fuses: bool = False
    channels_last: bool = False
    compiles: bool = False
    gradients: bool = True
    cams: bool = True
    videos: bool = False
    row: str = "image"
    output: str = "logits"


_TRAITS = {
    "classification": FamilyTraits(fuses=True, channels_last=True, compiles=True),
    "segmentation": FamilyTraits(fuses=True, channels_last=True, output="masks"),
    "detection": FamilyTraits(fuses=True, output="detections"),
    "video": FamilyTraits(cams=False, videos=True, row="clip"),
    "optical_flow": FamilyTraits(gradients=False, cams=False, videos=True, row="pair", output="flow"),
    "quantized": FamilyTraits(gradients=False, cams=False),
}


def family_traits(family: str) -> FamilyTraits:
    """The :class:`FamilyTraits` of ``family`` (one of :data:`FAMILIES`)."""
    return _TRAITS[family]


#: Frames a clip has when no clip length is given: what torchvision's video weights were evaluated on.
DEFAULT_CLIP_LENGTH = 16
#: Side of the square input :func:`natural_input` uses when the weights' preprocessing names no size.
_FREE_SIZE = 320


def build_options(family: str, *, pretrained: bool) -> dict[str, object]:
    """Keyword arguments ``torchvision.models.get_model`` needs for a model of ``family``.

    Random detection and segmentation models get random backbones too (their
    default would download ImageNet weights); quantized models are built
    quantized.
    """
    options: dict[str, object] = {}
    if family in ("detection", "segmentation") and not pretrained:
        options["weights_backbone"] = None
    if family == "quantized":
        options["quantize"] = True
    return options


def natural_input(family: str, *, size: int | None = None, preprocess=None, frames: int | None = None):
    """One input of batch 1, all zeros, as a model of ``family`` takes it: the argument tuple of a forward.

    ``size`` is the side of the square image (default: the preprocessing's
    crop, else its resize, else 320); ``frames`` a clip's length (video).
    """
    import torch

    height, width = (size, size) if size is not None else _natural_size(preprocess)
    if family == "detection":
        return ([torch.zeros(3, height, width)],)
    if family == "video":
        return (torch.zeros(1, 3, frames or DEFAULT_CLIP_LENGTH, height, width),)
    if family == "optical_flow":
        return torch.zeros(1, 3, height, width), torch.zeros(1, 3, height, width)
    return (torch.zeros(1, 3, height, width),)


def _natural_size(preprocess) -> tuple[int, int]:
    """The height and width of what the preprocessing makes: its crop, else its resize (an image squashed to
    ``[height, width]``, say), else :data:`_FREE_SIZE`."""
    if preprocess is not None and preprocess.crop is not None:
        return preprocess.crop, preprocess.crop
    if preprocess is not None and isinstance(preprocess.resize, int):
        return preprocess.resize, preprocess.resize
    if preprocess is not None and isinstance(preprocess.resize, tuple) and preprocess.kind == "classification":
        return preprocess.resize
    return _FREE_SIZE, _FREE_SIZE


def call_model(model, batch):
    """``model`` called with a batch: a tensor, a list of images (detection), or a tuple of arguments (flow)."""
    return model(*batch) if isinstance(batch, tuple) else model(batch)


def batch_length(batch) -> int:
    """How many rows a batch holds, whatever form it takes (see :func:`call_model`)."""
    return len(batch[0]) if isinstance(batch, tuple) else len(batch)


def first_rows(batch):
    """The first row of a batch, as a batch of one in the batch's own form."""
    return tuple(part[:1] for part in batch) if isinstance(batch, tuple) else batch[:1]


def map_batch(batch, function):
    """``function`` applied to every tensor of a batch (a tensor, a list of images, a tuple of either)."""
    if isinstance(batch, tuple):
        return tuple(map_batch(part, function) for part in batch)
    if isinstance(batch, list):
        return [function(image) for image in batch]
    return function(batch)


def batch_device(batch):
    """The device a batch's tensors are on."""
    while isinstance(batch, tuple | list):
        batch = batch[0]
    return batch.device


def rows_by_shape(run, batch) -> tuple[dict, list | None]:
    """``run`` on each group of same-shape rows of ``batch``, every result back in input order.

    ``batch`` is stacked, or (images of several shapes) a list, or a tuple of
    either for pairs of frames. ``run(group)`` returns ``(features, about)``:
    batch-first tensors and a list with an entry a row (or None). Every
    feature comes back as a list of its rows, ``about`` as one list.
    """
    import torch

    first = batch[0] if isinstance(batch, tuple) else batch
    if not isinstance(first, list):
        features, about = run(batch)
        return {key: list(value) for key, value in features.items()}, about
    sizes = [tuple(image.shape) for image in first]
    features, about = {}, [None] * len(sizes)
    for size in dict.fromkeys(sizes):
        picked = [i for i, s in enumerate(sizes) if s == size]
        group = (
            tuple(torch.stack([part[i] for i in picked]) for part in batch)
            if isinstance(batch, tuple)
            else torch.stack([batch[i] for i in picked])
        )
        found, told = run(group)
        for key, value in found.items():
            rows = features.setdefault(key, [None] * len(sizes))
            for position, i in enumerate(picked):
                rows[i] = value[position]
        for position, i in enumerate(picked):
            about[i] = told[position] if told is not None else None
    return features, about


def ragged_rows(family: str, preprocess) -> bool:
    """Whether rows of a run may differ in shape: every detection run (the model resizes each image by its own
    rules), and inputs that keep their own sizes (no crop) for segmentation and optical flow. Such runs store every
    captured tensor as rows of their own shapes."""
    return family == "detection" or family in ("segmentation", "optical_flow") and preprocess.crop is None


def is_square(count: int) -> bool:
    """Whether ``count`` tokens (more than one) fold into a square."""
    import math

    return count > 1 and math.isqrt(count) ** 2 == count


def square_input(preprocess) -> bool:
    """Whether every image reaches the model square: a centre crop, or an image squashed to equal sides."""
    if preprocess is None or preprocess.kind != "classification":
        return False
    if preprocess.crop is not None:
        return True
    return isinstance(preprocess.resize, tuple) and preprocess.resize[0] == preprocess.resize[1]


def channels_last_output(shape) -> bool:
    """Whether a 4-D layer output of a square input is laid out ``[N, H, W, C]`` (timm's and transformers' Swin,
    MambaOut, a ViT's patch embedding with a dynamic size): its middle two axes are equal and the last differs. A
    channels-first ``[N, C, H, W]`` output of a square input has equal last two."""
    return len(shape) == 4 and shape[1] == shape[2] != shape[3]
