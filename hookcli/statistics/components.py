"""The principal components of an earlier statistics file, gathered as layers of their own (``stats --components``).

A layer's components are known only once every input has been seen, so the
inputs that drive a component hardest take a second pass: a run given a
statistics file with PCA (:func:`read_basis`) projects each row of each layer
that file describes onto the file's first :data:`MOST_COMPONENTS` components,
position by position (the channels less the file's means, onto each
component), and gathers the projections as a layer keyed ``<key>#pc`` whose
channels are the components (:func:`hookcli.storage.stats_format.component_key`). Every statistic of a
channel follows for each component: its moments, quantiles, and its dataset
examples with the projection's map over each, where ``--top-by mean`` ranks
inputs by the projection of their pooled channels, the PCA's own score.

>>> basis = Basis(torch.tensor([1.0, 0.0]), torch.tensor([[0.0], [1.0]], dtype=torch.float64))
>>> layout = UnitLayout.of((2, 1, 3))
>>> rows = torch.tensor([[[[1.0, 1.0, 1.0]], [[0.0, 2.0, 4.0]]]])
>>> derived, projected = basis.project(rows, layout)
>>> derived.kind, projected.tolist()
('maps', [[[[0.0, 2.0, 4.0]]]])
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch

from hookcli.errors import UsageProblem
from hookcli.statistics.units import UnitLayout
from hookcli.storage.shards import open_features
from hookcli.storage.stats_file import read_stats
from hookcli.storage.stats_format import is_component_key

__all__ = ["MOST_COMPONENTS", "Basis", "check_basis", "component_layout", "read_basis"]

#: The most components of a layer gathered (the first, by variance explained).
MOST_COMPONENTS = 16


@dataclass(frozen=True)
class Basis:
    """A layer's channel ``mean`` ``[C]`` and its first components, the columns of ``vectors`` ``[C, N]``."""

    mean: torch.Tensor
    vectors: torch.Tensor

    def project(self, rows: torch.Tensor, layout: UnitLayout) -> tuple[UnitLayout, torch.Tensor]:
        """Rows ``[n, *layout.row_shape]`` projected onto the components at each position, and their layout: maps
        ``[n, N, *S]``, tokens ``[n, T, N]`` (the prefix tokens left out) or vectors ``[n, N]``, float32."""
        maps = layout.units(rows)  # [n, C, P]
        vectors = self.vectors.to(maps.device, torch.float32)
        offset = self.mean.to(maps.device, torch.float32) @ vectors  # (x − μ)·v = x·v − μ·v
        projected = maps.to(torch.float32).transpose(1, 2) @ vectors - offset  # [n, P, N]
        count, components = projected.shape[0], vectors.shape[1]
        if layout.kind == "flat":
            return UnitLayout((components,), components, (), "flat"), projected.reshape(count, components)
        if layout.kind == "tokens":
            return UnitLayout((*layout.spatial, components), components, layout.spatial, "tokens"), projected
        maps_of = projected.transpose(1, 2).reshape(count, components, *layout.spatial)
        return UnitLayout((components, *layout.spatial), components, layout.spatial, "maps"), maps_of


def component_layout(row_shape, **_) -> UnitLayout:
    """The layout of a layer of components' rows, as :meth:`Basis.project` makes them: ``[N, *S]`` maps,
    ``[T, N]`` tokens (no prefix: it was left out before the projection) or ``[N]``."""
    shape = tuple(int(n) for n in row_shape)
    if len(shape) == 1:
        return UnitLayout(shape, shape[0], (), "flat")
    if len(shape) == 2:
        return UnitLayout(shape, shape[1], shape[:1], "tokens")
    return UnitLayout(shape, shape[0], shape[1:], "maps")


def read_basis(path) -> dict[str, Basis]:
    """The basis of every layer the statistics file ``path`` holds (refused, in one line, when it is not a
    statistics file, or holds no principal components)."""
    with open_features(path) as features:
        stats = read_stats(features)
        if not stats.options["pca"]:
            raise UsageProblem(
                f"'{path}' holds no principal components (it was made with --no-pca)",
                hint="give a statistics file made with --pca",
            )
        found = {}
        for key, layer in stats.layers.items():
            if is_component_key(key):
                continue  # components of components: not asked for
            count = min(MOST_COMPONENTS, layer.channels)  # each channel's first components: none of the others read
            rows = [stats.channel(key, "pca_vectors", channel, count) for channel in range(layer.channels)]
            vectors = torch.from_numpy(np.stack(rows))
            if not bool(torch.isfinite(vectors).all()):
                raise UsageProblem(
                    f"'{path}' holds components of '{key}' that are not finite numbers: its statistics took NaN or "
                    "infinite values, and every projection onto them would be NaN",
                    hint="gather the statistics again of inputs whose values are finite",
                )
            found[key] = Basis(torch.from_numpy(stats.read(key, "mean").copy()), vectors)
    return found


def check_basis(basis: Mapping[str, Basis], channels: Mapping[str, int | None], source: str) -> None:
    """Refuse a run whose layers (``channels`` of each key; None where not known yet) the basis has none of, or
    whose channels differ."""
    shared = [key for key in channels if key in basis]
    if not shared:
        raise UsageProblem(
            f"'{source}' holds the components of {', '.join(repr(k) for k in basis)}, and none of this run's layers "
            f"({', '.join(repr(k) for k in channels)})",
            hint="give the statistics file of the same layers (hookcli info lists them)",
        )
    for key in shared:
        if channels[key] is not None and basis[key].mean.shape[0] != channels[key]:
            raise UsageProblem(
                f"'{key}' has {channels[key]:,} channels, and its components in '{source}' "
                f"{basis[key].mean.shape[0]:,}",
                hint="give the statistics file of the same layer of the same model",
            )
