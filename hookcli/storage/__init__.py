"""What comes out, on disk: the file contract and everything that writes or reads it.

:mod:`~hookcli.storage.fileformat` describes once what a file holds (keys,
metadata, the version, a shard folder's index and resume identity);
:mod:`~hookcli.storage.saving` writes safetensors files and
:mod:`~hookcli.storage.features` reads them back a row at a time, every reader offering :mod:`~hookcli.storage.reader`'s
interface; :mod:`~hookcli.storage.index`,
:mod:`~hookcli.storage.shards` and :mod:`~hookcli.storage.shard_writer` read
and write shard folders that many processes share through
:mod:`~hookcli.storage.claims` (with :mod:`~hookcli.storage.index_log` and
:mod:`~hookcli.storage.background`); :mod:`~hookcli.storage.writers` is the one
interface a run's rows go through; :mod:`~hookcli.storage.stats_format` describes a statistics file and
:mod:`~hookcli.storage.stats_file` checks one read back. It imports the foundation modules and
:mod:`hookcli.inputs` (for the names rows record), nothing above.
"""
