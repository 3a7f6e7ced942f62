"""The forward of ``hookcli patch``: activation patching over pairs of inputs.

A batch holds pairs, each a source row then its target row. The model runs once on the whole batch; then, for each
layer named, the part after that layer runs on the targets with the layer's output (or, with ``positions``, one
position of it at a time) taken from their sources, in chunks of copies. Each run is measured by the logit
difference m = z[y_s] − z[y_t], y_s and y_t the classes the model predicts for the source and for the target: a
patch's change is m(patched) − m(target), the target's measured in the same call (so that a patch that changes
nothing changes m by exactly 0), and the file's effect divides it by m(source) − m(target): 0 where the patch does
nothing, 1 where it moves the target's output as far as the source's.

The model is traced (:mod:`torch.fx`) with the named layers kept whole, so the layers before a layer do not run
again; a model that cannot be traced runs whole on the copied targets, its layer's output replaced by a hook.

>>> import torch
>>> net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2)).eval()
>>> patching = Patching(net, ["0", "2"], positions=False)
>>> with torch.no_grad():
...     rows = patching.measured(torch.tensor([[1.0, 0, 0], [0, 1.0, 0]]))
>>> sorted(rows), rows["2"].shape, torch.allclose(rows["2"], rows["source_metric"] - rows["target_metric"])
(['0', '2', 'source_class', 'source_metric', 'target_class', 'target_metric'], torch.Size([1]), True)
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from hookcli.errors import CaptureError, HookcliError, UsageProblem, never_runs
from hookcli.families import channels_last_output
from hookcli.run.batches import call_model
from hookcli.run.replay import CHUNK_BYTES, Kept, ReplayForward, class_scores, repeated, taken, traced
from hookcli.statistics.units import UnitLayout, layer_widths

__all__ = ["PatchForward", "Patching", "patch_forward", "position_axes"]


def position_axes(row_shape: Sequence[int], layout: UnitLayout) -> tuple[int, ...]:
    """The axes of a row (counted from 0, after the batch's) that hold its positions: a map's height and width, a
    channels-last map's, a clip's time, height and width, every token of a sequence; none for a vector."""
    if layout.kind == "maps":
        return tuple(range(1, len(row_shape)))
    if layout.kind == "channels_last":
        return (0, 1)
    if layout.kind == "tokens":
        return (0,)
    return ()


class Patching:
    """Activation patching of ``layers`` of ``model``: each layer's output (or each position of it, ``positions``)
    taken from the source of each pair of a batch into its target."""

    def __init__(
        self,
        model: nn.Module,
        layers: Sequence[str],
        *,
        positions: bool,
        prefix_tokens: int | None = None,
        square: bool = False,
        chunk_bytes: int = CHUNK_BYTES,
    ) -> None:
        self.model, self.layers, self.positions = model, list(layers), positions
        self.prefix_tokens, self.square, self.chunk_bytes = prefix_tokens, square, chunk_bytes
        self._widths = layer_widths(model, {layer: layer for layer in self.layers})  # where the modules say them
        self.graph, self.untraced = traced(model, set(self.layers))
        self._nodes: dict[str, Any] = {}
        self._read_after: dict[str, list[Any]] = {}
        self._before: dict[str, list[Any]] = {}
        self._placeholders: list[Any] = []
        if self.graph is None:
            return
        nodes = list(self.graph.graph.nodes)
        self._placeholders = [node for node in nodes if node.op == "placeholder"]
        for layer in self.layers:
            calls = [node for node in nodes if node.op == "call_module" and node.target == layer]
            if len(calls) != 1:
                raise _not_once(layer, len(calls))
            at = nodes.index(calls[0])
            later = set(nodes[at + 1 :])
            self._nodes[layer] = calls[0]
            self._before[layer] = nodes[:at]
            self._read_after[layer] = [
                node for node in nodes[:at] if node.op != "get_attr" and any(user in later for user in node.users)
            ]

    def measured(self, batch: Any) -> dict[str, torch.Tensor]:
        """For the ``P`` pairs of ``batch`` (source, target, source, target…): the
        :data:`~hookcli.storage.patch_format.PAIR_FIELDS` ``[P]``, and for
        each layer the change of m its patch makes, ``[P]`` or ``[P, *positions]``."""
        rows = batch.shape[0] if isinstance(batch, torch.Tensor) else len(batch)
        if rows % 2:
            raise CaptureError(
                f"patch: a batch of {rows} inputs does not hold whole pairs",
                hint="give an even --batch-size and --shard-size, and every pair's two inputs",
            )
        if self.graph is not None:
            # Each value copied as it was computed: an in-place operation later in the forward (a residual added
            # with add_) changes the values the interpreter holds, not the copies.
            needed = {node for layer in self.layers for node in self._read_after.get(layer, ())}
            interpreter = Kept(self.graph, copied=needed | {self._nodes[layer] for layer in self.layers})
            output = interpreter.run(batch)
            outputs = {layer: interpreter.copies[self._nodes[layer]] for layer in self.layers}
            env = interpreter.copies
        else:
            outputs = {}
            output = self._whole(batch, outputs)
            env = {}
        scores = _scores(output)
        sources, targets = torch.arange(0, rows, 2), torch.arange(1, rows, 2)
        source_class = scores[sources.to(scores.device)].argmax(dim=1)
        target_class = scores[targets.to(scores.device)].argmax(dim=1)
        found = {
            "source_class": source_class,
            "target_class": target_class,
            "source_metric": _metric(scores[sources.to(scores.device)], source_class, target_class),
            "target_metric": _metric(scores[targets.to(scores.device)], source_class, target_class),
        }
        for layer in self.layers:
            value = outputs.get(layer)
            if value is None:
                raise never_runs("patch", layer)
            if not isinstance(value, torch.Tensor) or not value.is_floating_point() or value.dim() < 2:
                raise CaptureError(
                    f"patch: {layer} returns {type(value).__name__}, not rows of floating-point values",
                    hint="patch layers whose output is one tensor (hookcli layers lists them)",
                )
            source, target = value[sources.to(value.device)], value[targets.to(value.device)]
            # What the part after the layer reads, of the targets alone: taken once a batch, copied for each chunk.
            read = {node: taken(env[node], targets, rows) for node in self._read_after.get(layer, ())}
            alone = taken(batch, targets, rows) if self.graph is None else None

            def run(copies: torch.Tensor, layer: str = layer, read: dict = read, alone: Any = alone) -> torch.Tensor:
                return _scores(self._replayed(layer, read, alone, copies, rows // 2))

            found[layer] = self._changes(layer, source, target, run, source_class, target_class)
        return found

    def _changes(
        self,
        layer: str,
        source: torch.Tensor,
        target: torch.Tensor,
        run: Callable[[torch.Tensor], torch.Tensor],
        source_class: torch.Tensor,
        target_class: torch.Tensor,
    ) -> torch.Tensor:
        """The change of m for each pair and patch of ``layer`` (the whole output, or each position)."""
        pairs, row_shape = target.shape[0], tuple(target.shape[1:])
        axes = self._axes(layer, row_shape) if self.positions else ()
        sizes = tuple(row_shape[axis] for axis in axes)
        patches = math.prod(sizes)
        mask_shape = [1] * len(row_shape)
        for axis in axes:
            mask_shape[axis] = row_shape[axis]
        per_copy = target.numel() * target.element_size() * 3
        chunk = max(1, min(patches, self.chunk_bytes // max(per_copy, 1)))
        pieces = []
        for start in range(0, patches, chunk):
            count = min(chunk, patches - start)
            if axes:
                mask = torch.zeros(count, patches, dtype=torch.bool, device=target.device)
                mask[
                    torch.arange(count, device=target.device), torch.arange(start, start + count, device=target.device)
                ] = True
                mask = mask.reshape(count, 1, *mask_shape)
            else:
                mask = torch.ones(count, 1, *mask_shape, dtype=torch.bool, device=target.device)
            copies = torch.cat([target.unsqueeze(0), torch.where(mask, source.unsqueeze(0), target.unsqueeze(0))])
            scores = run(copies.reshape(-1, *row_shape)).reshape(count + 1, pairs, -1)
            measured = torch.stack([_metric(copy, source_class, target_class) for copy in scores])
            pieces.append((measured[1:] - measured[0]).T)  # [P, count]: against the target in the same call
        changes = torch.cat(pieces, dim=1)
        return changes.reshape(pairs, *sizes) if axes else changes.reshape(pairs)

    def _axes(self, layer: str, row_shape: tuple[int, ...]) -> tuple[int, ...]:
        layout = UnitLayout.of(
            row_shape,
            prefix_tokens=self.prefix_tokens,
            channels_last=self.square and channels_last_output((1, *row_shape)),
            key=layer,
            width=self._widths.get(layer),
        )
        return position_axes(row_shape, layout)

    def _replayed(self, layer: str, read: Mapping[Any, Any], targets: Any, copies: torch.Tensor, pairs: int) -> Any:
        """The model's output on the targets, copied as many times as ``copies`` holds copies of their rows, with
        ``layer``'s output replaced by ``copies``: from what the part after the layer ``read`` s of the targets'
        values, or (untraced) from the ``targets``' inputs run whole."""
        count = copies.shape[0] // pairs
        if self.graph is None:
            return self._whole(repeated(targets, count, pairs), {}, (layer, copies))
        initial: dict[Any, Any] = dict.fromkeys(self._before[layer])
        for node, value in read.items():
            initial[node] = repeated(value, count, pairs)
        initial[self._nodes[layer]] = copies
        interpreter = Kept(self.graph)
        return interpreter.run(*(initial[node] for node in self._placeholders), initial_env=initial)

    def _whole(self, batch: Any, kept: dict[str, Any], replacing: tuple[str, torch.Tensor] | None = None) -> Any:
        """The model run whole (untraceable models): ``kept`` gets a copy of each layer's output; ``replacing``
        (a layer and its copies) replaces one."""
        modules = dict(self.model.named_modules())
        handles = []
        for layer in self.layers:

            def hook(module: nn.Module, inputs: Any, output: Any, layer: str = layer) -> Any:
                kept.setdefault(layer, output.clone() if isinstance(output, torch.Tensor) else output)
                if replacing is not None and replacing[0] == layer:
                    return replacing[1]
                return None

            handles.append(modules[layer].register_forward_hook(hook))
        try:
            return call_model(self.model, batch)
        finally:
            for handle in handles:
                handle.remove()


def _metric(scores: torch.Tensor, source_class: torch.Tensor, target_class: torch.Tensor) -> torch.Tensor:
    """m = z[y_s] − z[y_t] of each row of ``scores`` ``[P, K]``, in float64."""
    rows = torch.arange(scores.shape[0], device=scores.device)
    return scores[rows, source_class].double() - scores[rows, target_class].double()


def _scores(output: Any) -> torch.Tensor:
    """The model's output as rows of class scores ``[N, K]``."""
    scores = class_scores(output)
    if scores is None:
        raise CaptureError(
            f"patch: the model returns {type(output).__name__}, not rows of class scores to measure a patch by",
            hint="patch a classifier: m is the logit of the source's class less the target's",
        )
    return scores


def _not_once(layer: str, calls: int) -> HookcliError:
    if calls == 0:
        return never_runs("patch", layer)
    return UsageProblem(
        f"patch: the forward runs {layer} {calls} times, so its output is not one value to patch",
        hint="patch a layer the forward runs once (hookcli layers shows how often each runs)",
    )


class PatchForward(ReplayForward):
    """The forward strategy of ``patch``: each batch's rows are those of :meth:`Patching.measured`, by key."""

    def __init__(
        self, model: nn.Module, layers: Mapping[str, str], settings: Any, on_note: Any = None, **patching: Any
    ) -> None:
        super().__init__(model, settings, list(layers))
        self.keys = dict(layers)
        self.patching = Patching(model, list(self.keys), **patching)
        if self.patching.untraced is not None and on_note is not None:
            on_note(
                f"{type(model).__name__} {self.patching.untraced}, so it runs whole for each patch (the values are "
                "the same)"
            )

    def measure(self, batch: Any) -> dict[str, torch.Tensor]:
        return {self.keys.get(name, name): value for name, value in self.patching.measured(batch).items()}


def patch_forward(**patching: Any) -> Callable[..., PatchForward]:
    """The forward factory of a patching run: :class:`PatchForward` with ``patching``'s settings."""
    return functools.partial(PatchForward, **patching)
