"""What torchvision can build (every family: :mod:`hookcli.families`), cached so naming a model needs no torch.

Importing torchvision takes seconds; listing its models, or refusing a name
it does not know, should not. :func:`model_registry` reads every model's
weights enum (its class name, its members, its default) from a JSON file,
``models.json`` in ``$HOOKCLI_CACHE_DIR`` (default
``$XDG_CACHE_HOME/hookcli``, else ``~/.cache/hookcli``), written for one
torchvision version and one hookcli version. The file is untrusted: when it is
missing, unreadable, not exactly what this module writes, or for other
versions, the registry is read from torchvision again and the file rewritten
atomically. A folder that cannot be written only means no cache.

>>> registry = model_registry()
>>> registry["resnet18"]
ModelEntry(enum='ResNet18_Weights', default='IMAGENET1K_V1', weights=('IMAGENET1K_V1',), family='classification')
>>> registry["raft_small"].family, registry["quantized_resnet18"].family
('optical_flow', 'quantized')
"""

from __future__ import annotations

import importlib
import json
import os
from dataclasses import asdict, dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from hookcli.errors import HookcliError
from hookcli.families import FAMILIES, MODULES
from hookcli.files import atomic_path, open_regular
from hookcli.version import __version__

__all__ = ["CACHE_FILE", "ModelEntry", "cache_path", "model_registry"]

CACHE_FILE = "models.json"
#: A real cache is about 10 KB; anything much larger is not one.
_MAX_BYTES = 1 << 20
_TOP_KEYS = {"hookcli", "torchvision", "models"}
_ENTRY_KEYS = {"enum", "default", "weights", "family"}


@dataclass(frozen=True)
class ModelEntry:
    """A model's pretrained weights (the enum's class name, its default member, every member but ``DEFAULT``) and
    its family (:data:`hookcli.families.FAMILIES`)."""

    enum: str
    default: str
    weights: tuple[str, ...]
    family: str = "classification"


def cache_path() -> Path | None:
    """Where the registry is cached: ``$HOOKCLI_CACHE_DIR``, ``$XDG_CACHE_HOME/hookcli`` or ``~/.cache/hookcli``.

    None when no home folder can be found (and neither variable is set).
    """
    override = os.environ.get("HOOKCLI_CACHE_DIR", "")
    if override:
        return Path(override) / CACHE_FILE
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    if os.path.isabs(xdg):  # the XDG spec says to ignore a relative path
        return Path(xdg) / "hookcli" / CACHE_FILE
    try:
        home = Path.home()
    except RuntimeError:  # Python 3.12 and later, when there is no home to find
        return None
    return home / ".cache" / "hookcli" / CACHE_FILE if home.is_absolute() else None  # 3.11 leaves "~" as it is


def model_registry() -> dict[str, ModelEntry]:
    """Every model name torchvision can build, sorted, with its weights; from the cache when it is valid.

    A command asks several times (the plan, then the loader): the answer is
    kept in memory as long as the versions and the cache file (its size,
    time and inode) stay the same, so the file is read and checked once.
    """
    versions = {"hookcli": __version__, "torchvision": _torchvision_version()}
    path = cache_path() if versions["torchvision"] is not None else None  # no version, nothing to key it by
    key = (path, *versions.values(), _signature(path))
    if key in _KNOWN:
        return _KNOWN[key]
    registry = _read(path, versions) if path is not None else None
    if registry is None:
        registry = _scan()
        if path is not None:
            _write(path, {**versions, "models": {name: asdict(entry) for name, entry in registry.items()}})
    _KNOWN.clear()
    _KNOWN[(path, *versions.values(), _signature(path))] = registry
    return registry


_KNOWN: dict[tuple, dict[str, ModelEntry]] = {}


def _signature(path: Path | None) -> tuple | None:
    try:
        stat = path.stat() if path is not None else None
    except OSError:
        return None
    return (stat.st_size, stat.st_mtime_ns, stat.st_ino, stat.st_mode) if stat is not None else None


def _torchvision_version() -> str | None:
    try:
        return version("torchvision")
    except PackageNotFoundError:
        return None


def _scan() -> dict[str, ModelEntry]:
    import torchvision.models

    found = {}
    for family, module in MODULES.items():
        for name in torchvision.models.list_models(module=importlib.import_module(module)):
            weights = torchvision.models.get_model_weights(name)
            found[name] = ModelEntry(
                enum=weights.__name__,
                default=weights.DEFAULT.name,
                weights=tuple(member for member in weights.__members__ if member != "DEFAULT"),
                family=family,
            )
    return {name: found[name] for name in sorted(found)}


def _read(path: Path, versions: dict) -> dict[str, ModelEntry] | None:
    """The cached registry, or None unless the file is exactly one this module writes for ``versions``."""
    try:
        with open_regular(path) as handle:
            raw = handle.read(_MAX_BYTES + 1)
        data = json.loads(raw) if len(raw) <= _MAX_BYTES else None
    except (OSError, ValueError, RecursionError):  # ValueError: not JSON or not text; RecursionError: nested deep
        return None
    if not isinstance(data, dict) or set(data) != _TOP_KEYS or any(data[key] != versions[key] for key in versions):
        return None
    models = data["models"]
    if not isinstance(models, dict) or not models:
        return None
    registry = {}
    for name in sorted(models):
        entry = _parsed_entry(name, models[name])
        if entry is None:
            return None
        registry[name] = entry
    return registry


def _parsed_entry(name: str, fields) -> ModelEntry | None:
    if not name.isidentifier() or not isinstance(fields, dict) or set(fields) != _ENTRY_KEYS:
        return None
    enum, default, weights = fields["enum"], fields["default"], fields["weights"]
    if fields["family"] not in FAMILIES:
        return None
    if not (
        _is_name(enum)
        and isinstance(weights, list)
        and weights
        and all(map(_is_name, weights))
        and len(set(weights)) == len(weights)
        and "DEFAULT" not in weights
        and default in weights
    ):
        return None
    return ModelEntry(enum=enum, default=default, weights=tuple(weights), family=fields["family"])


def _is_name(value) -> bool:
    return isinstance(value, str) and value.isidentifier()


def _write(path: Path, data: dict) -> None:
    """Write the cache atomically; a folder that cannot be made or written means no cache, not an error."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(path, force=True) as temporary:
            temporary.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    except (OSError, HookcliError):
        pass
