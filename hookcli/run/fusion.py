"""Fused inference on the CPU: a convolution, its BatchNorm, its activation and a residual add as one kernel.

In eager PyTorch a ResNet block runs convolution, BatchNorm, ReLU and the
residual ``+=`` as separate passes over memory; on the CPU the passes after
the convolution cost about as much as the convolution itself. For inference,
:func:`fused_for_inference` traces the model (torch.fx) and rewrites, where
nothing hooked sits in between:

- ``Conv2d -> BatchNorm2d``: the BatchNorm's running statistics are folded
  into the convolution's weight and bias (computed in float64); timm's
  ``BatchNormAct2d`` (a BatchNorm with its activation inside) too, its
  activation becoming the kernel's;
- ``conv -> activation``: ReLU, ReLU6/Hardtanh, SiLU, Hardswish, Hardsigmoid,
  Sigmoid, Tanh, GELU, LeakyReLU run inside the convolution (oneDNN post-op);
- ``conv + other [-> ReLU]``: the residual add (and the ReLU after it) too.

A convolution is fused only when its output has no other user, so nothing
else could see the value that is no longer computed. Hooked modules stay
whole: they are leaves of the trace, called as modules, so their hooks fire
with what they really return, and fusion never reaches into them. The model
given is not changed: fused convolutions are new modules holding their own
weights (in the compute dtype: bf16 weights are cast once, not per batch).

Results equal the unfused model to fp32 rounding (BatchNorm folding
reassociates; relative error about 1e-7 on ResNet-50). Models that cannot be
traced, or with nothing to fuse, are returned as they are.

>>> import torch, torch.nn as nn
>>> model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU()).eval()
>>> fused, count = fused_for_inference(model, keep=[], dtype=torch.float32)
>>> count
1
"""

from __future__ import annotations

import math
import operator
from collections.abc import Iterable
from typing import NamedTuple

import torch
import torch.fx
import torch.nn as nn
import torch.nn.functional as F
import torchvision.ops

from hookcli.run.capture import preserved_mode
from hookcli.run.replay import hooked_names, untraced

__all__ = ["FusedConvolution", "FusionAttempt", "fused_convolutions", "fused_for_inference", "fusion_attempt"]


def fused_for_inference(model, keep: Iterable[str], *, dtype, channels_last: bool = False, whole_run: bool = False):
    """``(module, number of fused convolutions)``: a traced, fused copy of ``model``, or ``(model, 0)``.

    Only for CPU inference: the fused kernels have no backward. Nothing is fused in the modules ``keep`` names (the
    hooked ones), in modules with hooks of their own, or after the last of ``keep``, where extraction stops (unless
    ``whole_run``: ``model`` is part of a larger one that goes on after it); with global module hooks registered,
    nothing at all. ``dtype`` is the fused convolutions' compute dtype (``torch.float32`` or ``torch.bfloat16``);
    ``channels_last`` stores their weights that way. :func:`fusion_attempt` also says why nothing was fused.
    """
    attempt = fusion_attempt(model, keep, dtype=dtype, channels_last=channels_last, whole_run=whole_run)
    return attempt.module, attempt.count


class FusionAttempt(NamedTuple):
    """What :func:`fusion_attempt` made: the module to run, its fused convolutions, and whether torch.fx could trace
    the model (False only when a trace was tried and failed)."""

    module: object
    count: int  # type: ignore[assignment]  # the field hides tuple.count, which nothing here calls
    traced: bool = True
    why: str = "cannot be traced by torch.fx"  # where not traced


def fusion_attempt(
    model, keep: Iterable[str], *, dtype, channels_last: bool = False, whole_run: bool = False
) -> FusionAttempt:
    """:func:`fused_for_inference`, saying whether the model could be traced (one trace, whatever the outcome)."""
    if not _available(dtype) or any(p.device.type != "cpu" for p in model.parameters()):
        return FusionAttempt(model, 0)
    if not _worth_fusing(model):
        return FusionAttempt(model, 0)
    why = untraced(model)
    if why is not None:
        return FusionAttempt(model, 0, traced=False, why=why)
    keep = set(keep)
    whole = keep | set(hooked_names(model))
    graph_module = _traced(model, whole)
    if graph_module is None:
        return FusionAttempt(model, 0, traced=False)
    memory_format = torch.channels_last if channels_last else torch.contiguous_format
    rewriter = _Rewriter(graph_module, whole, set() if whole_run else keep, dtype, memory_format)
    count = rewriter.run()
    return FusionAttempt(graph_module, count) if count else FusionAttempt(model, 0)


