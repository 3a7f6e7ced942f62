"""A model ready to run (:class:`LoadedModel`), whatever its source, and what can be read off its module.

>>> from hookcli.inputs.preprocess import Preprocess
>>> LoadedModel("m", None, {"source": "none"}, Preprocess(resize=256, crop=224), None).family
'classification'
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hookcli.inputs.preprocess import Preprocess

__all__ = [
    "LoadedModel",
    "out_size",
    "has_class_token",
    "prefix_tokens",
]


@dataclass
class LoadedModel:
    """A model ready to run, with what it needs to be described in metadata.

    ``weights`` is a JSON-able description (source and name, seed or file);
    ``preprocess`` is the default preprocessing for these weights (for random
    or local weights, that of the architecture's default weights); ``family``
    one of :data:`hookcli.families.FAMILIES`.
    """

    name: str
    module: Any
    weights: dict
    preprocess: Preprocess
    categories: list[str] | None
    family: str = "classification"
    #: Where the model comes from (:data:`hookcli.models.specs.SOURCES`).
    source: str = "torchvision"
    #: Tokens a vision transformer puts before its patch tokens (class, registers); None for other models.
    prefix_tokens: int | None = None
    #: Whether the first of those prefix tokens is a class token (False: a register, as in timm's ``*_reg*_gap``
    #: models); None when the model does not say.
    class_token: bool | None = None
    #: How many scores grad and cam choose targets among; None: counted from the model's last layer.
    classes: int | None = None
    #: The field of the model's output (a transformers ``ModelOutput``) that holds those scores: ``logits``,
    #: ``pooler_output``; ``embedding`` for an embedding tower; None when the output is a tensor of logits.
    scores: str | None = None
    #: What the user should know about how the model was built (a mode approximated), but for an assumed
    #: preprocessing.
    build_notes: tuple[str, ...] = ()
    #: Why ``preprocess`` is ImageNet's defaults, assumed for a model that gives none (``nets.py:make: the factory
    #: gives no preprocessing``); None when it is the model's own.
    assumed_because: str | None = None
    #: Whether a caller handed the model in, to be given back as it came after a run
    #: (:func:`hookcli.run.forwards.given_back`); False for one a run built for itself from a name.
    handed_in: bool = True

    @property
    def notes(self) -> tuple[str, ...]:
        """What the user should know about how the model was built, for a run that sets no preprocessing."""
        return self.notes_for({})

    def notes_for(self, given: Mapping[str, object]) -> tuple[str, ...]:
        """What the user should know about how the model was built, for a run given the options ``given`` (of
        ``resize``, ``crop``, ``mean`` and ``std``, those not None): an assumed preprocessing is said with the parts of
        it the run uses, and not at all when every part is given.

        >>> loaded = LoadedModel("m", None, {}, Preprocess(resize=256, crop=224), None, assumed_because="m: why")
        >>> note, = loaded.notes_for({"resize": 8, "crop": 8, "std": None})
        >>> note[note.index("("):]
        '(mean 0.485,0.456,0.406, std 0.229,0.224,0.225)'
        >>> loaded.notes_for({"resize": 8, "crop": 8, "mean": (0.5,) * 3, "std": (0.5,) * 3})
        ()
        """
        assumed = [name for name in ("resize", "crop", "mean", "std") if given.get(name) is None]
        if self.assumed_because is None or not assumed:
            return self.build_notes
        shown = {name: getattr(self.preprocess, name) for name in assumed}
        for name in {"mean", "std"} & set(assumed):
            shown[name] = ",".join(f"{v:g}" for v in shown[name])
        return (
            f"{self.assumed_because}, so what --resize, --crop, --mean and --std do not set is ImageNet's "
            f"preprocessing ({', '.join(f'{name} {value}' for name, value in shown.items())})",
            *self.build_notes,
        )


def out_size(layer) -> int:
    """A Linear layer's outputs, or a convolution's output channels."""
    return layer.out_features if hasattr(layer, "out_features") else layer.out_channels


def prefix_tokens(module) -> int | None:
    """How many tokens a vision transformer puts before its patch tokens (class, distillation, register tokens);
    None for a model that is not one.

    Read from the model: timm's ``num_prefix_tokens``, torchvision's
    ``class_token``, OpenCLIP's ``class_embedding``, and the embeddings'
    ``cls_token``, ``distillation_token`` and ``register_tokens`` of
    transformers models.
    """
    count = getattr(module, "num_prefix_tokens", None)
    if isinstance(count, int):
        return count
    if getattr(module, "class_token", None) is not None or getattr(module, "class_embedding", None) is not None:
        return 1
    base = getattr(module, "base_model", module)  # a transformers classifier's backbone (vit, deit, dinov2, …)
    holder = getattr(base, "embeddings", None)
    if holder is None:
        return None
    found = 0
    for name in ("cls_token", "distillation_token", "register_tokens", "class_embedding"):
        tensor = getattr(holder, name, None)
        if tensor is not None and hasattr(tensor, "dim"):
            found += 1 if tensor.dim() == 1 else tensor.shape[-2]  # CLIP's class embedding is one vector
    return found or None


def has_class_token(module) -> bool | None:
    """Whether a vision transformer's first token is a class token: timm's ``has_class_token`` or ``cls_token``
    (None in a model of registers alone); None where the model does not say."""
    said = getattr(module, "has_class_token", None)
    if isinstance(said, bool):
        return said
    if hasattr(module, "cls_token") and hasattr(module, "num_prefix_tokens"):  # timm's EVA and kin
        return module.cls_token is not None
    return None
