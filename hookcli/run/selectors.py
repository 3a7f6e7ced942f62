"""Name the layers of a model and turn a user's selection into an ordered mapping.

A selector is one of:

- an exact module path: ``features.18``, ``layer3.1.conv2``;
- a glob: ``*`` matches within one path component, ``**`` across components,
  ``?`` one character, ``[...]`` a character set (``layer3.*.conv2``, ``features.**``);
- a type: ``type:Conv2d`` (class name, globs allowed; a dotted pattern matches
  the qualified name ``torch.nn.modules.conv.Conv2d``);
- ``.``, the model itself: what its forward returns, stored under the key
  ``output`` (a transformers model's ``ModelOutput`` fields become
  ``output#last_hidden_state``, ``output#pooler_output``);
- any of the above followed by ``=NAME`` to store the layer under another key
  (``layer4=final``); the selector must then match exactly one layer.

>>> import torch.nn as nn
>>> model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Conv2d(8, 8, 3))
>>> resolve_layers(model, ["type:Conv2d", "1=act"])
{'0': '0', '1': 'act', '2': '2'}
"""

from __future__ import annotations

import difflib
import fnmatch
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from hookcli.errors import UnknownLayerError, UsageProblem
from hookcli.patterns import glob_to_regex

if TYPE_CHECKING:
    from hookcli.models.loaded import LoadedModel

__all__ = [
    "KEY_RESERVED",
    "MODEL",
    "MODEL_KEY",
    "as_selectors",
    "check_path_key",
    "hookable_layers",
    "resolve_layers",
    "selected_layers",
    "selector_keys",
]

#: Characters that separate a layer's key from call index, input marker and container element.
KEY_RESERVED = ":@#"
#: The selector of the model itself (module path ``""``), and the key its output is stored under.
MODEL = "."
MODEL_KEY = "output"


def hookable_layers(model) -> dict:
    """Every sub-module a hook can be put on, by dotted path, in definition order."""
    return {path: module for path, module in model.named_modules() if path}


def resolve_layers(model, selectors: Iterable[str], *, model_name: str | None = None) -> dict[str, str]:
    """Resolve selectors into ``{module path: output key}``, in the model's definition order.

    Raises :class:`UnknownLayerError` naming the closest paths when a selector
    matches nothing.
    """
    layers = hookable_layers(model)
    chosen: dict[str, str] = {}
    for selector in selectors:
        pattern, rename = _parse_selector(selector)
        if pattern not in layers and selector.strip() in layers:
            raise UsageProblem(
                f"'{selector}' reads as layer '{pattern}' under the key '{rename}', and the model has no "
                f"'{pattern}' (its layer '{selector.strip()}' has '=' in its name)",
                hint=f"select that layer with a key of its own: '{selector.strip()}=NAME'",
            )
        if pattern not in layers and "=" in pattern and pattern.partition("=")[0].strip() in layers:
            raise UsageProblem(
                f"'{selector}' reads as layer '{pattern}' under the key '{rename}' (the last '=' parts a key), and "
                f"the model has no '{pattern}'",
                hint="a key may not hold '='",
            )
        if pattern not in layers and not _is_glob(pattern):
            _refuse_second_name(model, pattern)
        matches = _match(pattern, layers, model_name)
        if rename:
            if len(matches) != 1:
                raise UsageProblem(
                    f"'{selector}' renames {len(matches)} layers",
                    hint="a =NAME rename needs a selector that matches exactly one layer",
                )
        for path in matches:
            key = rename or path or MODEL_KEY
            if not rename:
                check_path_key(path, alone=matches == [pattern])
            if chosen.get(path, key) != key:
                raise UsageProblem(
                    f"layer '{path}' is selected under two names, '{chosen[path]}' and '{key}'",
                    hint="select it once",
                )
            chosen[path] = key
    if not chosen:
        raise UsageProblem("no layers selected", hint="pass --layer PATH (see 'hookcli layers')")
    keys = list(chosen.values())
    clash = next((k for k in keys if keys.count(k) > 1), None)
    if clash is not None:
        raise UsageProblem(f"two layers would be stored under the key '{clash}'", hint="rename one with PATH=NAME")
    order = {path: i for i, path in enumerate(layers)}  # the model itself finishes last
    return dict(sorted(chosen.items(), key=lambda item: order.get(item[0], len(order))))


def as_selectors(layers: str | Iterable[str]) -> list[str]:
    """Layers as given (one selector, or a list of them) as a list of selectors; anything else is refused."""
    found = [layers] if isinstance(layers, str) else list(layers) if isinstance(layers, Iterable) else None
    odd = [layers] if found is None else [layer for layer in found if not isinstance(layer, str)]
    if odd or found is None:
        raise UsageProblem(
            f"layers are named by their paths in the model, such as 'layer3.1.conv2', and one given is of type "
            f"{type(odd[0]).__name__}",
            hint="give a path as a string, or a list of them (hookcli.layers(model) lists the paths)",
        )
    return found or []


def selected_layers(loaded: LoadedModel, layers: str | Iterable[str]) -> dict[str, str]:
    """:func:`resolve_layers` of ``loaded``'s module, errors naming the model as the command line knows it (a
    module handed in has no name there)."""
    return resolve_layers(
        loaded.module, as_selectors(layers), model_name=None if loaded.source == "module" else loaded.name
    )


