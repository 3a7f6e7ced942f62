"""Gradients of a chosen logit with respect to layer outputs, and class-activation maps made from them.

A target is a class index, a class name from the weights' categories, or
``top1`` … ``topK`` (each image's K highest logits). :class:`GradientForward`
is the forward strategy of :func:`hookcli.run.pipeline.iter_batches` for grad:
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
import functools
from collections.abc import Iterator, Mapping, Sequence

import torch

from hookcli.errors import CaptureError, UsageProblem
from hookcli.families import channels_last_output, family_traits, is_square, ragged_rows
from hookcli.models.loaded import LoadedModel
from hookcli.options.run import CAM_METHODS
from hookcli.pictures.render import map_layout
from hookcli.run.batches import batch_device, call_model, rows_by_shape
from hookcli.run.capture import GradientCapture, preserved_mode
from hookcli.run.forwards import DetectionRows
from hookcli.run.speed import compute_precision
from hookcli.run.targets import Target
from hookcli.statistics.units import width_axis
from hookcli.storage.fileformat import RunFacts

__all__ = [
    "CamForward",
    "GradientForward",
    "Target",
    "class_activation_maps",
    "default_cam_layer",
    "frozen_parameters",
    "picked_classes",
    "spatial_maps",
]


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
            # A parameter made under inference mode takes its flag back only there.
            with torch.inference_mode() if parameter.is_inference() else contextlib.nullcontext():
                parameter.requires_grad_(flag)


class GradientForward:
    """The forward strategy of grad: activations, ``<key>@grad`` next to each ``<key>``, and per-row targets.

    Parameters stay frozen while it is entered. Called with a batch, returns
    ``(features, targets)``: each row's ``targets`` entry lists K dicts:
    ``class``, ``name`` (or None), ``logit`` and ``probability`` (softmax over
    all classes).
    """

    def __init__(
        self,
        model,
        layers: Mapping[str, str],
        settings,
        on_note=None,
        *,
        target: Target,
        categories: Sequence[str] | None = None,
        scores: str | None = None,
    ) -> None:
        self.model, self.settings, self.target, self.categories = model, settings, target, categories
        self.on_note = on_note
        self.scores = scores  # the output field holding the scores (a transformers model's logits), if not a tensor
        self._said_uncovered = False  # whether a segmentation target of no pixel was said
        edits = getattr(settings, "edits", ())
        self.capture = GradientCapture(model, layers, edits, getattr(settings, "capture_edited", False))
        self.family = getattr(settings, "family", "classification")
        self.rows = (
            DetectionRows(model, detections=False) if family_traits(self.family).output == "detections" else None
        )
        self.ragged = ragged_rows(self.family, settings.preprocess) if settings.preprocess is not None else False
        self._stack = contextlib.ExitStack()

    def __enter__(self) -> GradientForward:
        with contextlib.ExitStack() as stack:
            stack.enter_context(frozen_parameters(self.model))
            stack.enter_context(self.capture)
            if self.rows is not None:
                stack.enter_context(self.rows)
            self._stack = stack.pop_all()
        return self

    def __exit__(self, *exc_info) -> None:
        try:
            if exc_info[0] is None:  # what the device had not said by the last batch
                self._say_overflows(wait=True)
        finally:
            self._stack.close()

    def __call__(self, batch) -> tuple[dict, list | None]:
        found = self._forward(batch)
        self._say_overflows(wait=False)
        return found

    def _say_overflows(self, *, wait: bool) -> None:
        for said in self.capture.take_overflows(wait=wait):
            if self.on_note is not None:
                self.on_note(said)

    def _forward(self, batch) -> tuple[dict, list | None]:
        with compute_precision(self.settings.precision, batch_device(batch), backward=True):
            if self.rows is not None:  # a detection model
                captured, about, _ = self.capture.run_gradients(list(batch), score=self._detection_scores)
                return self.rows.cut(captured), about
            if family_traits(self.family).output == "masks":

                def run(group):
                    return self.capture.run_gradients(group, score=self._mask_scores)[:2]

                return rows_by_shape(run, batch) if self.ragged else run(batch)
            captured, classes, logits = self.capture.run_gradients(
                batch, functools.partial(picked_classes, self.target), field=self.scores
            )
        return captured, _describe_targets(classes, logits, self.categories)

    def _name(self, index: int) -> str | None:
        return self.categories[index] if self.categories and 0 <= index < len(self.categories) else None

    def _mask_scores(self, output):
        """Each image's score for a segmentation target: its class's logits summed over the class's mask."""
        logits = output["out"] if isinstance(output, Mapping) else output
        count, classes, height, width = logits.shape
        predicted = logits.detach().argmax(1)
        if self.target.top:
            _check_top(self.target.top, classes)
            areas = torch.stack([torch.bincount(p.flatten(), minlength=classes) for p in predicted])
            chosen = areas.topk(self.target.top, dim=1).indices
        else:
            assert self.target.class_index is not None, "a target is the top K or one class"
            if self.target.class_index >= classes:
                raise UsageProblem(
                    f"target class {self.target.class_index} is out of range: the model has {classes} classes",
                    hint=f"use 0 to {classes - 1} or top1",
                )
            chosen = torch.full((count, 1), self.target.class_index, device=logits.device)
        if self.target.region is None:
            masks = predicted[:, None] == chosen[:, :, None, None]
        else:
            x0, y0, x1, y1 = self.target.region
            region = torch.zeros((height, width), dtype=torch.bool, device=logits.device)
            region[
                int(y0 * height) : max(int(y0 * height) + 1, round(y1 * height)),
                int(x0 * width) : max(int(x0 * width) + 1, round(x1 * width)),
            ] = True
            masks = region.expand(count, chosen.shape[1], height, width)
        picked = logits.gather(1, chosen[:, :, None, None].expand(-1, -1, height, width))
        scores = (picked * masks).sum(dim=(2, 3))
        where = {} if self.target.region is None else {"region": list(self.target.region)}
        counts = masks.sum(dim=(2, 3)).tolist()  # one copy from the device for the whole batch
        if self.target.top and self.target.region is None and not self._said_uncovered and self.on_note is not None:
            bare = sum(1 for row in counts for n in row if n == 0)
            if bare:
                self._said_uncovered = True
                top = self.target.top
                self.on_note(
                    f"--target top{top}: an image predicted to hold fewer than {top} classes still takes {top} "
                    f"targets, and those of no pixel ({bare:,} in the first batch that had any) have a score and "
                    "gradients of 0"
                )
        about = [
            [
                {
                    "class": int(c),
                    "name": self._name(int(c)),
                    "pixels": n,
                    "share": n / (height * width),
                    "score": float(v),
                    **where,
                }
                for c, n, v in zip(row_classes, row_counts, row_scores, strict=True)
            ]
            for row_classes, row_counts, row_scores in zip(chosen, counts, scores.detach(), strict=True)
        ]
        return scores, about

    def _detection_scores(self, output):
        """Each image's score for a detection target: the score of its K best detections (of one class, if asked).

        An image with fewer such detections scores 0 for the rest, and its entry says ``"detection": None``.
        """
        wanted = self.target.count
        scores, about = [], []
        for found in output:
            order = found["scores"].detach().argsort(descending=True, stable=True).tolist()
            if self.target.detection is not None:
                order = [self.target.detection] if self.target.detection < len(order) else []
            elif self.target.class_index is not None:
                order = [i for i in order if int(found["labels"][i]) == self.target.class_index]
            chosen = order[:wanted]
            row = [found["scores"][i] for i in chosen]
            row += [found["scores"].new_zeros(())] * (wanted - len(chosen))
            scores.append(torch.stack(row))
            described = [
                {
                    "detection": i,
                    "class": int(found["labels"][i]),
                    "name": self._name(int(found["labels"][i])),
                    "score": float(found["scores"][i].detach()),
                    "box": [round(float(v), 2) for v in found["boxes"][i].detach()],
                }
                for i in chosen
            ]
            missing = self.target.class_index
            described += [
                {
                    "detection": None,
                    "class": missing,
                    "name": None if missing is None else self._name(missing),
                    "score": None,
                    "box": None,
                }
            ] * (wanted - len(chosen))
            about.append(described)
        return torch.stack(scores), about

    def facts(self) -> RunFacts:
        return RunFacts(calls=dict(self.capture.calls or {}), omitted=tuple(sorted(self.capture.omitted)))


