"""Models from outside torchvision: timm, Hugging Face transformers, OpenCLIP, and the user's own factories.

A ``--model`` value names its source by its spelling (:func:`parse_model`):

==========================  =========================================================================
``timm:NAME``               a timm model (``pip install "hookcli[timm]"``)
``hf:ORG/NAME``             a transformers vision model from the local Hugging Face cache
``hf:/path/to/folder``      one written by ``save_pretrained`` (a path: ``/``, ``./``, ``../`` or ``~``)
``open_clip:ARCH``          the image tower of an OpenCLIP model (``open_clip:/path/Config.json`` too)
``path/to/file.py:make``    ``make()`` from a Python file: it runs the user's code
``package.module:make``     ``make()`` from an importable module (the current folder is searched too)
anything else               a torchvision model name (:mod:`hookcli.models.loading`)
==========================  =========================================================================

Everything that can be said without torch is said by :func:`check_model`
and :func:`check_weights` (a missing file, a missing package, a weights name
the source has no use for); :func:`load` builds the model in eval mode on the
CPU as a :class:`~hookcli.models.loading.LoadedModel` whose ``name`` is the value as
given (a file factory's path made absolute), ``weights`` says where the
weights came from, and ``preprocess`` is the source's own preprocessing.

Nothing is downloaded: pretrained files come from the local caches, and a
missing one is named, with where to place it. A TorchScript or
``torch.export`` archive given as a model is refused: hooks cannot reach the
modules inside it.

>>> parse_model("timm:resnet50"), parse_model("hf:facebook/dinov2-small").source
(ModelSpec(source='timm', name='resnet50'), 'hf')
>>> parse_model("my_models.nets:small").source, parse_model("resnet18").source
('factory', 'torchvision')
>>> parse_model("hf:./export").label, parse_model("open_clip:ViT-B-32").label
('hf-export', 'open_clip-ViT-B-32')
"""

from __future__ import annotations

import contextlib
import errno
import fnmatch
import hashlib
import importlib
import importlib.util
import json
import logging
import math
import os
import re
import stat
import sys
import warnings
import zipfile
from dataclasses import dataclass
from pathlib import Path

from hookcli.errors import UnknownModelError, UnknownWeightsError, UsageProblem, WeightsError, first_line
from hookcli.models.loading import file_sha256, file_weights, hub_checkpoint_path, seeded
from hookcli.inputs.preprocess import MAX_SIDE
from hookcli.files import file_kind

__all__ = ["LISTED_SOURCES", "PREFIXES", "SOURCES", "ModelSpec", "SourceError", "archive_kind", "check_model",
           "check_weights", "list_source_models", "load", "parse_model", "prefix_tokens"]

#: Every source a model can come from; all but torchvision are named by a prefix or a ``:factory`` suffix.
SOURCES = ("torchvision", "timm", "hf", "open_clip", "factory")
#: The prefixes that name a source.
PREFIXES = ("timm", "hf", "open_clip")
#: The sources ``hookcli models --source`` lists (a factory is named by its file or module).
LISTED_SOURCES = ("torchvision", *PREFIXES)
#: The Python package each source needs, and the extra that installs it.
_PACKAGES = {"timm": ("timm", "timm"), "hf": ("transformers", "hf"), "open_clip": ("open_clip", "open_clip")}
_HF_RESAMPLE = {0: "nearest", 2: "bilinear", 3: "bicubic"}
_IDENTIFIER = r"[A-Za-z_][A-Za-z0-9_]*"
_FACTORY = re.compile(rf"^(?P<module>.+):(?P<function>{_IDENTIFIER})$")
_DOTTED = re.compile(rf"^{_IDENTIFIER}(\.{_IDENTIFIER})*$")
_HF_REPO = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*(/[A-Za-z0-9][A-Za-z0-9_.-]*)?$")


class SourceError(WeightsError):
    """A model of another source cannot be built here (its package is missing, its files are not cached, its
    factory failed); exit 1."""


@dataclass(frozen=True)
class ModelSpec:
    """A ``--model`` value split into its ``source`` (one of :data:`SOURCES`) and the ``name`` within it."""

    source: str
    name: str

    @property
    def text(self) -> str:
        """The value as a user writes it."""
        if self.source in PREFIXES:
            return f"{self.source}:{self.name}"
        return self.name

    @property
    def label(self) -> str:
        """A file-name-safe short form, for default output names: ``timm-resnet50``, ``hf-dinov2-small``."""
        if self.source == "torchvision":
            return self.name
        if self.source == "factory":
            module, function = self.name.rsplit(":", 1)
            return f"{Path(module).stem if module.endswith('.py') else module.rsplit('.', 1)[-1]}-{function}"
        tail = self.name.rstrip("/").rsplit("/", 1)[-1] if self.source == "hf" else self.name
        if self.source == "open_clip" and tail.endswith(".json"):
            tail = Path(tail).stem
        return f"{self.source}-{re.sub(r'[^A-Za-z0-9._-]+', '_', tail)}"

    @property
    def hf_folder(self) -> bool:
        """Whether an ``hf:`` name is a folder rather than a repository id."""
        return self.source == "hf" and _is_path(self.name)


def parse_model(text: str) -> ModelSpec:
    """The source and name of a ``--model`` value (see the module docs); nothing is imported or opened.

    A value that names no source is a torchvision model name; one that is a
    path to a file (a TorchScript, ``torch.export`` or weights file, say) is
    refused, saying what to give instead.
    """
    text = str(text).strip()
    prefix, colon, rest = text.partition(":")
    if colon and prefix in PREFIXES:
        if not rest.strip():
            raise UsageProblem(f"model '{text}' names no {prefix} model after '{prefix}:'",
                               hint=f"for example {prefix}:{_EXAMPLES[prefix]}")
        return ModelSpec(prefix, rest.strip())
    factory = _FACTORY.match(text)
    if factory and (factory["module"].endswith(".py") or _DOTTED.match(factory["module"])):
        return ModelSpec("factory", text)
    if colon and (prefix.lower() in ("torchvision", "tv", "open-clip", "openclip", "huggingface", "transformers")):
        raise UsageProblem(f"unknown model source '{prefix}:' in '{text}'",
                           hint="use timm:, hf:, open_clip:, a factory (file.py:function) or a torchvision name")
    if _is_path(text) or os.sep in text or "/" in text or text.lower().endswith(_ARCHIVE_SUFFIXES):
        raise _model_file_refusal(text)
    return ModelSpec("torchvision", text)


