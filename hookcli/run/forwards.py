"""How a batch goes through the model: the forward strategies (eager, with BatchNorm folded into its
convolution, compiled), each a context manager that captures the selected layers, and the model prepared for
the run's device, precision and layout.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import weakref
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

import torch

from hookcli.errors import HookcliError, first_line
from hookcli.families import family_traits, ragged_rows
from hookcli.models.loaded import LoadedModel
from hookcli.run import speed
from hookcli.run.batches import batch_device, first_rows, map_batch, rows_by_shape
from hookcli.run.capture import FeatureCapture, preserved_mode
from hookcli.run.fusion import FusionAttempt, fused_convolutions, fusion_attempt
from hookcli.run.settings import RunSettings
from hookcli.storage.fileformat import DETECTIONS, FLOW, RunFacts

if TYPE_CHECKING:
    from torch.utils.hooks import RemovableHandle

__all__ = [
    "CompiledForward",
    "DetectionRows",
    "EagerForward",
    "extraction_forward",
    "ForwardFactory",
    "FusedForward",
    "prepared_model",
]


#: ``forward(model, layers, settings, on_note)``: what makes a run's forward strategy.
ForwardFactory = Callable[..., "EagerForward"]


def extraction_forward(settings: RunSettings) -> ForwardFactory:
    """The forward strategy extraction uses with these settings: compiled, fused or as written."""
    if settings.compile:
        return CompiledForward
    return FusedForward if settings.fusing else EagerForward


@contextlib.contextmanager
def prepared_model(loaded: LoadedModel, settings: RunSettings):
    """The model on its device in the chosen memory format, with threads budgeted; yields ``(model, to_device)``.

    ``settings`` must be resolved. ``to_device(batch)`` moves a batch of
    images the same way (non-blocking, channels-last when the model is). A
    model handed in is given back as it came (:func:`given_back`); one the run
    built for itself is not, so that its weights' first copy is freed as they
    are moved or laid out.
    """
    device = torch.device(settings.device)
    memory_format = settings.memory_format

    def place(module):
        # weights moved or laid out are tensors autograd takes, in any caller's mode; those of a module made under
        # inference mode stay inference tensors, as torch runs them only so
        made_inferring = any(parameter.is_inference() for parameter in module.parameters())
        with torch.inference_mode(made_inferring):
            return speed.to_memory_format(module.to(device), memory_format)

    with (
        given_back(loaded.module, place) if loaded.handed_in else contextlib.nullcontext(place(loaded.module)) as model
    ):

        def to_device(batch):
            def moved(images):
                images = images.to(device, non_blocking=True)
                return speed.to_memory_format(images, memory_format) if images.dim() == 4 else images

            return map_batch(batch, moved)

        with speed.thread_budget(device, settings.workers):
            yield model, to_device


@contextlib.contextmanager
def given_back(module, place: Callable | None = None):
    """Yields the module to run: ``place(module)``, which moves and lays it out for the run, or ``module`` itself,
    run where it is (a caller that moves it moves it through ``place``).

    Inside, it may be moved, laid out and put in eval mode; afterwards each parameter, gradient and buffer is the
    tensor it was (its device, dtype, memory format and values), except that a buffer holds what the module's
    forward wrote into it or put in its place (told from what ``place`` made of it), each parameter needs a
    gradient as it did, each tensor attribute (what a pre-hook derives) is the one it held, and each submodule is
    in its mode, with its hooks and no others. Blocks on one module nest: the first one entered keeps its state,
    and the last one to end (a second side's run of the same model may end after the first's) gives it back. Lazy
    modules' parameters not made yet are left as the run makes them.

    >>> net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3)).train()
    >>> weight = net[0].weight.data_ptr()
    >>> with given_back(net):
    ...     _ = net.to(memory_format=torch.channels_last).eval().requires_grad_(False)
    ...     _ = net.register_forward_hook(lambda *args: None)
    >>> net[0].weight.data_ptr() == weight, net[0].weight.is_contiguous(), net.training, len(net._forward_hooks)
    (True, True, True, 0)
    """
    if module in _GIVEN:
        _GIVEN[module][0] += 1
    else:
        _GIVEN[module] = [1, _held(module), {}]
    try:
        model = module if place is None else place(module)
        _placed(module)
        yield model
    finally:
        entry = _GIVEN[module]
        entry[0] -= 1
        if not entry[0]:
            del _GIVEN[module]
            _give_back(entry[1], entry[2])


#: The modules inside :func:`given_back`: how many blocks hold each, what it was when the first began, and each
#: buffer as the run placed it (:func:`_placed`).
_GIVEN: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _placed(module) -> None:
    """Inside :func:`given_back`, once ``module`` is moved and laid out for the run: its buffers as they are now, so
    that what its forward then writes into them, or puts in their place, is told from what the run did, and kept."""
    entry = _GIVEN[module]
    if not entry[2]:
        entry[2].update(
            ((owner, name), (buffer, _version(buffer)))
            for owner in module.modules()
            for name, buffer in owner._buffers.items()
            if buffer is not None
        )


def _version(tensor: torch.Tensor) -> int | None:
    """How many times ``tensor`` was written in place (None for an inference tensor, which does not count)."""
    try:
        return tensor._version
    except RuntimeError:
        return None


def _written(buffer: torch.Tensor | None, now: torch.Tensor | None, put: tuple | None) -> torch.Tensor | None:
    """The buffer to give back: the tensor it was, unless the module's forward wrote into the copy the run placed
    (its values then go into that tensor, as a run in place would have written them) or put another tensor in its
    place (given back, on the buffer's device and dtype, as a forward called by hand leaves it)."""
    if now is None or now is buffer:
        return buffer
    if buffer is None:  # a buffer the forward filled in: hookcli sets none
        return _outside_inference(now)
    if put is None:  # nothing said what the run placed (its move failed part way): the buffer it was
        return buffer
    tensor, version = put
    if now is tensor and (version is None or _version(now) == version):  # the run's copy, as the run made it
        return buffer
    written = _outside_inference(now.detach().to(buffer.device, buffer.dtype))
    if now is not tensor or tensor is buffer or written.shape != buffer.shape:
        return written
    try:
        with torch.no_grad(), torch.inference_mode() if buffer.is_inference() else contextlib.nullcontext():
            buffer.copy_(written)
    except RuntimeError:  # a buffer no values can be written into (an expanded one): the values, in a tensor of theirs
        return written
    return buffer


def _outside_inference(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor``, copied where it is an inference tensor (made in the run), which autograd would refuse later."""
    return tensor.clone() if tensor.is_inference() else tensor


def _held(module) -> list:
    """What :func:`_give_back` needs to put ``module`` back as it is now."""
    held = []
    for owner in module.modules():
        parameters = {
            name: (parameter, parameter.data, grad, None if grad is None else grad.data, parameter.requires_grad)
            for name, parameter in owner._parameters.items()
            if parameter is not None and not isinstance(parameter, torch.nn.parameter.UninitializedParameter)
            for grad in [parameter.grad]
        }
        buffers = {
            name: buffer
            for name, buffer in owner._buffers.items()
            if not isinstance(buffer, torch.nn.parameter.UninitializedBuffer)
        }
        hooks = {
            name: dict(table)
            for name, table in vars(owner).items()
            if name.endswith("_hooks") and isinstance(table, dict)
        }
        # what a forward pre-hook derives and sets as a plain attribute (old-style ``weight_norm``'s ``weight``):
        # the run's copy would be an inference tensor on the run's device
        attributes = {name: value for name, value in vars(owner).items() if isinstance(value, torch.Tensor)}
        held.append((owner, parameters, buffers, owner.training, hooks, attributes))
    return held


def _give_back(held: list, placed: dict) -> None:
    for owner, parameters, buffers, training, hooks, attributes in held:
        for name, (parameter, data, grad, grad_data, requires_grad) in parameters.items():
            parameter.data = data
            if grad is not None:
                grad.data = grad_data  # moved in place with the parameter: the tensor it held, where it was
            parameter.grad = grad
            with torch.inference_mode() if parameter.is_inference() else contextlib.nullcontext():
                parameter.requires_grad_(requires_grad)  # one made under inference mode takes it back only there
            owner._parameters[name] = parameter
        for name, buffer in buffers.items():
            try:
                owner._buffers[name] = _written(buffer, owner._buffers.get(name), placed.get((owner, name)))
            except RuntimeError:  # what the forward left cannot be brought back: the buffer as it was
                owner._buffers[name] = buffer
        vars(owner).update(attributes)
        owner.training = training
        for name, table in hooks.items():
            current = getattr(owner, name)
            for key in [key for key in current if key not in table]:
                del current[key]


class EagerForward:
    """Forwards with hooks on the selected layers of the model as written; the hooks go on at the first batch.

    Called with a batch on the device, returns ``(features, None)``: the
    captured tensors (not yet pooled, cast or moved) and no targets.
    :meth:`facts` says what the forward has learnt.
    """

    def __init__(self, model, layers: Mapping[str, str], settings: RunSettings, on_note=None) -> None:
        self.layers, self.settings, self.on_note = layers, settings, on_note
        self._stack = contextlib.ExitStack()
        self._use(model)

    def _use(self, model) -> None:
        self._stack.close()  # hooks of a model no longer used come off
        output = family_traits(self.settings.family).output
        detecting = output == "detections"
        self.capture = FeatureCapture(
            model,
            self.layers,
            capture=self.settings.capture,
            stop_early=not self.settings.final_output,
            edits=self.settings.edits,
            capture_edited=self.settings.capture_edited,
            attention=self.settings.attention,
        )
        self.rows = DetectionRows(model, self.settings.final_output) if detecting else None
        self.flow = _FinalOutput(model) if output == "flow" and self.settings.final_output else None
        self.ragged = ragged_rows(self.settings.family, self.settings.preprocess)
        self._fused = fused_convolutions(model)
        self._entered = False

    def __enter__(self) -> EagerForward:
        return self

    def __exit__(self, *exc_info) -> None:
        try:
            if exc_info[0] is None:  # what the device had not said by the last batch
                for said in self.capture.take_overflows(wait=True):
                    self._note(said)
        finally:
            self._stack.close()

    def __call__(self, batch) -> tuple[dict, None]:
        if not self._entered:
            self._stack.enter_context(self.capture)
            for extra in (self.rows, self.flow):
                if extra is not None:
                    self._stack.enter_context(extra)
            self._entered = True
        with torch.inference_mode(), speed.compute_precision(self.settings.precision, batch_device(batch)):
            if self.rows is not None:  # a detection model takes a list of images and pads them itself
                found = self.rows.cut(self.capture.run(list(batch)))
            elif not self.ragged:
                found = self._run(batch)
            else:
                found = rows_by_shape(lambda group: (self._run(group), None), batch)[0]
        for edit in self.capture.take_late_edits():
            self._note(
                f"{edit.intervention.named}: it applies after the last value kept is captured, so it changes "
                "nothing kept"
            )
        for said in self.capture.take_overflows():
            self._note(said)
        return found, None

    def _run(self, batch) -> dict:
        found = self.capture.run(batch)
        if self.flow is not None:
            found[FLOW] = self.flow.take()[-1]  # RAFT returns each pass's field: the last is the finest
        return found

    def facts(self) -> RunFacts:
        return RunFacts(
            calls=dict(self.capture.calls or {}), omitted=tuple(sorted(self.capture.omitted)), fused=self._fused
        )

    def _note(self, text: str) -> None:
        if self.on_note is not None:
            self.on_note(text)


class FusedForward(EagerForward):
    """:class:`EagerForward` on a fused copy of the model, or on the model as written should that fail at first.

    A detection model as a whole cannot be traced (its transform and heads
    hold control flow), but its backbone's convolution stack can: there the
    copy differs from the model only in its fused backbone.
    """

    def __init__(self, model, layers: Mapping[str, str], settings: RunSettings, on_note=None) -> None:
        fuse = functools.partial(
            fusion_attempt,
            dtype=speed.compute_dtype(settings.precision),
            channels_last=settings.memory_format == "channels_last",
        )
        attempt = (
            _with_fused_backbone(model, layers, fuse, settings.final_output)
            if family_traits(settings.family).output == "detections"
            else fuse(model, layers)
        )
        super().__init__(attempt.module, layers, settings, on_note)
        self.plain = model
        self.proven = attempt.module is model  # nothing to fall back to
        if not attempt.traced and family_traits(settings.family).output != "detections":
            self._note(f"--fuse: {type(model).__name__} {attempt.why}, so it runs unfused (the values are the same)")

    def __call__(self, batch) -> tuple[dict, None]:
        try:
            result = super().__call__(batch)
        except HookcliError:
            raise
        except Exception as err:  # an unforeseen kernel or graph problem must not cost the user the run
            if self.proven:
                raise
            self._use(self.plain)
            result = super().__call__(batch)  # where the model itself fails, that is the error to report
            self._note(
                f"the fused forward failed ({type(err).__name__}: {first_line(err)[:120]}); running the model unfused"
            )
        self.proven = True
        return result


def _with_fused_backbone(model, layers: Mapping[str, str], fuse, detections: bool):
    """A copy of detection ``model`` whose backbone's convolution stack (``backbone.body``, or SSD's ``backbone``) is
    fused by ``fuse`` (:func:`~hookcli.run.fusion.fusion_attempt`), as a
    :class:`~hookcli.run.fusion.FusionAttempt`; ``model`` itself where nothing fuses. The copy shares every other
    module.

    The stack is fused up to its last hooked layer when the forward ends there, whole when it goes on (a layer
    hooked after the stack, or the final detections asked for).
    """
    path = "backbone.body" if hasattr(model.backbone, "body") else "backbone"
    keep = [layer[len(path) + 1 :] for layer in layers if layer.startswith(path + ".")]
    goes_on = detections or len(keep) < len(layers)
    attempt = fuse(model.get_submodule(path), keep, whole_run=goes_on)
    fused, count = attempt.module, attempt.count
    if not count:
        return FusionAttempt(model, 0, attempt.traced, attempt.why)
    clone = copy.copy(model)
    clone._modules = dict(model._modules)
    backbone = clone.backbone
    if path == "backbone.body":
        backbone = copy.copy(backbone)
        backbone._modules = dict(backbone._modules)
        backbone.body = fused
        clone.backbone = backbone
    else:
        clone.backbone = fused
    return FusionAttempt(clone, count)


class CompiledForward(EagerForward):
    """A compiled graph of the model cut after the last layer; the eager path where that cannot be had.

    The hooks are on only for a one-image forward that learns how often each
    layer runs; the compiled graph must not contain them.
    """

    def __init__(self, model, layers: Mapping[str, str], settings: RunSettings, on_note=None) -> None:
        super().__init__(model, layers, settings, on_note)
        self.model = model
        self.compiled = None  # not tried yet; then the compiled function, or False for the eager path

    def __call__(self, batch) -> tuple[dict, None]:
        if self.compiled is None:
            self.compiled = self._compile(batch)
            if self.compiled:  # the graph's modules are the caller's: eval for the whole run, as eagerly
                self._stack.enter_context(preserved_mode(self.model))
        if self.compiled:
            try:
                with torch.inference_mode(), speed.compute_precision(self.settings.precision, batch_device(batch)):
                    return self.compiled(batch), None
            except Exception as err:  # compilation happens on first call; a missing compiler shows up here
                self._note(f"--compile failed ({type(err).__name__}: {first_line(err)[:120]}); running eagerly")
                self.compiled = False
        return super().__call__(batch)

    def _compile(self, batch):
        with (
            self.capture,
            torch.inference_mode(),
            speed.compute_precision(self.settings.precision, batch_device(batch)),
        ):
            self.capture.run(first_rows(batch))
        assert self.capture.calls is not None, "counted by the run just made"
        with preserved_mode(self.model):  # traced in eval mode; the caller's modes come back after
            function, reason = speed.compiled_extractor(
                self.model, self.layers, self.capture.calls, self.settings.capture
            )
        if function is None:
            self._note(f"--compile: {reason}; running eagerly")
            return False
        return function


class DetectionRows:
    """Cuts a detection model's padded batch back to each image: layer outputs ``[N, C, H, W]`` to the part that
    covers the image (the model pads a batch to its largest image), and, when asked, its detections.

    The model resizes every image (``min_size``/``max_size``) inside its ``transform``; a hook there learns each
    image's size after resizing and the padded size, and the part of a map of height ``h`` that covers an image
    of height ``ih`` in a padding of ``ph`` is its first ``ceil(h * ih / ph)`` rows (columns alike).
    """

    def __init__(self, model, detections: bool) -> None:
        self.model = model
        self.output = _FinalOutput(model) if detections else None
        self._stack = contextlib.ExitStack()
        self.sizes: list = []
        self.padded: tuple[int, ...] | None = None

    def __enter__(self):
        self._stack.enter_context(self.model.transform.register_forward_hook(self._on_transform))
        if self.output is not None:
            self._stack.enter_context(self.output)
        return self

    def __exit__(self, *exc_info) -> None:
        self._stack.close()

    def _on_transform(self, module, inputs, output) -> None:
        images = output[0]
        self.sizes, self.padded = list(images.image_sizes), tuple(images.tensors.shape[-2:])

    def cut(self, features: dict) -> dict:
        rows = {}
        for key, value in features.items():
            if value.dim() == 4 and self.padded is not None:
                height, width = value.shape[-2:]
                rows[key] = [
                    value[i, :, : -(-height * h // self.padded[0]), : -(-width * w // self.padded[1])]
                    for i, (h, w) in enumerate(self.sizes)
                ]
            else:
                rows[key] = list(value)
        if self.output is not None:
            found = self.output.take()
            for name in ("boxes", "labels", "scores", "masks", "keypoints", "keypoints_scores"):
                if found and name in found[0]:
                    rows[f"{DETECTIONS}#{name}"] = [image[name].detach() for image in found]
        return rows


class _FinalOutput:
    """Keeps what the model returns (the final detections; the flow fields of RAFT's passes), for the block."""

    def __init__(self, model) -> None:
        self.model = model
        self._found = None
        self._handle: RemovableHandle | None = None

    def __enter__(self):
        self._handle = self.model.register_forward_hook(self._on_output)
        return self

    def __exit__(self, *exc_info) -> None:
        assert self._handle is not None, "entered first"
        self._handle.remove()

    def _on_output(self, module, inputs, output) -> None:
        self._found = output

    def take(self):
        """The last forward's output, handed over once."""
        found, self._found = self._found, None
        return found
