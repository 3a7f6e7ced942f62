"""The ``hookcli`` command line: parses options, calls :mod:`hookcli.api`, prints what it reports.

The top layer and the only package that imports Click; no run logic lives here. :mod:`~hookcli.cli.app` holds the
group (one-line errors, notes, signals), :mod:`~hookcli.cli.declared` the shared option declarations,
:mod:`~hookcli.cli.commands` the commands (:mod:`~hookcli.cli.gathering` ``stats`` and ``compare``),
:mod:`~hookcli.cli.running` what running one takes, :mod:`~hookcli.cli.printing` tables and ``info``'s text, and
:mod:`~hookcli.cli.presets` the ``--config`` files. Torch, numpy and Pillow load in :mod:`hookcli.api` only when a
command needs them, so ``hookcli --help`` starts at once.
"""

from hookcli.cli import ablating, attending, commands, gathering, patching  # noqa: F401  (register the commands on the group)
from hookcli.cli.app import main

__all__ = ["main"]
