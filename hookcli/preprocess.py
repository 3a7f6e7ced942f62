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
import math
from dataclasses import dataclass

__all__ = ["INTERPOLATIONS", "MAX_SIDE", "Preprocess", "check_normalisation", "parse_triple"]

INTERPOLATIONS = ("bilinear", "bicubic", "nearest")
#: The largest resize and crop accepted, from options or from a file's metadata.
MAX_SIDE = 8192


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


def check_normalisation(mean, std) -> None:
    """Refuse a mean or std that would turn every pixel into NaN or infinity: non-finite values, a std of 0."""
    if mean is not None and not all(math.isfinite(v) for v in mean):
        raise ValueError(f"mean must be finite numbers, not {', '.join(map(str, mean))}")
    if std is not None and not all(math.isfinite(v) and v > 0 for v in std):
        raise ValueError(f"std must be finite numbers above 0, not {', '.join(map(str, std))}")


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
            raise ValueError(f"interpolation must be one of {', '.join(INTERPOLATIONS)}, not {self.interpolation!r}")
        for name in ("resize", "crop"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_SIDE:
                raise ValueError(f"{name} must be a whole number from 1 to {MAX_SIDE}, not {value!r}")
        check_normalisation(self.mean, self.std)
        for name in ("antialias", "fast_decode"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be true or false, not {getattr(self, name)!r}")

    @classmethod
    def from_metadata(cls, text: str | None) -> Preprocess | None:
        """The preprocessing a file's ``preprocess`` metadata records (None if it records none).

        The text is untrusted: anything but the fields :meth:`to_json` writes,
        with values in range, raises ValueError saying what is wrong.
        """
        if not text:
            return None
        try:
            fields = json.loads(text)
        except (ValueError, RecursionError):
            raise ValueError("it is not JSON") from None
        if not isinstance(fields, dict):
            raise ValueError("it is not a JSON object")
        known = {f.name for f in dataclasses.fields(cls)}
        given = {k: v for k, v in fields.items() if k in known}
        if not {"resize", "crop"} <= given.keys():
            raise ValueError("it lacks resize or crop")
        for name in ("mean", "std"):
            if name in given:
                if not isinstance(given[name], list) or len(given[name]) != 3 or not all(
                        isinstance(v, int | float) and not isinstance(v, bool) for v in given[name]):
                    raise ValueError(f"its {name} is not three numbers")
                given[name] = tuple(float(v) for v in given[name])
        return cls(**given)

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
