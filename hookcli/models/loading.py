"""Build torchvision models of every family (:mod:`hookcli.families`) with the weights a user asks for.

Weights are given as one string:

- ``none`` (any case): random initialisation from ``seed``;
- ``DEFAULT`` (any case) or an enum name such as ``IMAGENET1K_V1`` (also the
  qualified ``VGG16_BN_Weights.IMAGENET1K_V1``): torchvision's pretrained
  weights, read from its cache under ``$TORCH_HOME/hub/checkpoints`` or
  downloaded there. These are always names, even when a file or folder of that
  name is in the current folder: write ``./DEFAULT`` to mean the file;
- a path, that is a string with a path separator or ending in ``.pth``, ``.pt``,
  ``.safetensors``, ``.bin`` or ``.ckpt`` (whether or not it exists), to a state
  dict. Wrappers such as ``{"state_dict": …}`` and ``module.``/``_orig_mod.``
  prefixes are unwrapped; pickles are read with ``weights_only=True`` so no code
  is ever run. Only a regular file is opened; an empty file, a file that holds
  no weights (text, an image, another zip) and tensors whose shapes do not fit
  the model are refused with an error that says which.

Anything else is an unknown weights name, and the error lists the known ones.

Set ``HOOKCLI_OFFLINE=1`` to refuse downloads (the missing-weights error then
says where to put the file).

>>> loaded = load_model("resnet18", "none", seed=0)
>>> loaded.preprocess.crop, loaded.weights, loaded.family
(224, {'source': 'none', 'seed': 0}, 'classification')
"""

from __future__ import annotations

import codecs
import contextlib
import difflib
import hashlib
import os
import pickle
import stat
import sys
import warnings
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from hookcli.errors import UnknownModelError, UnknownWeightsError, WeightsError, check_choice, first_line
from hookcli.families import FAMILIES, build_options
from hookcli.inputs.preprocess import Preprocess
from hookcli.models.registry import ModelEntry, model_registry
from hookcli.files import file_kind

__all__ = [
    "LoadedModel", "check_weights_file", "describe_models", "file_sha256", "file_weights", "fit_state_dict",
    "list_models", "hub_checkpoint_path", "load_model", "looks_like_weights_path", "model_family", "no_models_note",
    "num_classes", "resolve_weights", "seeded", "weights_cache_path",
]

_WEIGHT_FILE_SUFFIXES = (".pth", ".pt", ".safetensors", ".bin", ".ckpt")
_WRAPPER_KEYS = ("state_dict", "model_state_dict", "model", "module", "net", "ema")
_PREFIXES = ("module.", "_orig_mod.", "model.")
_WEIGHTS_FILE_HINT = (
    "give a complete file written by torch.save(model.state_dict(), path) or safetensors.torch.save_file"
)


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
    #: Where the model comes from (:data:`hookcli.models.sources.SOURCES`).
    source: str = "torchvision"
    #: Tokens a vision transformer puts before its patch tokens (class, registers); None for other models.
    prefix_tokens: int | None = None
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

    @property
    def preprocess_assumed(self) -> bool:
        """Whether ``preprocess`` is ImageNet's defaults, assumed for a model that gives none."""
        return self.assumed_because is not None

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
        return (f"{self.assumed_because}, so what --resize, --crop, --mean and --std do not set is ImageNet's "
                f"preprocessing ({', '.join(f'{name} {value}' for name, value in shown.items())})", *self.build_notes)


def list_models(family: str | None = None) -> list[str]:
    """Names of every model torchvision can build (of one ``family``), sorted (from :mod:`hookcli.models.registry`)."""
    return [name for name, entry in model_registry().items() if family in (None, entry.family)]


def describe_models(family: str | None = None, *, pattern: str | None = None, source: str = "torchvision"
                    ) -> list[dict]:
    """Every model hookcli can load (of one ``family``, named like the glob ``pattern``) from ``source`` (one of
    :data:`hookcli.models.sources.LISTED_SOURCES`): ``{"model", "family", "default", "weights"}`` rows.

    >>> [row for row in describe_models("optical_flow")][0]["model"]
    'raft_large'
    >>> [row["model"] for row in describe_models(pattern="resnet1*")]
    ['resnet101', 'resnet152', 'resnet18']
    """
    import fnmatch

    from hookcli.models.sources import LISTED_SOURCES, list_source_models

    if family is not None:
        check_choice("family", family, FAMILIES)
    check_choice("source", source, LISTED_SOURCES)
    if source != "torchvision":
        return [row for row in list_source_models(source, pattern) if family in (None, row["family"])]
    return [{"model": name, "family": entry.family, "default": entry.default, "weights": list(entry.weights)}
            for name, entry in model_registry().items() if family in (None, entry.family)
            and (pattern is None or fnmatch.fnmatchcase(name, pattern))]


