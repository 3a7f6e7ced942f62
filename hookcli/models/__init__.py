"""Which models exist, and building them with their weights.

:mod:`~hookcli.models.registry` caches what torchvision can build, so names are checked without torch;
:mod:`~hookcli.models.specs` says what a ``--model`` value names; :mod:`~hookcli.models.catalog` lists models and
checks names and weights from the cache; :mod:`~hookcli.models.weights` checks a weights file before anything loads;
:mod:`~hookcli.models.loading` builds torchvision models of every family; :mod:`~hookcli.models.state_dicts` reads and
fits state dicts; :mod:`~hookcli.models.loaded` is a model ready to run; :mod:`hookcli.models.sources` holds timm,
transformers, OpenCLIP and the user's factories, a module each. It imports the foundation modules,
:mod:`hookcli.inputs` (for preprocessing) and :mod:`hookcli.storage`, nothing above.
"""