def selector_keys(selectors: Iterable[str]) -> list[str] | None:
    """The keys :func:`resolve_layers` will store ``selectors`` under, known without the model when each names one
    module path (``PATH`` or ``PATH=NAME``); None when a glob or a type leaves them to the model.

    Malformed selectors (empty, a bad key) are refused here as there.

    >>> selector_keys(["layer4=final", "fc"]), selector_keys(["layer3.*"])
    (['final', 'fc'], None)
    """
    keys: dict[str, str] = {}
    for selector in selectors:
        pattern, rename = _parse_selector(selector)
        key = rename or (MODEL_KEY if pattern == MODEL else pattern)
        if pattern.startswith("type:") or _is_glob(pattern) or keys.setdefault(pattern, key) != key:
            return None  # a pattern, or one path under two names: resolve_layers decides (or refuses)
    found = list(keys.values())
    return found if found and len(set(found)) == len(found) else None


def _parse_selector(selector: str) -> tuple[str, str]:
    """``(pattern, rename)`` of ``PATTERN[=NAME]``; an empty pattern or a key hookcli cannot store is refused.

    The last ``=`` parts them, so a layer whose own name holds one is selected with a key (``a=b=NAME``).
    """
    pattern, _, rename = selector.rpartition("=") if "=" in selector else (selector, "", "")
    pattern = pattern.strip()
    if not pattern:
        raise UsageProblem(f"empty layer selector '{selector}'", hint="give a path such as features.18")
    if rename:
        _check_key(rename, selector)
    return pattern, rename


def _refuse_second_name(model, path: str) -> None:
    """Refuse ``path`` where it names a module that the model holds at an earlier path too: torch lists (and hooks)
    one module once, under its first name."""
    try:
        module = model.get_submodule(path)
    except Exception:  # no such module, or a module whose attributes do not follow torch's: the usual refusal
        return
    first = next((name for name, each in model.named_modules() if each is module), None)
    if first:
        raise UnknownLayerError(
            f"'{path}' is the module that '{first}' is (one module at two names): its calls are all '{first}'",
            hint=f"select it as '{first}'; its calls are counted apart ({first}:0, {first}:1…) where it runs twice",
        )


def _is_glob(pattern: str) -> bool:
    return any(ch in pattern for ch in "*?[")


def _match(pattern: str, layers: Mapping, model_name: str | None) -> list[str]:
    if pattern == MODEL:
        return [""]
    if pattern in layers:  # a path first: a ModuleDict key may hold '[' or '*'
        return [pattern]
    where = f" in {model_name}" if model_name else ""
    hint = (
        f"run 'hookcli layers --model {model_name}' to list them" if model_name else "hookcli.layers(model) lists them"
    )
    if pattern.startswith("type:"):
        type_pattern = pattern[len("type:") :]
        found = [p for p, m in layers.items() if _type_matches(type_pattern, type(m))]
        if not found:
            types = sorted({type(m).__name__ for m in layers.values()})
            closest = difflib.get_close_matches(type_pattern, types, n=3, cutoff=0.0)
            raise UnknownLayerError(
                f"no layer of type '{type_pattern}'{where} (closest types: {', '.join(closest)})", hint=hint
            )
        return found
    if _is_glob(pattern):
        regex = glob_to_regex(pattern)
        found = [p for p in layers if regex.fullmatch(p)]
        if not found:
            raise UnknownLayerError(
                f"no layer matches '{pattern}'{where}",
                hint=f"'*' stays within one path component, '**' crosses them; {hint}",
            )
        return found
    closest = difflib.get_close_matches(pattern, list(layers), n=3, cutoff=0.0)
    raise UnknownLayerError(f"no layer '{pattern}'{where} (closest: {', '.join(closest)})", hint=hint)


def _type_matches(pattern: str, cls: type) -> bool:
    name = f"{cls.__module__}.{cls.__qualname__}" if "." in pattern else cls.__name__
    return fnmatch.fnmatchcase(name, pattern)


def check_path_key(path: str, *, alone: bool = True) -> None:
    """Refuse storing a layer under its path where the path holds a character that stored keys reserve (``alone``:
    the layer was named on its own, not matched by a pattern).

    >>> check_path_key("heads.k")
    >>> try:
    ...     check_path_key("heads.k@grad")
    ... except UsageProblem as refused:
    ...     print(refused.hint)
    select it with a key of its own: 'heads.k@grad=NAME'
    """
    bad = [ch for ch in KEY_RESERVED if ch in path]
    if bad:
        also = "" if alone else ", and the others by paths or a pattern that leaves it out"
        raise UsageProblem(
            f"layer '{path}' cannot be stored under its path: '{bad[0]}' in a key marks a call, an input or a "
            f"gradient ({', '.join(KEY_RESERVED)} are kept for that)",
            hint=f"select it with a key of its own: '{path}=NAME'{also}",
        )


def _check_key(name: str, selector: str) -> None:
    bad = [ch for ch in KEY_RESERVED if ch in name]
    if bad or not name.strip():
        raise UsageProblem(
            f"invalid key name in '{selector}'",
            hint=f"names may not be empty or contain {' '.join(KEY_RESERVED)}",
        )
