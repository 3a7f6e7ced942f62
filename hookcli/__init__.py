"""hookcli: hook any layer of a vision model (torchvision, timm, transformers, OpenCLIP, your own) and save it.

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
from typing import TYPE_CHECKING

from hookcli.version import __version__

if TYPE_CHECKING:  # what editors and type checkers see; at run time each name loads on first use (below)
    from hookcli.api import ablate, cam, compare, doctor, extract, grad, grid, info, layers, models, plan, report, stats
    from hookcli.errors import HookcliError
    from hookcli.inputs.preprocess import Preprocess
    from hookcli.models.loading import load_model
    from hookcli.options.compare import CompareOptions
    from hookcli.options.grid import GridOptions
    from hookcli.options.run import RunOptions
    from hookcli.run.capture import FeatureCapture, GradientCapture
    from hookcli.run.execute import execute
    from hookcli.run.layer_table import describe_layers
    from hookcli.run.outputs import DEFAULT_OUTPUT
    from hookcli.run.plan import RunPlan
    from hookcli.run.selectors import resolve_layers
    from hookcli.storage.features import FeatureFile, Features
    from hookcli.storage.reader import FeatureReader
    from hookcli.storage.shards import ShardedFeatures, open_features

_PUBLIC = {
    "CompareOptions": "hookcli.options.compare",
    "DEFAULT_OUTPUT": "hookcli.run.outputs",
    "FeatureCapture": "hookcli.run.capture",
    "FeatureFile": "hookcli.storage.features",
    "FeatureReader": "hookcli.storage.reader",
    "Features": "hookcli.storage.features",
    "GradientCapture": "hookcli.run.capture",
    "GridOptions": "hookcli.options.grid",
    "HookcliError": "hookcli.errors",
    "Preprocess": "hookcli.inputs.preprocess",
    "RunOptions": "hookcli.options.run",
    "RunPlan": "hookcli.run.plan",
    "ablate": "hookcli.api",
    "cam": "hookcli.api",
    "compare": "hookcli.api",
    "describe_layers": "hookcli.run.layer_table",
    "doctor": "hookcli.api",
    "execute": "hookcli.run.execute",
    "extract": "hookcli.api",
    "grad": "hookcli.api",
    "grid": "hookcli.api",
    "info": "hookcli.api",
    "layers": "hookcli.api",
    "load_model": "hookcli.models.loading",
    "models": "hookcli.api",
    "patch": "hookcli.api",
    "open_features": "hookcli.storage.shards",
    "plan": "hookcli.api",
    "report": "hookcli.api",
    "rollout": "hookcli.statistics.rollout",
    "resolve_layers": "hookcli.run.selectors",
    "ShardedFeatures": "hookcli.storage.shards",
    "stats": "hookcli.api",
}

__all__ = [
    "__version__",
    "CompareOptions",
    "DEFAULT_OUTPUT",
    "FeatureCapture",
    "FeatureFile",
    "FeatureReader",
    "Features",
    "GradientCapture",
    "GridOptions",
    "HookcliError",
    "Preprocess",
    "RunOptions",
    "RunPlan",
    "ShardedFeatures",
    "ablate",
    "cam",
    "compare",
    "describe_layers",
    "doctor",
    "execute",
    "extract",
    "grad",
    "grid",
    "info",
    "layers",
    "load_model",
    "models",
    "open_features",
    "patch",
    "plan",
    "report",
    "resolve_layers",
    "rollout",
    "stats",
]


def __getattr__(name: str):
    if name in _PUBLIC:
        return getattr(_import_module(_PUBLIC[name]), name)
    raise AttributeError(f"module 'hookcli' has no attribute {name!r}")


def __dir__() -> list[str]:
    """The public names (loaded on use), so that ``dir(hookcli)`` and completion show them."""
    return sorted(__all__)
