"""The commands that run a model, each an object the run asks (:class:`~hookcli.run.commands.base.Command`): a new
command is a module here and a line in :data:`COMMANDS`."""

from __future__ import annotations

from hookcli.run.commands.ablate import Ablate
from hookcli.run.commands.base import Command
from hookcli.run.commands.cam import Cam
from hookcli.run.commands.compare import Compare
from hookcli.run.commands.extract import Extract
from hookcli.run.commands.grad import Grad
from hookcli.run.commands.patch import Patch
from hookcli.run.commands.stats import Stats

__all__ = ["COMMANDS", "Command"]

#: Every command that runs a model, by name.
COMMANDS: dict[str, Command] = {
    command.name: command for command in (Extract(), Grad(), Cam(), Stats(), Compare(), Ablate(), Patch())
}