class CamForward(GradientForward):
    """The forward strategy of cam: maps ``cam`` ``[n, h, w]`` (``cam#<k>`` for each of top K) from one layer."""

    def __init__(
        self,
        model,
        layers: Mapping[str, str],
        settings,
        on_note=None,
        *,
        target: Target,
        categories: Sequence[str] | None = None,
        method: str = "gradcam",
        scores: str | None = None,
        prefix_tokens: int | None = None,
        square: bool = True,
        width: int | None = None,
    ) -> None:
        if method not in CAM_METHODS:
            raise UsageProblem(f"unknown CAM method '{method}'", hint=f"use one of {', '.join(CAM_METHODS)}")
        (self.layer,) = layers
        super().__init__(
            model, {self.layer: "act"}, settings, on_note, target=target, categories=categories, scores=scores
        )
        self.method = method
        self._maps_of = functools.partial(spatial_maps, prefix_tokens=prefix_tokens, square=square, width=width)

    def __call__(self, batch) -> tuple[dict, list | None]:
        captured, targets = super().__call__(batch)
        if "act" not in captured:  # stored as act:0, act:1, …: the module ran more than once
            calls = sum(1 for key in captured if key.startswith("act:") and "@" not in key)
            raise UsageProblem(
                f"cam needs a layer that runs once per forward, and '{self.layer}' runs {calls} times",
                hint=(
                    f"choose the block around it ({self.layer.rpartition('.')[0]}) or another layer"
                    if "." in self.layer
                    else "choose another layer"
                )
                + "; 'hookcli layers' shows each module's calls",
            )
        activations = captured["act"]
        maps, maps_of = {}, self._maps_of
        for k in range(self.target.count):
            gradient = captured["act@grad" if self.target.count == 1 else f"act@grad#{k}"]
            if isinstance(activations, list):  # rows of their own sizes: a map each
                found = [
                    class_activation_maps(maps_of(a[None]), maps_of(g[None]), self.method)[0]
                    for a, g in zip(activations, gradient, strict=True)
                ]
            else:
                found = class_activation_maps(maps_of(activations), maps_of(gradient), self.method)
            maps["cam" if self.target.count == 1 else f"cam#{k}"] = found
        return maps, targets


