"""The forward of ``hookcli ablate``: a batch runs once as the model is, then once for each unit of the ablated layer
with that unit alone ablated, and each unit's effect on the output is measured row by row.

The model is traced (:mod:`torch.fx`) with the ablated layer kept whole, so the layers before it run once per batch:
the part after it runs on the layer's output copied for a chunk of units at a time, each copy with its own unit
ablated, and every value of the part before that it reads copied alike. A model that cannot be traced runs whole for
each chunk, its inputs copied (the same numbers, more time), and says so.

>>> import torch
>>> net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2)).eval()
>>> forward = UnitAblation(net, "1", how="zero", effect_on=".")
>>> with torch.no_grad():
...     rows = forward.effects(torch.ones(5, 3))
>>> sorted(rows), rows[CLASS_DELTA].shape
(['class_delta', 'flips', 'kl', 'logit_change', 'prob_change'], torch.Size([5, 4, 2]))
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from hookcli.errors import CaptureError, UsageProblem, never_runs
from hookcli.families import channels_last_output
from hookcli.run.batches import call_model
from hookcli.run.edits import first_missing, partners
from hookcli.run.replay import CHUNK_BYTES, Kept, ReplayForward, class_scores, repeated, traced
from hookcli.statistics.units import UnitLayout, known_units

__all__ = ["CLASS_DELTA", "ROW_FIELDS", "AblationForward", "UnitAblation", "ablation_forward"]

#: What a row holds for each unit: the change of the predicted class's logit and probability, whether the top
#: class flipped, the KL divergence of the output distribution; and each class's change (``[units, classes]``).
ROW_FIELDS = ("logit_change", "prob_change", "flips", "kl")
CLASS_DELTA = "class_delta"


class UnitAblation:
    """Each unit of layer ``layer`` of ``model`` ablated alone (``how``: ``zero``, ``mean`` with ``mean`` the units'
    means, or ``resample`` with ``seed``), the effect measured on the output of ``effect_on`` (``.``: the model's)."""

    def __init__(
        self,
        model: nn.Module,
        layer: str,
        *,
        how: str,
        effect_on: str,
        units: Sequence[int] | None = None,
        mean: torch.Tensor | None = None,
        seed: int = 0,
        prefix_tokens: int | None = None,
        square: bool = False,
        chunk_bytes: int = CHUNK_BYTES,
    ) -> None:
        self.model, self.layer, self.how, self.effect_on = model, layer, how, effect_on
        self.units, self.mean, self.seed = None if units is None else list(units), mean, seed
        self.prefix_tokens, self.square, self.chunk_bytes = prefix_tokens, square, chunk_bytes
        if effect_on == layer:
            raise UsageProblem(
                f"--effect-on {effect_on} is the ablated layer itself",
                hint="measure a layer after it, or leave --effect-on out for the model's output",
            )
        if effect_on.startswith(layer + "."):
            raise UsageProblem(
                f"--effect-on {effect_on} runs inside {layer}, the ablated layer, before its output is ablated, so "
                "nothing it returns can change",
                hint="measure a layer after the ablated one, or leave --effect-on out for the model's output",
            )
        self._width = known_units(dict(model.named_modules()).get(layer))  # the module's own count, where it says
        self.graph, self.untraced = traced(model, {layer, effect_on} - {"."})
        #: The nodes before the layer's, and those of them the part after it reads (parameters aside).
        self._before: list[Any] = []
        self._read_after: list[Any] = []
        self._placeholders: list[Any] = []
        self._layer_node: Any = None
        self._effect_node: Any = None  # None: the model's output
        if self.graph is not None:
            nodes = list(self.graph.graph.nodes)
            called = {node.target for node in nodes if node.op == "call_module"}
            for path in (layer, effect_on):
                if path != "." and path not in called:
                    raise never_runs("ablate", path)
            for path, measured in ((layer, False), (effect_on, True)):
                calls = sum(node.op == "call_module" and node.target == path for node in nodes)
                if calls > 1:
                    raise _runs_more_than_once(path, calls, measured=measured)
            self._layer_node = self._node(layer)
            self._effect_node = None if effect_on == "." else self._node(effect_on)
            self._placeholders = [node for node in nodes if node.op == "placeholder"]
            at = nodes.index(self._layer_node)
            if self._effect_node is not None and nodes.index(self._effect_node) < at:
                raise _runs_before(effect_on, layer)
            later = set(nodes[at + 1 :])
            self._before = nodes[:at]
            self._read_after = [n for n in self._before if n.op != "get_attr" and any(u in later for u in n.users)]

    def effects(self, batch: Any) -> dict[str, torch.Tensor]:
        """The effect of each unit on each row of ``batch``: :data:`ROW_FIELDS` ``[N, units]`` and
        :data:`CLASS_DELTA` ``[N, units, classes]``."""
        if self.graph is not None:
            env, output = self._first(batch)
            measured = output if self._effect_node is None else env[self._effect_node]
            return self._measured(env[self._layer_node], measured, lambda copies: self._replayed(env, copies))
        kept: dict[str, Any] = {}
        output = self._whole(batch, kept)
        if "layer" not in kept:
            raise never_runs("ablate", self.layer)
        if kept.get("first") == "effect":
            raise _runs_before(self.effect_on, self.layer)
        return self._measured(kept["layer"], output, lambda copies: self._whole(_repeated_input(batch, copies), {},
                                                                              copies))  # fmt: skip

    def _measured(
        self, layer: torch.Tensor, output: Any, run: Callable[[torch.Tensor], Any]
    ) -> dict[str, torch.Tensor]:
        """The effects, from the layer's output, the model's, and ``run(copies)``: the output over the layer's
        output copied and ablated unit by unit."""
        if not isinstance(layer, torch.Tensor) or not layer.is_floating_point() or layer.dim() < 2:
            raise CaptureError(
                f"{self.layer} returns {type(layer).__name__}, not rows of floating-point units",
                hint="ablate a layer whose output is one tensor (hookcli layers lists them)",
            )
        _logits(output, self.effect_on)  # refused here when it is not rows of values
        axis, channels = self._axis(layer)
        units = self._chosen(channels)
        rows = layer.shape[0]
        per_copy = layer.numel() * layer.element_size() * 3  # the layer's copy, and about as much again downstream
        chunk = max(1, min(len(units), self.chunk_bytes // max(per_copy, 1)))
        pieces: dict[str, list[torch.Tensor]] = {}
        for start in range(0, len(units), chunk):
            group = units[start : start + chunk]
            # The first copy is the layer's output as it is: the chunk's own baseline, computed in the same call,
            # so that a unit whose ablation changes nothing measures 0 (to the last bits a row's place in a batch
            # may change).
            copies = self._ablated(layer, axis, group)
            outputs = _logits(run(copies), self.effect_on).reshape(len(group) + 1, rows, -1)
            for name, value in _changes(outputs).items():
                pieces.setdefault(name, []).append(value)
        return {name: torch.cat(values, dim=1) for name, values in pieces.items()}

    def _axis(self, layer: torch.Tensor) -> tuple[int, int]:
        layout = UnitLayout.of(
            tuple(layer.shape[1:]),
            prefix_tokens=self.prefix_tokens,
            channels_last=self.square and channels_last_output(layer.shape),
            key=self.layer,
            width=self._width,
        )
        return (-1 if layout.kind in ("tokens", "channels_last") else 1), layout.channels

    def _chosen(self, channels: int) -> list[int]:
        if self.mean is not None and self.mean.shape[0] != channels:
            raise UsageProblem(
                f"{self.layer} has {channels:,} units, and the means given {self.mean.shape[0]:,}",
                hint="give the statistics file of the same layer of the same model",
            )
        if self.units is None:
            return list(range(channels))
        if max(self.units) >= channels:
            raise UsageProblem(
                f"{self.layer} has {channels:,} units (0 to {channels - 1}), and unit "
                f"{first_missing(self.units, channels)} does not exist",
                hint="count units from 0 (hookcli layers gives each layer's shape)",
            )
        return self.units

    def _ablated(self, layer: torch.Tensor, axis: int, group: list[int]) -> torch.Tensor:
        """``[(1 + len(group)) · N, …]``: the layer's output as it is, then once for each unit of ``group`` with that
        unit ablated."""
        count = len(group)
        copies = layer.unsqueeze(0).expand(count + 1, *layer.shape).clone()  # in the layer's own layout
        moved = copies.movedim(axis if axis < 0 else axis + 1, -1)  # a view: the units last
        copy = torch.arange(1, count + 1, device=layer.device)
        unit = torch.tensor(group, device=layer.device)
        if self.how == "zero":
            moved[copy, ..., unit] = 0
        elif self.how == "mean":
            assert self.mean is not None, "a mean ablation has its means"
            means = self.mean.to(layer.device, layer.dtype)[unit]
            moved[copy, ..., unit] = means.reshape(count, *[1] * (moved.dim() - 2))
        else:
            partner = layer.movedim(axis, -1)[partners(layer.shape[0], self.seed).to(layer.device)]
            moved[copy, ..., unit] = partner[..., unit].movedim(-1, 0)
        return copies.reshape(-1, *layer.shape[1:])

    def _first(self, batch: Any) -> tuple[dict[Any, Any], Any]:
        """What the part after the layer reads of the traced model's values on ``batch`` (the other nodes before the
        layer's hold None, there only so that a replay skips them), and its output."""
        assert self.graph is not None, "the traced path"
        # Each copied as it was computed: an in-place operation later in the forward (a ReLU(inplace=True) after
        # the measured layer, a residual added with add_) changes the values the interpreter holds, not the copies.
        kept = {self._layer_node, *self._read_after, *([self._effect_node] if self._effect_node is not None else [])}
        interpreter = Kept(self.graph, copied=kept)
        output = interpreter.run(batch)
        env = dict.fromkeys(self._before)
        env.update(interpreter.copies)
        return env, output

    def _replayed(self, env: Mapping[Any, Any], copies: torch.Tensor) -> Any:
        """The traced model's output (or ``effect_on``'s) from the ablated copies of the layer's output on."""
        assert self.graph is not None, "the traced path"
        layer_node = self._layer_node
        rows = env[layer_node].shape[0]
        count = copies.shape[0] // rows
        initial: dict[Any, Any] = {node: env[node] for node in self._before}
        for node in self._read_after:  # what the part after the layer reads of the part before, copied as rows are
            initial[node] = repeated(env[node], count, rows)
        initial[layer_node] = copies
        interpreter = Kept(self.graph, copied=[self._effect_node] if self._effect_node is not None else [])
        output = interpreter.run(*(initial[node] for node in self._placeholders), initial_env=initial)
        return output if self._effect_node is None else interpreter.copies[self._effect_node]

    def _node(self, path: str) -> Any:
        assert self.graph is not None, "the traced path"
        return next(node for node in self.graph.graph.nodes if node.op == "call_module" and node.target == path)

    def _whole(self, batch: Any, kept: dict[str, Any], copies: torch.Tensor | None = None) -> Any:
        """The model run whole (untraceable models): ``kept`` gets the layer's output; ``copies`` replace it."""
        modules = dict(self.model.named_modules())

        def at_layer(module: nn.Module, inputs: Any, output: Any) -> Any:
            kept["calls"] = kept.get("calls", 0) + 1
            if kept["calls"] > 1:
                raise _runs_more_than_once(self.layer, None)
            kept["layer"] = output.clone() if isinstance(output, torch.Tensor) else output  # before in-place ops
            kept.setdefault("first", "layer")
            return copies

        def at_effect(module: nn.Module, inputs: Any, output: Any) -> None:
            if "effect" in kept:
                raise _runs_more_than_once(self.effect_on, None, measured=True)
            kept["effect"] = output.clone() if isinstance(output, torch.Tensor) else output  # before in-place ops
            kept.setdefault("first", "effect")

        handles = [modules[self.layer].register_forward_hook(at_layer)]
        if self.effect_on != ".":
            handles.append(modules[self.effect_on].register_forward_hook(at_effect))
        try:
            output = call_model(self.model, batch)
        finally:
            for handle in handles:
                handle.remove()
        return output if self.effect_on == "." else kept["effect"]


def _runs_more_than_once(layer: str, calls: int | None, *, measured: bool = False) -> UsageProblem:
    """The refusal of a layer the forward runs ``calls`` times (None: more than once, the count unknown), to ablate
    or, ``measured``, to measure the effects on (``--effect-on``)."""
    runs = f"the forward runs {layer} {'more than once' if calls is None else f'{calls} times'}, so its output is"
    if measured:
        return UsageProblem(
            f"--effect-on {layer}: {runs} not one value to measure",
            hint="measure a layer the forward runs once (hookcli layers shows how often each runs), or leave "
            "--effect-on out for the model's output",
        )
    return UsageProblem(
        f"ablate: {runs} not one value to ablate",
        hint="ablate a layer the forward runs once (hookcli layers shows how often each runs)",
    )


def _runs_before(effect_on: str, layer: str) -> UsageProblem:
    return UsageProblem(
        f"--effect-on {effect_on} runs before {layer}, the ablated layer, so nothing it returns can change",
        hint="measure a layer after the ablated one, or leave --effect-on out for the model's output",
    )


def _repeated_input(batch: Any, copies: torch.Tensor) -> Any:
    """The batch copied as many times as the layer's copies hold copies of its rows."""
    rows = batch.shape[0] if isinstance(batch, torch.Tensor) else len(batch)
    return repeated(batch, copies.shape[0] // rows, rows)


def _logits(output: Any, effect_on: str) -> torch.Tensor:
    """The output measured, as rows of values ``[N, K]``."""
    scores = class_scores(output)
    if scores is None:
        where = "the model" if effect_on == "." else effect_on
        raise CaptureError(
            f"{where} returns {type(output).__name__}, not rows of class scores to measure an ablation's effect on",
            hint="give --effect-on a layer that returns one tensor a row (an embedding, a head's scores)",
        )
    return scores


def _changes(outputs: torch.Tensor) -> dict[str, torch.Tensor]:
    """Each row's changes for each unit, rows first, from ``outputs`` ``[1 + units, N, K]``: the output as it is,
    then with each unit ablated.

    Written in the changes Δ = z' − z, so that small ones keep their digits: with p = softmax(z),
    KL(p ‖ q) = log(1 + Σ p·expm1(Δ)) − Σ p·Δ and q_c − p_c = p_c (expm1(Δ_c) − Σ p·expm1(Δ)) / (1 + Σ p·expm1(Δ));
    everything after Δ in float64 (the two sums agree to about Δ², which float32 would round away).
    """
    logits, ablated = outputs[0], outputs[1:]
    predicted = logits.argmax(dim=1)
    rows = torch.arange(logits.shape[0], device=logits.device)
    p = logits.double().softmax(dim=1)
    delta = ablated - logits  # exact where the two are close, as a subtraction of floats within a factor of 2 is
    wide = delta.double()
    grown = torch.expm1(wide)
    spread = (grown * p).sum(dim=2)  # Σ p·expm1(Δ)
    moved = (wide * p).sum(dim=2)  # Σ p·Δ
    kl = (torch.log1p(spread) - moved).clamp_min(0)
    chosen = grown[:, rows, predicted]
    prob_change = p[rows, predicted] * (chosen - spread) / (1 + spread)
    return {
        "logit_change": delta[:, rows, predicted].T,
        "prob_change": prob_change.T,
        "flips": (ablated.argmax(dim=2) != predicted).T,
        "kl": kl.T,
        CLASS_DELTA: delta.transpose(0, 1),
    }


class AblationForward(ReplayForward):
    """The forward strategy of ``ablate``: each batch's rows are those of :meth:`UnitAblation.effects`."""

    def __init__(
        self, model: nn.Module, layers: Mapping[str, str], settings: Any, on_note: Any = None, **ablating: Any
    ) -> None:
        (layer,) = layers
        super().__init__(model, settings, [layer])
        self.ablation = UnitAblation(model, layer, **ablating)
        if self.ablation.untraced is not None and on_note is not None:
            on_note(
                f"{type(model).__name__} {self.ablation.untraced}, so the layers before {layer} run again for each "
                "chunk of units (the values are the same)"
            )

    def measure(self, batch: Any) -> dict[str, torch.Tensor]:
        return self.ablation.effects(batch)


def ablation_forward(**ablating: Any) -> Callable[..., AblationForward]:
    """The forward factory of an ablation run: :class:`AblationForward` with ``ablating``'s settings."""
    return functools.partial(AblationForward, **ablating)
