"""``async_model_average``: centralized, asynchronous. A background thread averages the shared
parameters of all trainers while the workers go on training.

Every ``sync_interval`` seconds (at most; a round takes as long as the network needs) each
trainer's round thread joins an all-reduce of the *values*, computed as the mean of everybody's
changes since the last round (which is the same thing: see
:mod:`bigembed.communication.delta_reduce`). The workers never wait for it. What a worker
changes while a round is in flight is kept and goes out with the next round.

Averaging, as in local SGD and Bagua's asynchronous model average, divides each trainer's
contribution to the shared parameters by the number of trainers: with sparse shared tables
(an unpartitioned entity type most buckets touch in different rows) it learns them more
slowly than ``allreduce`` or ``async_ps``, which sum.

With ``communication.sparse_rows`` the embedding tables move as row-sparse deltas, averaged
the same way (see ``allreduce`` and :mod:`~bigembed.communication.sparse_reduce`).
"""

from __future__ import annotations

from bigembed.communication.strategies.allreduce import Allreduce


class AsyncModelAverage(Allreduce):
    centralized = True
    synchronous = False
    averages = True