def _worth_fusing(model) -> bool:
    """Whether ``model`` has convolutions to fuse: a transformer's lone patch embedding is not worth a trace (tracing
    a large model costs a good part of a second)."""
    convolutions = sum(type(m) is nn.Conv2d for m in model.modules())
    return convolutions > 1 or convolutions == 1 and any(type(m) is nn.BatchNorm2d for m in model.modules())


def fused_convolutions(module) -> int:
    """How many fused convolutions ``module`` runs (0 for a model as written)."""
    return sum(isinstance(m, FusedConvolution) for m in module.modules())


def _available(dtype) -> bool:
    if not torch.backends.mkldnn.is_available() or not hasattr(torch.ops.mkldnn, "_convolution_pointwise"):
        return False
    if dtype == torch.bfloat16:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    return dtype == torch.float32


def _traced(model, keep: set[str]):
    """A GraphModule of ``model`` with the kept modules as leaves, or None when tracing fails."""

    class Tracer(torch.fx.Tracer):
        def is_leaf_module(self, module, qualified_name: str) -> bool:
            return (
                qualified_name in keep
                or _norm_with_activation(module) is not None
                or super().is_leaf_module(module, qualified_name)
            )

    try:
        with preserved_mode(model):  # trace what eval mode runs (dropout, auxiliary heads)
            # torch annotates autowrap_modules as a tuple of one module; it takes any number.
            tracer = Tracer(autowrap_modules=(math, torchvision.ops))  # type: ignore[arg-type]
            graph = tracer.trace(model)
            graph_module = torch.fx.GraphModule(tracer.root, graph, type(model).__name__)
    except Exception:  # Python control flow on tensor values, unsupported calls: run the model as it is
        return None
    present = {name for name, _ in graph_module.named_modules()}
    return graph_module if keep <= present else None


def _norm_with_activation(module):
    """For timm's ``BatchNormAct2d`` (a BatchNorm2d subclass that applies ``act`` after normalising, and ``drop``,
    a no-op in eval mode): the activation's post-op, ``("none", [], "")`` for none; None for other modules and
    for activations the kernel cannot run."""
    if not isinstance(module, nn.BatchNorm2d) or type(module).__name__ != "BatchNormAct2d":
        return None
    if type(getattr(module, "drop", None)) not in (nn.Identity, nn.Dropout):
        return None
    act = getattr(module, "act", None)
    return ("none", [], "") if type(act) is nn.Identity else _module_activation(act)


def _module_activation(module):
    """``(post-op name, scalars, algorithm)`` for an activation module the kernel runs; None for others."""
    kind = type(module)
    if kind is nn.ReLU:
        return "relu", [], ""
    if kind is nn.ReLU6:
        return "hardtanh", [0.0, 6.0], ""
    if kind is nn.Hardtanh:
        return "hardtanh", [float(module.min_val), float(module.max_val)], ""
    if kind is nn.LeakyReLU:
        return "leaky_relu", [float(module.negative_slope)], ""
    if kind is nn.GELU:
        return "gelu", [], module.approximate
    simple = {
        nn.SiLU: "swish",
        nn.Hardswish: "hardswish",
        nn.Hardsigmoid: "hardsigmoid",
        nn.Sigmoid: "sigmoid",
        nn.Tanh: "tanh",
    }
    return (simple[kind], [], "") if kind in simple else None


def _activation(node, modules: dict):
    """``(post-op name, scalars, algorithm)`` for a node that applies a supported activation to its one input."""
    if node.op == "call_module":
        return _module_activation(modules.get(node.target))
    if len(node.args) != 1:
        return None
    if node.op == "call_method" and not node.kwargs:
        names = {"relu": "relu", "relu_": "relu", "sigmoid": "sigmoid", "tanh": "tanh"}
        return (names[node.target], [], "") if node.target in names else None
    if node.op == "call_function" and set(node.kwargs) <= {"inplace"}:
        functions = {
            F.relu: "relu",
            torch.relu: "relu",
            torch.relu_: "relu",
            F.silu: "swish",
            F.hardswish: "hardswish",
            F.hardsigmoid: "hardsigmoid",
            torch.sigmoid: "sigmoid",
            torch.tanh: "tanh",
        }
        if node.target is F.relu6:
            return "hardtanh", [0.0, 6.0], ""
        return (functions[node.target], [], "") if node.target in functions else None
    return None


