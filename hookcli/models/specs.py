"""What a ``--model`` value names: its source and name (:func:`parse_model`), and what can be refused
before torch is imported (:func:`check_model`, :func:`check_weights`).

A ``--model`` value names its source by its spelling:

==========================  =========================================================================
``timm:NAME``               a timm model (``pip install "hookcli[timm]"``)
``hf:ORG/NAME``             a transformers vision model from the local Hugging Face cache
``hf:/path/to/folder``      one written by ``save_pretrained`` (a path: ``/``, ``./``, ``../`` or ``~``)
``open_clip:ARCH``          the image tower of an OpenCLIP model (``open_clip:/path/Config.json`` too)
``path/to/file.py:make``    ``make()`` from a Python file: it runs the user's code
``package.module:make``     ``make()`` from an importable module (the current folder is searched too)
anything else               a torchvision model name (:mod:`hookcli.models.loading`)
==========================  =========================================================================

A TorchScript or ``torch.export`` archive given as a model is refused: hooks
cannot reach the modules inside it.

>>> parse_model("timm:resnet50"), parse_model("hf:facebook/dinov2-small").source
(ModelSpec(source='timm', name='resnet50'), 'hf')
>>> parse_model("my_models.nets:small").source, parse_model("resnet18").source
('factory', 'torchvision')
>>> parse_model("hf:./export").label, parse_model("open_clip:ViT-B-32").label
('hf-export', 'open_clip-ViT-B-32')
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from hookcli.errors import UnknownWeightsError, UsageProblem, WeightsError
from hookcli.files import MISSING, regular_file_problem
from hookcli.models.weights import archive_kind, check_weights_file, looks_like_weights_path

__all__ = [
    "LISTED_SOURCES",
    "MISSING",
    "PACKAGES",
    "PREFIXES",
    "SOURCES",
    "ModelSpec",
    "SourceError",
    "check_model",
    "check_weights",
    "is_path",
    "parse_model",
    "regular_file_problem",
    "search_current_folder",
]


#: Every source a model can come from; all but torchvision are named by a prefix or a ``:factory`` suffix.
SOURCES = ("torchvision", "timm", "hf", "open_clip", "factory")


#: The prefixes that name a source.
PREFIXES = ("timm", "hf", "open_clip")


#: The sources ``hookcli models --source`` lists (a factory is named by its file or module).
LISTED_SOURCES = ("torchvision", *PREFIXES)


#: The Python package each source needs, and the extra that installs it.
PACKAGES = {"timm": ("timm", "timm"), "hf": ("transformers", "hf"), "open_clip": ("open_clip", "open_clip")}


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
        return self.source == "hf" and is_path(self.name)


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
            raise UsageProblem(
                f"model '{text}' names no {prefix} model after '{prefix}:'",
                hint=f"for example {prefix}:{_EXAMPLES[prefix]}",
            )
        return ModelSpec(prefix, rest.strip())
    factory = _FACTORY.match(text)
    if factory and (factory["module"].endswith(".py") or _DOTTED.match(factory["module"])):
        return ModelSpec("factory", text)
    if colon and (prefix.lower() in ("torchvision", "tv", "open-clip", "openclip", "huggingface", "transformers")):
        raise UsageProblem(
            f"unknown model source '{prefix}:' in '{text}'",
            hint="use timm:, hf:, open_clip:, a factory (file.py:function) or a torchvision name",
        )
    if is_path(text) or os.sep in text or "/" in text or text.lower().endswith(_ARCHIVE_SUFFIXES):
        raise _model_file_refusal(text)
    return ModelSpec("torchvision", text)


_EXAMPLES = {"timm": "resnet50", "hf": "facebook/dinov2-small", "open_clip": "ViT-B-32"}


_ARCHIVE_SUFFIXES = (
    ".pt",
    ".pth",
    ".pt2",
    ".ts",
    ".jit",
    ".torchscript",
    ".safetensors",
    ".bin",
    ".ckpt",
    ".onnx",
    ".zip",
    ".py",
)


def is_path(text: str) -> bool:
    return text.startswith(("/", "./", "../", "~", ".\\", "..\\")) or text in (".", "..")


def _model_file_refusal(text: str) -> UsageProblem:
    """Why a file cannot be a ``--model``, from what it holds: TorchScript, torch.export, weights, or code."""
    path = Path(text).expanduser()
    kind = archive_kind(path)
    if kind == "torchscript":
        return UsageProblem(
            f"'{text}' is a TorchScript archive: its modules are compiled code that forward hooks cannot reach",
            hint="give the Python model it was scripted from (timm:NAME, a torchvision name, or file.py:factory) and "
            "its weights with --weights state_dict.pth",
        )
    if kind == "export":
        return UsageProblem(
            f"'{text}' is a torch.export archive: its graph has no modules for hooks to reach",
            hint="give the Python model it was exported from (timm:NAME, a torchvision name, or file.py:factory) "
            "and its weights with --weights state_dict.pth",
        )
    if text.endswith(".py"):
        return UsageProblem(
            f"'{text}' is a Python file but names no function to call",
            hint=f"write {text}:FUNCTION, where FUNCTION() returns the nn.Module",
        )
    if kind == "weights" or text.lower().endswith((".pth", ".pt", ".safetensors", ".bin", ".ckpt")):
        return UsageProblem(
            f"'{text}' is a weights file, not a model",
            hint=f"name the architecture with --model and pass the file as --weights {text}",
        )
    return UsageProblem(
        f"model '{text}' is a path, and a model is named, not opened",
        hint="use a torchvision name, timm:NAME, hf:ORG/NAME or hf:/folder, open_clip:ARCH, or "
        "file.py:factory ('hookcli models' lists the torchvision ones)",
    )


def check_model(spec: ModelSpec) -> None:
    """Refuse, without importing torch, a model that cannot be built: its package is not installed, its file or
    folder is missing, a factory's module cannot be found."""
    if spec.source in PACKAGES:
        package, extra = PACKAGES[spec.source]
        if importlib.util.find_spec(package) is None:
            raise SourceError(
                f"{spec.source}: models need the {package} package, which is not installed",
                hint=f'pip install "hookcli[{extra}]"',
            )
    if spec.hf_folder:
        folder = Path(spec.name).expanduser()
        config = regular_file_problem(folder / "config.json")
        if config is not None:
            what = (
                "not a folder"
                if not folder.is_dir()
                else "a folder without config.json"
                if config == MISSING
                else f"a folder whose config.json {config}"
            )
            raise UsageProblem(
                f"'{spec.name}' (from {spec.text}) is {what}",
                hint="give a folder written by save_pretrained, or hf:ORG/NAME from the cache",
            )
    elif spec.source == "hf" and not _HF_REPO.match(spec.name):
        raise UsageProblem(
            f"'{spec.name}' is not a Hugging Face model id",
            hint="write hf:ORG/NAME, or hf:/path/to/folder (hf:./folder for a relative one)",
        )
    if spec.source == "open_clip" and spec.name.startswith("hf-hub:"):
        raise UsageProblem(
            f"{spec.text}: OpenCLIP fetches hf-hub: models from the Hub itself, and hookcli does not download",
            hint="give the architecture's name (open_clip:ViT-B-32) and a pretrained "
            "tag, or its JSON config (open_clip:/path/Config.json) and --weights FILE",
        )
    if spec.source == "open_clip" and spec.name.endswith(".json"):
        problem = regular_file_problem(Path(spec.name).expanduser())
        if problem is not None:
            raise UsageProblem(f"OpenCLIP model config '{spec.name}' {problem}", hint="check the path")
    if spec.source == "factory":
        module, _ = spec.name.rsplit(":", 1)
        if module.endswith(".py"):
            problem = regular_file_problem(Path(module).expanduser())
            if problem is not None:
                raise UsageProblem(f"factory file '{module}' {problem}", hint="check the path of --model FILE.py:FUNC")
        elif _find_module(module) is None:
            raise UsageProblem(
                f"no Python module '{module}' (for the factory {spec.name})",
                hint="install it, or run hookcli from the folder that holds it",
            )


def _find_module(name: str):
    search_current_folder()
    try:
        return importlib.util.find_spec(name)
    except Exception:  # a parent package that is not one, or whose __init__ fails: said when it is imported
        return None


def search_current_folder() -> None:
    """Modules of the current folder import as they would under ``python -m``: an installed script lacks it."""
    here = os.getcwd()
    if here not in sys.path and "" not in sys.path:
        sys.path.append(here)


def check_weights(spec: ModelSpec, weights: str) -> None:
    """Refuse, without torch, weights a source has no use for (see :func:`load` for what each takes)."""
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
