"""What happens to an image before it reaches the model.

A :class:`Preprocess` is read off the weights' own transforms (resize, centre
crop, normalisation), may be overridden field by field, is recorded in the
output's metadata, and builds torchvision's ``ImageClassification`` transform so
the numbers are exactly those torchvision uses.

``fast_decode`` trades a little of that exactness for speed on large photos:
JPEGs are decoded at a reduced scale (libjpeg's 1/2, 1/4 or 1/8) that still
leaves the shorter side at least twice ``resize``, then resized as usual.

>>> spec = Preprocess(resize=256, crop=224)
>>> spec.replace(crop=112).crop
112
>>> spec.replace(fast_decode=True).decode_size
512
>>> sorted(json.loads(spec.to_json()))
['antialias', 'crop', 'fast_decode', 'interpolation', 'mean', 'resize', 'std']
>>> parse_triple("0.5"), parse_triple([0.4, 0.5, 0.6])
((0.5, 0.5, 0.5), (0.4, 0.5, 0.6))
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass

__all__ = ["INTERPOLATIONS", "Preprocess", "parse_triple"]

INTERPOLATIONS = ("bilinear", "bicubic", "nearest")


def parse_triple(value) -> tuple[float, float, float]:
    """Three floats (a mean or std) from ``R,G,B``, one number for all three, or a sequence; ValueError if not."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        parts = [value]
    elif isinstance(value, list | tuple):
        parts = list(value)
    else:
        parts = str(value).replace(" ", "").split(",")
    try:
        numbers = tuple(float(p) for p in parts)
    except (TypeError, ValueError):
        raise ValueError(f"'{value}' is not a number or three comma-separated numbers") from None
    if len(numbers) == 1:
        numbers = numbers * 3
    if len(numbers) != 3:
        raise ValueError(f"'{value}' has {len(numbers)} values; give one or three (R,G,B)")
    return numbers


@dataclass(frozen=True)
class Preprocess:
    """Resize the shorter side to ``resize``, centre-crop ``crop``², scale to [0, 1], normalise."""

    resize: int
    crop: int
    mean: tuple[float, float, float] = (0.485, 0.456, 0.406)
    std: tuple[float, float, float] = (0.229, 0.224, 0.225)
    interpolation: str = "bilinear"
    antialias: bool = True
    fast_decode: bool = False

    def __post_init__(self) -> None:
        if self.interpolation not in INTERPOLATIONS:
            raise ValueError(f"interpolation must be one of {INTERPOLATIONS}, not {self.interpolation!r}")

    @classmethod
    def from_transforms(cls, transforms) -> Preprocess:
        """Read a torchvision ``ImageClassification`` transform (what ``weights.transforms()`` returns)."""
        return cls(
            resize=int(transforms.resize_size[0]),
            crop=int(transforms.crop_size[0]),
            mean=tuple(float(v) for v in transforms.mean),
            std=tuple(float(v) for v in transforms.std),
            interpolation=transforms.interpolation.value,
            antialias=bool(transforms.antialias),
        )

    def replace(self, **overrides) -> Preprocess:
        """A copy with the given fields changed; ``None`` values are ignored."""
        return dataclasses.replace(self, **{k: v for k, v in overrides.items() if v is not None})

    @property
    def decode_size(self) -> int | None:
        """The smallest shorter side a JPEG may be decoded to (``fast_decode``), or None to decode it whole."""
        return 2 * self.resize if self.fast_decode else None

    def to_transform(self):
        """The torchvision transform: PIL image → normalised float tensor ``[3, crop, crop]``."""
        from torchvision.transforms import InterpolationMode
        from torchvision.transforms._presets import ImageClassification

        return ImageClassification(
            crop_size=self.crop,
            resize_size=self.resize,
            mean=self.mean,
            std=self.std,
            interpolation=InterpolationMode(self.interpolation),
            antialias=self.antialias,
        )

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))
