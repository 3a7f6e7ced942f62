"""What happens to an image before it reaches the model.

A :class:`Preprocess` is read off the weights' own transforms (resize, centre
crop, normalisation) for each model family (its ``kind``), may be overridden
field by field, and is recorded in the output's metadata;
:mod:`hookcli.inputs.transforms` builds its transform (torchvision's preset,
or steps equal to it, so the numbers are exactly those torchvision uses).
Nothing here imports torch: the pictures read a run's preprocessing back.

``fast_decode`` trades a little of that exactness for speed: JPEGs are
decoded at a reduced scale (libjpeg's 1/2, 1/4 or 1/8) that still leaves the
shorter side at least twice ``resize``, and a classifier's resize and centre
crop are one resize of the part the crop keeps
(:func:`hookcli.inputs.transforms.window_resized`).
``decode="device"`` decodes and preprocesses on the run's device instead
(:mod:`hookcli.inputs.decoding`); the transform takes uint8 tensors as well as PIL
images for that.

>>> spec = Preprocess(resize=256, crop=224)
>>> spec.replace(crop=112).crop
112
>>> spec.replace(fast_decode=True).decode_size
512
>>> sorted(json.loads(spec.to_json()))
['antialias', 'crop', 'fast_decode', 'interpolation', 'kind', 'mean', 'resize', 'std']
"""

from __future__ import annotations

import dataclasses
import functools
import json
from dataclasses import dataclass

from hookcli.errors import UsageProblem
from hookcli.options.run import DECODERS, INTERPOLATIONS, MAX_SIDE, RunOptions
from hookcli.parsing import check_normalisation

__all__ = [
    "DEVICE_DECODE_KINDS",
    "STILL_KINDS",
    "Preprocess",
    "refuse_device_decoding",
]

#: The input kinds read from image files, one at a time: those whose rows the decode workers hand over as uint8,
#: and those ``decode="device"`` serves.
STILL_KINDS = ("classification", "segmentation", "detection")
DEVICE_DECODE_KINDS = STILL_KINDS


def refuse_device_decoding(decode: str, kind: str) -> None:
    """Refuse ``--decode device`` for a model of input ``kind`` that takes frames decoded on the CPU."""
    if decode == "device" and kind not in DEVICE_DECODE_KINDS:
        raise UsageProblem(
            f"--decode device reads image files, and this {kind.replace('_', ' ')} model takes frames decoded on the "
            "CPU",
            hint="leave out --decode device",
        )


#: The input kinds a preprocessing is for, named after the torchvision preset it reproduces.
KINDS = ("classification", "segmentation", "detection", "video", "optical_flow")
_IMAGENET_MEAN = (0.485, 0.456, 0.406)
_IMAGENET_STD = (0.229, 0.224, 0.225)


