"""The batch pipeline every model-running command shares: inputs → decode → device → forward → rows.

:func:`iter_batches` is the one loop: images are decoded and preprocessed in
worker processes (``workers``) while the model runs on earlier batches, or,
with the preprocessing's ``decode="device"``, read there and decoded batched
on the device while it computes the batch before (:mod:`hookcli.inputs.decoding`);
batches go to the device (pinned memory and non-blocking copies on CUDA); a
forward strategy, chosen once per run, runs the model with the layers
captured; features are pooled and cast (``pool``, ``dtype``) on the device,
then moved to the CPU. Each :class:`Batch` carries its rows, the inputs that
could not be read, and the run's facts so far (:class:`~hookcli.storage.fileformat.RunFacts`).

Forward strategies (each a context manager called with a batch):

- :class:`EagerForward`: hooks on the model as written;
- :class:`FusedForward`: the same hooks on a fused copy of the model (CPU
  extraction, :mod:`hookcli.run.fusion`), falling back to the model as written
  should the fused forward fail on the first batch; by default only for runs
  of :data:`~hookcli.run.speed.FUSE_FROM` images or more, where tracing and
  folding pay back (:func:`hookcli.run.speed.choose_fuse`);
- :class:`CompiledForward`: a compiled graph cut after the last layer
  (:func:`hookcli.run.speed.compiled_extractor`), falling back to the eager path
  where hooks are needed;
- gradient and CAM strategies live in :mod:`hookcli.run.gradients`.

>>> from hookcli.models.loading import load_model
>>> photo = __import__("matplotlib.cbook").cbook.get_sample_data("grace_hopper.jpg", asfileobj=False)
>>> loaded = load_model("resnet18", "none")
>>> settings = RunSettings(preprocess=loaded.preprocess.replace(resize=64, crop=64))
>>> batch = next(iter_batches(loaded, {"layer3": "layer3"}, [photo], settings))
>>> batch.features["layer3"].shape, batch.facts.calls
(torch.Size([1, 256, 4, 4]), {'layer3': 1})

The library's front door is :func:`hookcli.extract`; this loop is what it
(and grad, cam, the benchmarks) runs.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Generator, Iterable, Mapping, Sequence

import torch

from hookcli.errors import CaptureError, input_kind, size_refusal
from hookcli.families import ragged_rows, square_input
from hookcli.inputs.images import PictureMaker
from hookcli.models.loaded import LoadedModel
from hookcli.run.batches import Decoded, image_loader, reported_failures, videos_closed
from hookcli.run.capture import stored
from hookcli.run.forwards import ForwardFactory, extraction_forward, prepared_model
from hookcli.run.settings import Batch, RunSettings
from hookcli.run.speed import model_refusal, resolve_settings
from hookcli.statistics.units import layer_widths, width_of

__all__ = ["iter_batches"]


def iter_batches(
    loaded: LoadedModel,
    layers: Mapping[str, str],
    paths: Sequence[str | os.PathLike],
    settings: RunSettings | None = None,
    *,
    forward: ForwardFactory | None = None,
    order: Iterable[list[int]] | None = None,
    on_note: Callable[[str], None] | None = None,
    picture: PictureMaker | None = None,
    rows_on_device: bool = False,
) -> Generator[Batch, None, None]:
    """Yield :class:`Batch` es of ``paths`` in input order, or the batches of input indices ``order`` gives.

    ``forward`` builds the run's forward strategy (default:
    :func:`extraction_forward` of the settings). With ``on_error="fail"`` an
    unreadable image raises :class:`ImageError`; with ``"skip"`` it is
    reported in ``Batch.failures`` and left out. ``on_note(text)`` hears why
    a strategy fell back to another (compile to eager, fused to unfused).
    ``picture`` makes a picture of each image where it is decoded (a CAM's
    photo), from the same decode; they come in ``Batch.pictures``. With ``rows_on_device`` the features stay on the
    run's device (a gathering run's accumulators take them there) instead of coming to the CPU.
    """
    settings = resolve_settings(settings or RunSettings(), loaded, len(paths))
    make_forward = forward or extraction_forward(settings)
    ragged = ragged_rows(settings.family, settings.preprocess)  # every key a list of rows, whatever the strategy
    square = square_input(settings.preprocess)
    # Each layer's channels where its module says them (by the key of its output), so that pooling finds the axis
    # its shape alone hides.
    widths = layer_widths(loaded.module, layers) if settings.pool else {}
    cast = getattr(torch, settings.dtype)
    batches = Decoded(image_loader(paths, settings, order=order, picture=picture), settings, on_note)
    unreadable = input_kind(paths)
    ran = False  # a forward has run: a later failure is no refusal of the inputs' size
    with (
        prepared_model(loaded, settings) as (model, to_device),
        make_forward(model, layers, settings, on_note) as run,
        videos_closed(),
    ):
        for indices, batch, failures, pictures, damaged in batches:
            failures = reported_failures(failures, settings.on_error, unreadable)
            features, targets, facts = {}, None, None
            if batch is not None:
                try:
                    captured, targets = run(to_device(batch))
                except (RuntimeError, ValueError, AssertionError) as err:
                    refusal = None if ran else model_refusal(err, model, settings.precision, loaded.name)
                    if refusal is not None:
                        raise refusal from err
                    words = None if ran else size_refusal(err)
                    if words is None:
                        raise
                    shape = list(batch.shape) if isinstance(batch, torch.Tensor) else type(batch).__name__
                    raise CaptureError(  # the model's own words of an input it cannot take (a ViT's size)
                        f"{loaded.name} cannot run on this run's inputs ({shape}: {words})",
                        hint="give it inputs of a size it takes (--resize, --crop)"
                        + (
                            ""
                            if loaded.handed_in
                            else f"; hookcli layers -m {loaded.name} runs it on its natural input"
                        ),
                    ) from err
                ran = True
                batches.prepare()  # while the device computes this batch
                features = {
                    key: stored(key, value, settings.pool, cast, ragged, square, rows_on_device, width_of(widths, key))
                    for key, value in captured.items()
                }
                facts = run.facts()
            yield Batch(indices, features, failures, targets, facts, pictures, damaged)