def _describe_targets(classes, logits, categories) -> list[list[dict]]:
    probabilities = logits.float().softmax(dim=1)
    rows = []
    for row_classes, row_logits, row_probabilities in zip(classes.tolist(), logits.float(), probabilities, strict=True):
        rows.append(
            [
                {
                    "class": c,
                    "name": categories[c] if categories and c < len(categories) else None,
                    "logit": float(row_logits[c]),
                    "probability": float(row_probabilities[c]),
                }
                for c in row_classes
            ]
        )
    return rows


def spatial_maps(tensor, prefix_tokens: int | None = None, *, square: bool = True, width: int | None = None):
    """A batch of layer outputs as ``[N, C, H, W]``.

    A 4-D output is channels-last ([N, H, W, C], as inside Swin) where its
    module's ``width`` (:func:`~hookcli.statistics.units.known_units`) is its
    last axis, or, where the width does not tell, where the inputs are
    ``square`` and its middle two axes are equal and the last differs; else
    channels-first. Tokens ``[N, T, D]`` fold into a square, the model's
    ``prefix_tokens`` (class and register tokens) left out first; when the
    model does not say, a leading class token is dropped when T-1 is square.
    """
    if tensor.dim() == 4:
        said = width_axis(tuple(tensor.shape[1:]), width)
        last = said == -1 if said is not None else square and channels_last_output(tensor.shape)
        return tensor.permute(0, 3, 1, 2) if last else tensor
    if tensor.dim() == 3:
        dim, side, _, layout = map_layout(tensor.shape[1:], prefix_tokens)  # the square pictures draw, too
        if layout != "matrix":
            grid = tensor[:, tensor.shape[1] - side * side :, :]
            return grid.transpose(1, 2).reshape(len(tensor), dim, side, side)
    raise CaptureError(
        f"a layer output of shape {list(tensor.shape)} has no spatial layout for a map",
        hint="pick a convolutional layer ([N, C, H, W]) or a ViT block (square token grid)",
    )