class _Rewriter:
    """Finds conv [-> BatchNorm] [-> activation | + other [-> ReLU]] chains in a graph and fuses each."""

    def __init__(self, graph_module, whole: set[str], last: set[str], dtype, memory_format) -> None:
        self.graph_module = graph_module
        self.graph = graph_module.graph
        self.modules = dict(graph_module.named_modules())
        self.whole = whole  # modules that run as they are
        self.last = last  # modules after whose last call nothing runs
        self.dtype = dtype
        self.memory_format = memory_format

    def run(self) -> int:
        nodes = list(self.graph.nodes)
        # Extraction stops once the last kept module has run: what comes after it is not worth fusing.
        kept = [index for index, node in enumerate(nodes) if node.op == "call_module" and node.target in self.last]
        count = 0
        for node in nodes[: kept[-1] if kept else len(nodes)]:
            if self._is_free(node) and self._convolution(node) is not None and self._fuse_from(node, count):
                count += 1
        if count:
            self.graph.lint()
            self.graph_module.recompile()
        return count

    def _is_free(self, node) -> bool:
        """A node that calls no module kept whole (hooks must see its real input and output)."""
        return not (node.op == "call_module" and node.target in self.whole)

    def _sole_user(self, node):
        return next(iter(node.users)) if len(node.users) == 1 else None

    def _convolution(self, node):
        if node.op != "call_module" or len(node.args) != 1 or node.kwargs:
            return None
        conv = self.modules.get(node.target)
        if type(conv) is not nn.Conv2d or conv.padding_mode != "zeros" or isinstance(conv.padding, str):
            return None
        return conv

    def _batch_norm(self, node, source):
        if node is None or not self._is_free(node) or node.op != "call_module" or node.args != (source,):
            return None
        norm = self.modules.get(node.target)
        if any(path.startswith(f"{node.target}.") for path in self.whole):  # a hook inside it (its act) must fire
            return None
        plain = type(norm) is nn.BatchNorm2d
        if (
            norm is None
            or not plain
            and _norm_with_activation(norm) is None
            or norm.running_mean is None
            or node.kwargs
        ):
            return None
        return norm

    def _fuse_from(self, node, index: int) -> bool:
        """Fuse the chain that starts at the convolution ``node``; False when nothing follows it that could be."""
        conv = self._convolution(node)
        chain = [node]
        norm = self._batch_norm(self._sole_user(node), node)
        if norm is not None:
            chain.append(self._sole_user(node))
        unary: tuple[str, list, str] = ("none", [], "")
        add_to = None
        inside = _norm_with_activation(norm) if norm is not None else None
        if inside is not None and inside[0] != "none":
            unary = inside  # the norm applies it: the chain ends there
        after = self._sole_user(chain[-1])
        if after is not None and self._is_free(after) and unary[0] == "none":
            activation = _activation(after, self.modules)
            other = self._added(after, chain[-1])
            if activation is not None and after.args[0] is chain[-1]:
                unary = activation
                chain.append(after)
            elif other is not None and not self._changed_between(node.args[0], node, after):
                add_to = other
                chain.append(after)
                relu = self._sole_user(after)
                if relu is not None and self._is_free(relu) and relu.args and relu.args[0] is after:
                    if (_activation(relu, self.modules) or ("",))[0] == "relu":
                        unary = ("relu", [], "")
                        chain.append(relu)
        if len(chain) == 1:
            return False
        weight, bias = _folded(conv, norm)
        fused = FusedConvolution(
            conv, weight, bias, unary, add=add_to is not None, dtype=self.dtype, memory_format=self.memory_format
        )
        name = f"hookcli_fused_{index}"
        self.graph_module.add_submodule(name, fused)
        last = chain[-1]
        # Without an add the kernel runs where the convolution did; with one, where the add did, once both
        # operands exist (_changed_between made sure the convolution's input is still what it was there).
        with self.graph.inserting_before(node if add_to is None else last):
            args = (node.args[0],) if add_to is None else (node.args[0], add_to)
            replacement = self.graph.call_module(name, args)
        last.replace_all_uses_with(replacement)
        for old in reversed(chain):
            self.graph.erase_node(old)
        return True

    def _changed_between(self, value, first, last) -> bool:
        """Whether a node after ``first`` and before ``last`` may change ``value`` in place."""
        node = first.next
        while node is not last:
            if value in node.args and self._may_write_to_arguments(node):
                return True
            node = node.next
        return False

    def _may_write_to_arguments(self, node) -> bool:
        if node.op == "call_method":
            return node.target.endswith("_")
        if node.op == "call_function":
            return bool(node.kwargs.get("inplace")) or getattr(node.target, "__name__", "").endswith("_")
        if node.op == "call_module":
            module = self.modules[node.target]
            return bool(getattr(module, "inplace", False)) or any(True for _ in module.children())
        return False

    def _added(self, node, source):
        """The other operand when ``node`` is ``source + other`` or ``other + source``.

        Tracing records ``a += b`` as ``a + b``. In-place calls (``a.add_(b)``)
        are left alone: ``a`` itself must change.
        """
        if node.op != "call_function" or node.kwargs or len(node.args) != 2:
            return None
        if node.target not in (operator.add, torch.add):
            return None
        first, second = node.args
        other = second if first is source else first
        return other if other is not source and isinstance(other, torch.fx.Node) else None


