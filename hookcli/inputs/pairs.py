"""Pairs of inputs for ``hookcli patch``: a source and a target, read from a pairs file or made from two folders in
order, and given to the run interleaved (source, target, source, target…).

A pairs file holds a pair a line: the source's path, a tab, the target's (or the two separated by spaces, when
neither path holds one). Blank lines and lines starting with ``#`` are skipped; relative paths are relative to the
current folder, as a list read from stdin is.

>>> read_pair_line("a.jpg\\tb c.jpg"), read_pair_line("a.jpg b.jpg")
(('a.jpg', 'b c.jpg'), ('a.jpg', 'b.jpg'))
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hookcli.errors import InputError, UsageProblem
from hookcli.files import regular_file_problem
from hookcli.inputs.discovery import gather_inputs

__all__ = ["given_pairs", "interleaved", "pairs_from_folders", "read_pair_line", "read_pairs"]

#: The most bytes a pairs file may hold (about a million pairs of long paths).
MAX_PAIRS_FILE = 512 * 1024 * 1024

_FORMAT_HINT = "write a pair a line: the source's path, a tab, the target's"


def read_pair_line(line: str) -> tuple[str, str] | None:
    """The two paths of a pairs file's line; None when it does not hold exactly two."""
    fields = line.split("\t") if "\t" in line else line.split()
    fields = [field.strip() for field in fields]
    if len(fields) != 2 or not all(fields):
        return None
    return fields[0], fields[1]


def read_pairs(path: str | os.PathLike[str]) -> list[tuple[os.PathLike[str], os.PathLike[str]]]:
    """The pairs a pairs file lists, each side one image that exists; refused in one line otherwise."""
    problem = regular_file_problem(Path(path))
    if problem is not None:
        raise InputError(f"pairs file '{os.fspath(path)}' {problem}", hint="give the file that lists the pairs")
    if os.path.getsize(path) > MAX_PAIRS_FILE:
        raise InputError(
            f"pairs file '{os.fspath(path)}' is larger than {MAX_PAIRS_FILE // 2**20} MiB",
            hint="split the pairs among runs",
        )
    try:
        text = Path(path).read_text(encoding="utf-8-sig")  # a byte-order mark some editors write is no path
    except UnicodeDecodeError:
        raise InputError(f"pairs file '{os.fspath(path)}' is not UTF-8 text", hint=_FORMAT_HINT) from None
    pairs = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        pair = read_pair_line(line)
        if pair is None:
            raise InputError(f"pairs file '{os.fspath(path)}' line {number} does not hold two paths", hint=_FORMAT_HINT)
        where = f"pairs file '{os.fspath(path)}' line {number}"
        pairs.append((_one_image(pair[0], where), _one_image(pair[1], where)))
    if not pairs:
        raise InputError(f"pairs file '{os.fspath(path)}' lists no pairs", hint=_FORMAT_HINT)
    return pairs


def pairs_from_folders(
    sources: str | os.PathLike[str], targets: str | os.PathLike[str]
) -> list[tuple[os.PathLike[str], os.PathLike[str]]]:
    """The images of two folders paired in order (each folder's images sorted by name); refused in one line when
    they hold different numbers of images."""
    found = []
    for folder in (sources, targets):
        if not Path(folder).is_dir():
            raise InputError(f"--pairs-from: '{os.fspath(folder)}' is not a folder", hint="give two folders of images")
        try:
            found.append(gather_inputs([os.fspath(folder)]))
        except InputError as err:
            raise InputError(
                f"--pairs-from: {err.message}", hint="--pairs-from reads a folder's own images, not its sub-folders"
            ) from None
    if len(found[0]) != len(found[1]):
        raise InputError(
            f"--pairs-from: '{os.fspath(sources)}' holds {len(found[0]):,} images and '{os.fspath(targets)}' "
            f"{len(found[1]):,}",
            hint="pairs are made in order of name, so the two folders must hold as many images",
        )
    return list(zip(found[0], found[1], strict=True))


def given_pairs(
    pairs: str | os.PathLike[str] | Sequence[Any] | None,
    pairs_from: tuple[str | os.PathLike[str], str | os.PathLike[str]] | None,
) -> list[tuple[Any, Any]]:
    """The pairs a call names: a pairs file, a list of ``(source, target)``, or two folders (``pairs_from``); one of
    them, refused in one line otherwise."""
    if (pairs is None) == (pairs_from is None):
        raise UsageProblem(
            "patch takes its pairs from a pairs file, a list of pairs or two folders: one of them",
            hint="give pairs=FILE or [(source, target), ...], or pairs_from=(SOURCES, TARGETS)",
        )
    if pairs_from is not None:
        return list(pairs_from_folders(*pairs_from))
    if isinstance(pairs, str | os.PathLike):
        return list(read_pairs(pairs))
    listed = []
    for number, pair in enumerate(pairs or ()):
        if not isinstance(pair, tuple | list) or len(pair) != 2:
            raise UsageProblem(f"a pair is a source and a target, not {pair!r}", hint="give [(source, target), ...]")
        where = f"pair {number}"
        listed.append((_one_image(os.fspath(pair[0]), where), _one_image(os.fspath(pair[1]), where)))
    return listed


def interleaved(pairs: Sequence[tuple[os.PathLike[str] | str, os.PathLike[str] | str]]) -> list[os.PathLike[str]]:
    """The run's inputs: each pair's source, then its target."""
    inputs: list[os.PathLike[str]] = []
    for source, target in pairs:
        inputs.extend(
            (Path(source) if isinstance(source, str) else source, Path(target) if isinstance(target, str) else target)
        )
    return inputs


def _one_image(name: str, where: str) -> os.PathLike[str]:
    """The one image ``name`` names (a file, or an archive's member); refused, saying ``where`` it was given,
    otherwise (a folder or an archive would shift every pair after it)."""
    try:
        found = gather_inputs([name])
    except InputError as err:
        raise InputError(f"{where}: {err.message}", hint=err.hint) from None
    if len(found) != 1 or Path(name).is_dir():
        raise InputError(f"{where}: '{name}' is not one image", hint="each side of a pair is one image file")
    return found[0]
