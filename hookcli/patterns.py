"""Globs over dotted names (module paths, stored keys): ``*`` and ``?`` stay within a component, ``**`` crosses
them.

>>> [bool(glob_to_regex(p).fullmatch("layer3.1.conv2")) for p in ("layer3.*.conv2", "layer3.*", "layer3.**")]
[True, False, True]
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Sequence

from hookcli.errors import FeatureFileError, UsageProblem

__all__ = ["glob_to_regex", "select_keys"]


def glob_to_regex(pattern: str) -> re.Pattern:
    """Compile a path glob: ``*`` and ``?`` stay within a dot-separated component, ``**`` crosses them."""
    parts, i = [], 0
    while i < len(pattern):
        if pattern.startswith("**", i):
            parts.append(".*")
            i += 2
        elif pattern[i] == "*":
            parts.append("[^.]*")
            i += 1
        elif pattern[i] == "?":
            parts.append("[^.]")
            i += 1
        elif pattern[i] == "[" and "]" in pattern[i + 1 :]:
            end = pattern.index("]", i + 1)
            body = pattern[i + 1 : end]
            parts.append("[" + ("^" + body[1:] if body.startswith("!") else body) + "]")
            i = end + 1
        else:
            parts.append(re.escape(pattern[i]))
            i += 1
    return re.compile("".join(parts))


def select_keys(available: Sequence[str], patterns: Sequence[str], name: str, *, what: str = "tensor") -> list[str]:
    """The keys of ``available`` (the tensors of ``name``, or what ``what`` names: its layers) that ``patterns``
    match, in the order the patterns match them (all of them for no pattern); a pattern that matches nothing is
    refused, naming the closest keys.

    >>> select_keys(["layer1", "layer2", "fc"], ["fc", "layer*"], "f.safetensors")
    ['fc', 'layer1', 'layer2']
    """
    if not available:
        raise FeatureFileError(f"'{name}' holds no {what}s", hint="'hookcli info' shows what it holds")
    if not patterns:
        return list(available)
    chosen: list[str] = []
    for pattern in patterns:
        try:
            regex = glob_to_regex(pattern)
        except re.error as err:
            raise UsageProblem(
                f"invalid key pattern '{pattern}': {err}",
                hint="patterns take * ? and [abc] or [a-z] ranges written low to high",
            ) from None
        found = [k for k in available if regex.fullmatch(k)]
        if not found:
            closest = difflib.get_close_matches(pattern, available, n=3, cutoff=0.0)
            raise UsageProblem(
                f"no {what} '{pattern}' in '{name}' (closest: {', '.join(closest)})",
                hint="'hookcli info' lists the keys",
            )
        chosen.extend(k for k in found if k not in chosen)
    return chosen
