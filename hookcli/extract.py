"""Run images through a model and collect what the selected layers produce.

:func:`iter_features` is the pipeline (decode → preprocess → batch → forward
with a :class:`~hookcli.capture.FeatureCapture`) and yields one batch at a
time, so a caller can stream; :func:`extract_features` gathers all rows into
preallocated tensors; :func:`build_metadata` describes the run for the file.

>>> loaded = load_model("resnet18", "none")                            # doctest: +SKIP
>>> layers = resolve_layers(loaded.module, ["layer3"])                 # doctest: +SKIP
>>> run = extract_features(loaded, layers, ["cat.jpg"])                # doctest: +SKIP
>>> run.tensors["layer3"].shape                                        # doctest: +SKIP
torch.Size([1, 256, 14, 14])
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from hookcli.capture import FeatureCapture
from hookcli.images import load_rgb
from hookcli.models import LoadedModel
from hookcli.preprocess import Preprocess
from hookcli.store import FORMAT_VERSION

__all__ = ["Extraction", "build_metadata", "extract_features", "iter_features"]


def iter_features(
    loaded: LoadedModel,
    layers: Mapping[str, str],
    paths: Sequence[str | os.PathLike],
    *,
    preprocess: Preprocess | None = None,
    capture: str = "output",
    device=None,
    batch_size: int = 16,
    capture_hooks: list | None = None,
) -> Iterator[tuple[list, dict]]:
    """Yield ``(paths of the batch, {key: CPU tensor})`` batch by batch, in input order.

    ``capture_hooks``, when given a list, receives the :class:`FeatureCapture`
    so a caller can read its ``calls`` and ``omitted`` after the run.
    """
    import torch

    device = torch.device(device or "cpu")
    transform = (preprocess or loaded.preprocess).to_transform()
    model = loaded.module.to(device)
    with FeatureCapture(model, layers, capture=capture) as hooks, torch.inference_mode():
        if capture_hooks is not None:
            capture_hooks.append(hooks)
        for start in range(0, len(paths), batch_size):
            chunk = list(paths[start:start + batch_size])
            batch = torch.stack([transform(load_rgb(path)) for path in chunk]).to(device)
            features = hooks.run(batch)
            yield chunk, {key: value.to("cpu") for key, value in features.items()}


@dataclass
class Extraction:
    """All rows of a run: ``tensors`` by key, what ran (``calls``) and what was not a tensor (``omitted``)."""

    tensors: dict
    calls: dict[str, int]
    omitted: list[str]


def extract_features(
    loaded: LoadedModel,
    layers: Mapping[str, str],
    paths: Sequence[str | os.PathLike],
    *,
    on_batch: Callable[[int], None] | None = None,
    **options,
) -> Extraction:
    """Run :func:`iter_features` to the end, writing rows into tensors allocated once.

    ``on_batch(n)`` is called after each batch of ``n`` images (for progress bars).
    """
    import torch

    tensors: dict = {}
    hooks: list = []
    row = 0
    for chunk, features in iter_features(loaded, layers, paths, capture_hooks=hooks, **options):
        for key, value in features.items():
            if key not in tensors:
                tensors[key] = torch.empty((len(paths), *value.shape[1:]), dtype=value.dtype)
            tensors[key][row:row + len(chunk)] = value
        row += len(chunk)
        if on_batch is not None:
            on_batch(len(chunk))
    return Extraction(tensors=tensors, calls=dict(hooks[0].calls or {}), omitted=sorted(hooks[0].omitted))


def build_metadata(
    loaded: LoadedModel,
    layers: Mapping[str, str],
    run: Extraction,
    paths: Sequence[str | os.PathLike],
    *,
    preprocess: Preprocess,
    capture: str,
    device,
) -> dict[str, str]:
    """The file's ``__metadata__``: strings, JSON for structured values (see the README)."""
    modules = dict(loaded.module.named_modules())
    described = {}
    for path, key in layers.items():
        stored = [k for k in run.tensors if k == key or (k.startswith(key) and k[len(key)] in ":@#")]
        described[path] = {
            "key": key,
            "type": type(modules[path]).__name__,
            "calls": run.calls.get(path, 0),
            "keys": stored,
        }
    metadata = {
        "format": FORMAT_VERSION,
        "producer": "hookcli",
        "model": loaded.name,
        "weights": loaded.weights_json(),
        "layers": json.dumps(described),
        "capture": capture,
        "preprocess": preprocess.to_json(),
        "inputs": json.dumps([os.path.abspath(p) for p in paths]),
        "device": str(device),
        "versions": json.dumps(_versions()),
    }
    if run.omitted:
        metadata["omitted"] = json.dumps(run.omitted)
    return metadata


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for package in ("hookcli", "torch", "torchvision", "safetensors", "pillow"):
        try:
            found[package] = version(package)
        except PackageNotFoundError:
            found[package] = "unknown"
    return found


def default_output_name(model_name: str, layers: Mapping[str, str]) -> Path:
    """``<model>-<key>.safetensors`` for one layer, ``<model>-<n>layers.safetensors`` for more."""
    keys = list(layers.values())
    label = keys[0] if len(keys) == 1 else f"{len(keys)}layers"
    return Path(f"{model_name}-{label.replace(os.sep, '_')}.safetensors")
