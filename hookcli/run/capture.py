"""Record what chosen layers return (or receive) during a forward pass.

:class:`FeatureCapture` is a context manager: hooks go on when it is entered
and come off when it exits, also when the forward raises, and every module's
train/eval mode is put back as it was.

What a hook sees is copied at once, before the next layer runs, so a later
in-place operation (vgg16_bn's ``ReLU(inplace=True)`` after a BatchNorm)
cannot change it. Inputs are read by a forward *pre*-hook, before the module
itself can modify them in place.

Keys (the file format's contract, see ``docs/file-format.md``):

- ``<key>`` a layer's output, ``<key>@input`` its input, ``<key>@attention`` an attention module's weights
  (:mod:`hookcli.run.attention`);
- ``<key>#<i>`` / ``<key>#<name>`` an element of a tuple/list/dict output
  (nested: ``<key>#0#1``); a multi-input module's inputs are ``<key>@input#<i>``,
  and those given by keyword ``<key>@input#<name>``;
- ``<key>:<call>`` when a module runs several times in one forward, for every
  call, counted from 0 (``layer1.0.relu:2``, ``layer1.0.relu:2@input``).

Elements that are not tensors (``None``) are not stored; they are listed in
:attr:`FeatureCapture.omitted`.

:class:`GradientCapture` also returns ``<key>@grad``: the gradient of a
chosen logit with respect to each layer's output. Its hook keeps the
module's own output tensor to itself and passes a copy on, so in-place
operations after the layer (``ReLU(inplace=True)``, ``out += identity``)
change the copy, and ``torch.autograd.grad`` on the kept tensor gives exactly
d(logit)/d(output). No module backward hooks are used.

>>> import torch, torch.nn as nn
>>> model = nn.Sequential(nn.Linear(4, 3), nn.ReLU(inplace=True))
>>> with FeatureCapture(model, ["0"]) as capture:
...     features = capture.run(torch.ones(2, 4))
>>> features["0"].shape
torch.Size([2, 3])
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from hookcli.errors import CaptureError, LayerNotRunError, UsageProblem, check_choice, never_runs
from hookcli.families import channels_last_output
from hookcli.options.run import ATTENTION_KEEPS, CAPTURE_KINDS
from hookcli.run.attention import attention_weights, check_attention
from hookcli.run.batches import batch_length, call_model, first_rows
from hookcli.run.selectors import check_path_key
from hookcli.statistics.units import width_axis
from hookcli.storage.fileformat import DETECTIONS

if TYPE_CHECKING:
    import torch

    from hookcli.run.edits import Edit

__all__ = ["COUNTING_FORWARD_FROM", "FeatureCapture", "GradientCapture", "preserved_mode", "stored"]

#: A first batch of this many images or more learns the call counts from a one-image forward of its own, so that it
#: can stop early too. That forward costs about one image and a set of kernels for a second shape, and saves only
#: the layers after the last chosen one on this batch (nothing when that is the model's last layer): a smaller
#: first batch runs whole and the call counts come from it.
COUNTING_FORWARD_FROM = 8


@contextlib.contextmanager
def preserved_mode(model) -> Iterator[None]:
    """Put ``model`` in eval mode for the block, then restore every module's own mode."""
    modes = [(module, module.training) for module in model.modules()]
    model.eval()
    try:
        yield
    finally:
        for module, training in modes:
            module.training = training


class _ForwardDone(BaseException):
    """Raised from a hook to end the forward once every selected layer has fired: not an ``Exception``, so that a
    forward's own ``except Exception`` (a fallback path) does not catch it and run on, and torch does not call
    ``always_call`` hooks with no output for a forward that hookcli cut short."""


