"""Models from outside torchvision: one module per source behind one interface, chosen through a table.

Each source module has ``load(spec, weights, seed)`` returning a
:class:`~hookcli.models.loaded.LoadedModel`; the listed ones also have
``list_models(pattern)``. :mod:`~hookcli.models.sources.common` holds what they
share. A new source is a module here, a row of :data:`BACKENDS`, and its
prefix in :data:`hookcli.models.specs.PREFIXES`.

Everything that can be said without torch is said by
:func:`~hookcli.models.specs.check_model` and
:func:`~hookcli.models.specs.check_weights`; :func:`load` builds the model in
eval mode on the CPU, its ``name`` the value as given (a file factory's path
made absolute), ``weights`` where the weights came from, and ``preprocess``
the source's own preprocessing. Nothing is downloaded: pretrained files come
from the local caches, and a missing one is named, with where to place it.

>>> sorted(BACKENDS), sorted(LISTING)
(['factory', 'hf', 'open_clip', 'timm'], ['hf', 'open_clip', 'timm'])
"""

from __future__ import annotations

from collections.abc import Callable

from hookcli.errors import UsageProblem
from hookcli.models.loaded import LoadedModel
from hookcli.models.sources import factory, hf, open_clip, timm
from hookcli.models.sources.common import offline_hub, quiet_libraries
from hookcli.models.specs import PREFIXES, ModelSpec, check_model, check_weights

__all__ = ["BACKENDS", "LISTING", "list_source_models", "load"]

#: Each source's ``load(spec, weights, seed)``.
BACKENDS: dict[str, Callable[[ModelSpec, str, int], LoadedModel]] = {
    "timm": timm.load,
    "hf": hf.load,
    "open_clip": open_clip.load,
    "factory": factory.load,
}
#: Each listed source's ``list_models(pattern)``.
LISTING: dict[str, Callable[[str | None], list[dict]]] = {
    "timm": timm.list_models,
    "hf": hf.list_models,
    "open_clip": open_clip.list_models,
}


def load(spec: ModelSpec, weights: str, *, seed: int = 0) -> LoadedModel:
    """Build ``spec``'s model with ``weights``.

    ``weights`` is ``none`` (random, from ``seed``), ``DEFAULT`` (timm's and
    OpenCLIP's default pretrained tag, the Hugging Face checkpoint, whatever
    a factory returns), a pretrained tag (timm: ``in1k`` or
    ``resnet50.a1_in1k``; OpenCLIP: ``laion2b_s34b_b79k``), or a path to a
    state dict loaded into the model.
    """
    check_model(spec)
    check_weights(spec, weights)
    if spec.source not in BACKENDS:
        raise UsageProblem(f"{spec.text} is a torchvision model", hint="load it with hookcli.load_model")
    with quiet_libraries(), offline_hub():
        return BACKENDS[spec.source](spec, weights.strip(), seed)


def list_source_models(source: str, pattern: str | None = None) -> list[dict]:
    """The models a source offers (matching a glob ``pattern``): ``{"model", "family", "default", "weights"}`` rows.

    timm and OpenCLIP: every architecture, with its pretrained tags; Hugging
    Face: the models in the local cache.
    """
    if source not in LISTING:
        raise UsageProblem(
            f"unknown source '{source}'",
            hint=f"use one of {', '.join(PREFIXES)} (hookcli.describe_models lists torchvision's)",
        )
    return LISTING[source](pattern)
