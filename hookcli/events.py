"""What a run tells as it goes: the events a ``progress`` callback hears, as values.

The command line prints them; a Python caller may collect them. Every layer
that reports progress (a run, pictures, a report) speaks these.

>>> heard = []
>>> heard.append(Started(total=3)); heard.append(Advanced(2))
>>> heard
[Started(total=3, done=0, output=None), Advanced(count=2)]
"""

from __future__ import annotations

import os
from dataclasses import dataclass

__all__ = ["Advanced", "Damaged", "Event", "Note", "Skipped", "Started", "Wrote"]


@dataclass(frozen=True)
class Started:
    """A run (or a set of pictures) begins: ``total`` items, ``done`` of them by an earlier run; ``output`` where
    they are kept (the output as given, or the folder of parts a gathering run merges at its end)."""

    total: int
    done: int = 0
    output: str | None = None


@dataclass(frozen=True)
class Advanced:
    """``count`` more items are done (rows stored or inputs skipped; pictures drawn)."""

    count: int


@dataclass(frozen=True)
class Skipped:
    """``on_error="skip"`` left ``input`` out because of ``error``."""

    input: str
    error: str


@dataclass(frozen=True)
class Damaged:
    """``input`` was decoded though its decoder found it damaged, saying ``detail`` (libjpeg's words, such as
    ``Corrupt JPEG data: 3 extraneous bytes before marker 0xda``): its row holds what could be decoded."""

    input: str
    detail: str


@dataclass(frozen=True)
class Note:
    """Something the user should know that is not an error (a fallback, a layer left undrawn)."""

    text: str


@dataclass(frozen=True)
class Wrote:
    """A file of the output is complete at ``path``."""

    path: str | os.PathLike


Event = Started | Advanced | Skipped | Damaged | Note | Wrote