class FeatureCapture:
    """Hooks on selected layers of ``model``; :meth:`run` returns what they caught.

    ``layers`` is a mapping ``{module path: key}`` (see
    :func:`hookcli.run.selectors.resolve_layers`) or a list of paths used as keys.
    ``capture`` is ``"output"``, ``"input"``, ``"both"`` or ``"attention"`` (``attention``: what is kept of the
    weights, :data:`~hookcli.options.run.ATTENTION_KEEPS`). With
    ``stop_early`` the forward ends as soon as every layer has fired as often
    as it did in the first forward, so layers nobody asked for are not paid
    for; that first, full forward runs on one image only when the first batch
    has :data:`COUNTING_FORWARD_FROM` images or more (a smaller one runs whole).
    """

    def __init__(
        self,
        model,
        layers: Mapping[str, str] | Sequence[str],
        *,
        capture: str = "output",
        stop_early: bool = True,
        edits: Sequence[Edit] = (),
        capture_edited: bool = False,
        attention: str = "all",
    ) -> None:
        check_choice("capture", capture, CAPTURE_KINDS)
        check_choice("attention", attention, ATTENTION_KEEPS)
        self.attention = attention
        self.model = model
        self.edits, self.capture_edited = tuple(edits), capture_edited
        self._edits_checked = False
        if not isinstance(layers, Mapping):
            for path in layers:
                check_path_key(path)
        self.layers = dict(layers) if isinstance(layers, Mapping) else {path: path for path in layers}
        self.capture = capture
        # DataParallel runs its replicas' hooks in threads that pass on only an Exception: the forward runs whole
        self.stop_early = stop_early and not any(isinstance(m, torch.nn.DataParallel) for m in model.modules())
        #: How many times each layer ran per forward, learnt from the first forward.
        self.calls: dict[str, int] | None = None
        #: Keys of container elements that were not tensors and so were not stored.
        self.omitted: set[str] = set()
        #: The edits that had not run when the first forward of a run that keeps only captures made its last
        #: capture: they edit layers after every captured one, and change nothing kept (None until then).
        self.late_edits: tuple[Edit, ...] | None = None
        self._edit_calls: list[int] = []  # each edit's calls at the last capture so far
        self._stack: contextlib.ExitStack | None = None
        self._outputs: dict[str, list] = {}
        self._inputs: dict[str, list] = {}
        self._counts: dict[str, int] = {}

    def __enter__(self) -> FeatureCapture:
        modules = dict(self.model.named_modules())
        missing = [path for path in self.layers if path not in modules]  # "": the model itself
        if missing:
            raise UsageProblem(f"no layer '{missing[0]}' in the model", hint="resolve selectors with resolve_layers")
        stack = contextlib.ExitStack()
        try:
            stack.enter_context(preserved_mode(self.model))
            for path in self.layers:
                module = modules[path]
                if self.capture == "attention":
                    check_attention(module, path)
                    stack.enter_context(
                        module.register_forward_hook(functools.partial(self._on_attention, path), with_kwargs=True)
                    )
                if self.capture in ("input", "both"):
                    stack.enter_context(
                        module.register_forward_pre_hook(functools.partial(self._on_input, path), with_kwargs=True)
                    )
                if self.capture in ("output", "both"):
                    stack.enter_context(module.register_forward_hook(functools.partial(self._on_output, path)))
            # Captures see what a layer returned, before its edits; or after them, the edits put first, in order.
            for edit in reversed(self.edits) if self.capture_edited else self.edits:
                stack.enter_context(edit.attached(self.model, prepend=self.capture_edited))
        except BaseException:
            stack.close()
            raise
        self._stack = stack
        return self

    def __exit__(self, *exc_info) -> None:
        stack, self._stack = self._stack, None
        self._clear()
        if stack is not None:
            stack.close()

    def run(self, batch) -> dict:
        """Run ``model(batch)`` and return ``{key: tensor}`` for this batch, batch-first.

        Gradient mode is the caller's: wrap in ``torch.inference_mode()`` to
        extract. Raises :class:`LayerNotRunError` if a layer never ran and
        :class:`CaptureError` if a layer's call count or batch dimension changes.
        """
        if self._stack is None:
            raise RuntimeError("FeatureCapture.run() needs the capture to be entered (use 'with')")
        size = batch_length(batch)
        if self.calls is None and self.stop_early and size >= COUNTING_FORWARD_FROM:
            # Learn how often each layer fires from one image, so this batch can already stop early.
            self._check_calls(self._forward(first_rows(batch))[0])
        counts, outputs, inputs = self._forward(batch)
        self._check_calls(counts)
        self._check_edits()
        return self._flatten(outputs, inputs, batch_size=size)

    def _check_edits(self) -> None:
        """Refuse, at the first forward (which runs whole), an edit of a layer it did not run, before anything is
        kept."""
        if self._edits_checked:
            return
        self._edits_checked = True
        unreached = next((edit for edit in self.edits if not edit.calls), None)
        if unreached is not None:
            spec = unreached.intervention
            raise never_runs(spec.named, spec.layer)

    def _forward(self, batch) -> tuple[dict, dict, dict]:
        self._clear()
        ran = self._edit_calls = [edit.calls for edit in self.edits]
        try:
            call_model(self.model, batch)
        except _ForwardDone:
            pass
        finally:
            counts, outputs, inputs = self._counts, self._outputs, self._inputs
            self._clear()
        if self.stop_early and self.late_edits is None and counts:  # stopped early or whole, alike
            self.late_edits = tuple(edit for edit, before, at in zip(self.edits, ran, self._edit_calls) if at == before)
        return counts, outputs, inputs

    def take_late_edits(self) -> tuple[Edit, ...]:
        """:attr:`late_edits` the first time they are known, to be said once; () before and after."""
        late, self.late_edits = self.late_edits or (), None if self.late_edits is None else ()
        return late

    def take_overflows(self, *, wait: bool = False) -> list[str]:
        """The notes of edits that made values infinite, each said once (:meth:`Edit.take_overflow`; ``wait``: at the
        end of the run, for the device to say)."""
        return [said for said in (edit.take_overflow(wait=wait) for edit in self.edits) if said is not None]

    def _clear(self) -> None:
        self._outputs, self._inputs, self._counts = {}, {}, {}

    def _on_input(self, path, module, args, kwargs):
        # One positional input is the layer's input (@input); more are #0, #1, …; keyword ones #name beside them.
        self._inputs.setdefault(path, []).append((_detached_copy(tuple(args)), _detached_copy(dict(kwargs))))
        if self.capture == "input":
            self._count(path)

    def _on_output(self, path, module, inputs, output):
        self._outputs.setdefault(path, []).append(_detached_copy(output))
        self._count(path)

    def _on_attention(self, path, module, args, kwargs, output):
        with torch.no_grad():
            weights = attention_weights(module, args, kwargs, keep=self.attention, path=path)
            self._outputs.setdefault(path, []).append(weights)
        self._count(path, weights_of=path)

    def _count(self, path: str, *, weights_of: str | None = None) -> None:
        self._counts[path] = self._counts.get(path, 0) + 1
        if self.edits and self.late_edits is None:
            # Attention weights come from what the layer receives: its own edit, put before this hook by
            # capture_edited, changes nothing kept.
            self._edit_calls = [
                edit.calls - (self.capture_edited and edit.intervention.layer == weights_of) for edit in self.edits
            ]
        expected = self.calls
        if (
            self.stop_early
            and expected is not None
            and len(self._counts) == len(expected)
            and all(self._counts[p] >= n for p, n in expected.items())
        ):
            raise _ForwardDone

    def _check_calls(self, counts: dict[str, int]) -> None:
        never = [path for path in self.layers if counts.get(path, 0) == 0]
        if never:
            raise LayerNotRunError(
                f"layer{'s' if len(never) > 1 else ''} {', '.join(never)} never ran during the forward pass",
                hint="the model defines it but does not call it (in eval mode); pick another with 'hookcli layers'",
            )
        if self.calls is None:
            self.calls = {path: counts[path] for path in self.layers}
        elif counts != self.calls:
            changed = next(p for p in self.layers if counts.get(p) != self.calls[p])
            raise CaptureError(
                f"layer {changed} ran {counts.get(changed)} times in this forward but {self.calls[changed]} "
                "times in the first one",
                hint="keys must be the same for every batch; select a layer that runs a fixed number of times",
            )

    def _flatten(self, outputs: dict, inputs: dict, batch_size: int) -> dict:
        flat: dict = {}
        for path, key in self.layers.items():
            calls = max(len(outputs.get(path, ())), len(inputs.get(path, ())))
            for call in range(calls):
                base = _call_key(key, call, calls)
                if path in inputs:
                    args, kwargs = inputs[path][call]
                    _add(flat, f"{base}@input", args[0] if len(args) == 1 else list(args), self.omitted)
                    for name, value in kwargs.items():
                        _add(flat, f"{base}@input#{name}", value, self.omitted)
                if path in outputs:
                    named = f"{base}@attention" if self.capture == "attention" else base
                    _add(flat, named, outputs[path][call], self.omitted)
        for key, tensor in list(flat.items()):
            if tensor.dim() > 0 and tensor.shape[0] == batch_size:
                continue
            if key.partition("@input")[2]:  # an element of a layer's inputs that is not per image: left out, said so
                self.omitted.add(key)
                del flat[key]
            else:
                raise CaptureError(
                    f"'{key}' has shape {list(tensor.shape)}, not batch-first for a batch of {batch_size}",
                    hint="hookcli stores one row per image; select a layer whose output starts with the batch",
                )
        return flat


