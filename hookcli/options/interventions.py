"""What ``--intervene LAYER[:UNITS]=EDIT`` asks for, read without torch: :class:`Intervention` and its parser.

UNITS is ``K``, ``A:B`` (from A to B-1), ``K,L,M`` or ``*`` (every unit, the default), counted over a map's
channels, a token's features or a vector's units. EDIT is ``zero``, ``value:V``, ``mean:FILE``, ``resample``,
``scale:F``, ``add:FILE:KEY:ROW:ALPHA`` or ``clamp:LO:HI``; :mod:`hookcli.run.edits` applies them.

>>> parse_intervention("features.14:135=zero")
Intervention(layer='features.14', units=(135,), edit='zero', numbers=(), file=None, key=None, row=None)
>>> parse_intervention("layer4:0:4=add:stats.safetensors:layer4@pca_vectors:0:2.5").describe()["units"]
[0, 1, 2, 3]
>>> parse_intervention("fc=clamp:-1:1").numbers, parse_intervention("fc=clamp:-1:1").units
((-1.0, 1.0), None)
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hookcli.errors import UsageProblem
from hookcli.files import regular_file_problem
from hookcli.options.effects import split_how

if TYPE_CHECKING:
    from hookcli.options.run import RunOptions

__all__ = [
    "EDITS",
    "FLOAT32_MAX",
    "MAX_UNITS",
    "Intervention",
    "asked_interventions",
    "parse_intervention",
    "parse_interventions",
    "parse_units",
    "read_beside",
]

#: The edits a spec may name, with what follows the name.
EDITS = {
    "zero": "",
    "value": "V",
    "mean": "FILE",
    "resample": "",
    "scale": "F",
    "add": "FILE:KEY:ROW:ALPHA",
    "clamp": "LO:HI",
}

#: The most units a spec may list one by one, or the highest unit it may name.
MAX_UNITS = 1 << 20

_HINT = "give LAYER[:UNITS]=EDIT, UNITS as K, A:B, K,L,M or *, EDIT one of " + ", ".join(
    f"{name}:{arguments}" if arguments else name for name, arguments in EDITS.items()
)


@dataclass(frozen=True)
class Intervention:
    """One edit of one layer's output: the ``layer`` (a module path), its ``units`` (None: every one), the ``edit``
    and its ``numbers`` (``value``'s V, ``scale``'s F, ``clamp``'s LO and HI, ``add``'s ALPHA), and for the edits
    that read a file, the ``file``, ``key`` and ``row``."""

    layer: str
    units: tuple[int, ...] | None
    edit: str
    numbers: tuple[float, ...] = ()
    file: str | None = None
    key: str | None = None
    row: int | None = None
    #: What errors name it by (``--intervene 'SPEC'`` when left empty).
    said: str = field(default="", repr=False, compare=False)
    #: The spec as it was written.
    written: str = field(default="", repr=False, compare=False)

    @property
    def named(self) -> str:
        """How errors name it: as it was written."""
        return self.said or f"--intervene '{self.written or self.text}'"

    def describe(self) -> dict[str, Any]:
        """The edit as a file's metadata records it (the file's stamp is added where it is read)."""
        found: dict[str, Any] = {"layer": self.layer, "units": None if self.units is None else list(self.units)}
        found["edit"] = self.edit
        if self.numbers:
            found["numbers"] = list(self.numbers)
        if self.file is not None:
            found["file"] = self.file
        if self.key is not None:
            found.update(key=self.key, row=self.row)
        return found

    @property
    def text(self) -> str:
        """The spec written back: its units as a range ``A:B`` where they run on from one to the next, else one by
        one."""
        units = "" if self.units is None else ":" + _units_text(self.units)
        arguments = [*([self.file] if self.file else []), *([self.key, str(self.row)] if self.key else [])]
        arguments += [f"{number:g}" for number in self.numbers]
        return f"{self.layer}{units}={':'.join([self.edit, *arguments])}"


def _units_text(units: tuple[int, ...]) -> str:
    """Units as a spec writes them: ``A:B`` for a run of more than two, each one by one otherwise.

    >>> _units_text((0, 1, 2, 3)), _units_text((4, 5)), _units_text((3, 1, 2))
    ('0:4', '4,5', '3,1,2')
    """
    if len(units) > 2 and units == tuple(range(units[0], units[0] + len(units))):
        return f"{units[0]}:{units[0] + len(units)}"
    return ",".join(map(str, units))


def parse_interventions(specs: Any) -> tuple[Intervention, ...]:
    """Every spec of ``specs`` (one string, or a list of them, applied in order) parsed."""
    if specs is None:
        return ()
    return tuple(parse_intervention(spec) for spec in ((specs,) if isinstance(specs, str) else specs))


def asked_interventions(opts: RunOptions) -> tuple[Intervention, ...]:
    """The edits ``--intervene`` asks for, each refused in one line when its spec is not one or the file it reads is
    not there."""
    found = parse_interventions(opts.intervene)
    for spec in found:
        problem = None if spec.file is None else regular_file_problem(Path(spec.file))
        if problem is not None:
            raise UsageProblem(
                f"--intervene '{spec.text}': '{spec.file}' {problem}",
                hint="mean:FILE takes a stats file of the same model and layer; add:FILE any safetensors file",
            )
    if opts.capture_edited and not found:
        raise UsageProblem("--capture-edited applies to layers edited with --intervene", hint="give --intervene too")
    return found


def parse_intervention(spec: Any) -> Intervention:
    """``LAYER[:UNITS]=EDIT`` as an :class:`Intervention`; :class:`UsageProblem` naming the spec when it is not one."""
    if isinstance(spec, Intervention):
        return spec
    text = str(spec).strip()
    target, equals, edit = text.partition("=")
    if not equals or not target.strip() or not edit.strip():
        raise _refused(spec, "it is not LAYER[:UNITS]=EDIT")
    layer, colon, units = target.strip().partition(":")
    if not layer:
        raise _refused(spec, "it names no layer")
    name, after, rest = edit.strip().partition(":")
    if name not in EDITS:
        raise _refused(spec, f"'{name}' is not an edit")
    found = _with_arguments(spec, layer, _units(spec, units) if colon else None, name, after + rest)
    return dataclasses.replace(found, written=text)


def _with_arguments(spec: Any, layer: str, units: tuple[int, ...] | None, name: str, rest: str) -> Intervention:
    """The intervention of edit ``name``, reading what follows the name (``rest``: empty, or a colon and then its
    arguments)."""
    wanted = EDITS[name]
    if not wanted:
        if rest:
            raise _refused(spec, f"{name} takes nothing after it")
        return Intervention(layer, units, name)
    rest = rest[1:]
    if name == "mean":
        if not rest:
            raise _refused(spec, "mean takes the statistics file: mean:FILE")
        return Intervention(layer, units, name, file=rest)
    if name == "add":
        pieces = rest.rsplit(":", 3)
        if len(pieces) != 4 or not all(pieces):
            raise _refused(spec, "add takes add:FILE:KEY:ROW:ALPHA")
        file, key, row, alpha = pieces
        if not (row.isascii() and row.isdigit()):
            raise _refused(spec, f"add's ROW must be a whole number from 0, not '{row}'")
        return Intervention(layer, units, name, (_number(spec, alpha),), file=file, key=key, row=int(row))
    pieces = rest.split(":") if rest else []
    if len(pieces) != wanted.count(":") + 1:
        raise _refused(spec, f"{name} takes {name}:{wanted}")
    numbers = tuple(_number(spec, piece) for piece in pieces)
    if name == "clamp" and not numbers[0] <= numbers[1]:
        raise _refused(spec, f"clamp's LO must not be above its HI ({numbers[0]:g} > {numbers[1]:g})")
    return Intervention(layer, units, name, numbers)


def _units(spec: Any, text: str) -> tuple[int, ...] | None:
    try:
        return parse_units(text)
    except ValueError as err:
        raise _refused(spec, str(err)) from None


def parse_units(text: str) -> tuple[int, ...] | None:
    """The units ``K``, ``A:B``, ``K,L,M`` or ``*`` name, in order and without repeats (None: every one); ValueError
    saying why when ``text`` names none."""
    text = text.strip()
    if text == "*":
        return None
    try:
        if any(not _WHOLE.fullmatch(piece.strip()) for piece in re.split("[:,]", text)):
            raise ValueError(text)  # int() takes other scripts' digits and underscores too
        if ":" in text:
            start, stop = (int(piece) for piece in text.split(":"))
            range_ok = 0 <= start < stop <= MAX_UNITS
        else:
            units = tuple(dict.fromkeys(int(piece) for piece in text.split(",")))
    except ValueError:
        raise ValueError(f"'{text}' names no units") from None
    if ":" in text:
        if not range_ok:
            raise ValueError(f"the units {text} are no range A:B with 0 <= A < B")
        return tuple(range(start, stop))
    if len(units) > MAX_UNITS or any(not 0 <= unit < MAX_UNITS for unit in units):
        raise ValueError(f"the units {text} are not whole numbers from 0")
    return units


def _number(spec: Any, text: str) -> float:
    try:
        if not text.isascii() or "_" in text:
            raise ValueError(text)  # float() takes other scripts' digits and underscores too
        number = float(text)
    except ValueError:
        raise _refused(spec, f"'{text}' is not a number") from None
    if not math.isfinite(number):
        raise _refused(spec, f"'{text}' is not a finite number")
    if abs(number) > FLOAT32_MAX:
        raise _refused(spec, f"'{text}' is beyond float32's range (±3.4e38), in which layers compute")
    return number


#: The largest finite float32: a number or vector past it becomes infinite in the layer it edits.
FLOAT32_MAX = 3.4028234663852886e38


#: A unit, as ``--intervene`` and ``--units`` take it: ASCII digits (a sign only to be refused as below 0).
_WHOLE = re.compile(r"-?[0-9]+")


def _refused(spec: Any, why: str) -> UsageProblem:
    return UsageProblem(f"--intervene '{spec}': {why}", hint=_HINT)


def read_beside(opts, interventions: Sequence[Intervention] = ()) -> list[str]:
    """The files a run reads besides its inputs (``--components``, an edit's FILE, ``ablate --how mean:FILE``): its
    output may be none of them."""
    components = getattr(opts, "components", None)
    how, ablation_means = split_how(getattr(opts, "how", None))
    files = [spec.file for spec in interventions if spec.file] + ([components] if components else [])
    return files + ([ablation_means] if how == "mean" and ablation_means else [])
