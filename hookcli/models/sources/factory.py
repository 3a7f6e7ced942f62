"""The user's own models: ``make()`` of a Python file (``nets.py:make``) or of an
importable module (``my_lab.models:make``), returning the model, or the model and its preprocessing.

It runs the user's code: a file is imported under a name made of its path and
content (an edited file runs anew, as its recorded ``code_sha256`` says)."""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from pathlib import Path

import torch
import torch.nn as nn

from hookcli.errors import UsageProblem, first_line
from hookcli.models.sources.common import (
    assumed_preprocess,
    given_preprocess,
    load_weights_file,
    loaded_model,
    quietly,
)
from hookcli.models.specs import ModelSpec, SourceError, search_current_folder
from hookcli.models.state_dicts import seeded
from hookcli.models.weights import file_sha256, looks_like_weights_path

__all__ = ["load"]


@quietly
def load(spec: ModelSpec, weights: str, seed: int):
    module_name, function_name = spec.name.rsplit(":", 1)
    code, digest = _import_factory_module(spec, module_name)
    factory = getattr(code, function_name, None)
    if not callable(factory):
        raise UsageProblem(
            f"{module_name} has no function '{function_name}'", hint=f"define {function_name}() returning the nn.Module"
        )
    try:
        with seeded(seed if weights.lower() == "none" else 0):
            made = factory()
    except (Exception, SystemExit) as err:  # user code: argparse and sys.exit included
        raise SourceError(
            f"the factory {spec.name} failed: {type(err).__name__}: {first_line(err)}",
            hint="run it in Python to see where",
        ) from None
    module, given = made if isinstance(made, tuple) and len(made) == 2 else (made, None)
    if not isinstance(module, nn.Module):
        raise SourceError(
            f"the factory {spec.name} returned {type(module).__name__}, not an nn.Module",
            hint="return the model, or (model, preprocessing)",
        )
    if _is_scripted(module):
        raise UsageProblem(
            f"the factory {spec.name} returned a TorchScript module, whose inside forward hooks cannot reach",
            hint="return the Python model it was scripted from",
        )
    if looks_like_weights_path(weights):
        described = load_weights_file(spec, module, Path(weights))
    elif weights.lower() == "none":
        described = {"source": "none", "seed": seed}
    else:
        described = {"source": "factory"}
    if digest is not None:
        described["code_sha256"] = digest
    if given is None:
        preprocess, assumed_because = assumed_preprocess(spec, "the factory gives no preprocessing")
    else:
        preprocess, assumed_because = given_preprocess(f"the factory {spec.name}", given), None
    return loaded_model(spec, module, described, preprocess, assumed_because=assumed_because)


def _import_factory_module(spec: ModelSpec, name: str):
    """``(module, the SHA-256 of its file)``: a file imported under a name of its own (None for an installed or
    local module's digest)."""
    if not name.endswith(".py"):
        search_current_folder()
        try:
            return importlib.import_module(name), None
        except (Exception, SystemExit) as err:
            raise SourceError(
                f"importing {name} failed: {type(err).__name__}: {first_line(err)}",
                hint="run it in Python to see where",
            ) from None
    path = Path(name).expanduser().resolve()
    # Named by path and content: an edited file is run again, as its recorded code_sha256 says it was.
    digest = file_sha256(path)
    unique = "hookcli_factory_" + hashlib.sha256(f"{path}\n{digest}".encode()).hexdigest()[:16]
    if unique in sys.modules:
        return sys.modules[unique], digest
    loader_spec = importlib.util.spec_from_file_location(unique, path)
    assert loader_spec is not None and loader_spec.loader is not None, "a .py file's spec has a source loader"
    code = importlib.util.module_from_spec(loader_spec)
    if str(path.parent) not in sys.path:
        sys.path.insert(0, str(path.parent))  # its sibling modules import as they would under python FILE
    sys.modules[unique] = code
    try:
        loader_spec.loader.exec_module(code)
    except (Exception, SystemExit) as err:
        del sys.modules[unique]
        raise SourceError(
            f"running {path.name} failed: {type(err).__name__}: {first_line(err)}", hint="run it in Python to see where"
        ) from None
    return code, digest


def _is_scripted(module) -> bool:
    return isinstance(module, torch.jit.ScriptModule)