class GradientCapture(FeatureCapture):
    """A :class:`FeatureCapture` of layer outputs that also takes gradients of chosen logits with respect to them.

    Use :meth:`run_gradients`, with parameters frozen (see
    :func:`hookcli.run.gradients.frozen_parameters`) so autograd records the graph
    from the first hooked layer on only. The whole forward runs: the logits
    are at its end.
    """

    def __init__(
        self, model, layers: Mapping[str, str] | Sequence[str], edits: Sequence[Edit] = (), capture_edited: bool = False
    ) -> None:
        super().__init__(model, layers, capture="output", stop_early=False, edits=edits, capture_edited=capture_edited)
        self._sources: dict[str, list] = {}

    def run(self, batch) -> dict:
        raise RuntimeError("GradientCapture takes gradients: call run_gradients(batch, pick_targets)")

    def run_gradients(
        self, batch, pick_targets=None, *, score=None, field: str | None = None
    ) -> tuple[dict, Any, torch.Tensor | None]:
        """Forward ``batch``, choose targets, and return activations and their gradients.

        ``pick_targets(logits)`` returns the classes ``[N, K]`` (long) to take gradients of, one backward per column.
        Returns ``({key: tensor}, classes, logits)``, with ``<key>@grad`` (K = 1) or ``<key>@grad#<k>`` beside each
        ``<key>``, and the detached logits; ``field`` names the logits in an output that is a mapping (a transformers
        ``ModelOutput``: ``logits``, ``pooler_output``). Models whose output is not logits (detection, segmentation)
        give ``score(output)`` instead, returning ``(scores [N, K], about)``; then ``(features, about, None)`` comes
        back. Raises :class:`CaptureError` for a layer the target does not depend on.
        """
        if self._stack is None:
            raise RuntimeError("GradientCapture.run_gradients() needs the capture to be entered (use 'with')")
        self._clear()
        logits = about = None
        try:
            with torch.inference_mode(False), torch.enable_grad():  # whatever mode the caller runs in
                output = call_model(self.model, batch)
                self._check_edits()
                if score is not None:
                    scores, about = score(output)
                else:
                    if field and isinstance(output, Mapping) and field not in output:
                        raise CaptureError(
                            f"the model's output has no {field} to take class scores from",
                            hint="gradients need a classifier, or a model that pools its features",
                        )
                    if field is None and isinstance(output, Mapping) and "logits" in output:
                        field = "logits"  # a mapping's logits, as ablate and patch take them
                    logits = output[field] if field and isinstance(output, Mapping) else output
                    if isinstance(logits, torch.Tensor) and logits.dim() > 2 and all(n == 1 for n in logits.shape[2:]):
                        logits = logits.flatten(1)  # a pooled [N, C, 1, 1] (transformers' ResNet, RegNet, BiT)
                    if not isinstance(logits, torch.Tensor) or logits.dim() != 2:
                        raise CaptureError(
                            "the model's output is not a [batch, classes] tensor of logits",
                            hint="gradients need a classification model",
                        )
                    about = pick_targets(logits.detach())
                    scores = logits.gather(1, about)
                sources = [
                    (path, call, tensor)
                    for path, tensors in self._sources.items()
                    for call, tensor in enumerate(tensors)
                ]
                gradients: list[Sequence[torch.Tensor | None]] = []  # None: a source the score does not reach
                for k in range(scores.shape[1]):
                    total = scores[:, k].sum()
                    if not total.requires_grad and score is None and sources:  # cut off from every captured layer
                        raise _no_path(sources[0][0])
                    if not total.requires_grad:  # no image has this target (a detection that is not there): 0
                        gradients.append([torch.zeros_like(t) for _, _, t in sources])
                        continue
                    gradients.append(
                        torch.autograd.grad(
                            total, [t for _, _, t in sources], retain_graph=k + 1 < scores.shape[1], allow_unused=True
                        )
                    )
            counts, outputs = self._counts, self._outputs
        finally:
            self._clear()
        self._check_calls(counts)
        flat = self._flatten(outputs, {}, batch_size=batch_length(batch))
        for index, (path, call, _) in enumerate(sources):
            base = _call_key(self.layers[path], call, counts[path])
            for k, found in enumerate(gradients):
                gradient = found[index]
                if gradient is None:
                    raise _no_path(path)
                flat[f"{base}@grad" if len(gradients) == 1 else f"{base}@grad#{k}"] = gradient.detach()
        return flat, about, None if logits is None else logits.detach()

    def _clear(self) -> None:
        super()._clear()
        self._sources = {}

    def _on_output(self, path, module, inputs, output):
        if not isinstance(output, torch.Tensor):
            raise CaptureError(
                f"layer {path or '.'} returns {type(output).__name__}, not a tensor",
                hint="gradients are taken for layers whose output is one tensor",
            )
        if not output.is_floating_point():
            raise CaptureError(
                f"layer {path} returns {output.dtype} values, which have no gradient",
                hint="choose a layer that returns floating-point values ('hookcli layers' lists them)",
            )
        # Before this layer nothing needs a gradient (parameters are frozen), so its output becomes a leaf.
        source = output if output.requires_grad else output.detach().requires_grad_()
        self._sources.setdefault(path, []).append(source)
        self._outputs.setdefault(path, []).append(_detached_copy(source))
        self._count(path)
        return source.clone()  # what later layers see, and may change in place