def no_models_note(source: str, pattern: str | None, family: str | None) -> str:
    """Why :func:`describe_models` found nothing, in words (for the local Hugging Face cache, where it is)."""
    wanted = " and ".join(part for part in (pattern and f"'{pattern}'", family and f"family {family}") if part)
    if source == "hf":
        from huggingface_hub import constants

        return f"no model{' matching ' + wanted if wanted else ''} in the Hugging Face cache ({constants.HF_HUB_CACHE})"
    return f"no {source} model matches {wanted}"


def model_family(name: str) -> str:
    """The family of model ``name`` (an unknown name is refused), from the registry cache: no torch needed.

    Models of other sources (:mod:`hookcli.models.sources`) are classification models: they take stacked images.
    """
    spec = _other_source(name)
    return "classification" if spec is not None else _entry(name).family


def _other_source(name: str):
    """The :class:`~hookcli.models.sources.ModelSpec` of a model from outside torchvision (checked), else None."""
    from hookcli.models.sources import check_model, parse_model

    spec = parse_model(name)
    if spec.source == "torchvision":
        return None
    check_model(spec)
    return spec


def resolve_weights(name: str, weights: str) -> str | None:
    """The member of model ``name``'s weights enum that ``weights`` names, None for ``none`` or a path.

    A name is ``DEFAULT`` in any case, a member (``IMAGENET1K_V1``) or a qualified one
    (``ResNet18_Weights.IMAGENET1K_V1``). An unknown model or weights name is refused from the
    registry cache, before torch is imported (see :mod:`hookcli.models.registry`), and so is a weights
    path that is missing, empty or not a regular file.

    >>> resolve_weights("resnet18", "default"), resolve_weights("resnet18", "ResNet18_Weights.IMAGENET1K_V1")
    ('DEFAULT', 'IMAGENET1K_V1')

    Models of other sources have their weights checked as far as can be
    without their package (:func:`hookcli.models.sources.check_weights`), and give None.
    """
    spec = _other_source(name)
    if spec is not None:
        from hookcli.models.sources import check_weights

        check_weights(spec, weights)
        return None
    entry = _entry(name)
    spec = weights.strip()
    if spec.lower() == "none":
        return None
    if spec.upper() == "DEFAULT":
        return "DEFAULT"
    member = spec.removeprefix(entry.enum + ".")
    if member in entry.weights or member == "DEFAULT":
        return member
    if looks_like_weights_path(spec):
        check_weights_file(Path(spec))  # missing, empty or not a file: said before torch loads, too
        return None
    raise _unknown_weights(name, spec, entry.weights)


def _entry(name: str) -> ModelEntry:
    """Model ``name``'s registry entry; an unknown name is refused with the closest ones."""
    registry = model_registry()
    if name in registry:
        return registry[name]
    closest = difflib.get_close_matches(name, list(registry), n=3, cutoff=0.0)
    raise UnknownModelError(
        f"unknown model '{name}' (closest: {', '.join(closest)})",
        hint="'hookcli models' lists every model",
    )


def weights_cache_path(weights) -> Path:
    """Where torchvision keeps (or would download) a pretrained weights enum's file."""
    return hub_checkpoint_path(weights.url)


def hub_checkpoint_path(url: str) -> Path:
    """Where torch.hub keeps the file downloaded from ``url``: ``$TORCH_HOME/hub/checkpoints/<its name>``."""
    import torch.hub

    return Path(torch.hub.get_dir()) / "checkpoints" / os.path.basename(urlparse(url).path)


@contextlib.contextmanager
def seeded(seed: int):
    """Random initialisation inside the block draws from ``seed``; the global generator is left as it was."""
    import torch

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


