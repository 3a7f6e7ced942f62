"""The ``hookcli`` command line: parses options, calls :mod:`hookcli.api`, prints what it reports.

The only package that imports Click, and the top layer: no run logic lives
here. :mod:`~hookcli.cli.app` holds the group (one-line errors, notes,
signals), :mod:`~hookcli.cli.declared` the option declarations the commands
share, :mod:`~hookcli.cli.commands` the commands (:mod:`~hookcli.cli.gathering` those
that gather: ``stats`` and ``compare``), :mod:`~hookcli.cli.running` what running one takes,
:mod:`~hookcli.cli.printing`
tables and ``info``'s text, and :mod:`~hookcli.cli.presets` the ``--config``
files. Heavy libraries (torch, numpy, Pillow) load in :mod:`hookcli.api` when a
command needs them, so ``hookcli --help`` starts at once.
"""

from hookcli.cli import commands, gathering  # noqa: F401  (register the commands on the group)
from hookcli.cli.app import main

__all__ = ["main"]