def _no_path(path: str) -> CaptureError:
    """The refusal of a layer whose output the target logit does not reach through autograd."""
    return CaptureError(
        f"layer {path or '.'} has no gradient path to the target logit",
        hint="choose a layer the model's output depends on, not one its forward runs under torch.no_grad() or detaches",
    )


def _call_key(key: str, call: int, calls: int) -> str:
    """``key`` for a layer that runs once per forward, ``key:<call>`` for each call of one that runs more often."""
    return f"{key}:{call}" if calls > 1 else key


def _detached_copy(value):
    if isinstance(value, torch.Tensor):
        if value.is_quantized:  # a quantized model's activations are stored as the real values they stand for
            return value.detach().dequantize().contiguous()
        # contiguous_format: stored tensors are plain row-major whatever layout the model runs in.
        return value.detach().clone(memory_format=torch.contiguous_format)
    if isinstance(value, tuple | list):
        return [_detached_copy(v) for v in value]
    if isinstance(value, dict):
        return {k: _detached_copy(v) for k, v in value.items()}
    return value


def _add(flat: dict, key: str, value, omitted: set) -> None:
    if isinstance(value, torch.Tensor):
        flat[key] = value
    elif isinstance(value, tuple | list):
        for i, element in enumerate(value):
            _add(flat, f"{key}#{i}", element, omitted)
    elif isinstance(value, dict):
        for name, element in value.items():
            _add(flat, f"{key}#{name}", element, omitted)
    else:
        omitted.add(key)


