"""The keywords a function of :mod:`hookcli.api` is given: its typed options objects and its keywords as one dict.

>>> from hookcli.options.run import RunOptions
>>> given_keywords(RunOptions(batch_size=4, resize=64), {"resize": 32, "target": None})
{'resize': 32, 'batch_size': 4}
"""

from __future__ import annotations

import dataclasses
from typing import Any

from hookcli.options.declaring import declarations
from hookcli.options.grid import GridOptions
from hookcli.options.run import RunOptions

__all__ = ["given_keywords"]


def given_keywords(typed: Any, keywords: dict[str, Any], *also: type) -> dict[str, Any]:
    """The options ``typed`` (an options object, or a list of them) sets away from its defaults, and ``keywords``,
    which win, an option's keyword given None taking its default, as a Python function's would; ``also``: the
    options classes the function takes besides :class:`RunOptions` (with :class:`GridOptions`, instead of it)."""
    taken = also if GridOptions in also else (RunOptions, *also)
    defaults = {option.name: option.default for kind in taken for option in declarations(kind)}
    keywords = {name: value for name, value in keywords.items() if value is not None or defaults.get(name) is None}
    objects: tuple[Any, ...] = tuple(typed) if isinstance(typed, list | tuple) else () if typed is None else (typed,)
    given: dict[str, Any] = {}
    for each in objects:
        if not (dataclasses.is_dataclass(each) and isinstance(each, taken)):
            names = " or ".join(kind.__name__ for kind in taken)
            raise TypeError(f"options must be {names} (or a list of them), not {type(each).__name__}")
        defaults = {field.name: field.default for field in dataclasses.fields(each)}
        given.update({name: value for name, value in vars(each).items() if value != defaults.get(name, value)})
    return {**given, **keywords}
