"""Globs over dotted names (module paths, stored keys): ``*`` and ``?`` stay within a component, ``**`` crosses
them.

>>> [bool(glob_to_regex(p).fullmatch("layer3.1.conv2")) for p in ("layer3.*.conv2", "layer3.*", "layer3.**")]
[True, False, True]
"""

from __future__ import annotations

import re

__all__ = ["glob_to_regex"]


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
