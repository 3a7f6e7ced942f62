"""What drives each unit: statistics of a layer's channels gathered in one streaming pass over any number of inputs.

Each statistic is a small accumulator (:class:`~hookcli.statistics.base.Accumulator`): ``update`` takes a batch,
``merge`` takes another accumulator's state, and ``state`` / ``from_state`` give that state as named tensors, so
that batches, shards and processes combine into one result whose memory does not grow with the number of inputs.
:mod:`~hookcli.statistics.moments` (count, mean, std, min, max, zeros), :mod:`~hookcli.statistics.sketch`
(quantiles within a bounded rank error), :mod:`~hookcli.statistics.examples` (each channel's top inputs, where and
their maps) and :mod:`~hookcli.statistics.covariance` (the pooled channels' covariance and its principal
components) are the accumulators; :mod:`~hookcli.statistics.units` says what a layer's channels and positions are,
:mod:`~hookcli.statistics.layer` gathers one layer's accumulators, and :mod:`~hookcli.storage.gathering_writer` feeds a
run's batches to them, shard by shard, into one statistics file. It uses the storage layer below it and torch.
"""