def class_activation_maps(activations, gradients, method: str = "gradcam"):
    """Maps ``[N, H, W]`` (ReLU'd, not normalised) from ``[N, C, H, W]`` activations and their gradients."""
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

    Transformers (whose tokens fold to a square): the last block's first LayerNorm, before the class token has mixed
    every patch away (a block holds two LayerNorms with token outputs). Otherwise the last layer to finish whose
    output is still a spatial map of more than one position, leaving out global pooling heads and modules run more
    than once (a shared ReLU): the last convolutional stage (``layer4``, ``features``, Swin's ``permute`` after its
    final norm, …); for detection and segmentation, within the backbone. ``example`` is a batch of the family's
    natural input (:func:`hookcli.run.batches.natural_input`).
    """
    name, model = loaded.name, loaded.module
    prefix = {"detection": "backbone.body.", "segmentation": "backbone."}.get(loaded.family, "")
    skip = loaded.prefix_tokens or 0
    finished: list[str] = []
    token_norms: list[str] = []

    def note(path, module, inputs, output):
        pooling_head = isinstance(module, torch.nn.AdaptiveAvgPool2d | torch.nn.AdaptiveMaxPool2d)
        if prefix and not path.startswith(prefix) or not isinstance(output, torch.Tensor):
            return
        if output.dim() == 4 and not pooling_head:
            height, width = spatial_maps(output).shape[2:]
            if height * width > 1:
                finished.append(path)
        elif (
            output.dim() == 3
            and isinstance(module, torch.nn.LayerNorm)
            and (is_square(output.shape[1] - skip) or loaded.prefix_tokens is None and is_square(output.shape[1] - 1))
        ):
            token_norms.append(path)
            finished.append(path)

    with contextlib.ExitStack() as stack, preserved_mode(model), torch.inference_mode():
        for path, module in model.named_modules():
            if path:
                stack.enter_context(module.register_forward_hook(functools.partial(note, path)))
        call_model(model, example)
    if not finished:
        raise UsageProblem(
            f"{name} has no layer with a spatial output to take a CAM at", hint="pass --layer (see 'hookcli layers')"
        )
    if token_norms and token_norms[-1] == finished[-1]:
        return _last_block_first_norm(token_norms)
    once = [path for path in finished if finished.count(path) == 1] or finished  # a module run twice has no one map
    return next(path for path in reversed(once) if path not in token_norms)


def _last_block_first_norm(norms: list[str]) -> str:
    """The first of the LayerNorms of the last module holding two or more (a transformer block), else the last."""
    blocks: dict[str, list[str]] = {}
    for path in norms:
        blocks.setdefault(path.rpartition(".")[0], []).append(path)
    held = [members for members in blocks.values() if len(members) >= 2]
    return held[-1][0] if held else norms[-1]


def picked_classes(target: Target, logits):
    """The classes ``[N, K]`` of a batch of ``logits`` that ``target`` takes gradients of."""
    if target.top:
        _check_top(target.top, logits.shape[1])
        return logits.topk(target.top, dim=1).indices
    assert target.class_index is not None, "a target that is not topK names a class"
    if target.class_index >= logits.shape[1]:
        raise UsageProblem(
            f"target class {target.class_index} is out of range: the model has {logits.shape[1]} classes",
            hint=f"use 0 to {logits.shape[1] - 1} or top1",
        )
    return torch.full((len(logits), 1), target.class_index, dtype=torch.long, device=logits.device)


def _check_top(top: int, classes: int) -> None:
    """Refuse a ``topK`` target of more classes than the model's scores have (counted as it runs)."""
    if top > classes:
        raise UsageProblem(f"target 'top{top}' asks for {top} classes of {classes}", hint=f"use top1 to top{classes}")