_EXAMPLES = {"timm": "resnet50", "hf": "facebook/dinov2-small", "open_clip": "ViT-B-32"}
_ARCHIVE_SUFFIXES = (".pt", ".pth", ".pt2", ".ts", ".jit", ".torchscript", ".safetensors", ".bin", ".ckpt",
                     ".onnx", ".zip", ".py")


def _is_path(text: str) -> bool:
    return text.startswith(("/", "./", "../", "~", ".\\", "..\\")) or text in (".", "..")


def _model_file_refusal(text: str) -> UsageProblem:
    """Why a file cannot be a ``--model``, from what it holds: TorchScript, torch.export, weights, or code."""
    path = Path(text).expanduser()
    kind = archive_kind(path)
    if kind == "torchscript":
        return UsageProblem(
            f"'{text}' is a TorchScript archive: its modules are compiled code that forward hooks cannot reach",
            hint="give the Python model it was scripted from (timm:NAME, a torchvision name, or file.py:factory) and "
                 "its weights with --weights state_dict.pth")
    if kind == "export":
        return UsageProblem(
            f"'{text}' is a torch.export archive: its graph has no modules for hooks to reach",
            hint="give the Python model it was exported from (timm:NAME, a torchvision name, or file.py:factory) "
                 "and its weights with --weights state_dict.pth")
    if text.endswith(".py"):
        return UsageProblem(f"'{text}' is a Python file but names no function to call",
                            hint=f"write {text}:FUNCTION, where FUNCTION() returns the nn.Module")
    if kind == "weights" or text.lower().endswith((".pth", ".pt", ".safetensors", ".bin", ".ckpt")):
        return UsageProblem(f"'{text}' is a weights file, not a model",
                            hint=f"name the architecture with --model and pass the file as --weights {text}")
    return UsageProblem(f"model '{text}' is a path, and a model is named, not opened",
                        hint="use a torchvision name, timm:NAME, hf:ORG/NAME or hf:/folder, open_clip:ARCH, or "
                             "file.py:factory ('hookcli models' lists the torchvision ones)")


def archive_kind(path: Path) -> str | None:
    """What a file given as a model or weights is, by the layout of its zip: ``torchscript``, ``export``,
    ``weights``, or None (not a zip we know, or not a regular file)."""
    try:
        if not path.is_file():
            return None
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
    except (OSError, zipfile.BadZipFile):
        return None
    parts = {name.split("/", 1)[1] if "/" in name else name for name in names}
    if any(p.startswith("code/") for p in parts) or "constants.pkl" in parts:
        return "torchscript"
    if any(p.startswith(("models/", "serialized_exported_program", "archive_format")) for p in parts) or \
            any("exported_program" in name for name in names):
        return "export"
    if "data.pkl" in parts:
        return "weights"
    return None


# -- checks before torch -------------------------------------------------------------------------------------


def check_model(spec: ModelSpec) -> None:
    """Refuse, without importing torch, a model that cannot be built: its package is not installed, its file or
    folder is missing, a factory's module cannot be found."""
    if spec.source in _PACKAGES:
        package, extra = _PACKAGES[spec.source]
        if importlib.util.find_spec(package) is None:
            raise SourceError(f"{spec.source}: models need the {package} package, which is not installed",
                              hint=f'pip install "hookcli[{extra}]"')
    if spec.hf_folder:
        folder = Path(spec.name).expanduser()
        config = _not_regular(folder / "config.json")
        if config is not None:
            what = ("not a folder" if not folder.is_dir() else "a folder without config.json" if config == _MISSING
                    else f"a folder whose config.json {config}")
            raise UsageProblem(f"'{spec.name}' (from {spec.text}) is {what}",
                               hint="give a folder written by save_pretrained, or hf:ORG/NAME from the cache")
    elif spec.source == "hf" and not _HF_REPO.match(spec.name):
        raise UsageProblem(f"'{spec.name}' is not a Hugging Face model id",
                           hint="write hf:ORG/NAME, or hf:/path/to/folder (hf:./folder for a relative one)")
    if spec.source == "open_clip" and spec.name.startswith("hf-hub:"):
        raise UsageProblem(f"{spec.text}: OpenCLIP fetches hf-hub: models from the Hub itself, and hookcli does "
                           "not download", hint="give the architecture's name (open_clip:ViT-B-32) and a pretrained "
                           "tag, or its JSON config (open_clip:/path/Config.json) and --weights FILE")
    if spec.source == "open_clip" and spec.name.endswith(".json"):
        what = _not_regular(Path(spec.name).expanduser())
        if what is not None:
            raise UsageProblem(f"OpenCLIP model config '{spec.name}' {what}", hint="check the path")
    if spec.source == "factory":
        module, _ = spec.name.rsplit(":", 1)
        if module.endswith(".py"):
            what = _not_regular(Path(module).expanduser())
            if what is not None:
                raise UsageProblem(f"factory file '{module}' {what}", hint="check the path of --model FILE.py:FUNC")
        elif _find_module(module) is None:
            raise UsageProblem(f"no Python module '{module}' (for the factory {spec.name})",
                               hint="install it, or run hookcli from the folder that holds it")


_MISSING = "not found"


def _not_regular(path: Path) -> str | None:
    """None for a regular file (links followed); else why ``path`` cannot be read as one, said after its name:
    :data:`_MISSING`, ``is a symbolic link loop``, ``is a FIFO (named pipe), not a regular file``… (reading a FIFO
    would wait forever for a writer)."""
    try:
        mode = path.stat().st_mode
    except OSError as err:
        if err.errno == errno.ELOOP:
            return "is a symbolic link loop"
        return _MISSING if err.errno in (errno.ENOENT, errno.ENOTDIR) else f"cannot be looked at ({err.strerror})"
    return None if stat.S_ISREG(mode) else f"is {file_kind(mode)}, not a regular file"