def load_model(name: str, weights: str = "DEFAULT", *, seed: int = 0) -> LoadedModel:
    """Build model ``name`` in eval mode on the CPU with ``weights`` (see the module docs).

    ``timm:``, ``hf:``, ``open_clip:`` and factory names are built by :mod:`hookcli.models.sources`.
    """
    spec = _other_source(name)
    if spec is not None:
        from hookcli.models import sources

        return sources.load(spec, weights, seed=seed)
    member = resolve_weights(name, weights)  # before torch: a name that cannot be built is refused at once
    import torchvision.models

    weights_enum = torchvision.models.get_model_weights(name)
    family = model_family(name)
    spec = weights.strip()
    named = None if member is None else weights_enum[member]
    if spec.lower() == "none":
        module = _build_seeded(name, seed, **build_options(family, pretrained=False))
        described = {"source": "none", "seed": seed}
    elif named is not None:
        module = _build_pretrained(name, named, build_options(family, pretrained=True))
        described = {"source": "torchvision", "name": f"{type(named).__name__}.{named.name}"}
    else:
        module, described = _build_from_file(name, Path(spec), seed, build_options(family, pretrained=False))
    module.eval()
    from hookcli.models.sources import prefix_tokens

    return LoadedModel(
        name=name,
        module=module,
        weights=described,
        preprocess=Preprocess.from_transforms((weights_enum.DEFAULT if named is None else named).transforms()),
        categories=None if named is None else named.meta.get("categories"),
        family=family,
        prefix_tokens=prefix_tokens(module),
    )


def looks_like_weights_path(spec: str) -> bool:
    """Whether a ``--weights`` value that is not a weights name is a path: it has a separator or a weights suffix.

    Decided by the spelling alone, so that a file named like weights in the
    current folder cannot shadow them.
    """
    return "/" in spec or os.sep in spec or spec.lower().endswith(_WEIGHT_FILE_SUFFIXES)


def _unknown_weights(name: str, spec: str, known: tuple[str, ...]) -> UnknownWeightsError:
    available = ", ".join(["DEFAULT", *known, "none"])
    hint = (f"to load the file '{spec}' in the current folder, write it as ./{spec}" if os.path.isfile(spec)
            else "or pass a path to a .pth/.safetensors state dict")
    return UnknownWeightsError(f"model '{name}' has no weights '{spec}' (available: {available})", hint=hint)


def _build_seeded(name: str, seed: int, **kwargs):
    import torchvision.models

    with seeded(seed), warnings.catch_warnings():
        # googlenet and inception_v3 warn that their default init may change; the init used is unchanged.
        warnings.filterwarnings("ignore", message="The default weight initialization", category=FutureWarning)
        # Quantizing a model goes through torch.ao.quantization functions torch has marked as deprecated.
        warnings.filterwarnings("ignore", message="torch.quantize_per_", category=UserWarning)
        warnings.filterwarnings("ignore", message="torch.ao.quantization is deprecated", category=DeprecationWarning)
        return torchvision.models.get_model(name, weights=None, **kwargs)


def _build_pretrained(name: str, weights, options: dict):
    import torchvision.models

    cached = weights_cache_path(weights)
    if not cached.exists() and os.environ.get("HOOKCLI_OFFLINE", "") not in ("", "0"):
        raise WeightsError(
            f"pretrained weights {type(weights).__name__}.{weights.name} are not cached and "
            f"downloads are off (HOOKCLI_OFFLINE); place {weights.url} at {cached}",
            hint="or use --weights none for random weights",
        )
    try:
        # torch.hub announces a download on stdout, which carries only data here (-o - writes the file there).
        with contextlib.redirect_stdout(sys.stderr):
            return torchvision.models.get_model(name, weights=weights, **options)
    except Exception as err:  # download and unpickling failures come in many types
        if cached.exists():
            raise WeightsError(
                f"cached weights file {cached} cannot be loaded ({first_line(err)})",
                hint="delete it so it is downloaded again, or replace it with a good copy",
            ) from None
        raise WeightsError(
            f"cannot download pretrained weights {type(weights).__name__}.{weights.name} "
            f"({first_line(err)}); place {weights.url} at {cached}",
            hint="or use --weights none for random weights",
        ) from None


def _build_from_file(name: str, path: Path, seed: int, options: dict):
    state = read_state_dict(path)
    module = _build_seeded(name, seed, **options)
    num_classes = _checkpoint_num_classes(module, state)
    if num_classes is not None:
        module = _build_seeded(name, seed, num_classes=num_classes, **options)
    fit_state_dict(module, state, path, name)
    described = file_weights(path)
    if num_classes is not None:
        described["num_classes"] = num_classes
    return module, described


