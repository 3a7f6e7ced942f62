"""Read option presets from TOML files.

A preset holds any option of a command, spelt like the long flag with or
without dashes (``batch-size`` or ``batch_size``); ``layers`` is accepted for
``layer``. Options given on the command line win over the preset. A relative
``weights`` path is taken relative to the preset's folder.

A path that does not exist, given as a bare name (``resnet50-stages``) or as
``configs/<name>.toml``, is looked up among the shipped presets (the
repository's ``configs/`` folder, installed as ``hookcli/presets``), so they
work from any folder.

>>> allowed = {name: name for name in ("model", "weights", "layer", "capture", "batch_size")}
>>> read_config("vgg16_bn-features18", allowed=allowed)["layer"]
['features.18']
"""

from __future__ import annotations

import difflib
import os
import tomllib
from collections.abc import Mapping
from pathlib import Path

from hookcli.errors import ConfigError
from hookcli.files import NotRegularFile, open_regular
from hookcli.models.weights import looks_like_weights_path

__all__ = ["PRESETS", "locate_config", "read_config"]

_ALIASES = {"layers": "layer"}

_PACKAGE = Path(__file__).resolve().parent.parent  # hookcli/
#: The shipped presets: ``hookcli/presets`` in an installed wheel, ``configs/`` in a source checkout.
PRESETS = next((p for p in (_PACKAGE / "presets", _PACKAGE.parent / "configs") if p.is_dir()), _PACKAGE / "presets")


def locate_config(path: str | os.PathLike) -> Path:
    """``path`` if it exists, else the shipped preset it names; raises :class:`ConfigError` listing the presets."""
    path = Path(path)
    if path.exists() or path.is_absolute():
        return path
    if path.parent in (Path("."), Path("configs")):
        name = path.name if path.suffix == ".toml" else f"{path.name}.toml"
        if (PRESETS / name).is_file():
            return PRESETS / name
    shipped = sorted(p.stem for p in PRESETS.glob("*.toml")) if PRESETS.is_dir() else []
    hint = f"shipped presets: {', '.join(shipped)} (a name is enough)" if shipped else "give the path of a .toml file"
    raise ConfigError(f"config file not found: '{path}'", hint=hint)


def read_config(path: str | os.PathLike, *, allowed: Mapping[str, str]) -> dict:
    """Return the preset's options keyed by parameter name; unknown keys are an error.

    ``allowed`` maps option names as written in presets (long flags with
    underscores: ``batch_size``) to the parameter names they set.
    """
    path = locate_config(path)
    try:
        with open_regular(path) as handle:
            raw = tomllib.load(handle)
    except NotRegularFile as err:
        raise ConfigError(f"cannot read config '{path}': {err}", hint="give a .toml file") from None
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError) as err:
        raise ConfigError(f"cannot read config '{path}': {err}", hint="check the TOML syntax") from None
    options = {}
    for key, value in raw.items():
        name = key.replace("-", "_")
        name = _ALIASES.get(name, name)
        if name not in allowed:
            closest = difflib.get_close_matches(name, sorted(allowed), n=1)
            suggestion = f"did you mean '{closest[0]}'? " if closest else ""
            raise ConfigError(
                f"config '{path}' has an unknown option '{key}'",
                hint=f"{suggestion}valid options: {', '.join(sorted(allowed))}",
            )
        options[allowed[name]] = value
    weights = options.get("weights")
    # A relative weights path is relative to the preset; a weights name (DEFAULT, IMAGENET1K_V1) stays a name.
    if isinstance(weights, str) and _is_relative_path(weights) and (path.parent / weights).is_file():
        options["weights"] = str(path.parent / weights)
    return options


def _is_relative_path(weights: str) -> bool:
    return looks_like_weights_path(weights) and not Path(weights).is_absolute()
