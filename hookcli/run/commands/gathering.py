"""What the commands that gather (``stats``, ``compare``, ``ablate``, ``patch``) share: they gather over their inputs
into one file, whose parts go beside it while the run lasts."""

from __future__ import annotations

import os
from typing import Any, ClassVar

from hookcli.errors import UsageProblem
from hookcli.files import check_own_folder
from hookcli.options.run import RunOptions
from hookcli.run.commands.base import Command
from hookcli.run.outputs import DEFAULT_OUTPUT, check_file_output, is_folder
from hookcli.storage.fileformat import parts_folder

__all__ = ["Gathers"]


class Gathers(Command):
    """A command that gathers: one file (never stdout or a folder), or the result in memory."""

    gathers: ClassVar[bool] = True
    rows_on_device: ClassVar[bool] = True
    captures_as_asked: ClassVar[bool] = False
    stores_as_asked: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """A gathering command's output is always its own kind of file, named after it, however many inputs or
        processes it has (what a subclass says of ``default_kind`` and ``shared_kind`` is replaced)."""
        super().__init_subclass__(**kwargs)
        cls.default_kind = cls.shared_kind = cls.name

    def output(self, output: Any, model_name: str, opts: RunOptions) -> tuple[str, str | None]:
        text = None
        if output is not None and output is not DEFAULT_OUTPUT:
            text = "-" if hasattr(output, "write") else os.fspath(output)
        if text == "-":
            raise UsageProblem(
                f"{self.name} writes a file (its parts are kept beside it until the run completes), not to stdout",
                hint=f"name the file with -o, for example -o {self.name}.safetensors",
            )
        if text is not None and (text.endswith(("/", os.sep)) or is_folder(text)):
            raise UsageProblem(
                f"{self.name} writes one file, and '{text}' is a folder",
                hint=f"name the file, for example -o {os.path.join(text, self.name + '.safetensors')}",
            )
        kind = self.name
        if output is None:
            kind = "memory"
        elif output is DEFAULT_OUTPUT:
            kind = "default"
        return kind, text

    def check_target(self, kind: str, path: str | None, inputs, force: bool) -> None:
        if path is not None:
            check_file_output(path, inputs, force, folders=False)
            check_own_folder(parts_folder(path), "a file's parts")
