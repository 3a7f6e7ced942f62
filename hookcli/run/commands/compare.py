"""``hookcli compare``: CKA or RSA of every pair of representations, of one model's layers or two models'."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from hookcli.errors import UsageProblem
from hookcli.run.commands.base import Planned
from hookcli.run.commands.gathering import Gathers

if TYPE_CHECKING:
    from hookcli.storage.rows_writer import RowsWriter

__all__ = ["Compare"]


class Compare(Gathers):
    """Gathers the comparison of the layers' representations. Its plan alone does not say how to compare them:
    :func:`hookcli.run.compare.compare_models` runs it (a second model beside the first), as a
    :class:`~hookcli.run.compare.ComparedRun`."""

    name = "compare"
    named = ".compare"

    def writer(self, run: Planned, note: Callable[[str], None]) -> RowsWriter:
        raise UsageProblem(
            "a comparison's plan says what runs, not how to compare it", hint="run it with hookcli.compare"
        )
