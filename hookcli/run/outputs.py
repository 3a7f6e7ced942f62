"""Where a run's rows go, decided and checked before any work: the kind of output a value names
(memory, a file, stdout, a shard folder, a CAM folder), its default name, and what it must not overwrite.

>>> default_output_name("resnet18", ["layer1"]), default_output_name("timm:vit_small", ["a", "b"], folder=True)
(PosixPath('resnet18-layer1.safetensors'), PosixPath('timm-vit_small-2layers'))
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from hookcli.errors import OutputExistsError, UsageProblem
from hookcli.files import check_writable
from hookcli.models.specs import parse_model
from hookcli.pictures.file_names import safe_name
from hookcli.storage.output_names import refuse_other_format

__all__ = [
    "check_file_output",
    "DEFAULT_OUTPUT",
    "default_output_name",
    "default_path",
    "is_folder",
    "model_label",
    "Output",
    "refuse_drawn_grids",
    "refuse_overwriting_inputs",
]


class _DefaultOutput:
    def __repr__(self) -> str:
        return "DEFAULT_OUTPUT"


#: ``output=DEFAULT_OUTPUT``: write where the command line writes when no ``-o`` is given.
DEFAULT_OUTPUT = _DefaultOutput()


@dataclass(frozen=True)
class Output:
    """Where rows go: ``memory`` (returned), ``file``, ``stdout``, ``folder`` (shards), ``cam`` (a CAM folder),
    ``stats`` (a statistics file) or ``compare`` (a comparison file)."""

    kind: str
    path: str | None = None
    #: Where ``stdout`` rows go when the caller gave a binary stream instead of ``-`` (None: ``sys.stdout``).
    stream: BinaryIO | None = field(default=None, repr=False)

    @property
    def to_stdout(self) -> bool:
        """Whether the rows' bytes go to stdout (or the binary stream given), so that the run returns nothing."""
        return self.kind == "stdout"

    @property
    def named_path(self) -> str:
        """``path``, of a kind that names one (every kind but ``memory``)."""
        if self.path is None:
            raise ValueError(f"a {self.kind} output names no path")
        return self.path


def is_folder(path: str) -> bool:
    """Whether ``path`` is a folder now (False where it cannot be told: a name too long is said by the checks)."""
    try:
        return Path(path).is_dir()
    except OSError:
        return False


def default_output_name(model_name: str, keys: Sequence[str], *, folder: bool = False, kind: str = "") -> Path:
    """``<model>-<key>`` for one layer's key, ``<model>-<n>layers`` for more; then ``<kind>.safetensors`` unless a
    folder."""
    label = keys[0] if len(keys) == 1 else f"{len(keys)}layers"
    name = f"{model_label(model_name)}-{label.replace(os.sep, '_')}"
    return Path(name) if folder else Path(f"{name}{kind}.safetensors")


def default_path(kind: str, model_name: str, keys: Sequence[str], named: str) -> str:
    """The path of an output of ``kind`` named by default: after the model and the layers' ``keys``, a file's name
    ending in what the command ``named`` it, then ``.safetensors``."""
    return str(default_output_name(model_name, keys, folder=kind == "folder", kind=named))


def model_label(model_name: str) -> str:
    """The model's name as a file name: ``timm-resnet50`` for ``timm:resnet50`` (see :mod:`hookcli.models.sources`)."""
    return parse_model(model_name).label


def check_file_output(path: str, inputs: Sequence[os.PathLike[str]], force: bool, *, folders: bool = True) -> None:
    """Refuse a file output that could not be written, that is one of the inputs, or that is named like another
    format (``folders``: the command writes shard folders too)."""
    check_writable(path, force=force)
    refuse_overwriting_inputs([path], inputs)
    refuse_other_format(path, folders=folders)


def refuse_drawn_grids(folder: str, keys: Sequence[str]) -> None:
    """``--grid``: refuse, before any work, a folder that already holds pictures of these keys (grid writes a layer's
    PNGs under names that start with its key; see :mod:`hookcli.pictures.grids`)."""
    try:
        names = sorted(entry.name for entry in os.scandir(folder) if entry.name.endswith(".png"))
    except OSError:  # not there yet: nothing to overwrite
        return
    prefixes = tuple(safe_name(key) for key in keys)
    drawn = [name for name in names if name.startswith(prefixes)]
    if drawn:
        more = f" and {len(drawn) - 1} more" if len(drawn) > 1 else ""
        raise OutputExistsError(
            f"--grid folder '{folder}' already holds pictures of these layers ('{drawn[0]}'{more})",
            hint="add --force to draw them again, or give another --grid folder",
        )


def refuse_overwriting_inputs(outputs: Sequence, inputs: Sequence[os.PathLike[str]]) -> None:
    """An output that is one of the inputs would destroy it, --force or not."""

    def identity(path) -> tuple[int, int] | None:
        try:
            found = os.stat(path)
        except OSError:
            return None
        return found.st_dev, found.st_ino

    existing = {identity(p) for p in outputs} - {None}
    if not existing:
        return
    for source in inputs:
        if identity(source) in existing:
            raise UsageProblem(
                f"output '{next(p for p in outputs if identity(p) == identity(source))}' is the input '{source}'",
                hint="write the output somewhere else with -o",
            )
