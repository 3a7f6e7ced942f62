"""Short, safe text for the names of pictures and the captions they carry: a key's part of a file name
(:func:`file_stems`), and text cut to a length with a digest of the whole (:func:`capped`).

>>> capped("a" * 30, 12), safe_name("layer3/1:conv")
('aaa~cd762363', 'layer3_1_conv')
"""

from __future__ import annotations

import collections
import hashlib
import re
from collections.abc import Sequence
from pathlib import Path

__all__ = ["capped", "digest", "file_stem", "file_stems", "safe_name"]


def capped(text: str, limit: int) -> str:
    """``text``, or its first characters and a digest of the whole when it is longer than ``limit``."""
    return text if len(text) <= limit else f"{text[: limit - 9]}~{digest(text)}"


def digest(text: str) -> str:
    return hashlib.sha1(text.encode("utf-8", "surrogatepass")).hexdigest()[:8]


_UNSAFE = re.compile(r"[^A-Za-z0-9._@#+=-]+")


def file_stem(name: str, fallback: str) -> str:
    """A picture's stem after the file ``name`` it is drawn from (its ``.safetensors`` left out, its characters made
    safe), so that two files drawn into one folder keep apart; ``fallback`` for features in memory or from stdin."""
    path = Path(name)
    return (safe_name(path.name.removesuffix(".safetensors")) if path.is_file() else "") or fallback


def safe_name(text: str) -> str:
    """``text`` for a file name: runs of characters other than letters, digits and ``._@#+=-`` become ``_``."""
    return _UNSAFE.sub("_", text)


#: The longest key part of a PNG's name (:func:`file_stems`).
_KEY_STEM = 100


def file_stems(keys: Sequence[str]) -> list[str]:
    """Each key's part of the PNG names: safe characters, capped length, and never two alike.

    Keys that would give the same name (``a/b`` and ``a:b``; ``A`` and ``a`` on
    a file system that ignores case) get a short hash of the key appended.

    >>> file_stems(["layer1", "a/b", "a:b"])
    ['layer1', 'a_b~3ec69c85', 'a_b~dcea6d9c']
    """
    stems = [capped(safe_name(key), _KEY_STEM) for key in keys]
    seen = collections.Counter(stem.casefold() for stem in stems)
    return [f"{stem}~{digest(key)}" if seen[stem.casefold()] > 1 else stem for key, stem in zip(keys, stems)]