def file_weights(path: Path) -> dict:
    """The metadata's description of weights read from the file at ``path``."""
    return {"source": "file", "path": str(path.resolve()), "sha256": file_sha256(path)}


def fit_state_dict(module, state: dict, path: Path, name: str) -> None:
    """Load ``state`` (read from ``path``) into ``module``, refusing, with the first misfit named, one that does not
    fit it exactly."""
    # load_state_dict reports wrong shapes as one RuntimeError whose first line names nothing; check them first.
    expected = module.state_dict()
    misfits = [key for key, tensor in expected.items() if key in state and state[key].shape != tensor.shape]
    if misfits:
        key, more = misfits[0], (f" (and {len(misfits) - 1} more)" if len(misfits) > 1 else "")
        raise _does_not_fit(path, name, f"{key} is {list(state[key].shape)} in the file but "
                                        f"{list(expected[key].shape)} in the model{more}")
    for key, tensor in expected.items():
        if key in state and not _casts_faithfully(state[key].dtype, tensor.dtype):
            stored, wanted = (str(t.dtype).removeprefix("torch.") for t in (state[key], tensor))
            raise WeightsError(f"weights file '{path}' holds {key} as {stored} and the model takes {wanted}: hookcli "
                               f"does not cast {stored} into {wanted}",
                               hint="save the model's float weights (dequantized ones, for a quantized model)")
    result = module.load_state_dict(state, strict=False)
    problems = [*(f"missing {k}" for k in result.missing_keys), *(f"unexpected {k}" for k in result.unexpected_keys)]
    if problems:
        raise _does_not_fit(path, name, ", ".join(problems[:4]) + (
            f" and {len(problems) - 4} more" if len(problems) > 4 else ""))


def _casts_faithfully(stored, wanted) -> bool:
    """Whether a tensor stored as dtype ``stored`` holds the same numbers once loaded into a ``wanted`` one: a float
    into a float (half and bfloat16 files are common), an integer into an integer (counters). Not quantized integers
    or float8 into floats (scaled: the stored numbers are not the weights), nor booleans or complex numbers."""
    return stored == wanted or _number_kind(stored) is not None and _number_kind(stored) == _number_kind(wanted)


def _number_kind(dtype) -> str | None:
    """``float`` (16 bits or more), ``integer`` (a plain one, not quantized), or None for a dtype that only loads into
    itself."""
    import torch

    if dtype.is_floating_point and dtype.itemsize >= 2:
        return "float"
    return "integer" if dtype in (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64) else None


def _does_not_fit(path: Path, name: str, detail: str) -> WeightsError:
    return WeightsError(f"weights file '{path}' does not fit model '{name}': {detail}",
                        hint="check that it was saved from the same architecture")


def read_state_dict(path: Path) -> dict:
    """Read a state dict from a file, unwrapping common checkpoint layouts.

    Only a regular file is opened (opening a named pipe would wait for a writer forever). When the file does not
    load, its first bytes tell a file of another kind (text, an image, a zip) from a damaged weights file.
    """
    check_weights_file(path)
    import torch

    try:
        if path.suffix.lower() == ".safetensors":
            from safetensors.torch import load_file

            state = load_file(str(path))
        else:
            state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:
        raise _unreadable(path, err) from None
    return _unwrap(state, path)


def check_weights_file(path: Path) -> None:
    """Refuse a weights path that is missing, not a regular file, or empty, before anything opens it."""
    try:
        status = path.stat()
    except OSError:
        raise WeightsError(
            f"weights file not found: '{path}'", hint="check the path, or use --weights DEFAULT|none"
        ) from None
    if not stat.S_ISREG(status.st_mode):
        raise WeightsError(f"weights path '{path}' is not a regular file but {file_kind(status.st_mode)}",
                           hint="give the path of the .pth/.pt/.safetensors file itself")
    if status.st_size == 0:
        raise WeightsError(f"weights file '{path}' is empty", hint=_WEIGHTS_FILE_HINT)


