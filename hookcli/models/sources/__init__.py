"""Models from outside torchvision: one module per source behind one interface, chosen through a table.

Each source module has ``load(spec, weights, seed)`` returning a
:class:`~hookcli.models.loaded.LoadedModel`; the listed ones also have
``list_models(pattern)``, and ``nothing_listed(wanted)`` where an empty listing
needs more said than that nothing matched (the Hugging Face cache: where it is).
:mod:`~hookcli.models.sources.common` holds what they share. A new source is a
module here, a row of :data:`BACKENDS`, and its prefix in
:data:`hookcli.models.specs.PREFIXES`.

A source's module imports its library (and torch) at its top, so this
package's one import made on use is :func:`backend`'s: a source's module loads
when one of its models is loaded or listed, after
:func:`~hookcli.models.specs.check_model` has said that its library is
installed. Naming and listing torchvision's models never loads one.

Everything that can be said without torch is said by
:func:`~hookcli.models.specs.check_model` and
:func:`~hookcli.models.specs.check_weights`; :func:`load` builds the model in
eval mode on the CPU, its ``name`` the value as given (a file factory's path
made absolute), ``weights`` where the weights came from, and ``preprocess``
the source's own preprocessing. Nothing is downloaded: pretrained files come
from the local caches, and a missing one is named, with where to place it.

>>> sorted(BACKENDS), LISTED
(['factory', 'hf', 'open_clip', 'timm'], ('timm', 'hf', 'open_clip'))
"""

from __future__ import annotations

import importlib
from types import ModuleType

from hookcli.errors import UsageProblem
from hookcli.models.loaded import LoadedModel
from hookcli.models.specs import PREFIXES, ModelSpec, check_model

__all__ = ["BACKENDS", "LISTED", "backend", "list_source_models", "load", "nothing_listed"]

#: Each source's module.
BACKENDS: dict[str, str] = {
    "timm": "hookcli.models.sources.timm",
    "hf": "hookcli.models.sources.hf",
    "open_clip": "hookcli.models.sources.open_clip",
    "factory": "hookcli.models.sources.factory",
}
#: The sources whose models can be listed: every one named by a prefix (a factory is named by its file or module).
LISTED = PREFIXES


def backend(source: str) -> ModuleType:
    """The module of ``source`` (a key of :data:`BACKENDS`), imported on first use (see the package's docs)."""
    return importlib.import_module(BACKENDS[source])


def load(spec: ModelSpec, weights: str, *, seed: int = 0) -> LoadedModel:
    """Build ``spec``'s model with ``weights``.

    ``weights`` is ``none`` (random, from ``seed``), ``DEFAULT`` (timm's and
    OpenCLIP's default pretrained tag, the Hugging Face checkpoint, whatever
    a factory returns), a pretrained tag (timm: ``in1k`` or
    ``resnet50.a1_in1k``; OpenCLIP: ``laion2b_s34b_b79k``), or a path to a
    state dict loaded into the model. Both are checked already, and the
    weights stripped (:func:`hookcli.models.catalog.choose_model`).
    """
    return backend(spec.source).load(spec, weights, seed)


def list_source_models(source: str, pattern: str | None = None) -> list[dict]:
    """The models a source offers (matching a glob ``pattern``): ``{"model", "family", "default", "weights"}`` rows.

    timm and OpenCLIP: every architecture, with its pretrained tags; Hugging
    Face: the models in the local cache.
    """
    _check_listed(source)
    return backend(source).list_models(pattern)


def nothing_listed(source: str, wanted: str) -> str | None:
    """What ``source`` says when :func:`list_source_models` found no model that is ``wanted`` (a pattern or a family,
    in words; empty for any), or None where it has nothing to add to :func:`hookcli.models.catalog.no_models_note`'s
    words."""
    _check_listed(source)
    own = getattr(backend(source), "nothing_listed", None)
    return own(wanted) if own is not None else None


def _check_listed(source: str) -> None:
    if source not in LISTED:
        raise UsageProblem(
            f"unknown source '{source}'",
            hint=f"use one of {', '.join(PREFIXES)} (hookcli.models() lists torchvision's)",
        )
    check_model(ModelSpec(source, "x"))
