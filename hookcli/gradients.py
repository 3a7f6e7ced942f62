"""Gradients of a chosen logit with respect to layer outputs, and class-activation maps made from them.

A target is a class index, a class name from the weights' categories, or
``top1`` … ``topK`` (each image's K highest logits). :class:`GradientForward`
is the forward strategy of :func:`hookcli.pipeline.iter_batches` for grad:
gradients are enabled only where needed, parameters are frozen for the run,
so autograd records the graph from the first hooked layer on, and each
batch's graph is freed after its backward pass. :class:`CamForward` turns
each batch's activations and gradients into maps.

:func:`class_activation_maps` turns activations and gradients into maps:

- ``gradcam``: weights = spatial mean of the gradient; map = ReLU(Σ_c w_c·A_c)
  (Selvaraju et al., 2017);
- ``gradcam++``: per-position weights from second- and third-order terms of
  the gradient (Chattopadhay et al., 2018);
- ``xgradcam``: weights = Σ(A·g) / ΣA per channel (Fu et al., 2020);
- ``layercam``: map = ReLU(Σ_c ReLU(g_c)·A_c), position by position (Jiang et al., 2021).

>>> import torch
>>> acts = torch.ones(1, 2, 3, 3); grads = torch.stack([torch.full((3, 3), 1.0), torch.full((3, 3), -3.0)])[None]
>>> class_activation_maps(acts, grads, "gradcam")[0, 0].tolist()
[0.0, 0.0, 0.0]
>>> class_activation_maps(acts, grads, "layercam")[0, 0].tolist()
[1.0, 1.0, 1.0]
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import math
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

from hookcli.capture import GradientCapture, preserved_mode
from hookcli.errors import CaptureError, UsageProblem
from hookcli.fileformat import RunFacts
from hookcli.models import LoadedModel
from hookcli.speed import compute_precision

__all__ = [
    "CAM_METHODS", "CamForward", "GradientForward", "Target", "class_activation_maps", "default_cam_layer",
    "frozen_parameters", "parse_target", "spatial_maps",
]

CAM_METHODS = ("gradcam", "gradcam++", "xgradcam", "layercam")


@dataclass(frozen=True)
class Target:
    """``top`` K logits of each image, or one ``class_index`` for all."""

    top: int | None = None
    class_index: int | None = None

    @property
    def count(self) -> int:
        return self.top or 1

    def describe(self) -> str:
        return f"top{self.top}" if self.top else str(self.class_index)

    def pick(self, logits):
        """Classes ``[N, K]`` to take gradients of, for a batch of ``logits``."""
        import torch

        if self.top:
            return logits.topk(self.top, dim=1).indices
        if self.class_index >= logits.shape[1]:
            raise UsageProblem(f"target class {self.class_index} is out of range: the model has "
                               f"{logits.shape[1]} classes", hint=f"use 0 to {logits.shape[1] - 1}")
        return torch.full((len(logits), 1), self.class_index, dtype=torch.long, device=logits.device)


def parse_target(spec: str, categories: Sequence[str] | None, num_classes: int) -> Target:
    """Read ``--target``: ``top1``/``topK``, a class index, or a class name of the weights."""
    text = str(spec).strip()
    top = re.fullmatch(r"top(\d+)", text.lower())
    if top:
        count = int(top.group(1))
        if not 1 <= count <= num_classes:
            raise UsageProblem(f"target '{text}' asks for {count} classes of {num_classes}",
                               hint=f"use top1 to top{num_classes}")
        return Target(top=count)
    if re.fullmatch(r"-?\d+", text):
        index = int(text)
        if not 0 <= index < num_classes:
            raise UsageProblem(f"target class {index} is out of range: the model has {num_classes} classes",
                               hint=f"use 0 to {num_classes - 1}, a class name or top1")
        return Target(class_index=index)
    if not categories:
        raise UsageProblem(f"target '{text}' is a class name, but these weights have no class names",
                           hint=f"give a class index (0 to {num_classes - 1}) or top1; names come with pretrained "
                           "--weights")
    lowered = [name.lower() for name in categories]
    if text.lower() in lowered:
        return Target(class_index=lowered.index(text.lower()))
    closest = difflib.get_close_matches(text.lower(), lowered, n=3, cutoff=0.0)
    raise UsageProblem(f"unknown class name '{text}' (closest: {', '.join(categories[lowered.index(c)] for c in closest)})",
                       hint="class names are the weights' categories; a class index or top1 also works")


@contextlib.contextmanager
def frozen_parameters(model) -> Iterator[None]:
    """No parameter needs a gradient inside the block (no weight gradients are computed or kept)."""
    flags = [(p, p.requires_grad) for p in model.parameters()]
    for parameter, _ in flags:
        parameter.requires_grad_(False)
    try:
        yield
    finally:
        for parameter, flag in flags:
            parameter.requires_grad_(flag)


class GradientForward:
    """The forward strategy of grad: activations, ``<key>@grad`` next to each ``<key>``, and per-row targets.

    Parameters stay frozen while it is entered. Called with a batch, returns
    ``(features, targets)``: each row's ``targets`` entry lists K dicts:
    ``class``, ``name`` (or None), ``logit`` and ``probability`` (softmax over
    all classes).
    """

    def __init__(self, model, layers: Mapping[str, str], settings, on_note=None, *, target: Target,
                 categories: Sequence[str] | None = None) -> None:
        self.model, self.settings, self.target, self.categories = model, settings, target, categories
        self.capture = GradientCapture(model, layers)
        self._stack = contextlib.ExitStack()

    def __enter__(self) -> GradientForward:
        with contextlib.ExitStack() as stack:
            stack.enter_context(frozen_parameters(self.model))
            stack.enter_context(self.capture)
            self._stack = stack.pop_all()
        return self

    def __exit__(self, *exc_info) -> None:
        self._stack.close()

    def __call__(self, batch) -> tuple[dict, list]:
        with compute_precision(self.settings.precision, batch.device):
            captured, classes, logits = self.capture.run_gradients(batch, self.target.pick)
        return captured, _describe_targets(classes, logits, self.categories)

    def facts(self) -> RunFacts:
        return RunFacts(calls=dict(self.capture.calls or {}), omitted=tuple(sorted(self.capture.omitted)))


class CamForward(GradientForward):
    """The forward strategy of cam: maps ``cam`` ``[n, h, w]`` (``cam#<k>`` for each of top K) from one layer."""

    def __init__(self, model, layers: Mapping[str, str], settings, on_note=None, *, target: Target,
                 categories: Sequence[str] | None = None, method: str = "gradcam") -> None:
        if method not in CAM_METHODS:
            raise UsageProblem(f"unknown CAM method '{method}'", hint=f"use one of {', '.join(CAM_METHODS)}")
        (self.layer,) = layers
        super().__init__(model, {self.layer: "act"}, settings, on_note, target=target, categories=categories)
        self.method = method

    def __call__(self, batch) -> tuple[dict, list]:
        captured, targets = super().__call__(batch)
        if "act" not in captured:  # stored as act:0, act:1, …: the module ran more than once
            calls = sum(1 for key in captured if key.startswith("act:") and "@" not in key)
            raise UsageProblem(f"cam needs a layer that runs once per forward, and '{self.layer}' runs {calls} times",
                               hint="choose the block around it (such as layer4.0) or another layer; 'hookcli layers' "
                                    "shows each module's calls")
        activations = spatial_maps(captured["act"])
        maps = {}
        for k in range(self.target.count):
            gradient = captured["act@grad" if self.target.count == 1 else f"act@grad#{k}"]
            maps["cam" if self.target.count == 1 else f"cam#{k}"] = class_activation_maps(
                activations, spatial_maps(gradient), self.method)
        return maps, targets


def _describe_targets(classes, logits, categories) -> list[list[dict]]:
    probabilities = logits.float().softmax(dim=1)
    rows = []
    for row_classes, row_logits, row_probabilities in zip(classes.tolist(), logits.float(), probabilities, strict=True):
        rows.append([{"class": c, "name": categories[c] if categories and c < len(categories) else None,
                      "logit": float(row_logits[c]), "probability": float(row_probabilities[c])}
                     for c in row_classes])
    return rows


def spatial_maps(tensor):
    """A batch of layer outputs as ``[N, C, H, W]``.

    Crops are square, so a 4-D output is channels-first when its last two
    axes are equal and channels-last ([N, H, W, C], as inside Swin) when its
    middle two are; tokens ``[N, T, D]`` fold into a square (a leading class
    token dropped when T-1 is square).
    """
    if tensor.dim() == 4:
        return tensor.permute(0, 3, 1, 2) if _channels_last(tensor.shape) else tensor
    if tensor.dim() == 3:
        tokens = tensor.shape[1]
        for skip in (0, 1):
            side = math.isqrt(tokens - skip)
            if side * side == tokens - skip and side > 0:
                grid = tensor[:, skip:, :]
                return grid.transpose(1, 2).reshape(len(tensor), tensor.shape[2], side, side)
    raise CaptureError(f"a layer output of shape {list(tensor.shape)} has no spatial layout for a map",
                       hint="pick a convolutional layer ([N, C, H, W]) or a ViT block (square token grid)")


def _channels_last(shape) -> bool:
    return shape[2] != shape[3] and shape[1] == shape[2]


def class_activation_maps(activations, gradients, method: str = "gradcam"):
    """Maps ``[N, H, W]`` (ReLU'd, not normalised) from ``[N, C, H, W]`` activations and their gradients."""
    import torch

    a, g = activations.float(), gradients.float()
    if method == "gradcam":
        weights = g.mean(dim=(2, 3), keepdim=True)
        return torch.relu((weights * a).sum(dim=1))
    if method == "gradcam++":
        g2, g3 = g.pow(2), g.pow(3)
        denominator = 2 * g2 + a.sum(dim=(2, 3), keepdim=True) * g3
        alpha = torch.where(denominator != 0, g2 / torch.where(denominator != 0, denominator, 1.0), 0.0)
        weights = (alpha * torch.relu(g)).sum(dim=(2, 3), keepdim=True)
        return torch.relu((weights * a).sum(dim=1))
    if method == "xgradcam":
        totals = a.sum(dim=(2, 3), keepdim=True)
        weights = (a * g).sum(dim=(2, 3), keepdim=True) / torch.where(totals != 0, totals, 1.0)
        return torch.relu((weights * a).sum(dim=1))
    if method == "layercam":
        return torch.relu((torch.relu(g) * a).sum(dim=1))
    raise UsageProblem(f"unknown CAM method '{method}'", hint=f"use one of {', '.join(CAM_METHODS)}")


def default_cam_layer(loaded: LoadedModel, example) -> str:
    """The layer a CAM is usually taken at.

    ViTs: the last encoder block's first LayerNorm (the class token has not yet
    mixed every patch away); otherwise the last layer to finish whose output
    is still a spatial map with more than one position, global pooling heads
    aside: the last convolutional stage (``layer4``, ``features``, Swin's
    ``permute`` after its final norm, …).
    """
    import torch

    name, model = loaded.name, loaded.module
    if name.startswith("vit_"):
        blocks = [path for path, _ in model.named_modules() if re.fullmatch(r"encoder\.layers\.encoder_layer_\d+", path)]
        return f"{blocks[-1]}.ln_1"
    finished: list[str] = []

    def note(path, module, inputs, output):
        pooling_head = isinstance(module, torch.nn.AdaptiveAvgPool2d | torch.nn.AdaptiveMaxPool2d)
        if isinstance(output, torch.Tensor) and output.dim() == 4 and not pooling_head:
            height, width = spatial_maps(output).shape[2:]
            if height * width > 1:
                finished.append(path)

    with contextlib.ExitStack() as stack, preserved_mode(model), torch.inference_mode():
        for path, module in model.named_modules():
            if path:
                stack.enter_context(module.register_forward_hook(functools.partial(note, path)))
        model(example)
    if not finished:
        raise UsageProblem(f"{name} has no layer with a spatial output to take a CAM at",
                           hint="pass --layer (see 'hookcli layers')")
    return finished[-1]
