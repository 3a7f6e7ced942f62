"""Interventions applied: each :class:`~hookcli.options.interventions.Intervention` resolved against the model as an
:class:`Edit`, a forward hook that returns the layer's output edited.

A layer's units are its channels as ``stats`` reads them (:class:`~hookcli.statistics.units.UnitLayout`): a map's
channels, a token's features (every token, prefix tokens included) or a vector's units. An edit returns a new
tensor, so what a capture at the edited layer copied before it stays what the layer returned.

>>> import torch
>>> from hookcli.options.interventions import parse_intervention
>>> net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 1))
>>> (edit,) = resolve_edits(net, [parse_intervention("0:1,3=scale:0")], model_name="net")
>>> edit.describe()
{'layer': '0', 'units': [1, 3], 'edit': 'scale', 'numbers': [0.0]}
>>> with torch.no_grad(), edit.attached(net):
...     out = net(torch.ones(1, 3, 2, 2))
>>> out[0, :, 0, 0].eq(0).tolist()
[False, True, False, True]
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import math
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from hookcli.errors import FeatureFileError, UsageProblem
from hookcli.families import channels_last_output, square_input
from hookcli.inputs.archives import file_stamp
from hookcli.inputs.preprocess import Preprocess
from hookcli.models.loaded import LoadedModel
from hookcli.options.interventions import FLOAT32_MAX, Intervention
from hookcli.run.settings import RunSettings
from hookcli.statistics.units import UnitLayout, known_units
from hookcli.storage.fileformat import identity_differences
from hookcli.storage.recorded_run import lenient_json, recorded_edits, recorded_layers
from hookcli.storage.shards import open_features
from hookcli.storage.stats_format import is_stats

__all__ = [
    "Edit",
    "Overflow",
    "edits_entries",
    "first_missing",
    "partners",
    "read_otherwise",
    "resampled_alone",
    "resolve_edits",
    "unseen_by_attention",
    "with_edits",
]


@dataclass
class Overflow:
    """Whether an edit made values infinite, kept on the device so that no batch waits for it: read once a copy of
    it has reached the host (a CUDA event says when, without waiting), or at the end of the run, waiting."""

    found: torch.Tensor | bool = False
    #: The dtype the layer computes in, where it was found.
    dtype: torch.dtype = torch.float32
    said: bool = False
    _copy: tuple[torch.Tensor, Any] | None = None

    def add(self, flag: torch.Tensor | bool, dtype: torch.dtype) -> None:
        """Keep ``flag`` (of one batch) with what earlier batches found."""
        if self.found is True or flag is False:
            return
        self.dtype = dtype
        self.found = flag if self.found is False or flag is True else self.found | flag

    def take(self, *, wait: bool) -> bool:
        """Whether it is known to have happened: True once, the first time it is known."""
        if self.said or self.found is False:
            return False
        found = self.found if isinstance(self.found, bool) else self._read(self.found, wait)
        if found:
            self.said, self.found, self._copy = True, False, None
        return found

    def _read(self, flag: torch.Tensor, wait: bool) -> bool:
        if flag.device.type != "cuda" or wait:
            return bool(flag)
        if self._copy is None:  # copied behind the batch's work; read at a later batch
            copy, arrived = flag.to("cpu", non_blocking=True), torch.cuda.Event()
            arrived.record()
            self._copy = (copy, arrived)
            return False
        copy, arrived = self._copy
        if not arrived.query():
            return False
        self._copy = None
        return bool(copy)


@dataclass(eq=False)
class Edit:
    """One intervention on one module: the ``vector`` a ``mean`` or ``add`` edit reads (all of the layer's units),
    the ``seed`` of ``resample``'s partner rows, the ``stamp`` of the file read, and the model's ``prefix_tokens``
    and square inputs, which say how its rows hold their units."""

    intervention: Intervention
    vector: torch.Tensor | None = None
    seed: int = 0
    stamp: Any = None
    prefix_tokens: int | None = None
    square: bool = False
    #: How many units the module says its output has (:func:`~hookcli.statistics.units.known_units`).
    width: int | None = None
    #: The preprocessing the file read was made with, as it records it (None: no file, or none recorded).
    made_with: Preprocess | None = None
    #: The edits of the run that made the file read, as it records them.
    made_under: tuple[str, ...] = ()
    #: How many times a forward has run the edit.
    calls: int = 0
    #: Whether the edit made values infinite, past the range of the dtype the layer computes in.
    overflow: Overflow = field(default_factory=Overflow, repr=False)
    _moved: dict[tuple[torch.device, torch.dtype], torch.Tensor] = field(default_factory=dict, repr=False)
    _layouts: dict[tuple[int, ...], tuple[int, int]] = field(default_factory=dict, repr=False)

    def describe(self) -> dict[str, Any]:
        """What a file's metadata records of the edit: the spec's parts, and the stamp of the file it read."""
        found = self.intervention.describe()
        if self.stamp is not None:
            found["file"] = os.path.abspath(str(found["file"]))
            found["stamp"] = self.stamp
        if self.intervention.edit == "resample":
            found["seed"] = self.seed
        return found

    @contextlib.contextmanager
    def attached(self, model: nn.Module, *, prepend: bool = False) -> Iterator[None]:
        """The edit on its layer of ``model`` while the context lasts (``prepend``: before the layer's other forward
        hooks)."""
        handle = model.get_submodule(self.intervention.layer).register_forward_hook(self._hook, prepend=prepend)
        try:
            yield
        finally:
            handle.remove()

    def _hook(self, module: nn.Module, inputs: Any, output: Any) -> torch.Tensor:
        spec = self.intervention
        self.calls += 1
        if not isinstance(output, torch.Tensor) or output.dim() < 2 or not output.is_floating_point():
            what = type(output).__name__ if not isinstance(output, torch.Tensor) else f"a {output.dtype} tensor"
            raise UsageProblem(
                f"{spec.named}: {spec.layer} returns {what}, not rows of floating-point units",
                hint="edit a layer whose output is one tensor (hookcli layers lists them)",
            )
        axis, channels = self._layout(tuple(output.shape))
        units = self._units(channels)
        moved = output.movedim(axis, -1)
        edited = moved.clone()
        chosen = moved[..., units] if units is not None else moved
        new = self._edited(chosen, units, moved)
        if not self.overflow.said:
            with torch.no_grad():
                self.overflow.add(self._overflowed(chosen, new, units), new.dtype)
        edited[..., units if units is not None else slice(None)] = new
        return edited.movedim(-1, axis)

    def _overflowed(self, chosen: torch.Tensor, new: torch.Tensor, units: list[int] | None) -> torch.Tensor | bool:
        """Whether ``new`` holds infinities that the edit made of finite values (a flag on the device, read later):
        one pass over the values at most, none for the edits that cannot."""
        spec = self.intervention
        if spec.edit == "value":
            return math.isinf(_rounded(spec.numbers[0], new.dtype))
        if spec.edit == "mean":
            vector = self._vector(new)
            return torch.isinf(vector if units is None else vector[units]).any()
        if spec.edit == "scale" and abs(spec.numbers[0]) > 1:  # the largest value, scaled, is the largest made
            peak = torch.linalg.vector_norm(chosen, ord=math.inf)
            return torch.isfinite(peak) & torch.isinf(peak * spec.numbers[0])
        if spec.edit == "add":
            before = torch.linalg.vector_norm(chosen, ord=math.inf)
            return torch.isfinite(before) & torch.isinf(torch.linalg.vector_norm(new, ord=math.inf))
        return False

    def take_overflow(self, *, wait: bool = False) -> str | None:
        """The note that the edit made values infinite, the first time it is known (``wait``: wait for the device
        to say); None before and after."""
        if not self.overflow.take(wait=wait):
            return None
        dtype = str(self.overflow.dtype).removeprefix("torch.")
        largest = torch.finfo(self.overflow.dtype).max
        shown = f"±{largest:,.0f}" if largest < 1e6 else f"±{largest:.2g}".replace("e+", "e")
        return (
            f"{self.intervention.named}: some values it made are past {dtype}'s range ({shown}), in which the layer "
            "computes, and became infinite; what reads them reads infinities"
        )

    def _layout(self, shape: tuple[int, ...]) -> tuple[int, int]:
        """The axis of the units of a batch of ``shape``, and how many there are (read once a shape)."""
        if shape[1:] not in self._layouts:
            layout = UnitLayout.of(
                shape[1:],
                prefix_tokens=self.prefix_tokens,
                channels_last=self.square and channels_last_output(shape),
                key=self.intervention.layer,
                width=self.width,
            )
            self._layouts[shape[1:]] = (-1 if layout.kind in ("tokens", "channels_last") else 1), layout.channels
        return self._layouts[shape[1:]]

    def _units(self, channels: int) -> list[int] | None:
        spec = self.intervention
        if self.vector is not None and self.vector.shape[0] != channels:
            raise UsageProblem(
                f"{spec.named}: {spec.layer} has {channels:,} units, and the vector read from "
                f"'{spec.file}' {self.vector.shape[0]:,}",
                hint="give a vector (a row of a matrix, a column of @pca_vectors) of one value for each unit",
            )
        if spec.units is None:
            return None
        if max(spec.units) >= channels:
            raise UsageProblem(
                f"{spec.named}: {spec.layer} has {channels:,} units (0 to {channels - 1}), "
                f"and unit {first_missing(spec.units, channels)} does not exist",
                hint="count units from 0 (hookcli layers gives each layer's shape)",
            )
        return list(spec.units)

    def _edited(self, chosen: torch.Tensor, units: list[int] | None, whole: torch.Tensor) -> torch.Tensor:
        """The chosen units' new values."""
        spec = self.intervention
        if spec.edit == "zero":
            return torch.zeros_like(chosen)
        if spec.edit == "value":
            return torch.full_like(chosen, _rounded(spec.numbers[0], chosen.dtype))
        if spec.edit == "scale":
            return chosen * spec.numbers[0]
        if spec.edit == "clamp":
            return chosen.clamp(_rounded(spec.numbers[0], chosen.dtype), _rounded(spec.numbers[1], chosen.dtype))
        if spec.edit == "resample":
            return chosen[partners(chosen.shape[0], self.seed).to(chosen.device)]
        vector = self._vector(chosen)
        vector = vector if units is None else vector[units]
        if spec.edit == "mean":
            return vector.expand_as(chosen).clone()
        return chosen + spec.numbers[0] * vector  # add

    def _vector(self, like: torch.Tensor) -> torch.Tensor:
        assert self.vector is not None, "mean and add edits read their vector when resolved"
        place = (like.device, like.dtype)
        if place not in self._moved:
            self._moved[place] = self.vector.to(device=like.device, dtype=like.dtype)
        return self._moved[place]


@functools.lru_cache(maxsize=64)  # asked at every hook call
def _rounded(number: float, dtype: torch.dtype) -> float:
    """``number`` as ``dtype`` holds it: infinite past its range (float16's ±65,504), where torch refuses to fill or
    clamp with it."""
    return float(torch.tensor(number, dtype=dtype))


def partners(rows: int, seed: int) -> torch.Tensor:
    """Each row's partner for ``resample``: one cycle through a seeded shuffle of the rows, so that no row is its
    own partner (one row is its own). It depends only on the seed and the number of rows, so every process of a run
    pairs a batch's rows alike."""
    order = torch.randperm(rows, generator=torch.Generator().manual_seed(seed * 1_000_003 + rows))
    found = torch.empty(rows, dtype=torch.long)
    found[order] = order.roll(-1)
    return found


def first_missing(units: Sequence[int], channels: int) -> int:
    """The first of ``units`` that a layer of ``channels`` units does not have."""
    return min(unit for unit in units if unit >= channels)


def resolve_edits(
    model: nn.Module,
    interventions: Sequence[Intervention],
    *,
    model_name: str | None,
    weights: Mapping[str, Any] | None = None,
    seed: int = 0,
    prefix_tokens: int | None = None,
    square: bool = False,
) -> tuple[Edit, ...]:
    """The edits of ``interventions`` on ``model`` (named ``model_name`` by its files), each refused in one line
    when its layer is not one of the model's, its units beyond what the layer has, or its file is not of the same
    model and layer."""
    modules = dict(model.named_modules())
    found = []
    for spec in interventions:
        if spec.layer not in modules or not spec.layer:
            target = (spec.written or "").partition("=")[0].strip()
            named = (path for path in modules if target == path or target.startswith(f"{path}:"))
            held = next((path for path in named if path.startswith(f"{spec.layer}:")), "")
            raise UsageProblem(
                f"{spec.named}: the model has no layer '{spec.layer}'"
                + (f" (its layer '{held}' has ':' in its name, where --intervene reads UNITS)" if held else ""),
                hint="give one module path as hookcli layers lists it (globs and type: selectors are -l's alone)"
                + ("; a layer whose name holds ':' or '=' cannot be edited by name" if held else ""),
            )
        known = known_units(modules[spec.layer])
        _check_units(spec, known)
        vector, stamp, made_with, made_under = (
            _read_vector(spec, model_name, weights) if spec.file is not None else (None, None, None, ())
        )
        edit = Edit(spec, vector, seed, stamp, prefix_tokens, square, known, made_with, made_under)
        if vector is not None and known is not None:
            edit._units(known)  # refuses a vector of another length than the layer's units
        found.append(edit)
    return tuple(found)


def _check_units(spec: Intervention, known: int | None) -> None:
    """Refuse, before the model runs, units beyond the ``known`` ones the module's weights say it has."""
    if known is not None and spec.units is not None and max(spec.units) >= known:
        raise UsageProblem(
            f"{spec.named}: {spec.layer} has {known:,} units (0 to {known - 1}), "
            f"and unit {first_missing(spec.units, known)} does not exist",
            hint="count units from 0 (hookcli layers gives each layer's shape)",
        )


def _read_vector(
    spec: Intervention, model_name: str | None, weights: Mapping[str, Any] | None
) -> tuple[torch.Tensor, Any, Preprocess | None, tuple[str, ...]]:
    """The vector a ``mean`` or ``add`` edit reads, its file's stamp, and the preprocessing and edits the file
    records; refused when the file is not of this model and layer, or the key or row is not there."""
    assert spec.file is not None, "edits that read a file name it"
    path = spec.file
    if not os.path.exists(path):
        raise UsageProblem(f"{spec.named}: '{path}' not found", hint="give a file hookcli wrote")
    try:
        opened = open_features(path)
    except FeatureFileError as err:  # not a file of features: said as the edit's
        raise FeatureFileError(f"{spec.named}: {err.message}", hint=err.hint) from None
    with opened as features:
        metadata = features.metadata
        made_by = metadata.get("model")
        if (
            spec.edit == "mean" and made_by is None
        ):  # a statistics file says what made it; a vector of one's own need not
            raise UsageProblem(
                f"{spec.named}: '{path}' records no model (statistics of saved features that named none), so its "
                "means cannot be checked against this run's model",
                hint="give a statistics file of a run of this model (hookcli stats -m MODEL …)",
            )
        if model_name is not None and made_by is not None and made_by != model_name:
            raise UsageProblem(
                f"{spec.named}: '{path}' was made with the model {made_by}, and this run's is {model_name}",
                hint="give a file of the same model",
            )
        if weights is not None and made_by is not None and lenient_json(metadata.get("weights")) != dict(weights):
            raise UsageProblem(
                f"{spec.named}: '{path}' was made with other weights ({metadata.get('weights')}) than this run's "
                f"({json.dumps(dict(weights))})",
                hint="give a file made with the same weights (and --seed, for --weights none)",
            )
        key = _layer_key(metadata, spec, path) + "@mean" if spec.edit == "mean" else spec.key
        assert key is not None, "an add edit names its key"
        if key not in features.keys():
            raise UsageProblem(
                f"{spec.named}: '{path}' holds no tensor '{key}'",
                hint="hookcli info lists a file's tensors",
            )
        values = np.asarray(features.read(key), dtype=np.float64)
        try:
            made_with = Preprocess.from_metadata(metadata.get("preprocess"))
        except ValueError:  # untrusted, and only said in a note: unreadable is unknown
            made_with = None
    return _row_of(spec, key, values), file_stamp(path), made_with, tuple(recorded_edits(metadata))


def _layer_key(metadata: Any, spec: Intervention, path: str) -> str:
    """The key under which a statistics file holds layer ``spec.layer``; refused when it holds another layer."""
    if not is_stats(metadata):
        raise UsageProblem(
            f"{spec.named}: '{path}' is not a statistics file",
            hint="mean:FILE takes the file of hookcli stats of the same model and layer",
        )
    layers = recorded_layers(metadata)
    if not layers and "layers" in metadata:  # a table there, not as hookcli writes it: no layer can be told
        raise UsageProblem(
            f"{spec.named}: '{path}' has a table of layers that is not what hookcli writes",
            hint="make the statistics file again with hookcli stats",
        )
    if spec.layer not in layers:
        raise UsageProblem(
            f"{spec.named}: '{path}' holds the statistics of {', '.join(sorted(layers)) or 'no layer'}, not of "
            f"{spec.layer}",
            hint="give the statistics file of the same layer",
        )
    return layers[spec.layer]


def _row_of(spec: Intervention, key: str, values: np.ndarray) -> torch.Tensor:
    """The vector the edit reads: the whole of a one-dimensional tensor, or row ``spec.row`` of a matrix (column,
    for a statistics file's ``@pca_vectors``, whose columns are the components)."""
    if spec.edit == "mean" and values.ndim != 1:
        raise UsageProblem(
            f"{spec.named}: '{key}' has shape {list(values.shape)}, and a statistics file's means are one vector",
            hint="give a statistics file as hookcli stats wrote it",
        )
    if spec.edit == "mean" or values.ndim == 1 and spec.row in (None, 0):
        vector = values.reshape(-1)
    elif values.ndim == 1:
        raise UsageProblem(
            f"{spec.named}: '{key}' is a vector of {values.shape[0]:,} values, which ROW 0 reads whole, not ROW "
            f"{spec.row}",
            hint="give ROW 0 for a vector",
        )
    elif values.ndim != 2:
        raise UsageProblem(
            f"{spec.named}: '{key}' has shape {list(values.shape)}, not rows of units",
            hint="give a vector, or a matrix whose row ROW holds one value for each of the layer's units",
        )
    else:
        components = key.endswith("@pca_vectors")  # a column a component, in a statistics file
        matrix = values.T if components else values
        if spec.row is None or spec.row >= matrix.shape[0]:
            what = "components (its columns)" if components else "rows"
            raise UsageProblem(
                f"{spec.named}: '{key}' has {matrix.shape[0]:,} {what}, and ROW {spec.row} names none of them",
                hint=f"count {'components' if components else 'rows'} from 0",
            )
        vector = matrix[spec.row]
    if not np.isfinite(vector).all():
        raise UsageProblem(
            f"{spec.named}: '{key}' holds values that are not finite numbers",
            hint="give a vector of finite numbers",
        )
    if np.abs(vector).max(initial=0) > FLOAT32_MAX:
        raise UsageProblem(
            f"{spec.named}: '{key}' holds values beyond float32's range (±3.4e38), in which layers compute",
            hint="give a vector of float32 numbers",
        )
    return torch.from_numpy(np.ascontiguousarray(vector))


def with_edits(settings: RunSettings, loaded: LoadedModel, interventions: Sequence[Intervention], seed: int):
    """``settings`` with the edits of ``interventions`` on ``loaded``'s model, and what the run says of them: the
    model runs as written (no fused or compiled forward, whose graphs would leave the edited layers out)."""
    assert settings.preprocess is not None, "the preprocessing is known once the model has loaded"
    edits = resolve_edits(
        loaded.module,
        interventions,
        model_name=loaded.name,
        weights=loaded.weights,
        seed=seed,
        prefix_tokens=loaded.prefix_tokens,
        square=square_input(settings.preprocess),
    )
    asked = [flag for flag, on in (("--compile", settings.compile), ("--fuse", settings.fuse)) if on]
    notes: tuple[str, ...] = (
        (f"--intervene runs the model as written: {' and '.join(asked)} left out",) if asked else ()
    )
    notes += tuple(said for edit in edits for said in read_otherwise(edit, settings.preprocess))
    return dataclasses.replace(settings, edits=edits, compile=False, fuse=False), notes


def resampled_alone(named: Sequence[str], batch_size: int | None) -> tuple[str, ...]:
    """What to say of each resampling (by how errors name it) in a run of batches of one row: it changes nothing."""
    if batch_size != 1:
        return ()
    return tuple(
        f"{each}: resample takes each row's values from another row of its batch, and a batch of one row holds no "
        "other, so it changes nothing (give --batch-size 2 or more)"
        for each in named
    )


def unseen_by_attention(edits: Sequence[Edit], layers: Mapping[str, str], capture: str) -> tuple[str, ...]:
    """What to say of each edit of an attention module's own output where its weights are captured: they come from
    what the module receives."""
    if capture != "attention":
        return ()
    return tuple(
        f"{spec.named}: {layers[spec.layer]}@attention comes from what {spec.layer} receives, so this edit of what "
        "it returns changes none of it (the attention of the layers after it takes the edit)"
        for spec in (edit.intervention for edit in edits)
        if spec.layer in layers
    )


#: What a file's preprocessing must share with a run's for its vectors to be of inputs prepared as the run's are.
_PREPARED = ("kind", "resize", "crop", "interpolation", "mean", "std")


def read_otherwise(edit: Edit, preprocess: Preprocess | None) -> tuple[str, ...]:
    """What to say of the file an edit read: that it holds values of inputs prepared otherwise than this run's, or
    of a model its run edited (nothing where neither, or where the file does not say)."""
    spec, said = edit.intervention, []
    if edit.made_with is not None and preprocess is not None:
        theirs, mine = ({"preprocess": {k: v for k, v in json.loads(p.to_json()).items() if k in _PREPARED}}
                        for p in (edit.made_with, preprocess))  # fmt: skip
        differ = identity_differences(theirs, mine, ("the file's", "this run's"))
        if differ:
            said.append(f"{spec.named}: '{spec.file}' holds values of inputs prepared otherwise than this run's: "
                        f"{differ[0]}")  # fmt: skip
    if edit.made_under:
        said.append(
            f"{spec.named}: '{spec.file}' holds values of the model as its run edited it ({', '.join(edit.made_under)})"
        )
    return tuple(said)


def edits_entries(settings: RunSettings) -> dict[str, str]:
    """What a run's files record of its edits (nothing for a run without): each edit, in order, and whether a
    capture at an edited layer holds its output before or after them."""
    if not settings.edits:
        return {}
    described: dict[str, Any] = {"edits": [edit.describe() for edit in settings.edits]}
    described["captures"] = "after edits" if settings.capture_edited else "before edits"
    if any(edit.intervention.edit == "resample" for edit in settings.edits):
        described["batch_size"] = settings.batch_size  # resample pairs the rows of a batch: part of what it means
    return {"interventions": json.dumps(described)}
