"""hookcli from Python: one function per command, with the command's options as keywords.

Keywords are the command line's long options with underscores
(``batch_size``, ``memory_format``, ``on_error``, ``shard_size``…), with the
same defaults, the same checks and the same error texts. The same options
come typed, for an editor to complete, as ``options=``
:class:`~hookcli.options.run.RunOptions` (a run's),
:class:`~hookcli.options.compare.CompareOptions` (how :func:`compare`
compares; a list gives both) or :class:`~hookcli.options.grid.GridOptions`
(:func:`grid`, :func:`report`); keywords given beside them win. Errors are
:class:`~hookcli.errors.HookcliError` s (``exit_code`` is what the command
line would exit with). Nothing is printed: pass ``progress=callback`` to hear
:class:`~hookcli.events.Started`, :class:`~hookcli.events.Advanced`,
:class:`~hookcli.events.Skipped`, :class:`~hookcli.events.Note` and
:class:`~hookcli.events.Wrote` events as the run goes.

``output=None`` (the default) keeps the result in memory: a read-only
mapping key → ``torch.Tensor`` (:class:`~hookcli.storage.features.Features`) with
``.metadata`` (exactly what a file would hold), ``.inputs``, ``.facts`` and
``.notes``. ``output="x.safetensors"``, ``"DIR/"`` (shards, resumable) or
``"-"`` writes what the command line writes for the same options and returns
the path (None for ``-``); a binary stream (``io.BytesIO()``, an open file)
receives the file's bytes as ``-`` does; ``output=DEFAULT_OUTPUT`` picks the
command line's default name.

>>> import hookcli
>>> photo = __import__("matplotlib.cbook").cbook.get_sample_data("grace_hopper.jpg", asfileobj=False)
>>> features = hookcli.extract("resnet18", ["layer1", "fc=logits"], photo, weights="none", resize=64, crop=64)
>>> {key: tuple(t.shape) for key, t in features.items()}, features.metadata["model"]
({'layer1': (1, 64, 16, 16), 'logits': (1, 1000)}, 'resnet18')
>>> pictures = hookcli.grid(features, keys="layer1", channels="0:4", columns=2)
>>> list(pictures), pictures["layer1__00000_grace_hopper.png"].shape[2]
(['layer1__00000_grace_hopper.png'], 3)
>>> [row.path for row in hookcli.layers("resnet18", depth=1)][:3]
['.', 'conv1', 'bn1']
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

from hookcli.errors import UsageProblem, check_whole
from hookcli.events import Note
from hookcli.families import family_traits
from hookcli.inputs.pairs import given_pairs, interleaved
from hookcli.models.catalog import choose_model, describe_models
from hookcli.options.compare import COMPARE_OPTIONS, CompareOptions
from hookcli.options.given import given_keywords
from hookcli.options.grid import GridOptions, drawing_options
from hookcli.options.run import MAX_SIDE, RunOptions, refuse_unknown
from hookcli.pictures.grid_job import default_grid_folder
from hookcli.run.outputs import DEFAULT_OUTPUT

if TYPE_CHECKING:  # what the functions return: numpy and the readers load when a command runs
    import numpy as np

    from hookcli.events import Event
    from hookcli.run.layer_table import LayerInfo
    from hookcli.run.planned import RunPlan
    from hookcli.storage.features import Features
    from hookcli.storage.reader import FeatureReader

#: A model as the functions take it: a name (``"resnet18"``, ``"timm:resnet50"``, ``"nets.py:make"``), a
#: :class:`~hookcli.models.loaded.LoadedModel`, an ``nn.Module``, or a module and its preprocessing.
Model: TypeAlias = Any
#: Layer selectors: one, or a list.
Layers: TypeAlias = str | Sequence[str]
#: Inputs: an image, a folder, a tar file, ``-`` (a list on stdin), or a list of them.
Inputs: TypeAlias = str | os.PathLike[str] | Sequence[str | os.PathLike[str]]
#: Where a run writes: None (in memory), :data:`DEFAULT_OUTPUT`, a file, a folder (``DIR/``), ``-`` or a binary
#: stream.
Output: TypeAlias = Any
#: What hears a run's events (:mod:`hookcli.events`) as it goes.
Progress: TypeAlias = Callable[["Event"], None] | None
#: Saved features to read: a file, a shard folder, ``-``, or a reader (what :func:`extract` returns).
Source: TypeAlias = "str | os.PathLike[str] | FeatureReader"

__all__ = [
    "DEFAULT_OUTPUT",
    "ablate",
    "cam",
    "compare",
    "doctor",
    "extract",
    "grad",
    "grid",
    "info",
    "layers",
    "models",
    "patch",
    "plan",
    "report",
    "stats",
]


def extract(
    model: Model,
    layers: Layers,
    inputs: Inputs,
    *,
    output: Output = None,
    progress: Progress = None,
    options: RunOptions | None = None,
    **keywords: Any,
) -> Features | Path | None:
    """Capture ``layers`` of ``model`` on ``inputs``: ``hookcli extract`` as a function.

    ``model``: a torchvision model name, or one of another source
    (``"timm:resnet50"``, ``"hf:facebook/dinov2-small"``, ``"hf:/folder"``,
    ``"open_clip:ViT-B-32"``, ``"nets.py:make"``; see :mod:`hookcli.models.sources`),
    or a :class:`~hookcli.models.loaded.LoadedModel`; ``layers``: one selector or a
    list (paths, globs, ``type:Conv2d``, ``.`` for the model's own output,
    ``PATH=NAME``); ``inputs``: an image, a folder or a list of them.
    Options: ``weights`` (``"DEFAULT"``), ``seed``, ``capture``
    (``"output"``, ``"input"``, ``"both"``), ``resize``, ``crop``, ``mean``,
    ``std``, ``interpolation``, ``fast_decode``, ``decode`` (``"cpu"``;
    ``"device"``: batched on the device, :mod:`hookcli.inputs.decoding`), ``device`` (``"auto"``),
    ``batch_size`` (16), ``precision`` (``"fp32"``), ``memory_format``
    (``"auto"``), ``compile``, ``workers``, ``recursive``, ``on_error``
    (``"fail"``), ``force``, ``pool``, ``dtype`` (``"float32"``),
    ``shard_size``, ``fuse`` (None: from 16 inputs on), ``grid`` (a folder for PNGs); video and optical-flow
    models: ``clip_length`` (16), ``frame_stride`` (1), ``clips_per_video`` (1; 0: every clip); detection
    models: ``detections`` (store the final detections too).

    >>> import tempfile
    >>> photo = __import__("matplotlib.cbook").cbook.get_sample_data("grace_hopper.jpg", asfileobj=False)
    >>> folder = tempfile.mkdtemp() + "/feats/"
    >>> extract("resnet18", "layer3", [photo, photo], output=folder, pool="avg", weights="none").name
    'index.jsonl'
    """
    return _run("extract", model, layers, inputs, output, given_keywords(options, keywords), progress)


def grad(
    model: Model,
    layers: Layers,
    inputs: Inputs,
    *,
    output: Output = None,
    progress: Progress = None,
    options: RunOptions | None = None,
    **keywords: Any,
) -> Features | Path | None:
    """Activations of ``layers`` and the gradient of a target logit with respect to them: ``hookcli grad``.

    Keys ``<layer>`` and ``<layer>@grad`` (``@grad#k`` for each of ``topK``);
    each row's targets are in ``.metadata["targets"]``. Options as for
    :func:`extract` (no ``capture``, ``pool``, ``fuse``, ``grid``), and
    ``target``: a class index, a class name of the weights, or ``"topK"``
    (default ``"top1"``).

    >>> photo = __import__("matplotlib.cbook").cbook.get_sample_data("grace_hopper.jpg", asfileobj=False)
    >>> grads = grad("resnet18", "layer4", photo, target="top2", weights="none", resize=64, crop=64)
    >>> sorted(grads), len(grads.metadata["targets"]) > 0
    (['layer4', 'layer4@grad#0', 'layer4@grad#1'], True)
    """
    return _run("grad", model, layers, inputs, output, given_keywords(options, keywords), progress)


def cam(
    model: Model,
    inputs: Inputs,
    *,
    layer: str | None = None,
    output: Output = None,
    progress: Progress = None,
    options: RunOptions | None = None,
    **keywords: Any,
) -> Features | Path:
    """Class-activation maps: ``hookcli cam``.

    ``layer`` defaults to the model's last convolutional stage (ViT: the last
    block's ``ln_1``). In memory, the maps ``cam`` ``[N, h, w]`` (``cam#k``
    for each of ``topK``); with ``output=DIR`` (or ``DEFAULT_OUTPUT``:
    ``<model>-cam``), ``DIR/cams.safetensors`` and an overlay PNG per image
    and target, and the path of ``cams.safetensors`` is returned. Options:
    ``method`` (``"gradcam"``, ``"gradcam++"``, ``"xgradcam"``,
    ``"layercam"``), ``target``, ``alpha``, ``cmap``, and the preprocessing
    and run options of :func:`extract`.

    >>> import tempfile
    >>> photo = __import__("matplotlib.cbook").cbook.get_sample_data("grace_hopper.jpg", asfileobj=False)
    >>> cam("resnet18", photo, weights="none", method="gradcam++", resize=64, crop=64)["cam"].shape
    torch.Size([1, 2, 2])
    >>> cam("resnet18", photo, output=tempfile.mkdtemp() + "/cams", weights="none").name
    'cams.safetensors'
    """
    return _never_none(_run("cam", model, layer, inputs, output, given_keywords(options, keywords), progress))


def stats(
    model: Model = None,
    layers: Layers | None = None,
    inputs: Inputs | None = None,
    *,
    features: Source | None = None,
    keys: str | Sequence[str] = (),
    output: Output = None,
    progress: Progress = None,
    options: RunOptions | None = None,
    **keywords: Any,
) -> Features | Path:
    """Statistics of each channel of ``layers`` over every input, gathered in one pass: ``hookcli stats``.

    Either a model runs (``model``, ``layers``, ``inputs`` as for
    :func:`extract`), or ``features`` saved earlier are read (a file, a shard
    folder, ``-``, or what :func:`extract` returns; ``keys``: globs of the
    tensors, default every one whose rows share a shape), with the options
    ``batch_size``, ``force``, ``shard_size``, ``part`` and those below. With
    the same batch and shard sizes, the statistics of saved features are
    those gathered during the forward that saved them.

    For each layer key ``K``: ``K@count``, ``K@mean``, ``K@std``, ``K@min``,
    ``K@max``, ``K@zeros`` (the share of exact zeros) over every value of
    each channel; ``K@quantiles`` at the levels of ``quantiles``; the ``top``
    inputs that drive each channel hardest, ranked by ``top_by``
    (``K@top_values``, ``K@top_rows`` into ``.inputs``, ``K@top_at``, the
    position of the largest value, and ``K@top_maps``); with ``pca``, the
    covariance of the channels pooled over positions (``K@cov``) and its
    principal components (``K@pca_values``, ``K@pca_vectors``). See
    :mod:`hookcli.storage.stats_format`. Options: those of :func:`extract`
    (no ``capture``, ``pool``, ``dtype``, ``grid``, ``detections``, ``flow``),
    and ``top`` (9), ``top_by`` (``"max"``), ``quantiles``
    (``(0.5, 0.99, 0.995)``), ``pca`` (True) and ``components`` (a statistics
    file with PCA: each layer's first 16 principal components gathered too, as
    a layer ``K#pc``, :mod:`hookcli.statistics.components`). In memory (``output=None``)
    a read-only mapping (:class:`~hookcli.storage.features.Features`);
    with ``output="stats.safetensors"`` the file, whose path is returned.

    >>> photo = __import__("matplotlib.cbook").cbook.get_sample_data("grace_hopper.jpg", asfileobj=False)
    >>> found = stats("resnet18", "layer4", [photo, photo], weights="none", resize=64, crop=64, top=1)
    >>> found["layer4@mean"].shape, found["layer4@top_maps"].shape, int(found["layer4@count"])
    (torch.Size([512]), torch.Size([512, 1, 2, 2]), 8)
    """
    given = given_keywords(options, keywords)
    if features is not None:
        if model is not None or layers is not None or inputs is not None:
            raise UsageProblem(
                "stats reads saved features or runs a model, not both",
                hint="give features=, or model, layers and inputs",
            )
        from hookcli.run.saved import saved_stats  # torch, numpy

        return saved_stats(features, keys=keys, output=output, progress=progress, **given)
    if keys:
        raise UsageProblem("keys choose the tensors of saved features", hint="give features= too, or layers")
    if model is None or layers is None or inputs is None:
        raise UsageProblem("stats needs a model, its layers and inputs, or saved features", hint="see hookcli.stats")
    return _never_none(_run("stats", model, layers, inputs, output, given, progress))


def compare(
    model: Model = None,
    layers: Layers | None = None,
    inputs: Inputs | None = None,
    *,
    model2: Model = None,
    layers2: Layers | None = None,
    weights2: str | None = None,
    seed2: int | None = None,
    features: Source | None = None,
    features2: Source | None = None,
    keys: str | Sequence[str] = (),
    keys2: str | Sequence[str] = (),
    merge: Sequence[str | os.PathLike[str]] | None = None,
    output: Output = None,
    progress: Progress = None,
    options: RunOptions | CompareOptions | Sequence[RunOptions | CompareOptions] | None = None,
    **keywords: Any,
) -> Features | Path:
    """How alike representations are, every one of a side against every one of the other: ``hookcli compare``.

    Either models run over ``inputs`` in one pass (``model`` and ``layers``, against ``model2`` and ``layers2`` with
    ``weights2`` and ``seed2``, each the first's when None, or against themselves; one module on both sides runs
    the second on a copy of it), with the run options of
    :func:`extract` (no ``capture``, ``pool``, ``dtype``, ``grid``, ``detections``, ``flow``); or saved ``features``
    (a file, a shard folder, ``-`` or what :func:`extract` returns; tensors ``keys``) against ``features2`` (tensors
    ``keys2``) or themselves, with ``batch_size``, ``force``, ``shard_size`` and ``part``. How: ``method``
    (``"linear-cka"``, ``"minibatch-cka"``, ``"rsa"``), ``pool`` (``"avg"``, ``"max"``, ``"none"``; the method's
    default when None), ``debiased``, ``rsa_rows``, ``rsa_distance``, ``rsa_compare``, ``save_rdms``
    (:data:`hookcli.options.compare.COMPARE_OPTIONS`). In memory (``output=None``) a mapping whose ``method`` key is
    the float64 matrix, rows and columns labelled in ``.metadata["rows"]`` and ``["columns"]``; with
    ``output="cka.safetensors"`` the file, whose path is returned (see :mod:`hookcli.storage.compare_format`).
    ``merge``: linear-cka files made over disjoint inputs, merged into one as if one run had seen them all.

    >>> import json, numpy as np
    >>> from hookcli.storage.features import Features
    >>> rng = np.random.default_rng(0)
    >>> features = Features({"a": rng.normal(size=(20, 8)), "b": rng.normal(size=(20, 3))}, {})
    >>> found = compare(features=features)
    >>> json.loads(found.metadata["rows"]), [round(v, 9) for v in found["linear-cka"].diagonal().tolist()]
    (['a', 'b'], [1.0, 1.0])
    """
    given = given_keywords(options, keywords, CompareOptions)
    sides = (model, layers, inputs, model2, layers2, weights2, seed2)
    alone = not any(value is not None for value in (*sides, features, features2)) and set(given) <= {"force"}
    if merge is not None and not alone:
        raise UsageProblem("merge= takes comparison files alone (and output=, force=)", hint="see hookcli.compare")
    from hookcli.run.compare import compare_models, compare_saved, merge_comparisons  # torch
    from hookcli.statistics.comparison import CompareChoice  # torch

    if merge is not None:
        return merge_comparisons(merge, output, force=given.pop("force", False), progress=progress)
    choice = CompareChoice(**{name: given.pop(name) for name in list(given) if name in _COMPARING})
    if features is not None and any(value is not None for value in sides):
        raise UsageProblem(
            "compare reads saved features or runs models, not both",
            hint="give features= (and features2=), or model, layers and inputs",
        )
    if features is None and (features2 is not None or keys or keys2):
        raise UsageProblem("features2, keys and keys2 choose saved features", hint="give features= too")
    if features is None and (model is None or layers is None or inputs is None):
        raise UsageProblem(
            "compare needs a model, its layers and inputs, or saved features", hint="see hookcli.compare"
        )
    if features is not None:
        found = compare_saved(features, features2, keys=keys, keys2=keys2, output=output, choice=choice,
                              options=given, progress=progress)  # fmt: skip
    else:
        second = {name: value for name, value in (("weights", weights2), ("seed", seed2)) if value is not None}
        found = compare_models(model, layers, inputs, model2, layers2, second=second, output=output, choice=choice,
                               options=given, progress=progress)  # fmt: skip
    return found


def ablate(
    model: Model,
    layer: str,
    inputs: Inputs,
    *,
    output: Output = None,
    progress: Progress = None,
    options: RunOptions | None = None,
    **keywords: Any,
) -> Features | Path:
    """Each unit of ``layer`` ablated alone, and what that does to the model's output: ``hookcli ablate``.

    For each unit (``units``: ``"K"``, ``"A:B"``, ``"K,L,M"``; default every one), ablated as ``how`` says
    (``"zero"``, ``"mean:FILE"`` with a stats file of the same layer, ``"resample"``), the mean and spread of the
    change of each input's predicted class's logit and probability, the share of inputs whose top class flips, the
    KL divergence of the output distribution, and each class's mean change (``LAYER@class_effect``
    ``[units, classes]``); see :mod:`hookcli.storage.ablation_format`. ``effect_on``: a layer to measure instead of
    the model's output. The layers before ``layer`` run once a batch. Options: the preprocessing and run options of
    :func:`extract` that apply, ``shard_size`` and ``part``.

    >>> photo = __import__("matplotlib.cbook").cbook.get_sample_data("grace_hopper.jpg", asfileobj=False)
    >>> found = ablate("resnet18", "layer4", [photo, photo], units="0:8", weights="none", resize=64, crop=64)
    >>> found["layer4@flips"].shape, found["layer4@class_effect"].shape
    (torch.Size([8]), torch.Size([8, 1000]))
    """
    return _never_none(_run("ablate", model, layer, inputs, output, given_keywords(options, keywords), progress))


def patch(
    model: Model,
    layers: Layers,
    pairs: str | os.PathLike[str] | Sequence[tuple[Any, Any]] | None = None,
    *,
    pairs_from: tuple[str | os.PathLike[str], str | os.PathLike[str]] | None = None,
    output: Output = None,
    progress: Progress = None,
    options: RunOptions | None = None,
    **keywords: Any,
) -> Features | Path:
    """Activation patching over pairs of inputs: ``hookcli patch``.

    ``pairs``: a pairs file (a source's path, a tab, the target's, a line each) or ``[(source, target), ...]`` image
    paths; or ``pairs_from``: two folders, their n-th images paired. Each layer (or each position of it, ``positions``)
    of each target runs taken from its source; the file holds how far m = z[y_s] − z[y_t] moves (see
    :mod:`hookcli.storage.patch_format`). Options: those of :func:`extract`, ``positions``, ``shard_size``, ``part``.

    >>> photo = __import__("matplotlib.cbook").cbook.get_sample_data("grace_hopper.jpg", asfileobj=False)
    >>> patch("resnet18", "layer4", [(photo, photo)], weights="none", resize=64, crop=64)["layer4@change"].tolist()
    [0.0]
    """
    inputs = interleaved(given_pairs(pairs, pairs_from))
    return _never_none(_run("patch", model, layers, inputs, output, given_keywords(options, keywords), progress))


#: The keywords of :func:`compare` that say how to compare (the rest are the run's).
_COMPARING = tuple(option.name for option in COMPARE_OPTIONS)


def grid(
    source: Source,
    *,
    output: Output = None,
    progress: Progress = None,
    force: bool = False,
    options: GridOptions | None = None,
    **keywords: Any,
) -> dict[str, np.ndarray] | list[Path]:
    """Feature-map pictures of saved features: ``hookcli grid``.

    ``source``: a file, a shard folder, ``-`` (stdin), or features in memory (what :func:`extract` returns).
    Options: ``keys``, ``images``, ``channels`` (``"0:64"``), ``top``, ``columns``, ``padding``, ``cmap``,
    ``scale``, ``min_tile``, ``title``, ``overlay``, ``alpha``, ``overlay_cmap`` (see
    :class:`~hookcli.options.grid.GridOptions`). In memory (``output=None``): a dict of file name → ``uint8 [H, W,
    3]`` pixels; with ``output=DIR``: the PNGs, and their paths are returned. A statistics file (what :func:`stats`
    writes or returns) gives a picture a layer and channel: its dataset examples
    (:mod:`hookcli.pictures.stats_grids`); a comparison file (what :func:`compare` writes or returns) one heatmap of
    its matrix, named after the file (:mod:`hookcli.pictures.compare_grids`).

    >>> import tempfile
    >>> photo = __import__("matplotlib.cbook").cbook.get_sample_data("grace_hopper.jpg", asfileobj=False)
    >>> features = extract("resnet18", "layer1", photo, weights="none", resize=64, crop=64)
    >>> [p.name for p in grid(features, output=tempfile.mkdtemp(), channels="0:16", cmap="gray")]
    ['layer1__00000_grace_hopper.png']
    """
    from hookcli.pictures.grids import draw_grids

    drawing = _grid_options("grid", given_keywords(options, keywords, GridOptions))
    if output is DEFAULT_OUTPUT:
        output = default_grid_folder(source)
    with _opened(source) as features:
        return draw_grids(features, drawing, output, force=force, progress=progress)


def report(
    source: Source,
    *,
    output: Output = DEFAULT_OUTPUT,
    page_size: int | None = None,
    progress: Progress = None,
    force: bool = False,
    options: GridOptions | None = None,
    **keywords: Any,
) -> Path:
    """A static HTML report of saved features, in pages of ``page_size`` images (default 20): ``hookcli report``;
    of a statistics file, each layer's channels, ``page_size`` a page (default 64); of a comparison file, one page
    of its matrix (:mod:`hookcli.pictures.compare_reports`).

    ``source`` as for :func:`grid`; ``output``: the folder (default
    ``<file stem>_report``); the options of :func:`grid` choose tensors,
    images (also a range ``"A:B"`` of row indices) and the look of the
    pictures. Returns the path of the report's ``index.html``.

    >>> import tempfile
    >>> photo = __import__("matplotlib.cbook").cbook.get_sample_data("grace_hopper.jpg", asfileobj=False)
    >>> features = extract("resnet18", ["layer1", "fc=logits"], [photo] * 3, weights="none", resize=64, crop=64)
    >>> index = report(features, output=tempfile.mkdtemp() + "/report", page_size=2, channels="0:8")
    >>> index.name, sorted(path.name for path in index.parent.iterdir())
    ('index.html', ['index.html', 'page-00002.html'])
    """
    from hookcli.pictures.reports import default_report_folder, write_report  # numpy, Pillow

    drawing = _grid_options("report", given_keywords(options, keywords, GridOptions))
    if output is None:
        raise UsageProblem(
            "a report is a folder of pages and has no in-memory form",
            hint="give output a folder, or leave it out for <file stem>_report",
        )
    if output is DEFAULT_OUTPUT:
        output = default_report_folder(source)
    with _opened(source) as features:
        return write_report(features, output, drawing, page_size=page_size, force=force, progress=progress)


def _grid_options(command: str, options: dict[str, Any]) -> GridOptions:
    """:class:`~hookcli.options.grid.GridOptions` from a command's keywords; an unknown keyword is a TypeError."""
    refuse_unknown(command, options, [option.name for option in drawing_options(command)])
    return GridOptions(**options)


