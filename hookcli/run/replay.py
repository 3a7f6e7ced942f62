"""Running a traced model again from one of its layers on: what ``ablate`` and ``patch`` share.

A model is traced (:mod:`torch.fx`) with the layers a command changes kept as leaves; an interpreter that keeps
every value runs it once on a batch, and a later run starts from a layer's node with the values before it given
(:class:`Kept`), so the layers before that one do not run again.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torchvision
from torch import nn

__all__ = ["Kept", "repeated", "taken", "traced"]


class Kept(torch.fx.Interpreter):
    """An interpreter that keeps every value it computes (``env``), for a later run to start from."""

    def __init__(self, graph_module: torch.fx.GraphModule) -> None:
        super().__init__(graph_module, garbage_collect_values=False)


def traced(model: nn.Module, keep: set[str]) -> torch.fx.GraphModule | None:
    """A GraphModule of ``model`` with the modules of ``keep`` as leaves (those it calls), or None when it cannot be
    traced."""

    class Tracer(torch.fx.Tracer):
        def is_leaf_module(self, module: nn.Module, qualified_name: str) -> bool:
            return qualified_name in keep or super().is_leaf_module(module, qualified_name)

    try:
        tracer = Tracer(autowrap_modules=(math, torchvision.ops))  # type: ignore[arg-type]
        graph = tracer.trace(model)
        graph_module = torch.fx.GraphModule(tracer.root, graph, type(model).__name__)
    except Exception:  # Python control flow on tensor values, unsupported calls: the model runs whole
        return None
    return graph_module


def repeated(value: Any, count: int, rows: int) -> Any:
    """``value`` copied ``count`` times along its first axis when it holds the batch's rows (a tensor, or a tuple
    or list of them); anything else as it is."""
    if isinstance(value, torch.Tensor):
        return value.repeat(count, *([1] * (value.dim() - 1))) if value.dim() and value.shape[0] == rows else value
    if isinstance(value, tuple | list):
        return type(value)(repeated(item, count, rows) for item in value)
    return value


def taken(value: Any, index: torch.Tensor, rows: int) -> Any:
    """The rows ``index`` of ``value`` when it holds the batch's ``rows`` rows (a tensor, or a tuple or list of
    them); anything else as it is."""
    if isinstance(value, torch.Tensor):
        return value[index.to(value.device)] if value.dim() and value.shape[0] == rows else value
    if isinstance(value, tuple | list):
        return type(value)(taken(item, index, rows) for item in value)
    return value
