"""``hookcli extract``: the layers' outputs (or inputs), a row an input."""

from __future__ import annotations

from hookcli.run.commands.base import Command

__all__ = ["Extract"]


class Extract(Command):
    """Keeps what the hooked layers give, as :class:`~hookcli.run.commands.base.Command` does."""

    name = "extract"
