"""Gradients of a chosen logit with respect to layer outputs, and class-activation maps made from them.

A target is a class index, a class name from the weights' categories, or
``top1`` … ``topK`` (each image's K highest logits). :func:`iter_gradient_batches`
runs the same input pipeline as extraction, but with gradients enabled only
where needed: parameters are frozen for the run, so autograd records the graph
from the first hooked layer on, and each batch's graph is freed after its
backward pass.

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
import dataclasses
import difflib
import functools
import math
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

from hookcli.capture import FeatureCapture, preserved_mode
from hookcli.errors import CaptureError, UsageProblem
from hookcli.extract import Batch, RunSettings, image_loader, prepared_model, reported_failures
from hookcli.models import LoadedModel
from hookcli.speed import compute_precision

__all__ = [
    "CAM_METHODS", "Target", "class_activation_maps", "default_cam_layer", "frozen_parameters", "iter_cam_batches",
    "iter_gradient_batches", "parse_target", "spatial_maps",
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


def iter_gradient_batches(
    loaded: LoadedModel,
    layers: Mapping[str, str],
    paths: Sequence,
    settings: RunSettings,
    target: Target,
    *,
    start: int = 0,
    capture_hooks: list | None = None,
) -> Iterator[Batch]:
    """Like :func:`hookcli.extract.iter_batches`, with ``<key>@grad`` next to each ``<key>`` and per-row targets.

    Each row's ``targets`` entry lists K dicts: ``class``, ``name`` (or None),
    ``logit`` and ``probability`` (softmax over all classes).
    """
    import torch

    loader = image_loader(paths, settings, settings.preprocess or loaded.preprocess, start=start)
    cast = getattr(torch, settings.dtype)
    with prepared_model(loaded, settings) as (model, to_device), frozen_parameters(model), \
            FeatureCapture(model, layers, gradients=True) as hooks:
        if capture_hooks is not None:
            capture_hooks.append(hooks)
        for indices, batch, failures in loader:
            failures = reported_failures(failures, settings)
            features, targets = {}, None
            if batch is not None:
                batch = to_device(batch)
                with compute_precision(settings.precision, batch.device):
                    captured, classes, logits = hooks.run_gradients(batch, target.pick)
                features = {key: value.to(cast).to("cpu") for key, value in captured.items()}
                targets = _describe_targets(classes, logits, loaded.categories)
            yield Batch(indices, features, failures, targets)


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


def iter_cam_batches(
    loaded: LoadedModel,
    layer: str,
    paths: Sequence,
    settings: RunSettings,
    target: Target,
    method: str = "gradcam",
    *,
    start: int = 0,
    capture_hooks: list | None = None,
) -> Iterator[Batch]:
    """Batches whose features are class-activation maps ``cam`` ``[n, h, w]`` (``cam#<k>`` for each of top K)."""
    if method not in CAM_METHODS:
        raise UsageProblem(f"unknown CAM method '{method}'", hint=f"use one of {', '.join(CAM_METHODS)}")
    float_settings = dataclasses.replace(settings, dtype="float32")
    for batch in iter_gradient_batches(loaded, {layer: "act"}, paths, float_settings, target, start=start,
                                       capture_hooks=capture_hooks):
        maps = {}
        if batch.features:
            activations = spatial_maps(batch.features["act"])
            for k in range(target.count):
                gradient = batch.features["act@grad" if target.count == 1 else f"act@grad#{k}"]
                cam = class_activation_maps(activations, spatial_maps(gradient), method)
                maps["cam" if target.count == 1 else f"cam#{k}"] = cam
        yield Batch(batch.indices, maps, batch.failures, batch.targets)