def _find_module(name: str):
    _search_current_folder()
    try:
        return importlib.util.find_spec(name)
    except Exception:  # a parent package that is not one, or whose __init__ fails: said when it is imported
        return None


def _search_current_folder() -> None:
    """Modules of the current folder import as they would under ``python -m``: an installed script lacks it."""
    here = os.getcwd()
    if here not in sys.path and "" not in sys.path:
        sys.path.append(here)


def check_weights(spec: ModelSpec, weights: str) -> None:
    """Refuse, without torch, weights a source has no use for (see :func:`load` for what each takes)."""
    from hookcli.models.loading import check_weights_file, looks_like_weights_path

    text = weights.strip()
    if text.lower() in ("none", "default"):
        return
    if looks_like_weights_path(text):
        check_weights_file(Path(text))
        return
    if spec.source in ("timm", "open_clip"):
        return  # a pretrained tag: known once the package is imported
    hint = "use DEFAULT (the model's own), none (random) or a path to a state dict"
    raise UnknownWeightsError(f"{spec.text} takes no weights name '{text}'", hint=hint)


# -- loading ------------------------------------------------------------------------------------------------


def load(spec: ModelSpec, weights: str, *, seed: int = 0):
    """Build ``spec``'s model with ``weights``, as a :class:`~hookcli.models.loading.LoadedModel`.

    ``weights`` is ``none`` (random, from ``seed``), ``DEFAULT`` (timm's and
    OpenCLIP's default pretrained tag, the Hugging Face checkpoint, whatever
    a factory returns), a pretrained tag (timm: ``in1k`` or
    ``resnet50.a1_in1k``; OpenCLIP: ``laion2b_s34b_b79k``), or a path to a
    state dict loaded into the model.
    """
    check_model(spec)
    check_weights(spec, weights)
    loader = {"timm": _load_timm, "hf": _load_hf, "open_clip": _load_open_clip, "factory": _load_factory}
    if spec.source not in loader:
        raise UsageProblem(f"{spec.text} is a torchvision model", hint="load it with hookcli.load_model")
    with _quiet(), _offline():
        return loader[spec.source](spec, weights.strip(), seed)


@contextlib.contextmanager
def _offline():
    """The Hugging Face hub offline for the block, whatever the environment says: timm and OpenCLIP read pretrained
    files through it, and would otherwise ask the Hub for a newer revision."""
    try:
        from huggingface_hub import constants
    except ImportError:  # a factory's model needs no hub
        yield
        return
    before, environment = constants.HF_HUB_OFFLINE, os.environ.get("HF_HUB_OFFLINE")
    constants.HF_HUB_OFFLINE = True
    os.environ["HF_HUB_OFFLINE"] = "1"
    try:
        yield
    finally:
        constants.HF_HUB_OFFLINE = before
        if environment is None:
            os.environ.pop("HF_HUB_OFFLINE", None)
        else:
            os.environ["HF_HUB_OFFLINE"] = environment


@contextlib.contextmanager
def _quiet():
    """Libraries announce downloads, progress and random init on stdout and through logging; stdout carries data."""
    logger = logging.getLogger()
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stdout(sys.stderr), warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            yield
    finally:
        logger.setLevel(level)


def _loaded(spec: ModelSpec, module, described: dict, preprocess, **fields):
    from hookcli.models.loading import LoadedModel

    module.eval()
    fields.setdefault("categories", None)
    return LoadedModel(name=_recorded_name(spec), module=module,
                       weights=described, preprocess=preprocess, family="classification", source=spec.source,
                       prefix_tokens=prefix_tokens(module), **fields)


def _from_file(spec: ModelSpec, module, path: Path, part: str = "") -> dict:
    """Load a state-dict file into ``module`` (shapes checked first); its description for the metadata.

    ``part``: a prefix (``visual.``) whose entries are the module's, when the file holds a whole model of which
    ``module`` is one tower.
    """
    from hookcli.models.loading import fit_state_dict, read_state_dict

    state = read_state_dict(path)
    if part and any(key.startswith(part) for key in state):
        state = {key[len(part):]: value for key, value in state.items() if key.startswith(part)}
    fit_state_dict(module, state, path, spec.text)
    return file_weights(path)


# timm


def _load_timm(spec: ModelSpec, weights: str, seed: int):
    import timm
    import timm.data

    name, _, tag = spec.name.partition(".")
    if not timm.is_model(name):
        raise _unknown(spec, timm.list_models(), "hookcli models --source timm")
    from hookcli.models.loading import looks_like_weights_path

    pretrained = weights.lower() != "none" and not looks_like_weights_path(weights)
    if pretrained and tag and weights.lower() != "default" and weights.removeprefix(name + ".") != tag:
        raise UsageProblem(f"{spec.text} names the tag '{tag}', and --weights names another, '{weights}'",
                           hint=f"name the tag once: timm:{name} -w {weights}, or timm:{spec.name}")
    if pretrained:
        wanted = weights if weights.lower() != "default" else tag
        full = _timm_tag(spec, name, wanted)
        config = timm.models.get_pretrained_cfg(full)
        _require_timm_files(spec, full, config)
        try:
            module = timm.create_model(full, pretrained=True)
        except Exception as err:
            raise SourceError(f"cannot load pretrained {spec.text} ({full}): {first_line(err)}",
                              hint="replace the cached files, or use --weights none") from None
        described = {"source": "timm", "name": full}
    else:
        if tag and f"{name}.{tag}" not in (timm.list_pretrained(f"{name}.*") or []):
            raise UnknownWeightsError(f"{spec.text} names the pretrained tag '{tag}', which timm does not have",
                                      hint=f"write timm:{name}, or a tag 'hookcli models --source timm {name}' lists")
        with seeded(seed):
            module = timm.create_model(name, pretrained=False)
        described = {"source": "none", "seed": seed} if weights.lower() == "none" else _from_file(
            spec, module, Path(weights))
    categories = None
    if pretrained:
        with contextlib.suppress(Exception):  # label names ship with timm for ImageNet subsets
            subset = timm.data.infer_imagenet_subset(module)
            labels = timm.data.ImageNetInfo(subset).label_descriptions() if subset else None
            categories = [d.split(",")[0] for d in labels] if labels else None
    preprocess, notes = _timm_preprocess(timm.data.resolve_model_data_config(module))
    return _loaded(spec, module, described, preprocess, categories=categories, build_notes=notes,
                   classes=getattr(module, "num_classes", None) or None)