@dataclass(frozen=True)
class Preprocess:
    """Resize, centre-crop, scale to [0, 1] and normalise, as the ``kind`` of model takes its input.

    ``classification`` (quantized too): shorter side to ``resize``, centre crop ``crop``² (``ImageClassification``);
    ``resize`` may be ``[height, width]`` (squashed, as Hugging Face's ViT and timm's ``squash`` do), ``crop`` None.
    ``segmentation``: as ``SemanticSegmentation``, cropped only when ``crop`` is given. ``detection``: the image as it
    is, in [0, 1] (``ObjectDetection``: the model resizes and normalises), ``resize``/``crop`` when given. ``video``:
    frames resized and centre-cropped as ``VideoClassification`` does, clips ``[C, T, H, W]``. ``optical_flow``:
    scaled to [-1, 1] (``OpticalFlow``), resized or cropped only when asked. ``mean``/``std`` None: no normalisation.
    ``decode``: where images are decoded and preprocessed (:data:`DECODERS`, :mod:`hookcli.inputs.decoding`).
    """

    resize: int | tuple[int, int] | None
    crop: int | None
    mean: tuple[float, float, float] | None = _IMAGENET_MEAN
    std: tuple[float, float, float] | None = _IMAGENET_STD
    interpolation: str = "bilinear"
    antialias: bool = True
    fast_decode: bool = False
    kind: str = "classification"
    decode: str = "cpu"

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {', '.join(KINDS)}, not {self.kind!r}")
        if self.decode not in DECODERS:
            raise ValueError(f"decode must be one of {', '.join(DECODERS)}, not {self.decode!r}")
        if self.decode == "device" and self.kind not in DEVICE_DECODE_KINDS:
            raise ValueError(
                f"decode='device' reads image files, and {self.kind.replace('_', ' ')} models take "
                "frames decoded on the CPU"
            )
        if self.decode == "device" and self.fast_decode:
            raise ValueError(
                "fast_decode and decode='device' cannot be combined: fast_decode is the CPU decoder's reduced scale"
            )
        if self.interpolation not in INTERPOLATIONS:
            raise ValueError(f"interpolation must be one of {', '.join(INTERPOLATIONS)}, not {self.interpolation!r}")
        if isinstance(self.resize, list):
            object.__setattr__(self, "resize", tuple(self.resize))
        needed = {"classification": ("resize",), "segmentation": ("resize",), "video": ("resize", "crop")}
        for name in ("resize", "crop"):
            value = getattr(self, name)
            if value is None and name not in needed.get(self.kind, ()):
                continue
            pair = name == "resize" and isinstance(value, tuple) and self.kind in ("video", "classification")
            sides = value if pair else (value,)
            if len(sides) not in (1, 2) or not all(_is_side(v) for v in sides):
                raise ValueError(f"{name} must be a whole number from 1 to {MAX_SIDE}, not {value!r}")
        if self.kind == "classification" and isinstance(self.resize, int) and self.crop is None:
            raise ValueError(
                "crop must be given when resize is one side: a classifier's images are cropped to one "
                "square size (or squashed to resize [height, width])"
            )
        if (self.mean is None) != (self.std is None):
            raise ValueError("mean and std must both be given or both be left out")
        for name in ("mean", "std"):
            value = getattr(self, name)
            if value is not None and len(value) != 3:
                raise ValueError(f"{name} must be three numbers (R, G, B), not {len(value)}")
        check_normalisation(self.mean, self.std)
        for name in ("antialias", "fast_decode"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be true or false, not {getattr(self, name)!r}")

    @classmethod
    def from_metadata(cls, text: str | None) -> Preprocess | None:
        """The preprocessing a file's ``preprocess`` metadata records (None if it records none).

        The text is untrusted: anything but the fields :meth:`to_json` writes,
        with values in range, raises ValueError saying what is wrong. Read
        once for each text (every picture of a file asks).
        """
        return _from_metadata(text)

    @classmethod
    def _read_metadata(cls, text: str | None) -> Preprocess | None:
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
            if given.get(name) is not None:
                if (
                    not isinstance(given[name], list)
                    or len(given[name]) != 3
                    or not all(isinstance(v, int | float) and not isinstance(v, bool) for v in given[name])
                ):
                    raise ValueError(f"its {name} is not three numbers")
                given[name] = tuple(float(v) for v in given[name])
        for name in ("kind", "decode"):
            if not isinstance(given.get(name, ""), str):
                raise ValueError(f"its {name} is not a name")
        return cls(**given)

    @classmethod
    def from_transforms(cls, transforms) -> Preprocess:
        """Read the torchvision preset a weights' ``transforms()`` returns, for any model family.

        >>> import torchvision.models as tv
        >>> Preprocess.from_transforms(tv.ResNet18_Weights.DEFAULT.transforms()).crop
        224
        >>> spec = Preprocess.from_transforms(tv.video.R3D_18_Weights.DEFAULT.transforms())
        >>> spec.kind, spec.resize, spec.crop
        ('video', (128, 171), 112)
        """
        preset = type(transforms).__name__
        if preset == "ObjectDetection":
            return cls(resize=None, crop=None, mean=None, std=None, kind="detection")
        if preset == "OpticalFlow":
            return cls(resize=None, crop=None, mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5), kind="optical_flow")
        sizes = [int(v) for v in transforms.resize_size]
        common = {
            "mean": tuple(float(v) for v in transforms.mean),
            "std": tuple(float(v) for v in transforms.std),
            "interpolation": transforms.interpolation.value,
        }
        if preset == "SemanticSegmentation":
            return cls(resize=sizes[0], crop=None, antialias=bool(transforms.antialias), kind="segmentation", **common)
        if preset == "VideoClassification":
            return cls(
                resize=sizes[0] if len(sizes) == 1 else (sizes[0], sizes[1]),  # torchvision's [size] or [h, w]
                crop=int(transforms.crop_size[0]),
                antialias=False,
                kind="video",
                **common,
            )
        return cls(resize=sizes[0], crop=int(transforms.crop_size[0]), antialias=bool(transforms.antialias), **common)

    def asked(self, opts: RunOptions) -> Preprocess:
        """This preprocessing with the options' overrides. A model that squashes images to ``[height, width]``
        takes ``--resize N`` as ``[N, N]`` unless ``--crop`` is given too."""
        resize: int | tuple[int, int] | None = opts.resize
        squashes = isinstance(self.resize, tuple) and self.kind == "classification" and self.crop is None
        if opts.resize is not None and squashes and opts.crop is None:
            resize = (opts.resize, opts.resize)
        refuse_device_decoding(opts.decode, self.kind)
        return self.replace(
            resize=resize,
            crop=opts.crop,
            mean=opts.mean,
            std=opts.std,
            interpolation=opts.interpolation,
            fast_decode=opts.fast_decode or None,
            decode=opts.decode,
        )

    def padding_notes(self) -> tuple[str, ...]:
        """What to say of a centre crop larger than the resized image: the crop pads it with zeros."""
        side = min(self.resize) if isinstance(self.resize, tuple) else self.resize
        if self.kind != "classification" or side is None or self.crop is None or self.crop <= side:
            return ()
        return (
            f"the centre crop ({self.crop}) is larger than the resized image ({side} a side), so the crop pads it with "
            f"zeros: give --crop {side} or less to keep the image alone",
        )

    def replace(self, **overrides) -> Preprocess:
        """A copy with the given fields changed; ``None`` values are ignored."""
        return dataclasses.replace(self, **{k: v for k, v in overrides.items() if v is not None})

    @property
    def decode_size(self) -> int | None:
        """The smallest shorter side a JPEG may be decoded to (``fast_decode``), or None to decode it whole."""
        if not self.fast_decode or self.resize is None:
            return None
        return 2 * (self.resize if isinstance(self.resize, int) else min(self.resize))

    def to_json(self) -> str:
        """The fields as JSON; ``decode`` only when it is not ``"cpu"``, so a run that does not ask for it records
        what runs before the field existed recorded (and continues their shard folders)."""
        fields = dataclasses.asdict(self)
        if self.decode == "cpu":
            del fields["decode"]
        return json.dumps(fields)


def _is_side(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= MAX_SIDE


@functools.lru_cache(maxsize=16)
def _from_metadata(text: str | None) -> Preprocess | None:
    return Preprocess._read_metadata(text)  # a Preprocess is frozen: one may serve every picture
