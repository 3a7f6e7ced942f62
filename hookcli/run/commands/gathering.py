"""What ``stats`` and ``compare`` share as commands: they gather over their inputs into one file, whose parts go
beside it while the run lasts."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, ClassVar

from hookcli.errors import UsageProblem
from hookcli.files import check_own_folder
from hookcli.run.commands.base import Command, Planned
from hookcli.run.launch import block_of
from hookcli.run.outputs import DEFAULT_OUTPUT, check_file_output, is_folder
from hookcli.storage.fileformat import parts_folder

if TYPE_CHECKING:
    from hookcli.storage.gathering import Gathering

__all__ = ["Gathers"]


class Gathers(Command):
    """A command that gathers (statistics, comparisons): one file (never stdout or a folder), or the result in
    memory."""

    gathers: ClassVar[bool] = True
    rows_on_device: ClassVar[bool] = True
    captures_as_asked: ClassVar[bool] = False
    stores_as_asked: ClassVar[bool] = False

    def output(self, output, model_name: str) -> tuple[str, str | None]:
        if output is None:
            return "memory", None
        if output is DEFAULT_OUTPUT:
            return "default", None
        text = "-" if hasattr(output, "write") else os.fspath(output)
        if text == "-":
            raise UsageProblem(
                f"{self.name} writes a file (its parts are kept beside it until the run completes), not to stdout",
                hint=f"name the file with -o, for example -o {self.name}.safetensors",
            )
        if text.endswith(("/", os.sep)) or is_folder(text):
            raise UsageProblem(
                f"{self.name} writes one file, and '{text}' is a folder",
                hint=f"name the file, for example -o {os.path.join(text, self.name + '.safetensors')}",
            )
        return self.name, text

    def check_target(self, kind: str, path: str | None, inputs, force: bool) -> None:
        if path is None:
            return
        check_file_output(path, inputs, force)
        check_own_folder(parts_folder(path), "a file's parts")

    def default_kind(self, inputs: int) -> str:
        return self.name

    def gathering_writer(self, run: Planned, gathering: Gathering, note: Callable[[str], None], record=None):
        """The writer that gathers ``gathering`` over ``run``'s inputs into its output (its record unless
        ``record`` says otherwise)."""
        from hookcli.storage.gathering_writer import GatheringWriter

        return GatheringWriter(
            record or run.record,
            run.inputs,
            run.output.path,
            gathering,
            shard_size=run.shard_size,
            force=run.force,
            part=block_of(run.part),
            on_note=note,
            team=run.team is not None,
        )

    def shared_kind(self) -> str:
        return self.name