def _timm_tag(spec: ModelSpec, name: str, wanted: str) -> str:
    """``name.tag`` for a tag given alone or in full; the model's default tag for an empty one."""
    import timm

    tags = timm.list_pretrained(f"{name}.*") or timm.list_pretrained(name)
    if not wanted:
        if not tags:
            raise UnknownWeightsError(f"{spec.text} has no pretrained weights in timm",
                                      hint="use --weights none, or a path to a state dict")
        return f"{name}.{_timm_default_tag(name)}"
    full = wanted if wanted.startswith(name + ".") else f"{name}.{wanted}"
    if full not in tags:
        known = ", ".join(t.split(".", 1)[1] for t in tags[:8] if "." in t) + (
            f" and {len(tags) - 8} more" if len(tags) > 8 else "")
        raise UnknownWeightsError(f"{spec.text} has no pretrained tag '{wanted}' (timm has: {known or 'no tags'})",
                                  hint="use DEFAULT, a listed tag, none, or a path to a state dict")
    return full


def _timm_default_tag(name: str) -> str | None:
    """The pretrained tag timm loads for ``name`` alone (its first, not the first in sorted order)."""
    import timm

    config = timm.models.get_pretrained_cfg(name)
    return getattr(config, "tag", None) if config is not None else None


def _require_timm_files(spec: ModelSpec, full: str, config) -> None:
    """Refuse, naming the file and where to place it, timm weights that are not in the local caches."""
    hub_id = getattr(config, "hf_hub_id", None)
    if hub_id:
        repo, filename = hub_id.rstrip("/"), getattr(config, "hf_hub_filename", None)
        names = [filename] if filename else ["model.safetensors", "open_clip_pytorch_model.bin", "pytorch_model.bin"]
        if not any(_hub_cached(repo, n) for n in names):
            raise _not_cached(spec, repo, names[0])
        return
    url = getattr(config, "url", None)
    if url:
        cached = hub_checkpoint_path(url)
        if not cached.is_file():
            raise SourceError(f"pretrained weights of {spec.text} ({full}) are not cached, and hookcli does not "
                              f"download: place {url} at {cached}", hint="or use --weights none")
        return
    raise UnknownWeightsError(f"{full} has no pretrained files to load", hint="use --weights none or a file")


def _timm_preprocess(config: dict):
    """timm's evaluation transform (``transforms_imagenet_eval``) as a :class:`~hookcli.inputs.preprocess.Preprocess`."""
    from hookcli.inputs.preprocess import INTERPOLATIONS, Preprocess

    notes = []
    height, width = config["input_size"][-2:]
    crop_pct = config.get("crop_pct") or 0.875
    mode = config.get("crop_mode") or "center"
    interpolation = config.get("interpolation", "bilinear")
    if interpolation not in INTERPOLATIONS:
        notes.append(f"timm's '{interpolation}' interpolation is taken as bicubic")
        interpolation = "bicubic"
    if height != width:
        notes.append(f"the model takes {height}x{width} inputs; hookcli crops squares of {height}")
    scale = math.floor(height / crop_pct)
    if mode == "border":
        notes.append("timm's 'border' crop mode (pad to keep the whole image) is taken as 'center'")
    resize = (scale, scale) if mode == "squash" else scale
    return Preprocess(resize=resize, crop=height, mean=tuple(config["mean"]), std=tuple(config["std"]),
                      interpolation=interpolation), tuple(notes)


# Hugging Face


def _load_hf(spec: ModelSpec, weights: str, seed: int):
    import transformers

    logs = transformers.utils.logging
    verbosity, bars = logs.get_verbosity(), logs.is_progress_bar_enabled()
    logs.disable_progress_bar()  # its bars and warnings go to stderr, where hookcli's notes go
    logs.set_verbosity_error()
    try:
        return _load_hf_quietly(spec, weights, seed)
    finally:
        logs.set_verbosity(verbosity)
        if bars:
            logs.enable_progress_bar()


def _load_hf_quietly(spec: ModelSpec, weights: str, seed: int):
    import torch
    import transformers

    source = str(Path(spec.name).expanduser()) if spec.hf_folder else spec.name
    _check_hf_sizes(spec, Path(source) / "config.json" if spec.hf_folder else _hub_file(spec.name, "config.json"))
    try:
        config = transformers.AutoConfig.from_pretrained(source, local_files_only=True)
    except Exception as err:
        if spec.hf_folder:
            raise SourceError(f"cannot read the config of {spec.text}: {first_line(err)}",
                              hint="give a folder written by save_pretrained") from None
        raise _not_cached(spec, spec.name, "config.json") from None
    architectures = getattr(config, "architectures", None)
    architectures = [a for a in architectures if isinstance(a, str)] if isinstance(architectures, list) else []
    classifier = any("ForImageClassification" in a for a in architectures)  # …WithTeacher too
    auto = transformers.AutoModelForImageClassification if classifier else transformers.AutoModel
    from hookcli.models.loading import looks_like_weights_path

    if weights.lower() == "default":
        if not spec.hf_folder and not _hub_has_weights(spec.name):
            raise _not_cached(spec, spec.name, "model.safetensors")
        try:
            module = auto.from_pretrained(source, config=config, local_files_only=True, dtype=torch.float32)
        except Exception as err:
            raise SourceError(f"cannot load the weights of {spec.text}: {first_line(err)}",
                              hint="replace the files, or use --weights none") from None
        described = _hf_described(spec)
    else:
        try:
            with seeded(seed):
                module = auto.from_config(config, dtype=torch.float32)
        except Exception as err:
            raise SourceError(f"cannot build {spec.text} from its config: {first_line(err)}",
                              hint="check the folder's config.json") from None
        described = {"source": "none", "seed": seed} if not looks_like_weights_path(weights) else _from_file(
            spec, module, Path(weights))
    module = _vision_part(spec, module)
    preprocess, assumed_because = _hf_preprocess(spec, source, config)
    labels = getattr(config, "id2label", None)
    labels = labels if isinstance(labels, dict) else {}
    named = classifier and labels and not all(re.fullmatch(r"LABEL_\d+", str(v)) for v in labels.values()) and \
        set(labels) == set(range(len(labels)))
    categories = [str(labels[i]) for i in range(len(labels))] if named else None  # the config's, whatever weights
    scores, classes = _hf_scores(config, classifier)
    return _loaded(spec, module, described, preprocess, categories=categories, classes=classes, scores=scores,
                   assumed_because=assumed_because)