def _opened(source: Source) -> contextlib.AbstractContextManager[FeatureReader]:
    """Features to read: a path (or ``-``) opened, and closed after; features in memory as they are."""
    from hookcli.storage.shards import open_features  # numpy

    return open_features(source) if isinstance(source, str | os.PathLike) else contextlib.nullcontext(source)


def layers(
    model: Model,
    *,
    weights: str = "none",
    seed: int | None = None,
    input_size: int | None = None,
    depth: int | None = None,
    frames: int | None = None,
) -> list[LayerInfo]:
    """Every layer a selector can name, in forward order, with output shapes: ``hookcli layers``.

    Shapes come from one forward of the model family's natural input, all
    zeros (:func:`hookcli.run.batches.natural_input`): a square image of
    ``input_size`` (default: the weights' crop size, else their resize size),
    a list of one such image for detection, a clip of ``frames`` frames
    (default 16) for video, a pair of frames for optical flow. ``depth``
    keeps paths with at most that many components. Returns
    :class:`~hookcli.run.layer_table.LayerInfo` rows.

    >>> [(row.path, row.output) for row in layers("resnet18", depth=1)][-1]
    ('fc', [1, 1000])
    """
    check_whole("input_size", input_size, 1, MAX_SIDE, optional=True)
    check_whole("depth", depth, 1, optional=True)
    check_whole("frames", frames, 1, 1024, optional=True)
    if not isinstance(model, str):  # a module handed in (or a LoadedModel): torch is loaded already
        from hookcli.run.layer_table import handed_layer_table

        return handed_layer_table(model, input_size=input_size, depth=depth, frames=frames)
    choice = choose_model(model, weights)  # an unknown model or weights name is refused before torch loads
    if frames is not None and family_traits(choice.family).row != "clip":
        raise UsageProblem(
            f"--frames applies to video models, and {model} is {choice.family.replace('_', ' ')}",
            hint="leave it out",
        )
    from hookcli.run.layer_table import model_layer_table  # torch

    return model_layer_table(choice, seed=seed or 0, input_size=input_size, depth=depth, frames=frames)


