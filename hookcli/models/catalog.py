"""What models and weights there are, answered without torch: the listings, a model's family, and a ``--weights``
value checked against the model's weights names.

Read from :mod:`hookcli.models.registry`'s cache (torchvision) and from
:mod:`hookcli.models.sources` (the listed sources, which load their library
to list). :mod:`hookcli.models.loading` builds what this names.

>>> choice = choose_model("raft_small", "default")
>>> choice.family, choice.member
('optical_flow', 'DEFAULT')
"""

from __future__ import annotations

import difflib
import fnmatch
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from hookcli.errors import UnknownModelError, UnknownWeightsError, UsageProblem, check_choice
from hookcli.families import FAMILIES
from hookcli.models import sources
from hookcli.models.loaded import LoadedModel
from hookcli.models.registry import ModelEntry, model_registry
from hookcli.models.specs import LISTED_SOURCES, ModelSpec, check_model, check_weights, parse_model
from hookcli.models.weights import check_weights_file, looks_like_weights_path

__all__ = [
    "ModelChoice",
    "as_model",
    "choose_model",
    "describe_models",
    "list_models",
    "no_models_note",
    "registry_entry",
    "unknown_weights",
]


def as_model(model) -> str | LoadedModel:
    """A model as a run takes it: a name (or a factory's path), a :class:`~hookcli.models.loaded.LoadedModel`, or
    an ``nn.Module`` handed in, alone or with its preprocessing, made a loaded model that is given back as it came
    (:mod:`hookcli.models.sources.given`)."""
    if isinstance(model, os.PathLike):
        model = os.fspath(model)
    if not isinstance(model, str | LoadedModel) and "torch" in sys.modules:  # a module's holder has imported torch
        from hookcli.models.sources.given import is_handed_module, loaded_from_module

        model = loaded_from_module(model) if is_handed_module(model) else model
    if isinstance(model, type):
        raise UsageProblem(
            f"the model given is the class {model.__name__}, not a model built from it",
            hint=f"give one built: {model.__name__}(…)",
        )
    if not isinstance(model, str | LoadedModel):
        raise UsageProblem(
            "a model is a name, an nn.Module or a module and its preprocessing, and this is of type "
            f"{type(model).__name__}",
            hint="'hookcli models' lists the names",
        )
    return model


def list_models(family: str | None = None) -> list[str]:
    """Names of every model torchvision can build (of one ``family``), sorted (from :mod:`hookcli.models.registry`)."""
    return [name for name, entry in model_registry().items() if family in (None, entry.family)]


def describe_models(
    family: str | None = None, *, pattern: str | None = None, source: str = "torchvision"
) -> list[dict]:
    """Every model hookcli can load (of one ``family``, named like the glob ``pattern``) from ``source`` (one of
    :data:`hookcli.models.specs.LISTED_SOURCES`): ``{"model", "family", "default", "weights"}`` rows.

    >>> [row for row in describe_models("optical_flow")][0]["model"]
    'raft_large'
    >>> [row["model"] for row in describe_models(pattern="resnet1*")]
    ['resnet101', 'resnet152', 'resnet18']
    """

    if family is not None:
        check_choice("family", family, FAMILIES)
    check_choice("source", source, LISTED_SOURCES)
    if source != "torchvision":
        return [row for row in sources.list_source_models(source, pattern) if family in (None, row["family"])]
    return [
        {"model": name, "family": entry.family, "default": entry.default, "weights": list(entry.weights)}
        for name, entry in model_registry().items()
        if family in (None, entry.family) and (pattern is None or fnmatch.fnmatchcase(name, pattern))
    ]


