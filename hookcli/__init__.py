"""hookcli: hook any layer of a torchvision model and save what it returns.

The command line lives in :mod:`hookcli.cli`; everything else is a library that
works without it. Importing :mod:`hookcli` is cheap: the engine (and torch) load
on first use of one of the names below.

>>> from hookcli import FeatureCapture, load_model, resolve_layers   # doctest: +SKIP
>>> loaded = load_model("vgg16_bn", "none")                          # doctest: +SKIP
>>> with FeatureCapture(loaded.module, resolve_layers(loaded.module, ["features.18"])) as capture:  # doctest: +SKIP
...     features = capture.run(batch)
"""

from importlib import import_module
from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("hookcli")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0+unknown"

_PUBLIC = {
    "FeatureCapture": "hookcli.capture",
    "describe_layers": "hookcli.layers",
    "extract_features": "hookcli.extract",
    "gather_inputs": "hookcli.images",
    "load_model": "hookcli.models",
    "load_rgb": "hookcli.images",
    "open_features": "hookcli.shards",
    "resolve_layers": "hookcli.layers",
    "write_safetensors": "hookcli.store",
}

__all__ = ["__version__", *_PUBLIC]


def __getattr__(name: str):
    if name in _PUBLIC:
        return getattr(import_module(_PUBLIC[name]), name)
    raise AttributeError(f"module 'hookcli' has no attribute {name!r}")