#: The most a transformers config may say of each size, far above any vision model's (or its text tower's): torch
#: would allocate what one more digit asks for until memory runs out, and transformers writes out a label for each
#: of num_labels before anything is built.
_HF_SIZE_LIMITS = {
    "num_hidden_layers": 1024, "num_layers": 1024, "depths": 1024, "hidden_size": 16384, "hidden_sizes": 16384,
    "embed_dim": 16384, "projection_dim": 16384, "intermediate_size": 131072, "num_attention_heads": 1024,
    "num_heads": 1024, "image_size": MAX_SIDE, "patch_size": MAX_SIDE, "num_channels": 1024, "num_labels": 1_000_000,
    "vocab_size": 1_000_000, "max_position_embeddings": 1_000_000,
}
#: The most entries a list of sizes (``depths``: one per stage) may have, and the largest config.json read.
_HF_LIST_LIMIT, _HF_CONFIG_BYTES = 64, 64 << 20


def _check_hf_sizes(spec: ModelSpec, path: Path | None) -> None:
    """Refuse a config.json that asks for a model no machine holds, naming the field, before transformers reads it
    (what it cannot parse, transformers says)."""
    if path is None or _not_regular(path) is not None:
        return
    if path.stat().st_size > _HF_CONFIG_BYTES:
        raise UsageProblem(f"{spec.text}: its config.json is {path.stat().st_size:,} bytes, more than a model's config "
                           f"holds (at most {_HF_CONFIG_BYTES >> 20} MiB)", hint="check the model's config.json")
    try:
        settings = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    found = _oversized(settings, "")
    if found is not None:
        said, limit = found
        raise UsageProblem(f"{spec.text}: its config.json says {said}, more than hookcli builds (at most {limit:,})",
                           hint="check the model's config.json")


def _oversized(settings, where: str) -> tuple[str, int] | None:
    """The first size field (of ``settings`` and the configs nested in it, such as vision_config) above its limit
    in :data:`_HF_SIZE_LIMITS`: ``(its dotted name and value, the limit)``."""
    if not isinstance(settings, dict) or where.count(".") > 3:
        return None
    for key, value in settings.items():
        field = f"{where}{key}"
        if isinstance(value, dict):
            found = _oversized(value, field + ".")
            if found is not None:
                return found
        limit = _HF_SIZE_LIMITS.get(key)
        if limit is None:
            continue
        if isinstance(value, list) and len(value) > _HF_LIST_LIMIT:
            return f"{field} with {len(value):,} entries", _HF_LIST_LIMIT
        for number in value if isinstance(value, list) else [value]:
            if isinstance(number, int | float) and not isinstance(number, bool) and not number <= limit:
                return f"{field} {json.dumps(value)[:60]}", limit  # NaN included: no size
    return None


def _vision_part(spec: ModelSpec, module):
    """A CLIP-like model's vision tower (its forward takes text first); the model itself otherwise."""
    import inspect

    parameters = list(inspect.signature(module.forward).parameters)
    if parameters and parameters[0] == "pixel_values":
        return module
    tower = getattr(module, "vision_model", None)
    if tower is not None:
        return tower
    raise UsageProblem(f"{spec.text} does not take images first (its forward takes {parameters[0]})",
                       hint="give a vision model (ViT, DINOv2, Swin, ConvNeXt, CLIP…)")


def _hf_scores(config, classifier: bool) -> tuple[str, int | None]:
    """Which output field grad and cam take scores from, and how many there are: a classifier's logits, else the
    pooled output backbones return (ViT, DINOv2, CLIP's vision tower, ConvNeXt, Swin)."""
    if classifier:
        return "logits", int(config.num_labels)
    config = getattr(config, "vision_config", None) or config
    size = getattr(config, "hidden_size", None) or (getattr(config, "hidden_sizes", None) or [None])[-1]
    return "pooler_output", size


def _hf_described(spec: ModelSpec) -> dict:
    if spec.hf_folder:
        folder = Path(spec.name).expanduser().resolve()
        files = sorted(p for p in folder.iterdir() if p.suffix in (".safetensors", ".bin") and p.is_file())
        digest = hashlib.sha256()
        for path in files:
            digest.update(f"{path.name}:{file_sha256(path)}\n".encode())
        return {"source": "folder", "path": str(folder), "sha256": digest.hexdigest()}
    found = _hub_file(spec.name, "config.json")  # …/snapshots/<revision>/config.json
    return {"source": "hf", "repo": spec.name, "revision": found.parent.name if found is not None else None}


def _hf_preprocess(spec: ModelSpec, source: str, config):
    """``(preprocessing, why it is assumed)``: the image processor's settings as a
    :class:`~hookcli.inputs.preprocess.Preprocess` and None, or ImageNet's preprocessing at the model ``config``'s image
    size and why, when there are no settings to use."""
    # transformers writes an image processor's settings alone, or (a processor of several parts) under its key.
    for name, part in (("preprocessor_config.json", None), ("processor_config.json", "image_processor")):
        try:
            text = _folder_or_hub_text(spec, source, name)
            if text is None:
                continue
            settings = json.loads(text)
            if part is not None:
                settings = settings.get(part) if isinstance(settings, dict) else None
                if settings is None:
                    continue  # a processor of text alone
            return _processor_steps(settings), None
        except Exception as err:  # an untrusted file: any content at all
            reason = f"its {name} cannot be used ({first_line(err)[:200]})"
            break
    else:
        reason = "it has no preprocessor_config.json"
    return _assumed(spec, reason, _image_size(config))


