"""A griffe extension: hookcli's reStructuredText docstrings read as Markdown by mkdocstrings.

The docstrings are written for reStructuredText and doctest: roles (``:class:`~hookcli.events.Started```) would
show as literal text, and ``>>>`` prompts would become nested block quotes. Roles become code spans naming the
object as a reader would type it, and each run of doctest lines becomes a fenced ``pycon`` block. Everything else
(double backticks, lists, paragraphs) already reads as Markdown. The modules stay as they are: their doctests run
under pytest.

The public names reach the reference without help: ``hookcli/__init__.py`` imports them under ``TYPE_CHECKING``,
which griffe reads as aliases, although at run time they load on first use.

mkdocs.yml names this file in mkdocstrings' ``extensions`` option.
"""

from __future__ import annotations

import re

import griffe

_ROLE = re.compile(r":(?:class|func|meth|mod|data|attr|exc|obj):`(~?)([^`]+)`")


def _without_roles(text: str) -> str:
    """``:class:`~a.b.C``` → ```C```, ``:mod:`a.b``` → ```a.b```."""
    return _ROLE.sub(lambda match: f"`{match[2].rsplit('.', 1)[-1] if match[1] else match[2]}`", text)


def _fenced_doctests(text: str) -> str:
    """Fence every doctest (its ``>>>`` lines and their output, up to the next blank line) as ``pycon``."""
    fenced, inside = [], False
    for line in text.splitlines():
        if line.lstrip().startswith(">>>") and not inside:
            fenced.append("```pycon")
            inside = True
        elif inside and not line.strip():
            fenced.append("```")
            inside = False
        fenced.append(line)
    if inside:
        fenced.append("```")
    return "\n".join(fenced)


class HookcliDocstrings(griffe.Extension):
    """Markdown for the reStructuredText docstrings of hookcli's objects."""

    def on_instance(self, *, obj: griffe.Object, **kwargs) -> None:
        if obj.docstring is not None and obj.path.split(".")[0] == "hookcli":
            obj.docstring.value = _fenced_doctests(_without_roles(obj.docstring.value))