def no_models_note(source: str, pattern: str | None, family: str | None) -> str:
    """Why :func:`describe_models` found nothing, in words, the same for every source but the local Hugging Face
    cache, whose note says where it is.

    >>> no_models_note("torchvision", "resnet9*", "video"), no_models_note("torchvision", None, None)
    ("no torchvision model matches 'resnet9*' and family video", 'torchvision lists no models')
    >>> no_models_note("torchvision", "mobilenet", None)
    "no torchvision model matches 'mobilenet' (a pattern matches whole names: '*mobilenet*' finds it within them)"
    """
    wanted = " and ".join(part for part in (pattern and f"'{pattern}'", family and f"family {family}") if part)
    own = sources.nothing_listed(source, wanted) if source in sources.LISTED else None
    said = own or (f"no {source} model matches {wanted}" if wanted else f"{source} lists no models")
    prefix, colon, rest = (pattern or "").partition(":")
    if colon and prefix in LISTED_SOURCES:  # the spelling --model takes
        return f"{said} (a source's models are listed with --source: hookcli models --source {prefix} '{rest or '*'}')"
    if pattern and not any(sign in pattern for sign in "*?["):
        return f"{said} (a pattern matches whole names: '*{pattern}*' finds it within them)"
    return said


@dataclass(frozen=True)
class ModelChoice:
    """A model name and its weights, checked once without torch (:func:`choose_model`): what
    :func:`hookcli.models.loading.build_model` builds, and what a run's request carries to it."""

    name: str
    family: str
    weights: str  # as given, stripped
    spec: ModelSpec | None = None  # a model from outside torchvision (its package found, its files there)
    member: str | None = None  # the member of a torchvision model's weights enum named; None for none or a path


def choose_model(name: str, weights: str) -> ModelChoice:
    """Model ``name`` with ``weights``, checked: an unknown model or weights name is refused from the registry cache,
    before torch is imported (see :mod:`hookcli.models.registry`), and so is a weights path that is missing, empty
    or not a regular file.

    A weights name is ``DEFAULT`` in any case, a member (``IMAGENET1K_V1``) or a qualified one
    (``ResNet18_Weights.IMAGENET1K_V1``). Models of other sources (:mod:`hookcli.models.sources`) are classification
    models (they take stacked images), with their weights checked as far as can be without their package
    (:func:`hookcli.models.specs.check_weights`).

    >>> choose_model("resnet18", "ResNet18_Weights.IMAGENET1K_V1").member, choose_model("resnet18", "none").member
    ('IMAGENET1K_V1', None)
    """
    spec = parse_model(name)
    text = weights.strip()
    if spec.source != "torchvision":
        check_model(spec)
        check_weights(spec, text)
        return ModelChoice(name, "classification", text, spec=spec)
    entry = registry_entry(name)
    return ModelChoice(name, entry.family, text, member=_weights_member(name, entry, text))


def _weights_member(name: str, entry: ModelEntry, weights: str) -> str | None:
    if weights.lower() == "none":
        return None
    if weights.upper() == "DEFAULT":
        return "DEFAULT"
    member = weights.removeprefix(entry.enum + ".")
    if member in entry.weights or member == "DEFAULT":
        return member
    if looks_like_weights_path(weights):
        check_weights_file(Path(weights))  # missing, empty or not a file: said before torch loads, too
        return None
    raise unknown_weights(name, weights, entry.weights)


def registry_entry(name: str) -> ModelEntry:
    """Model ``name``'s registry entry; an unknown name is refused with the closest ones."""
    registry = model_registry()
    if name in registry:
        return registry[name]
    closest = difflib.get_close_matches(name, list(registry), n=3, cutoff=0.0)
    raise UnknownModelError(
        f"unknown model '{name}' (closest: {', '.join(closest)})",
        hint="'hookcli models' lists every model",
    )


def unknown_weights(name: str, spec: str, known: tuple[str, ...]) -> UnknownWeightsError:
    available = ", ".join(["DEFAULT", *known, "none"])
    hint = (
        f"to load the file '{spec}' in the current folder, write it as ./{spec}"
        if os.path.isfile(spec)
        else "or pass a path to a .pth/.safetensors state dict"
    )
    return UnknownWeightsError(f"model '{name}' has no weights '{spec}' (available: {available})", hint=hint)