def _folder_or_hub_text(spec: ModelSpec, source: str, name: str) -> str | None:
    """The text of file ``name`` of the model's folder or cached repository, None when it has none; ValueError
    or OSError when it is there but cannot be read as text."""
    path = Path(source) / name if spec.hf_folder else _hub_file(spec.name, name)
    what = _MISSING if path is None else _not_regular(path)
    if what == _MISSING:
        return None
    if what is not None:
        raise ValueError(f"it {what}")
    return path.read_text(encoding="utf-8")


def _image_size(config) -> int | None:
    """The side of the square images a transformers config (or its vision part) says the model takes, if it says
    one (the config is the folder's, so untrusted)."""
    size = getattr(getattr(config, "vision_config", None) or config, "image_size", None)
    if isinstance(size, list) and len(size) == 2 and size[0] == size[1]:
        size = size[0]
    return size if isinstance(size, int) and not isinstance(size, bool) and 1 <= size <= 8192 else None


def _processor_steps(config: dict):
    """Resize (shortest edge, or to an exact height and width), centre crop, rescale, normalise; ValueError naming
    the field that cannot be used (the file is untrusted: any value at all)."""
    from hookcli.inputs.preprocess import Preprocess

    if not isinstance(config, dict):
        raise ValueError("it is not a JSON object")
    size = config.get("size") or {}
    if isinstance(size, int | float) and not isinstance(size, bool):
        size = {"shortest_edge": size}
    if not isinstance(size, dict):
        raise ValueError(f"its size {size!r} is not a number or an object")
    crop = config.get("crop_size") if config.get("do_center_crop") else None
    if isinstance(crop, dict):
        if crop.get("height") != crop.get("width"):
            raise ValueError(f"its crop_size {crop} is not square")
        crop = _pixels(crop.get("height"), "crop_size.height")
    elif crop is not None:
        crop = _pixels(crop, "crop_size")
    resize = None
    if config.get("do_resize", True):
        if "shortest_edge" in size:
            resize = _pixels(size["shortest_edge"], "size.shortest_edge")
            crop_pct = config.get("crop_pct")
            if crop_pct is not None and (isinstance(crop_pct, bool) or not isinstance(crop_pct, int | float)
                                         or not 0 < crop_pct <= 1):  # NaN fails it too
                raise ValueError(f"its crop_pct {crop_pct!r} is not a fraction above 0 and at most 1")
            if crop_pct is not None and resize < 384:  # ConvNeXt: resize larger, then crop
                crop, resize = resize, _pixels(int(resize / crop_pct), "size.shortest_edge divided by crop_pct")
            elif crop_pct is not None:  # ConvNeXt from 384 pixels on: squashed, not cropped
                crop, resize = None, (resize, resize)
        elif "height" in size and "width" in size:
            resize = (_pixels(size["height"], "size.height"), _pixels(size["width"], "size.width"))
        else:
            raise ValueError(f"its size {size} is neither a shortest edge nor a height and width")
    if resize is None or isinstance(resize, int) and crop is None:
        raise ValueError("it does not resize to a fixed size")
    if config.get("do_rescale", True):
        factor = config.get("rescale_factor", 1 / 255)
        if isinstance(factor, bool) or not isinstance(factor, int | float) or not abs(factor - 1 / 255) <= 1e-9:
            raise ValueError(f"its rescale_factor {factor!r} is not 1/255")
    normalise = config.get("do_normalize", True)
    mean = _normalisation(config, "image_mean") if normalise else None
    std = _normalisation(config, "image_std") if normalise else None
    resample = config.get("resample", 2)
    if resample not in _HF_RESAMPLE:
        raise ValueError(f"its resample {resample!r} is none of nearest (0), bilinear (2) and bicubic (3)")
    interpolation = _HF_RESAMPLE[resample]
    return Preprocess(resize=resize, crop=crop, mean=mean, std=std, interpolation=interpolation)