def _unreadable(path: Path, err: Exception) -> WeightsError:
    # Told from the first bytes before reading torch's error: its weights-only unpickler fails on any non-pickle.
    from hookcli.models.sources import archive_kind

    archive = {"torchscript": "a TorchScript", "export": "a torch.export"}.get(archive_kind(path))
    if archive is not None:
        return WeightsError(f"weights file '{path}' is {archive} archive, not a state dict",
                            hint="save model.state_dict() of the model it came from")
    with open(path, "rb") as handle:
        kind = _kind_of_non_weights(path, handle.read(512))
    if kind is not None:
        return WeightsError(f"weights file '{path}' is {kind}", hint=_WEIGHTS_FILE_HINT)
    if isinstance(err, pickle.UnpicklingError) and "Weights only" in str(err):
        return WeightsError(
            f"cannot read weights file '{path}': it holds pickled objects other than tensors, which hookcli refuses "
            "to unpickle", hint="save a plain state_dict (torch.save(model.state_dict(), path))")
    return WeightsError(f"cannot read weights file '{path}': {first_line(err)}", hint=_WEIGHTS_FILE_HINT)


def _kind_of_non_weights(path: Path, head: bytes) -> str | None:
    """What a file that failed to load is, from its first bytes; None when it looks like weights (damaged inside)."""
    if head.startswith(b"\x89PNG\r\n\x1a\n"):
        return "a PNG image"
    if head.startswith(b"\xff\xd8\xff"):
        return "a JPEG image"
    if head[:4] in (b"PK\x03\x04", b"PK\x05\x06"):
        # torch.save writes a zip whose first entry is <name>/data.pkl; its name starts at byte 30 of the zip.
        first_entry = head[30:30 + int.from_bytes(head[26:28], "little")]
        if not first_entry.endswith(b"/data.pkl"):
            return "a zip archive but not a PyTorch checkpoint"
        return None if zipfile.is_zipfile(path) else "a truncated PyTorch checkpoint (its end is missing)"
    if _is_text(head):
        return "text"
    if head.startswith(b"\x80") or head[8:9] == b"{":  # a pickle (torch's legacy format) or a safetensors header
        return None
    return "not a PyTorch (.pth/.pt) or safetensors weights file"


def _is_text(head: bytes) -> bool:
    try:
        # The incremental decoder accepts a character cut in two at the end of head.
        text = codecs.getincrementaldecoder("utf-8")().decode(head)
    except UnicodeDecodeError:
        return False
    return all(char.isprintable() or char in "\t\n\r\f" for char in text)


def _unwrap(state: Any, path: Path) -> dict:
    import torch

    while isinstance(state, dict) and not all(isinstance(v, torch.Tensor) for v in state.values()):
        inner = next((state[k] for k in _WRAPPER_KEYS if isinstance(state.get(k), dict)), None)
        if inner is None:
            raise WeightsError(
                f"weights file '{path}' holds no state dict (top-level keys: {', '.join(map(str, list(state)[:6]))})",
                hint="save model.state_dict() or wrap it as {'state_dict': ...}",
            )
        state = inner
    if not isinstance(state, dict) or not state:
        raise WeightsError(f"weights file '{path}' holds no tensors", hint="save model.state_dict()")
    stripped = True
    while stripped:
        stripped = False
        for prefix in _PREFIXES:
            if all(k.startswith(prefix) for k in state):
                state = {k[len(prefix):]: v for k, v in state.items()}
                stripped = True
    return state


def num_classes(module) -> int:
    """How many classes a model tells apart: a classifier's logits (its last Linear or 1×1 Conv2d layer), a
    segmentation model's output channels, a detection model's classes (background included)."""
    import torch.nn as nn

    head = getattr(module, "head", None)
    classification_head = getattr(head, "classification_head", None)
    for found in (getattr(classification_head, "num_classes", None), getattr(classification_head, "num_columns", None),
                  getattr(getattr(getattr(getattr(module, "roi_heads", None), "box_predictor", None), "cls_score",
                                  None), "out_features", None)):
        if isinstance(found, int):
            return found
    last = [layer for layer in module.modules() if isinstance(layer, nn.Linear | nn.Conv2d)]
    return _out_size(last[-1])


def _checkpoint_num_classes(module, state: dict) -> int | None:
    """The class count of a fine-tuned checkpoint whose classifier differs from the default 1000."""
    import torch.nn as nn

    classifier = None
    for path, layer in module.named_modules():
        if isinstance(layer, nn.Linear | nn.Conv2d) and _out_size(layer) == 1000:
            classifier = path
    if classifier is None or f"{classifier}.weight" not in state:
        return None
    rows = state[f"{classifier}.weight"].shape[0]
    return rows if rows != 1000 else None


def _out_size(layer) -> int:
    return layer.out_features if hasattr(layer, "out_features") else layer.out_channels


def file_sha256(path: Path) -> str:
    """The SHA-256 of a file's bytes, read a MiB at a time."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
