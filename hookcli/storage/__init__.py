"""What comes out, on disk: the file contract and everything that writes or reads it.

:mod:`~hookcli.storage.fileformat` says what a file holds (keys, metadata, version, shard index, resume identity);
:mod:`~hookcli.storage.saving` writes safetensors files; :mod:`~hookcli.storage.features` reads them a row at a time,
like every :mod:`~hookcli.storage.reader`; :mod:`~hookcli.storage.index`, :mod:`~hookcli.storage.shards` and
:mod:`~hookcli.storage.shard_writer` handle shard folders shared through :mod:`~hookcli.storage.claims` (with
:mod:`~hookcli.storage.index_log`, :mod:`~hookcli.storage.background`); :mod:`~hookcli.storage.writers` is the one way a
run's rows are written; :mod:`~hookcli.storage.stats_format` describes a statistics file, which
:mod:`~hookcli.storage.stats_file` checks. It imports only the foundation modules and :mod:`hookcli.inputs`.
"""