def _pixels(value, field: str) -> int:
    """A processor file's side ``value`` as a whole number of pixels; ValueError naming ``field`` if it is not one."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 1 <= value <= MAX_SIDE or \
            value != int(value):  # NaN and infinities fail the range
        raise ValueError(f"its {field} {value!r} is not a whole number of pixels from 1 to {MAX_SIDE}")
    return int(value)


def _normalisation(config: dict, field: str) -> tuple[float, float, float]:
    """A processor file's ``image_mean`` or ``image_std``: one or three finite numbers (a std's above 0)."""
    from hookcli.inputs.preprocess import parse_triple

    if field not in config:
        raise ValueError(f"it has no {field}")
    value = config[field]
    try:
        numbers = parse_triple(value)
    except ValueError:
        raise ValueError(f"its {field} {value!r} is not one or three numbers") from None
    if not all(math.isfinite(v) and (v > 0 or field == "image_mean") for v in numbers):
        raise ValueError(f"its {field} {value!r} is not " + (
            "finite numbers" if field == "image_mean" else "finite numbers above 0"))
    return numbers


def _assumed(spec: ModelSpec, why: str, side: int | None = None):
    """ImageNet's preprocessing, for a model that gives none: resize 256 and crop 224, or in that proportion for a
    model made for ``side`` pixels; and why it is assumed (said with the parts a run uses,
    :meth:`~hookcli.models.loading.LoadedModel.notes_for`)."""
    from hookcli.inputs.preprocess import Preprocess

    crop = side or 224
    return Preprocess(resize=int(crop * 256 / 224), crop=crop), f"{spec.text}: {why}"  # mean and std: ImageNet's


def _hub_cached(repo: str, filename: str) -> bool:
    return _hub_file(repo, filename) is not None


def _hub_file(repo: str, filename: str) -> Path | None:
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(repo, filename)
    return Path(found) if isinstance(found, str) else None


def _hub_has_weights(repo: str) -> bool:
    return any(_hub_cached(repo, n) for n in ("model.safetensors", "model.safetensors.index.json",
                                               "pytorch_model.bin", "pytorch_model.bin.index.json"))


def _not_cached(spec: ModelSpec, repo: str, filename: str) -> SourceError:
    from huggingface_hub import constants

    folder = Path(constants.HF_HUB_CACHE) / f"models--{repo.replace('/', '--')}"
    otherwise = "or give hf:/path/to/a/folder written by save_pretrained" if spec.source == "hf" else \
        "or use --weights none"
    if spec.source == "hf" and Path(spec.name).is_dir():
        otherwise = f"or, for the folder '{spec.name}' here, write hf:./{spec.name}"
    return SourceError(
        f"{spec.text} is not in the local Hugging Face cache, and hookcli does not download: {filename} of "
        f"{repo} belongs under {folder}/snapshots/<revision>/",
        hint=f"run 'hf download {repo}' where there is network and copy {folder} here (or set HF_HUB_CACHE), "
             f"{otherwise}")


# OpenCLIP


def _load_open_clip(spec: ModelSpec, weights: str, seed: int):
    import open_clip

    arch = spec.name
    if arch.endswith(".json"):
        path = Path(arch).expanduser()
        try:
            config = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as err:
            raise SourceError(f"OpenCLIP model config '{arch}' cannot be read: {first_line(err)}",
                              hint="give a JSON model config like OpenCLIP's own") from None
        if not isinstance(config, dict) or not isinstance(config.get("vision_cfg"), dict):
            raise SourceError(f"OpenCLIP model config '{arch}' has no vision_cfg object",
                              hint="give a JSON model config like OpenCLIP's own")
        open_clip.add_model_config(path)
        arch = path.stem
    elif arch not in open_clip.list_models() and not arch.startswith("hf-hub:"):
        raise _unknown(spec, open_clip.list_models(), "hookcli models --source open_clip")
    from hookcli.models.loading import looks_like_weights_path

    tag = None
    if weights.lower() not in ("none",) and not looks_like_weights_path(weights):
        tags = open_clip.list_pretrained_tags_by_model(arch)
        tag = (tags[0] if tags else None) if weights.lower() == "default" else weights
        if tag is None:
            raise UnknownWeightsError(f"{spec.text} has no pretrained weights in OpenCLIP",
                                      hint="use --weights none, or a path to a state dict")
        if tag not in tags:
            more = f" and {len(tags) - 8} more" if len(tags) > 8 else ""
            raise UnknownWeightsError(f"{spec.text} has no pretrained tag '{tag}' (OpenCLIP has: "
                                      f"{', '.join(tags[:8]) or 'no tags'}{more})",
                                      hint="use DEFAULT, a listed tag or none")
        _require_open_clip_files(spec, arch, tag)
    try:
        with seeded(seed):
            model = open_clip.create_model(arch, pretrained=tag)
    except Exception as err:
        raise SourceError(f"cannot build {spec.text}: {first_line(err)}",
                          hint="replace the cached files, or use --weights none") from None
    module = model.visual
    if tag is not None:
        described = {"source": "open_clip", "name": f"{arch}.{tag}"}
    elif weights.lower() == "none":
        described = {"source": "none", "seed": seed}
    else:
        described = _from_file(spec, module, Path(weights), part="visual.")  # a whole CLIP's file: its image tower
    preprocess = _open_clip_preprocess(open_clip.get_model_preprocess_cfg(model))
    return _loaded(spec, module, described, preprocess, classes=getattr(module, "output_dim", None),
                   scores="embedding")


def _require_open_clip_files(spec: ModelSpec, arch: str, tag: str) -> None:
    import open_clip

    config = open_clip.get_pretrained_cfg(arch, tag)
    hub = (config.get("hf_hub") or "").rstrip("/")
    if hub:
        names = ["open_clip_model.safetensors", "open_clip_pytorch_model.bin"]
        if not any(_hub_cached(hub, n) for n in names):
            raise _not_cached(spec, hub, names[0])
        return
    url = config.get("url", "")
    cached = Path(os.path.expanduser("~/.cache/clip")) / os.path.basename(url)
    if not cached.is_file():
        raise SourceError(f"pretrained weights of {spec.text} ({tag}) are not cached, and hookcli does not download: "
                          f"place {url} at {cached}", hint="or use --weights none")


def _open_clip_preprocess(config: dict):
    from hookcli.inputs.preprocess import Preprocess

    size = config["size"]
    side = size if isinstance(size, int) else size[0]
    if config.get("resize_mode", "shortest") == "squash":
        resize = (side, side)
    else:
        resize = side
    return Preprocess(resize=resize, crop=side, mean=tuple(config["mean"]), std=tuple(config["std"]),
                      interpolation=config.get("interpolation", "bicubic"))


# factories


def _recorded_name(spec: ModelSpec) -> str:
    """The model's name as files record it: paths (a folder, a config, a factory's file) made absolute, so that the
    name means the same from any folder."""
    if spec.source == "factory":
        module, function = spec.name.rsplit(":", 1)
        return f"{Path(module).expanduser().resolve()}:{function}" if module.endswith(".py") else spec.name
    if spec.hf_folder or spec.source == "open_clip" and spec.name.endswith(".json"):
        return f"{spec.source}:{Path(spec.name).expanduser().resolve()}"
    return spec.text


def _load_factory(spec: ModelSpec, weights: str, seed: int):
    import torch.nn as nn

    module_name, function_name = spec.name.rsplit(":", 1)
    code, digest = _import_factory_module(spec, module_name)
    factory = getattr(code, function_name, None)
    if not callable(factory):
        raise UsageProblem(f"{module_name} has no function '{function_name}'",
                           hint=f"define {function_name}() returning the nn.Module")
    try:
        with seeded(seed if weights.lower() == "none" else 0):
            made = factory()
    except (Exception, SystemExit) as err:  # user code: argparse and sys.exit included
        raise SourceError(f"the factory {spec.name} failed: {type(err).__name__}: {first_line(err)}",
                          hint="run it in Python to see where") from None
    module, given = (made if isinstance(made, tuple) and len(made) == 2 else (made, None))
    if not isinstance(module, nn.Module):
        raise SourceError(f"the factory {spec.name} returned {type(module).__name__}, not an nn.Module",
                          hint="return the model, or (model, preprocessing)")
    if _is_scripted(module):
        raise UsageProblem(f"the factory {spec.name} returned a TorchScript module, whose inside forward hooks "
                           "cannot reach", hint="return the Python model it was scripted from")
    from hookcli.models.loading import looks_like_weights_path

    if looks_like_weights_path(weights):
        described = _from_file(spec, module, Path(weights))
    elif weights.lower() == "none":
        described = {"source": "none", "seed": seed}
    else:
        described = {"source": "factory"}
    if digest is not None:
        described["code_sha256"] = digest
    if given is None:
        preprocess, assumed_because = _assumed(spec, "the factory gives no preprocessing")
    else:
        preprocess, assumed_because = _given_preprocess(spec, given), None
    return _loaded(spec, module, described, preprocess, assumed_because=assumed_because)


def _import_factory_module(spec: ModelSpec, name: str):
    """``(module, the SHA-256 of its file)``: a file imported under a name of its own (None for an installed or
    local module's digest)."""
    if not name.endswith(".py"):
        _search_current_folder()
        try:
            return importlib.import_module(name), None
        except (Exception, SystemExit) as err:
            raise SourceError(f"importing {name} failed: {type(err).__name__}: {first_line(err)}",
                              hint="run it in Python to see where") from None
    path = Path(name).expanduser().resolve()
    # Named by path and content: an edited file is run again, as its recorded code_sha256 says it was.
    digest = file_sha256(path)
    unique = "hookcli_factory_" + hashlib.sha256(f"{path}\n{digest}".encode()).hexdigest()[:16]
    if unique in sys.modules:
        return sys.modules[unique], digest
    loader_spec = importlib.util.spec_from_file_location(unique, path)
    code = importlib.util.module_from_spec(loader_spec)
    if str(path.parent) not in sys.path:
        sys.path.insert(0, str(path.parent))  # its sibling modules import as they would under python FILE
    sys.modules[unique] = code
    try:
        loader_spec.loader.exec_module(code)
    except (Exception, SystemExit) as err:
        del sys.modules[unique]
        raise SourceError(f"running {path.name} failed: {type(err).__name__}: {first_line(err)}",
                          hint="run it in Python to see where") from None
    return code, digest


def _is_scripted(module) -> bool:
    import torch

    return isinstance(module, torch.jit.ScriptModule)


def _given_preprocess(spec: ModelSpec, given):
    """A factory's preprocessing: a :class:`~hookcli.inputs.preprocess.Preprocess`, a dict of its fields, or a torchvision
    weights' ``transforms()``."""
    from hookcli.inputs.preprocess import Preprocess

    if isinstance(given, Preprocess):
        return given
    try:
        if isinstance(given, dict):
            fields = dict(given)
            for name in ("mean", "std"):
                if fields.get(name) is not None:
                    fields[name] = tuple(float(v) for v in fields[name])
            return Preprocess(**{"crop": None, **fields})
        if hasattr(given, "resize_size") and hasattr(given, "crop_size"):
            return Preprocess.from_transforms(given)
    except (TypeError, ValueError) as err:
        raise SourceError(f"the preprocessing the factory {spec.name} returned is not usable: {err}",
                          hint="return a hookcli.Preprocess or a dict of resize, crop, mean, std") from None
    raise SourceError(f"the factory {spec.name} returned a {type(given).__name__} as preprocessing",
                      hint="return a hookcli.Preprocess, a dict of resize, crop, mean, std, or a torchvision "
                           "weights' transforms()")


# -- shared --------------------------------------------------------------------------------------------------


def _unknown(spec: ModelSpec, known: list[str], command: str) -> UnknownModelError:
    import difflib

    closest = difflib.get_close_matches(spec.name, known, n=3, cutoff=0.5)
    shown = f" (closest: {', '.join(closest)})" if closest else ""
    return UnknownModelError(f"unknown {spec.source} model '{spec.name}'{shown}", hint=f"'{command}' lists them")


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


def list_source_models(source: str, pattern: str | None = None) -> list[dict]:
    """The models a source offers (matching a glob ``pattern``): ``{"model", "family", "default", "weights"}`` rows.

    timm: every architecture, with its pretrained tags; OpenCLIP: every
    architecture, with its pretrained tags; Hugging Face: the models in the
    local cache.
    """
    if source == "timm":
        check_model(ModelSpec("timm", "x"))
        import timm

        tags: dict[str, list[str]] = {}
        for full in timm.list_pretrained():
            name, _, tag = full.partition(".")
            tags.setdefault(name, []).append(tag)
        names = timm.list_models(pattern or "")
        return [{"model": f"timm:{n}", "family": "classification",
                 "default": _timm_default_tag(n) if n in tags else None, "weights": tags.get(n, [])} for n in names]
    if source == "open_clip":
        check_model(ModelSpec("open_clip", "x"))
        import open_clip

        rows = []
        for arch in open_clip.list_models():
            if pattern and not fnmatch.fnmatchcase(arch, pattern):
                continue
            tags = open_clip.list_pretrained_tags_by_model(arch)
            rows.append({"model": f"open_clip:{arch}", "family": "classification", "default": (tags or [None])[0],
                         "weights": tags})
        return rows
    if source == "hf":
        check_model(ModelSpec("hf", "x"))
        from huggingface_hub import constants

        cache = Path(constants.HF_HUB_CACHE)
        rows = []
        for folder in sorted(cache.glob("models--*")) if cache.is_dir() else []:
            repo = folder.name[len("models--"):].replace("--", "/")
            if pattern and not fnmatch.fnmatchcase(repo, pattern):
                continue
            if _hub_cached(repo, "config.json"):
                rows.append({"model": f"hf:{repo}", "family": "classification", "default": "DEFAULT",
                             "weights": ["DEFAULT"] if _hub_has_weights(repo) else []})
        return rows
    raise UsageProblem(f"unknown source '{source}'", hint=f"use one of {', '.join(PREFIXES)} "
                       "(hookcli.describe_models lists torchvision's)")
