"""Running a traced model again from one of its layers on: what ``ablate`` and ``patch`` share.

A model is traced (:mod:`torch.fx`) with the layers a command changes kept as leaves; an interpreter that keeps
the values a later run reads runs it once on a batch, and a later run starts from a layer's node with the values
before it given (:class:`Kept`), so the layers before that one do not run again. Every other value goes once its
last user has run, so that a run holds what a forward holds.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import torch
import torchvision
from torch import nn
from torch.nn.modules import module as torch_module

from hookcli.run import speed
from hookcli.run.batches import batch_device
from hookcli.run.capture import preserved_mode
from hookcli.storage.fileformat import RunFacts

__all__ = [
    "CHUNK_BYTES",
    "Kept",
    "ReplayForward",
    "class_scores",
    "hooked",
    "hooked_names",
    "repeated",
    "taken",
    "traced",
    "untraced",
]

#: About how many bytes the copies of one chunk may take: the changed layer's output and what the part after it
#: reads, for every copy.
CHUNK_BYTES = 256 * 1024 * 1024


class Kept(torch.fx.Interpreter):
    """An interpreter that keeps the values of the nodes ``keep`` (``env``), for a later run to start from or to be
    read once it ends, and lets every other value go once its last user has run; and a copy of the values of the
    nodes ``copied`` as they were computed (``copies``): an in-place operation after a layer (a
    ``ReLU(inplace=True)``, a residual ``+=``) changes the value ``env`` holds, not its copy."""

    def __init__(
        self, graph_module: torch.fx.GraphModule, copied: Collection[Any] = (), keep: Collection[Any] = ()
    ) -> None:
        super().__init__(graph_module, garbage_collect_values=True)
        kept = set(keep)
        for user, last in self.user_to_last_uses.items():  # what goes once ``user`` has run: none of ``keep``
            self.user_to_last_uses[user] = [node for node in last if node not in kept]
        self.copied = set(copied)
        self.copies: dict[Any, Any] = {}

    def run_node(self, node: Any) -> Any:
        value = super().run_node(node)
        if node in self.copied:
            self.copies[node] = value.clone() if isinstance(value, torch.Tensor) else value
        return value


def untraced(model: nn.Module, keep: Collection[str] = ()) -> str | None:
    """Why a torch.fx trace of ``model`` would not run what calling it runs (a trace follows ``forward`` and inlines
    the modules it calls), or None: a ``__call__`` of its class, its own forward hooks, hooks on every module,
    hooks on a module that holds one of the layers ``keep`` (kept whole so that its hooks run, it would hide them),
    or one of those layers inside another (kept whole, it would hide the one inside)."""
    if type(model).__call__ is not nn.Module.__call__:
        return "has a __call__ of its own, which a torch.fx trace would skip"
    if model._forward_hooks or model._forward_pre_hooks:
        return "has hooks of its own, which a torch.fx trace would skip"
    if torch_module._global_forward_hooks or torch_module._global_forward_pre_hooks:
        return "runs under hooks set on every module, which a torch.fx trace would skip"
    for name in hooked_names(model):
        inside = next((layer for layer in sorted(keep) if layer.startswith(name + ".")), None)
        if inside is not None:
            return f"has hooks on {name}, which holds {inside}, and a torch.fx trace would skip them"
    for outer in sorted(keep):
        inside = next((layer for layer in sorted(keep) if layer.startswith(outer + ".")), None)
        if inside is not None:
            return f"holds {inside} inside {outer}, which a torch.fx trace would keep whole"
    return None


def hooked(module: nn.Module) -> bool:
    """Whether ``module`` has hooks of its own: a trace keeps it whole (a leaf), so that they run."""
    return bool(
        module._forward_hooks or module._forward_pre_hooks or module._backward_hooks or module._backward_pre_hooks
    )


def hooked_names(model: nn.Module) -> list[str]:
    """The paths of ``model``'s submodules with hooks of their own (:func:`hooked`)."""
    return [name for name, module in model.named_modules() if name and hooked(module)]


def traced(model: nn.Module, keep: set[str]) -> tuple[torch.fx.GraphModule | None, str | None]:
    """A GraphModule of ``model`` with the modules of ``keep``, and those with hooks, as leaves (those it calls), and
    None; or None and why the model runs whole: it cannot be traced, or a trace would not run what calling it runs
    (:func:`untraced`)."""
    why = untraced(model, keep)
    if why is not None:
        return None, why
    keep = keep | set(hooked_names(model))

    class Tracer(torch.fx.Tracer):
        def is_leaf_module(self, module: nn.Module, qualified_name: str) -> bool:
            return qualified_name in keep or super().is_leaf_module(module, qualified_name)

    try:
        tracer = Tracer(autowrap_modules=(math, torchvision.ops))  # type: ignore[arg-type]
        graph = tracer.trace(model)
        return torch.fx.GraphModule(tracer.root, graph, type(model).__name__), None
    except Exception:  # Python control flow on tensor values, unsupported calls: the model runs whole
        return None, "cannot be traced by torch.fx"


def repeated(value: Any, count: int, rows: int) -> Any:
    """``value`` copied ``count`` times along its first axis when it holds the batch's rows (a tensor, or a tuple
    or list of them), another tensor copied once (so that an in-place operation of one replay does not reach the
    next); anything else as it is."""
    if isinstance(value, torch.Tensor):
        return (
            value.repeat(count, *([1] * (value.dim() - 1))) if value.dim() and value.shape[0] == rows else value.clone()
        )
    if isinstance(value, tuple | list):
        return type(value)(repeated(item, count, rows) for item in value)
    return value


def class_scores(output: Any) -> torch.Tensor | None:
    """A model's output as rows of float32 values ``[N, K]`` (a transformers output's ``logits``), or None when it is
    not rows of floating-point values."""
    if isinstance(output, Mapping) and "logits" in output:
        output = output["logits"]
    if not isinstance(output, torch.Tensor) or not output.is_floating_point() or output.dim() < 2:
        return None
    return output.flatten(1).float()


def taken(value: Any, index: torch.Tensor, rows: int) -> Any:
    """The rows ``index`` of ``value`` when it holds the batch's ``rows`` rows (a tensor, or a tuple or list of
    them); anything else as it is."""
    if isinstance(value, torch.Tensor):
        return value[index.to(value.device)] if value.dim() and value.shape[0] == rows else value
    if isinstance(value, tuple | list):
        return type(value)(taken(item, index, rows) for item in value)
    return value


class ReplayForward:
    """A forward strategy (a :data:`~hookcli.run.forwards.ForwardFactory`'s) that measures each batch itself
    (:meth:`measure`): the model stays in eval mode for the run, each batch runs under inference mode in the run's
    precision, and it returns the measures' rows and no targets."""

    def __init__(self, model: nn.Module, settings: Any, layers: Sequence[str]) -> None:
        self.settings, self.layers = settings, list(layers)
        self._stack = contextlib.ExitStack()
        self._stack.enter_context(preserved_mode(model))

    def __enter__(self) -> ReplayForward:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self._stack.close()

    def __call__(self, batch: Any) -> tuple[dict[str, torch.Tensor], None]:
        with torch.inference_mode(), speed.compute_precision(self.settings.precision, batch_device(batch)):
            return self.measure(batch), None

    def measure(self, batch: Any) -> dict[str, torch.Tensor]:
        """The rows the command gathers, of ``batch`` on the device."""
        raise NotImplementedError

    def facts(self) -> RunFacts:
        return RunFacts(calls=dict.fromkeys(self.layers, 1))
