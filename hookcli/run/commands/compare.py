"""``hookcli compare``: CKA or RSA of every pair of representations, of one model's layers or two models'."""

from __future__ import annotations

from hookcli.run.commands.gathering import Gathers

__all__ = ["Compare"]


class Compare(Gathers):
    """Gathers the comparison of the layers' representations (:mod:`hookcli.run.compare` runs it, a second model
    beside the first)."""

    name = "compare"
    named = ".compare"
