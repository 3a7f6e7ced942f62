"""The layer table of ``hookcli layers``: every layer a selector can name, in forward order, with its output shape,
parameters and calls, from one forward of the family's natural input.

>>> from hookcli.models.loading import load_model
>>> rows = layer_table(load_model("resnet18", "none"), depth=1)
>>> [(row.path, row.output) for row in rows][-1]
('fc', [1, 1000])
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass, field

import torch

from hookcli.errors import CaptureError, size_refusal
from hookcli.families import family_traits
from hookcli.models import loading
from hookcli.models.catalog import ModelChoice, as_model
from hookcli.models.loaded import LoadedModel
from hookcli.run.batches import call_model, natural_input
from hookcli.run.capture import preserved_mode
from hookcli.run.forwards import given_back
from hookcli.run.selectors import MODEL, hookable_layers

__all__ = [
    "LayerInfo",
    "describe_layers",
    "layer_table",
    "model_layer_table",
]


def model_layer_table(
    choice: ModelChoice, *, seed: int = 0, input_size=None, depth=None, frames=None
) -> list[LayerInfo]:
    """:func:`layer_table` of the model ``choice`` names, built with its weights
    (:func:`hookcli.models.loading.build_model`)."""
    loaded = loading.build_model(choice, seed=seed)  # looked up on use: a test's seam
    return layer_table(loaded, input_size=input_size, depth=depth, frames=frames)


def handed_layer_table(model, *, input_size=None, depth=None, frames=None) -> list[LayerInfo]:
    """:func:`layer_table` of a model handed in (an ``nn.Module``, with its preprocessing or not, or a
    :class:`~hookcli.models.loaded.LoadedModel`), run on its own device and given back as it came."""
    loaded = as_model(model)
    assert isinstance(loaded, LoadedModel), "a name goes to model_layer_table"
    with given_back(loaded.module):  # run where it is: what its forward writes into its buffers is its own
        return layer_table(loaded, input_size=input_size, depth=depth, frames=frames)


def layer_table(
    loaded: LoadedModel, *, input_size: int | None = None, depth: int | None = None, frames: int | None = None
) -> list[LayerInfo]:
    """The rows of :func:`describe_layers` for ``loaded`` on its natural input (see :func:`hookcli.layers`), on the
    device and in the dtype of its parameters, the paths of at most ``depth`` components; a model that refuses the
    input's size is a :class:`CaptureError`."""
    example = natural_input(loaded.family, size=input_size, preprocess=loaded.preprocess, frames=frames)
    first = next(loaded.module.parameters(), None)
    device = torch.device("cpu") if first is None else first.device
    dtype = first.dtype if first is not None and first.is_floating_point() else torch.float32  # a float64 module's
    example = tuple([t.to(device, dtype) for t in x] if isinstance(x, list) else x.to(device, dtype) for x in example)
    try:
        rows = describe_layers(loaded.module, example)
    except (RuntimeError, ValueError, AssertionError) as err:  # the model refuses the input's size in its own words
        words = size_refusal(err)
        if words is None:
            raise
        row = family_traits(loaded.family).row
        what = {"clip": "clip", "pair": "pair of frames"}.get(row, "input")
        raise CaptureError(
            f"{loaded.name} cannot run on the dummy {what}: {words}",
            hint="give another --input-size" + (" or --frames" if row == "clip" else ""),
        ) from None
    return [row for row in rows if depth is None or row.path == MODEL or row.path.count(".") < depth]


@dataclass
class LayerInfo:
    """One row of the layer table: path, type, output shape(s), parameters, calls per forward."""

    path: str
    type: str
    params: int
    calls: int = 0
    output: object = None  # a shape list, or a nested list/dict of shapes for container outputs
    order: int = field(default=-1, repr=False)

    def to_dict(self) -> dict:
        return {"path": self.path, "type": self.type, "output": self.output, "params": self.params, "calls": self.calls}


def describe_layers(model, example) -> list[LayerInfo]:
    """Run ``model(example)`` once with hooks and describe every hookable layer.

    ``example`` is a batch as :func:`hookcli.run.batches.call_model` takes it (a
    tuple is the model's arguments).

    Rows come in forward order (the order layers start running), the model
    itself first as ``.`` (:data:`MODEL`, what its forward returns); layers
    that never run come last with ``calls == 0`` and no output shape. Hooks
    are removed and the model's mode restored before returning.
    """
    layers = hookable_layers(model)
    rows = {
        path: LayerInfo(path, type(m).__name__, sum(p.numel() for p in m.parameters())) for path, m in layers.items()
    }
    started: list[str] = []

    def on_start(path, module, inputs):
        if path not in started:
            started.append(path)

    def on_finish(path, module, inputs, output):
        row = rows[path]
        row.calls += 1
        if row.output is None:
            row.output = _shapes(output)

    with contextlib.ExitStack() as stack, preserved_mode(model), torch.inference_mode():
        for path, module in layers.items():
            stack.enter_context(module.register_forward_pre_hook(functools.partial(on_start, path)))
            stack.enter_context(module.register_forward_hook(functools.partial(on_finish, path)))
        output = call_model(model, example)
    itself = LayerInfo(
        MODEL, type(model).__name__, sum(p.numel() for p in model.parameters()), calls=1, output=_shapes(output)
    )
    ordered = [itself] + [rows[p] for p in started] + [row for p, row in rows.items() if p not in started]
    for i, row in enumerate(ordered):
        row.order = i
    return ordered


def _shapes(value):
    if isinstance(value, torch.Tensor):
        return list(value.shape)
    if isinstance(value, list | tuple):
        return [_shapes(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _shapes(v) for k, v in value.items()}
    return None
