"""How an option is declared: :class:`Option`, and :func:`option`, the dataclass field that declares one.

An options class (:class:`hookcli.options.run.RunOptions`, :class:`hookcli.options.grid.GridOptions`,
:class:`hookcli.options.compare.CompareOptions`) names each option once, as a typed field; the command line's
flags, the API's keywords and defaults, the checks and the CLI reference are all read from its fields.

>>> from dataclasses import dataclass
>>> @dataclass(frozen=True)
... class Drawn:
...     columns: int = option(("--columns",), "Tiles a row.", ("grid",), kind="int", default=8, low=1)
>>> declarations(Drawn)[0].name, declared("columns", declarations(Drawn)).flags
('columns', ('--columns',))
>>> try:
...     check_value(declared("columns", declarations(Drawn)), 0)
... except UsageProblem as err:
...     print(err.message)
columns must be a whole number of at least 1, not 0
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hookcli.errors import RANGE_HINT, UsageProblem, check_choice, check_whole

__all__ = ["Option", "check_flags", "check_value", "declarations", "declared", "option"]

#: Where a field keeps its :class:`Option` (``dataclasses.Field.metadata``).
_DECLARED = "hookcli.option"


@dataclass(frozen=True)
class Option:
    """One option: its keyword ``name`` and command-line ``flags``, the ``kind`` of value it takes (``int``,
    ``float``, ``choice``, ``flag``, ``text`` or ``parsed``: read by its ``parser``, which raises ValueError),
    its ``default``, bounds (``low``, ``high``) or ``choices``, its ``help`` and the ``commands`` that take it.
    A default that depends on what is drawn or run (None here) is said in the help's own words."""

    name: str
    flags: tuple[str, ...]
    help: str
    commands: tuple[str, ...]
    kind: str = "text"
    default: Any = None
    low: float | None = None
    high: float | None = None
    choices: tuple[str, ...] | None = None
    metavar: str | None = None
    parser: Callable[[Any], Any] | None = None
    multiple: bool = False
    show_default: bool = False
    #: The help a command gives instead of ``help`` (``(command, text)`` pairs).
    help_in: tuple[tuple[str, str], ...] = ()

    def help_for(self, command: str) -> str:
        """The help ``command`` gives for this option."""
        return dict(self.help_in).get(command, self.help)

    @property
    def long(self) -> str:
        """The long flag, as errors name it (``--batch-size``)."""
        return self.flags[0].split("/")[0]


def option(
    flags: tuple[str, ...], help: str, commands: tuple[str, ...], *, default: Any = None, **declared: Any
) -> Any:
    """A dataclass field that declares an option: its default, and the rest of :class:`Option` (named by the
    field)."""
    return dataclasses.field(
        default=default, metadata={_DECLARED: Option("", flags, help, commands, default=default, **declared)}
    )


def declarations(options: type) -> tuple[Option, ...]:
    """The options the fields of the dataclass ``options`` declare, in field order."""
    return tuple(
        dataclasses.replace(field.metadata[_DECLARED], name=field.name)
        for field in dataclasses.fields(options)
        if _DECLARED in field.metadata
    )


def declared(name: str, table: tuple[Option, ...]) -> Option:
    """The declaration of option ``name`` in ``table``."""
    return next(option for option in table if option.name == name)


def check_value(option: Option, value: Any) -> None:
    """Refuse, with the library's words, a ``value`` outside ``option``'s bounds or choices (None passes when the
    option has no default)."""
    if value is None and option.default is None:
        return
    if option.kind == "int":
        if option.low is not None:
            check_whole(option.name, value, int(option.low), None if option.high is None else int(option.high))
        elif isinstance(value, bool) or not isinstance(value, int):
            raise UsageProblem(f"{option.name} must be a whole number, not {value!r}", hint=RANGE_HINT)
    elif option.kind == "float":
        low, high = option.low or 0.0, option.high or 0.0
        if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
            raise UsageProblem(f"{option.name} must be between {low:g} and {high:g}, not {value!r}", hint=RANGE_HINT)
    elif option.kind == "choice":
        check_choice(option.name, value, option.choices)
    elif option.kind == "flag" and not isinstance(value, bool):
        raise UsageProblem(f"{option.name} must be True or False, not {value!r}", hint=RANGE_HINT)


def check_flags(values: object, table: tuple[Option, ...]) -> None:
    """Refuse a flag of ``values`` that is not True or False ("no" is true to Python)."""
    for option in table:
        if option.kind == "flag":
            check_value(option, getattr(values, option.name))
