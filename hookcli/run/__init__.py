"""A run, from options to rows: options → one frozen plan → the batch pipeline → a writer.

:mod:`~hookcli.run.options` and :mod:`~hookcli.run.request` check a command's
options without torch (with :mod:`~hookcli.run.outputs`,
:mod:`~hookcli.run.settings`, :mod:`~hookcli.run.selectors`,
:mod:`~hookcli.run.targets` and :mod:`~hookcli.run.launch`),
:mod:`~hookcli.run.plan` resolves them once with the model,
:mod:`~hookcli.run.execute` carries a plan
out through :mod:`~hookcli.run.batches`, :mod:`~hookcli.run.pipeline` and
:mod:`~hookcli.run.forwards`; :mod:`~hookcli.run.capture`,
:mod:`~hookcli.run.selectors`, :mod:`~hookcli.run.gradients`,
:mod:`~hookcli.run.fusion`, :mod:`~hookcli.run.speed`,
:mod:`~hookcli.run.device` and :mod:`~hookcli.run.team` are what a forward
needs; :mod:`~hookcli.run.layer_table` is ``hookcli layers``. The top of the
engine: it may import every layer below it (inputs, storage, models,
pictures), and only :mod:`hookcli.api` and :mod:`hookcli.cli` import it.
"""
