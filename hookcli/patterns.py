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
            negated = body.startswith("!")
            parts.append("[" + ("^" if negated else "") + _set_body(body[1:] if negated else body) + "]")
            i = end + 1
        else:
            parts.append(re.escape(pattern[i]))
            i += 1
    return re.compile("".join(parts))


def _set_body(body: str) -> str:
    """A glob set's characters as a regex set's: each one literal (``[``, ``\\``, ``&&``, ``~~``, ``||`` too) but a
    ``-`` between two others, which makes a range."""
    kept = []
    for place, char in enumerate(body):
        ranging = char == "-" and 0 < place < len(body) - 1 and "-" not in (body[place - 1], body[place + 1])
        kept.append("-" if ranging else re.escape(char) if char not in "^" else "\\^")
    return "".join(kept)


def select_keys(available: Sequence[str], patterns: Sequence[str], name: str, *, what: str = "tensor") -> list[str]:
    """The keys of ``available`` (the tensors of ``name``, or what ``what`` names: its layers) that ``patterns``
    match, in the order the patterns match them (all of them for no pattern); a pattern that is a key itself
    (``a[1]``) is that key alone; a pattern that matches nothing is refused, naming the closest keys.

    >>> select_keys(["layer1", "layer2", "fc"], ["fc", "layer*"], "f.safetensors")
    ['fc', 'layer1', 'layer2']
    >>> select_keys(["a1", "a[1]"], ["a[1]"], "f.safetensors"), select_keys(["a1", "a[1]"], ["a[!2]"], "f")
    (['a[1]'], ['a1'])
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
        found = [pattern] if pattern in available else [k for k in available if regex.fullmatch(k)]
        if not found:
            closest = difflib.get_close_matches(pattern, available, n=3, cutoff=0.0)
            globbed = "; * matches within one dot-separated name, ** across dots" if "*" in pattern else ""
            raise UsageProblem(
                f"no {what} '{pattern}' in '{name}' (closest: {', '.join(closest)})",
                hint=f"'hookcli info' lists the keys{globbed}",
            )
        chosen.extend(k for k in found if k not in chosen)
    return chosen
