"""What drives each unit: statistics of a layer's channels gathered in one streaming pass over any number of inputs.

Each statistic is an :class:`~hookcli.statistics.base.Accumulator`: ``update`` takes a batch, ``merge`` another's
state, and ``state``/``from_state`` give it as named tensors, so batches, shards and processes combine in memory that
does not grow with the inputs. They are :mod:`~hookcli.statistics.moments` (count, mean, std, min, max, zeros),
:mod:`~hookcli.statistics.sketch` (quantiles within a bounded rank error), :mod:`~hookcli.statistics.examples` (each
channel's top inputs and their maps) and :mod:`~hookcli.statistics.covariance` (covariance, principal components).
:mod:`~hookcli.statistics.units` says what a layer's channels and positions are, :mod:`~hookcli.statistics.layer`
gathers a layer's accumulators and :mod:`~hookcli.storage.gathering_writer` feeds them. It uses storage and torch.
"""
