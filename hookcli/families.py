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

Nothing here imports torch (:mod:`hookcli.run.batches` makes each family's
batches).

>>> FAMILIES[:3], family_traits("optical_flow").row
(('classification', 'detection', 'segmentation'), 'pair')
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = [
    "CPU_ONLY",
    "DEFAULT_CLIP_LENGTH",
    "FAMILIES",
    "FamilyTraits",
    "MODULES",
    "build_options",
    "channels_last_output",
    "family_traits",
    "is_square",
    "ragged_rows",
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

    ``fuses``: CPU fusion (:mod:`hookcli.run.fusion`; for detection, of the backbone's convolutions); ``channels_last``:
    what ``auto`` memory format may pick; ``compiles``: ``--compile`` (one stacked image batch in, hooked tensors
    out); ``gradients``, ``cams``: ``grad`` and ``cam``; ``videos``: inputs are videos, cut into clips or frame pairs.
    ``row``: one row is an ``image``, a ``clip`` (``[3, T, H, W]``) or a ``pair`` of frames (the model's two
    arguments). ``output``: what the model returns, and so what a target is and what may be stored beside the layers:
    ``logits``, ``masks`` (segmentation; ``--region`` applies), ``detections`` (``--detections``, targets ``#N``) or
    ``flow`` (``--flow``).
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


def ragged_rows(family: str, preprocess) -> bool:
    """Whether rows of a run may differ in shape: every detection run (the model resizes each image by its own
    rules), and inputs that keep their own sizes (no crop) for segmentation and optical flow. Such runs store every
    captured tensor as rows of their own shapes."""
    return family == "detection" or family in ("segmentation", "optical_flow") and preprocess.crop is None


def is_square(count: int) -> bool:
    """Whether ``count`` tokens (more than one) fold into a square."""
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
