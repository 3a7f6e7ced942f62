"""A model handed in as the ``nn.Module`` itself, ``hookcli.extract(net, "layer3", photo)``, or with its
preprocessing, ``hookcli.extract((net, weights.transforms()), …)``: run where it is and given back as it came.

>>> import torch
>>> loaded = loaded_from_module(torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3)))
>>> loaded.name, loaded.weights["source"], loaded.handed_in, loaded.preprocess.crop
('Sequential', 'module', True, 224)
"""

from __future__ import annotations

import hashlib

import torch

from hookcli.errors import UsageProblem
from hookcli.inputs.preprocess import Preprocess
from hookcli.models.loaded import LoadedModel, has_class_token, prefix_tokens
from hookcli.models.sources.common import given_preprocess

__all__ = ["is_handed_module", "loaded_from_module"]


def is_handed_module(model) -> bool:
    """Whether ``model`` is an ``nn.Module``, or a module and its preprocessing."""
    module = model[0] if isinstance(model, tuple) and len(model) == 2 else model
    return isinstance(module, torch.nn.Module)


def loaded_from_module(model) -> LoadedModel:
    """``model`` (an ``nn.Module``, or ``(module, preprocessing)``: a :class:`~hookcli.inputs.preprocess.Preprocess`,
    a dict of its fields or a torchvision weights' ``transforms()``) as a model ready to run. Without preprocessing,
    ImageNet's is assumed and said in a note. Its weights are recorded by the SHA-256 of its state."""
    module, given = model if isinstance(model, tuple) else (model, None)
    name = type(module).__name__
    if isinstance(module, torch.jit.ScriptModule):
        raise UsageProblem(
            f"the model given is a TorchScript module ({name}), whose inside forward hooks cannot reach",
            hint="give the Python model it was scripted from",
        )
    if given is None:
        preprocess = Preprocess(resize=256, crop=224)  # mean and std: ImageNet's
        assumed_because = f"{name}: the module was given without preprocessing"
    else:
        preprocess, assumed_because = given_preprocess(f"the module {name}", given, UsageProblem), None
    return LoadedModel(
        name=name,
        module=module,
        weights={"source": "module", "sha256": state_sha256(module)},
        preprocess=preprocess,
        categories=None,
        source="module",
        prefix_tokens=prefix_tokens(module),
        class_token=has_class_token(module),
        assumed_because=assumed_because,
        handed_in=True,
    )


def state_sha256(module: torch.nn.Module) -> str:
    """The SHA-256 of a module's state (each entry's name, dtype, shape and values, in order): what tells two
    modules of one class apart in a run's identity."""
    digest = hashlib.sha256()
    for key, value in module.state_dict().items():
        digest.update(f"{key}:{value.dtype}:{list(value.shape)}\n".encode())
        if value.numel():
            digest.update(value.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy())  # no copy
    return digest.hexdigest()