def models(
    family: str | None = None, *, pattern: str | None = None, source: str = "torchvision"
) -> list[dict[str, Any]]:
    """The models hookcli can load: ``hookcli models`` (see :func:`hookcli.models.catalog.describe_models`).

    >>> [row["model"] for row in models("optical_flow")]
    ['raft_large', 'raft_small']
    """
    return describe_models(family, pattern=pattern, source=source)


def doctor() -> list[dict[str, Any]]:
    """What this install and machine give hookcli: ``hookcli doctor``. Each check is a dict of ``name``, ``ok``
    (True; False where a command would fail; None for something optional that is absent), ``detail`` and
    ``hint`` (see :mod:`hookcli.run.environment`).

    >>> [check["name"] for check in doctor()][:2]
    ['python', 'torch and torchvision']
    """
    from hookcli.run.environment import check_install  # torch, once the pair is checked

    return [check.to_dict() for check in check_install()]


def info(source: Source, *, stats: bool = True, progress: Progress = None) -> dict[str, Any]:
    """What a features file or shard folder holds: ``hookcli info`` as data (keys, dtypes, shapes, sizes, the
    metadata parsed and, with ``stats``, each tensor's min, mean, max, share of zeros and non-finite count; a
    statistics file's layers instead, :func:`hookcli.pictures.summary.describe_stats`; a comparison file's matrix,
    :func:`hookcli.pictures.summary.describe_comparison`).
    What reading the source had to say (a shard folder's notes) comes as :class:`~hookcli.events.Note` events.

    >>> photo = __import__("matplotlib.cbook").cbook.get_sample_data("grace_hopper.jpg", asfileobj=False)
    >>> described = info(extract("resnet18", "layer1", photo, weights="none", resize=64, crop=64))
    >>> [(row["key"], row["shape"]) for row in described["tensors"]]
    [('layer1', [1, 64, 16, 16])]
    """
    from hookcli.pictures.summary import describe_file  # numpy

    with _opened(source) as features:
        described = describe_file(features, stats=stats)
        for text in getattr(features, "reading_notes", ()):
            if progress is not None:
                progress(Note(text))
    return described


