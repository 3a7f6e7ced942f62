"""What goes into a model: finding inputs and turning them into tensors.

:mod:`~hookcli.inputs.discovery` finds files, folders and stdin lists (named by :mod:`~hookcli.inputs.names`);
:mod:`~hookcli.inputs.images` decodes images (within :mod:`~hookcli.inputs.limits`), :mod:`~hookcli.inputs.archives`
those inside tar files; :mod:`~hookcli.inputs.clips` cuts videos and frame folders into rows, which
:mod:`~hookcli.inputs.video` decodes; :mod:`~hookcli.inputs.preprocess` is a model's preprocessing, built by
:mod:`~hookcli.inputs.transforms`; :mod:`~hookcli.inputs.decoding` decodes batches on the run's device. Finding inputs
needs neither Pillow nor torch. It imports only the foundation modules (errors, files, console, options, families).
"""
