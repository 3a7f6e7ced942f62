"""hookcli: hook any layer of a torchvision model and save what it returns.

One function per command, keywords named like the command line's options
(see :mod:`hookcli.api`); the command line itself lives in :mod:`hookcli.cli`.
Importing :mod:`hookcli` is cheap: the engine (and torch) load on first use
of one of the names below.

>>> import hookcli
>>> photo = __import__("matplotlib.cbook").cbook.get_sample_data("grace_hopper.jpg", asfileobj=False)
>>> features = hookcli.extract("vgg16_bn", "features.18", photo, weights="none", resize=64, crop=64)
>>> features["features.18"].shape, features.inputs == [photo]
(torch.Size([1, 256, 16, 16]), True)
"""

from importlib import import_module as _import_module
from importlib.metadata import PackageNotFoundError as _PackageNotFoundError
from importlib.metadata import version as _version

try:
    __version__ = _version("hookcli")
except _PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0+unknown"

_PUBLIC = {
    "DEFAULT_OUTPUT": "hookcli.run",
    "FeatureCapture": "hookcli.capture",
    "Features": "hookcli.store",
    "GradientCapture": "hookcli.capture",
    "HookcliError": "hookcli.errors",
    "RunPlan": "hookcli.run",
    "cam": "hookcli.api",
    "describe_layers": "hookcli.selectors",
    "execute": "hookcli.run",
    "extract": "hookcli.api",
    "grad": "hookcli.api",
    "grid": "hookcli.api",
    "layers": "hookcli.api",
    "load_model": "hookcli.models",
    "open_features": "hookcli.shards",
    "plan": "hookcli.run",
    "report": "hookcli.api",
    "resolve_layers": "hookcli.selectors",
}

__all__ = ["__version__", *_PUBLIC]


def __getattr__(name: str):
    if name in _PUBLIC:
        return getattr(_import_module(_PUBLIC[name]), name)
    raise AttributeError(f"module 'hookcli' has no attribute {name!r}")


def __dir__() -> list[str]:
    """The public names (loaded on use), so that ``dir(hookcli)`` and completion show them."""
    return sorted(__all__)