def plan(
    command: str, model: Model, layers: Layers | None, inputs: Inputs, *, output: Output = None, **options: Any
) -> RunPlan:
    """A run of ``command`` (``"extract"``, ``"stats"``…) resolved once, for :func:`hookcli.execute`
    (:func:`hookcli.run.plan.plan_request`). ``model``: a name or a module, as the functions take it; ``layers``:
    one selector or a list (cam: one or None); ``inputs``: a path, a folder, ``-`` or a list of them; ``output``:
    None (in memory), :data:`DEFAULT_OUTPUT`, a file, a folder (``DIR/``), ``-`` or a binary stream; ``options``:
    the command's keywords. Bad usage is refused before any model loads and, where the check needs no torch
    (options, inputs, existing outputs), before torch is imported."""
    from hookcli.run.request import request

    asked = request(command, model, layers, inputs, output=output, **options)
    from hookcli.run.plan import plan_request  # torch, numpy

    return plan_request(asked)


def _run(
    command: str, model: Model, layers: Layers | None, inputs: Inputs, output: Output, options: dict[str, Any],
    progress: Progress,
) -> Features | Path | None:  # fmt: skip
    from hookcli.run.request import request

    asked = request(command, model, layers, inputs, output=output, **options)  # refusals before any model loads
    from hookcli.run.execute import run_request  # torch, numpy, Pillow

    return run_request(asked, progress)


def _never_none(result: Features | Path | None) -> Features | Path:
    """What a run that never writes to stdout (cam, stats) returns."""
    assert result is not None, "only a run writing to stdout returns nothing"
    return result
