"""``hookcli extract``: the layers' outputs (or inputs), a row an input."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hookcli.errors import UsageProblem
from hookcli.run.commands.base import Command

if TYPE_CHECKING:
    from hookcli.models.loaded import LoadedModel
    from hookcli.options.run import RunOptions
    from hookcli.run.settings import RunSettings

__all__ = ["Extract"]


class Extract(Command):
    """Keeps what the hooked layers give, as :class:`~hookcli.run.commands.base.Command` does."""

    name = "extract"

    def check_options(self, opts: RunOptions) -> None:
        if opts.attention != "all" and opts.capture != "attention":
            raise UsageProblem(
                f"--attention {opts.attention} says what --capture attention keeps, and the capture is {opts.capture}",
                hint="add --capture attention, or leave --attention out",
            )
        if opts.capture == "attention" and opts.pool not in (None, "none"):
            raise UsageProblem(
                f"--pool {opts.pool} pools maps and tokens, and attention weights are neither",
                hint="leave --pool out with --capture attention",
            )

    def parts(self, loaded: LoadedModel, layers: Any, settings: RunSettings, opts: RunOptions, target: Any):
        if settings.capture == "attention" and settings.attention.startswith("class") and loaded.prefix_tokens == 0:
            raise UsageProblem(
                f"--attention {settings.attention} keeps the first token's row, and {loaded.name} has no class token "
                "before its patches (the first token is a patch)",
                hint="keep every row (--attention all or mean)",
            )
        return super().parts(loaded, layers, settings, opts, target)