def _folded(conv, norm):
    """The convolution's weight and bias with ``norm`` (eval-mode BatchNorm, or None) folded in."""
    with torch.no_grad():
        if norm is None:
            return conv.weight.detach(), None if conv.bias is None else conv.bias.detach()
        weight = conv.weight.detach().double()
        bias = conv.bias.detach().double() if conv.bias is not None else None
        scale = torch.rsqrt(norm.running_var.double() + norm.eps)
        if norm.weight is not None:
            scale = scale * norm.weight.detach().double()
        shift = -norm.running_mean.double() * scale
        if bias is not None:
            shift = shift + bias * scale
        if norm.bias is not None:
            shift = shift + norm.bias.detach().double()
        return weight * scale.reshape(-1, 1, 1, 1), shift


class FusedConvolution(nn.Module):
    """A 2-d convolution with folded BatchNorm, an optional residual add and activation, as one oneDNN call."""

    weight: torch.Tensor  # buffers, registered in __init__
    bias: torch.Tensor | None

    def __init__(self, conv, weight, bias, unary, *, add: bool, dtype, memory_format) -> None:
        super().__init__()
        self.register_buffer("weight", weight.to(dtype).contiguous(memory_format=memory_format), persistent=False)
        self.register_buffer("bias", None if bias is None else bias.to(dtype), persistent=False)
        self.padding, self.stride = list(conv.padding), list(conv.stride)
        self.dilation, self.groups = list(conv.dilation), conv.groups
        self.unary, self.scalars, self.algorithm = unary
        self.add = add
        self.dtype = dtype

    def forward(self, x, other=None):
        x = x.to(self.dtype)
        if not self.add:
            return torch.ops.mkldnn._convolution_pointwise(
                x,
                self.weight,
                self.bias,
                self.padding,
                self.stride,
                self.dilation,
                self.groups,
                self.unary,
                self.scalars,
                self.algorithm,
            )
        other = other.to(self.dtype)
        if other.shape != self._output_shape(x):  # a broadcasting add: the kernel needs equal shapes
            out = torch.ops.mkldnn._convolution_pointwise(
                x, self.weight, self.bias, self.padding, self.stride, self.dilation, self.groups, "none", [], ""
            )
            out = out + other
            return torch.relu(out) if self.unary == "relu" else out
        return torch.ops.mkldnn._convolution_pointwise.binary(
            x,
            other,
            self.weight,
            self.bias,
            self.padding,
            self.stride,
            self.dilation,
            self.groups,
            "add",
            None,
            None if self.unary == "none" else self.unary,
            [],
            "",
        )

    def _output_shape(self, x):
        sizes = [
            (size + 2 * pad - dilation * (kernel - 1) - 1) // stride + 1
            for size, pad, dilation, kernel, stride in zip(
                x.shape[2:], self.padding, self.dilation, self.weight.shape[2:], self.stride, strict=True
            )
        ]
        return (x.shape[0], self.weight.shape[0], *sizes)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[1] * self.groups}, {self.weight.shape[0]}, add={self.add}, post={self.unary}"