def stored(
    key: str,
    value,
    pool: str | None,
    cast,
    ragged: bool,
    square: bool = False,
    on_device: bool = False,
    width: int | None = None,
):
    """A captured batch (or list of rows) pooled, cast and on the CPU (``on_device``: a batch stays where it is);
    detections and integers kept as they are.

    In a run whose rows may differ in shape (``ragged``) it is always a list of rows, so a key keeps one form.
    ``square``: the inputs are square, so a ``[N, H, W, C]`` output is told apart (see :func:`_pooled`); ``width``:
    the channels its module says the output has, which decide where the shape cannot.
    """
    if key.startswith(DETECTIONS + "#"):
        return _on_cpu(key, list(value))

    def finish(tensor, *, row: bool):
        pooled = _pooled(tensor[None], pool, width=width)[0] if row else _pooled(tensor, pool, square, width)
        return pooled.to(cast) if pooled.is_floating_point() else pooled

    if isinstance(value, list):
        return _on_cpu(key, [finish(row, row=True) for row in value])
    kept = finish(value, row=False)
    kept = kept if on_device else kept.to("cpu")
    return list(kept) if ragged else kept


def _on_cpu(key: str, rows: list) -> list:
    """Rows of ``key`` (any shapes) moved to the CPU in one copy for each device they are on: one wait for a device,
    not one a row.

    A key is stored in one dtype, so rows of several (which one copy would promote to one) are refused.
    """
    dtypes = sorted({str(row.dtype).removeprefix("torch.") for row in rows})
    if len(dtypes) > 1:
        raise CaptureError(
            f"'{key}' has rows of {len(dtypes)} dtypes in one batch ({', '.join(dtypes)})",
            hint="hookcli stores a key in one dtype; select a layer whose rows share one",
        )
    moved = list(rows)
    on_devices: dict[torch.device, list[int]] = {}
    for index, row in enumerate(rows):
        if row.device.type != "cpu":
            on_devices.setdefault(row.device, []).append(index)
    for indices in on_devices.values():
        flat = torch.cat([rows[i].reshape(-1) for i in indices]).to("cpu")
        for i, piece in zip(indices, flat.split([rows[i].numel() for i in indices]), strict=True):
            moved[i] = piece.reshape(rows[i].shape)
    return moved


def _pooled(tensor, pool: str | None, square: bool = False, width: int | None = None):
    """Global pooling over the spatial axes: ``[N, C, H, W]`` → ``[N, C]``; tokens ``[N, T, D]`` → ``[N, D]``.

    With ``square`` inputs, an output laid out ``[N, H, W, C]`` (:func:`~hookcli.families.channels_last_output`)
    is pooled over H and W too. ``width`` (the channels the module says its output has) decides where the shape
    cannot: a Conv1d's ``[N, C, L]`` is pooled over L, a map whose C equals its H over H and W.
    """
    if pool is None or tensor.dim() < 3:
        return tensor
    axes = tuple(range(2, tensor.dim())) if tensor.dim() >= 4 else (1,)
    if square and channels_last_output(tensor.shape):
        axes = (1, 2)
    said = width_axis(tuple(tensor.shape[1:]), width)
    if said is not None:  # channels first, or last, as the module says
        axes = tuple(range(2, tensor.dim())) if said == 0 else tuple(range(1, tensor.dim() - 1))
    if pool == "avg":
        return tensor.float().mean(dim=axes).to(tensor.dtype)
    return tensor.amax(dim=axes)
