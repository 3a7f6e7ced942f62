"""What goes into a model: finding inputs and turning them into tensors.

Image files, folders and lists on stdin (:mod:`~hookcli.inputs.images`, with
the names of :mod:`~hookcli.inputs.names`), images inside tar files
(:mod:`~hookcli.inputs.archives`), videos and folders of frames
(:mod:`~hookcli.inputs.video`), the preprocessing a model takes
(:mod:`~hookcli.inputs.preprocess`) and decoding batched on the run's device
(:mod:`~hookcli.inputs.decoding`). The lowest layer above the foundation
modules: it imports only those (errors, files, console, options, families).
"""
