"""What ``grad`` and ``cam`` take gradients of: ``--target`` (a class index, a class name of the weights, ``topK``,
a detection ``#N``) and ``--region`` (a part of a segmentation's image), read and checked without torch.

>>> parse_target("top2", None, 10).describe(), parse_target("7", None, 10, region="0,0.5,1,1").region
('top2', (0.0, 0.5, 1.0, 1.0))
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Sequence
from dataclasses import dataclass

from hookcli.errors import UsageProblem
from hookcli.families import family_traits
from hookcli.parsing import parse_region

__all__ = [
    "Target",
    "parse_target",
]


@dataclass(frozen=True)
class Target:
    """``top`` K logits of each image, or one ``class_index`` for all.

    For a segmentation model the score is a class's mask (the sum of the
    class's logits over the pixels predicted as that class, or over
    ``region``: ``(x0, y0, x1, y1)`` as fractions of the image); ``top`` K
    are the K classes covering most pixels. For a detection model it is a
    detection's score: the K highest-scoring detections, those of
    ``class_index``, or the one at place ``detection`` of the model's output
    (``--target '#2'``).
    """

    top: int | None = None
    class_index: int | None = None
    region: tuple[float, float, float, float] | None = None
    detection: int | None = None  # detection models: the detection at this place in the model's output

    @property
    def count(self) -> int:
        return self.top or 1

    def describe(self) -> str:
        text = (
            f"top{self.top}"
            if self.top
            else f"#{self.detection}"
            if self.detection is not None
            else str(self.class_index)
        )
        return text + (" in " + ",".join(f"{v:g}" for v in self.region) if self.region else "")


def parse_target(
    spec: str,
    categories: Sequence[str] | None,
    num_classes: int | None,
    *,
    region=None,
    family: str = "classification",
) -> Target:
    """Read ``--target``: ``top1``/``topK``, a class index, or a class name of the weights (and ``--region``);
    for detection models also ``#N``, the detection at place N of the model's output. ``num_classes`` None: not known
    before the model runs (a module handed in), its scores are counted then."""
    place = re.fullmatch(r"#(\d+)", str(spec).strip())
    if place and family_traits(family).output == "detections":
        return Target(detection=int(place.group(1)))
    if place:
        raise UsageProblem(
            f"target '{spec}' names a detection, and only detection models give detections",
            hint="give a class index, a class name or topK",
        )
    found = _parsed_target(spec, categories, num_classes)
    return Target(top=found.top, class_index=found.class_index, region=parse_region(region))


def _parsed_target(spec: str, categories: Sequence[str] | None, num_classes: int | None) -> Target:
    text = str(spec).strip()
    top = re.fullmatch(r"top(\d+)", text.lower())
    if top:
        count = int(top.group(1))
        if num_classes is None and count < 1:
            raise UsageProblem(f"target '{text}' asks for no class", hint="use top1 or more")
        if num_classes is not None and not 1 <= count <= num_classes:
            raise UsageProblem(
                f"target '{text}' asks for {count} classes of {num_classes}", hint=f"use top1 to top{num_classes}"
            )
        return Target(top=count)
    if re.fullmatch(r"-?\d+", text):
        index = int(text)
        if num_classes is None and index < 0:
            raise UsageProblem(f"target class {index} is out of range", hint="count classes from 0, or use top1")
        if num_classes is not None and not 0 <= index < num_classes:
            raise UsageProblem(
                f"target class {index} is out of range: the model has {num_classes} classes",
                hint=f"use 0 to {num_classes - 1}{', a class name' if categories else ''} or top1",
            )
        return Target(class_index=index)
    if not categories:
        indices = "a class index" if num_classes is None else f"a class index (0 to {num_classes - 1})"
        raise UsageProblem(
            f"target '{text}' is a class name, but these weights have no class names",
            hint=f"give {indices} or top1; names come with pretrained --weights",
        )
    lowered = [name.lower() for name in categories]
    if text.lower() in lowered:
        return Target(class_index=lowered.index(text.lower()))
    closest = difflib.get_close_matches(text.lower(), lowered, n=3, cutoff=0.0)
    raise UsageProblem(
        f"unknown class name '{text}' (closest: {', '.join(categories[lowered.index(c)] for c in closest)})",
        hint="class names are the weights' categories; a class index or top1 also works",
    )
