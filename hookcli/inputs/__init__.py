"""What goes into a model: finding inputs and turning them into tensors.

Image files, folders and lists on stdin found (:mod:`~hookcli.inputs.discovery`,
with the names of :mod:`~hookcli.inputs.names`) and decoded
(:mod:`~hookcli.inputs.images`, within :mod:`~hookcli.inputs.limits`), images
inside tar files (:mod:`~hookcli.inputs.archives`), videos and folders of
frames cut into rows (:mod:`~hookcli.inputs.clips`) and decoded
(:mod:`~hookcli.inputs.video`), the preprocessing a model takes
(:mod:`~hookcli.inputs.preprocess`, built by :mod:`~hookcli.inputs.transforms`)
and decoding batched on the run's device (:mod:`~hookcli.inputs.decoding`).
Finding inputs needs neither Pillow nor torch. The lowest layer above the foundation
modules: it imports only those (errors, files, console, options, families).
"""
