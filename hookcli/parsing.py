"""Option values read from text: the parsers of the options declared ``kind="parsed"`` in :mod:`hookcli.options`.

Each raises ValueError saying what it accepts (the command line shows it as a usage error).

>>> parse_triple("0.5"), parse_device(" CUDA:1 "), parse_channels("4:"), parse_levels("0.5, 0.995")
((0.5, 0.5, 0.5), 'cuda:1', slice(4, None, None), (0.5, 0.995))
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from hookcli.errors import UsageProblem

__all__ = [
    "DEVICE_PATTERN",
    "Part",
    "block_of",
    "check_normalisation",
    "parse_channels",
    "parse_device",
    "parse_levels",
    "parse_part",
    "parse_region",
    "parse_triple",
]


def parse_triple(value) -> tuple[float, float, float]:
    """Three floats (a mean or std) from ``R,G,B``, one number for all three, or a sequence; ValueError if not."""
    parts: list[Any]
    if isinstance(value, int | float) and not isinstance(value, bool):
        parts = [value]
    elif isinstance(value, list | tuple):
        parts = list(value)
    else:
        parts = str(value).replace(" ", "").split(",")
    try:
        numbers = tuple(float(p) for p in parts)
    except (TypeError, ValueError):
        raise ValueError(f"'{value}' is not a number or three comma-separated numbers") from None
    if len(numbers) == 1:
        numbers = numbers * 3
    if len(numbers) != 3:
        raise ValueError(f"'{value}' has {len(numbers)} values; give one or three (R,G,B)")
    return numbers


#: What ``--device`` accepts.
DEVICE_PATTERN = re.compile(r"auto|cpu|cuda(:\d+)?|mps")


def parse_device(value) -> str:
    """``value`` (a string or a ``torch.device``) as a device name; ValueError saying what is accepted."""
    text = str(value).strip().lower()
    if not DEVICE_PATTERN.fullmatch(text):
        raise ValueError(f"'{value}' is not a device; use auto, cpu, cuda, cuda:N or mps")
    return text


def parse_channels(value) -> slice | None:
    """A channel selection as a slice: ``"A:B"`` (either end may be left out), one channel ``K``, or a slice; a
    sequence of one of these (the option given once), or of none.

    >>> parse_channels(("3",)), parse_channels(())
    (slice(3, 4, None), None)
    """
    if isinstance(value, list | tuple):
        if len(value) > 1:
            given = ", ".join(_channels_text(item) for item in value)
            raise ValueError(f"given {len(value)} times ({given}); give one range A:B or one channel K")
        value = value[0] if value else None
    if value is None or isinstance(value, slice):
        return value
    text = str(value).strip()
    try:
        if ":" not in text:
            index = int(text)
            return slice(index, index + 1 if index != -1 else None)
        start, stop = text.split(":")
        return slice(int(start) if start else None, int(stop) if stop else None)
    except ValueError:
        raise ValueError(f"'{value}' is not a channel range; use A:B, A:, :B or one index K") from None


def _channels_text(value) -> str:
    """A channel selection as it was written: ``16``, ``0:64``, ``:8``."""
    if not isinstance(value, slice):
        return str(value)
    if value.start is not None and value.stop == value.start + 1:
        return str(value.start)
    return f"{'' if value.start is None else value.start}:{'' if value.stop is None else value.stop}"


#: The most quantile levels one run gathers.
MAX_LEVELS = 100


def parse_levels(value) -> tuple[float, ...]:
    """Quantile levels from ``"Q,Q,..."`` or a sequence of numbers, each from 0 to 1, in the order given (at most
    :data:`MAX_LEVELS`, none repeated); ValueError saying what is accepted."""
    parts = list(value) if isinstance(value, list | tuple) else str(value).replace(" ", "").split(",")
    try:
        levels = tuple(float(part) for part in parts)
    except (TypeError, ValueError):
        raise ValueError(f"'{value}' is not a list of quantile levels such as 0.5,0.99,0.995") from None
    if not levels or len(levels) > MAX_LEVELS:
        raise ValueError(f"give 1 to {MAX_LEVELS} quantile levels, not {len(levels)}")
    wrong = next((level for level in levels if not 0 <= level <= 1), None)
    if wrong is not None:
        raise ValueError(f"quantile level {wrong} is not between 0 and 1")
    if len(set(levels)) < len(levels):
        raise ValueError(f"'{value}' repeats a level")
    return levels


@dataclass(frozen=True)
class Part:
    """Process ``index`` (from 0) of ``count``; ``local_index`` of ``local_count`` on this machine; for torchrun's
    processes that form a group, the ``address`` (``MASTER_ADDR``, ``MASTER_PORT``) where they meet."""

    index: int
    count: int
    local_index: int = 0
    local_count: int = 1
    launcher: str = "--part"
    address: tuple[str, int] | None = None


_PART = re.compile(r"\s*(\d+)\s*/\s*(\d+)\s*")


def parse_part(text: str) -> Part:
    """``K/N`` (the K-th of N parts, from 1) as a :class:`Part`; :class:`UsageProblem` when it is not one."""
    found = _PART.fullmatch(str(text))
    if not found or not 1 <= int(found.group(1)) <= int(found.group(2)):
        raise UsageProblem(
            f"--part takes K/N with 1 <= K <= N (the K-th of N processes), not '{text}'",
            hint="for example --part 1/4 … --part 4/4 for four processes",
        )
    return Part(int(found.group(1)) - 1, int(found.group(2)))


def check_normalisation(mean, std) -> None:
    """Refuse a mean or std that would turn every pixel into NaN or infinity: non-finite values, a std of 0."""
    if mean is not None and not all(math.isfinite(v) for v in mean):
        raise ValueError(f"mean must be finite numbers, not {', '.join(map(str, mean))}")
    if std is not None and not all(math.isfinite(v) and v > 0 for v in std):
        raise ValueError(f"std must be finite numbers above 0, not {', '.join(map(str, std))}")


def parse_region(spec: str | None) -> tuple[float, float, float, float] | None:
    """``--region x0,y0,x1,y1``: a box as fractions of the image (0 to 1, x0 < x1, y0 < y1), or None.

    >>> parse_region("0,0.5,1,1")
    (0.0, 0.5, 1.0, 1.0)
    """
    if spec is None:
        return None
    try:
        values = tuple(float(v) for v in str(spec).split(","))
    except ValueError:
        values = ()
    if len(values) != 4 or not all(0 <= v <= 1 for v in values) or values[0] >= values[2] or values[1] >= values[3]:
        raise UsageProblem(
            f"region '{spec}' is not x0,y0,x1,y1 with fractions of the image from 0 to 1, x0 < x1 and y0 < y1",
            hint="for example --region 0.25,0.25,0.75,0.75 (the middle)",
        )
    return values


def block_of(part: Part | None) -> tuple[int, int]:
    """``(index, count)`` of ``part``: which block of shards this process takes first; ``(0, 1)`` alone."""
    return (part.index, part.count) if part is not None else (0, 1)
