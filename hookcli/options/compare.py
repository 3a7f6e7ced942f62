"""The options of ``hookcli compare`` that say how to compare, each declared once as a typed field of
:class:`CompareOptions` (the model and input options of ``compare`` are a run's): the Click options and the checks
are made from its fields.

>>> from hookcli.options.declaring import declared
>>> declared("method", COMPARE_OPTIONS).choices, declared("rsa_rows", COMPARE_OPTIONS).high
(('linear-cka', 'minibatch-cka', 'rsa'), 10000)
"""

from __future__ import annotations

from dataclasses import dataclass

from hookcli.options.declaring import Option, check_value, declarations, option

__all__ = ["COMPARE_OPTIONS", "COMPARE_POOLS", "DISTANCES", "RANKINGS", "SIMILARITIES", "CompareOptions"]

#: What ``--method`` computes: exact linear CKA from running sums, the minibatch CKA estimator, or RSA.
SIMILARITIES = ("linear-cka", "minibatch-cka", "rsa")
#: How a representation is made of a layer's rows (``--pool``): each channel's mean or maximum over its
#: positions, or the rows flattened whole.
COMPARE_POOLS = ("avg", "max", "none")
#: How an RDM tells rows apart (``--rsa-distance``), and how two RDMs are compared (``--rsa-compare``).
DISTANCES = ("correlation", "euclidean")
RANKINGS = ("spearman", "pearson", "kendall")

_COMPARE = ("compare",)


@dataclass(frozen=True)
class CompareOptions:
    """How to compare: the ``method``, the ``pool`` (None: the method's own), for ``linear-cka`` whether it is
    ``debiased``, and for ``rsa`` the rows its RDMs are made of, their distance, how they are compared and whether
    they are kept in the file."""

    method: str = option(
        ("--method",),
        "linear-cka: exact linear CKA from running sums (representations of up to 16,384 values); minibatch-cka: "
        "the unbiased estimator averaged over the run's batches (maps taken whole); rsa: the RDMs of the first "
        "--rsa-rows inputs, compared by rank correlation.",
        _COMPARE,
        kind="choice",
        choices=SIMILARITIES,
        default="linear-cka",
        show_default=True,
    )
    pool: str | None = option(
        ("--pool",),
        "A representation: each channel's mean or maximum over its positions (tokens: over the patch tokens), "
        "or the layer's output whole. [linear-cka and rsa: avg; minibatch-cka: none]",
        _COMPARE,
        kind="choice",
        choices=COMPARE_POOLS,
    )
    debiased: bool = option(
        ("--debiased",),
        "linear-cka: the debiased estimator (each HSIC unbiased, after Song et al. 2012), near 0 for unrelated "
        "representations however few the inputs (4 at least), where plain CKA reads high until the inputs well "
        "outnumber the widths.",
        _COMPARE,
        kind="flag",
        default=False,
    )
    rsa_rows: int = option(
        ("--rsa-rows",),
        "rsa: the inputs the RDMs are made of, the first N (an RDM holds N x N distances: 8 MB at 1,000).",
        _COMPARE,
        kind="int",
        default=1000,
        low=3,
        high=10_000,
        show_default=True,
    )
    rsa_distance: str = option(
        ("--rsa-distance",),
        "rsa: the distance of two inputs, 1 - the Pearson correlation of their representations, or Euclidean.",
        _COMPARE,
        kind="choice",
        choices=DISTANCES,
        default="correlation",
        show_default=True,
    )
    rsa_compare: str = option(
        ("--rsa-compare",),
        "rsa: how two RDMs are compared, by the correlation of their upper triangles.",
        _COMPARE,
        kind="choice",
        choices=RANKINGS,
        default="spearman",
        show_default=True,
    )
    save_rdms: bool = option(
        ("--save-rdms",),
        "rsa: keep each RDM in the file too (rdm@<label>).",
        _COMPARE,
        kind="flag",
        default=False,
    )

    def __post_init__(self) -> None:
        for checked in COMPARE_OPTIONS:
            check_value(checked, getattr(self, checked.name))


#: Every option of how ``compare`` compares, in declaration order.
COMPARE_OPTIONS: tuple[Option, ...] = declarations(CompareOptions)
