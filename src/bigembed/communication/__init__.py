"""What crosses the network in the distributed mode, and how.

It sits below :mod:`bigembed.distributed`, which runs the lock, partition and rendezvous
services, picks the strategy from the config and calls its hooks.

Three layers, as in Bagua: the strategies (:mod:`bigembed.communication.strategies`, chosen by
``communication.strategy``), the logical primitives they are built from (point-to-point
exchange, sharded all-reduce, compressed streams with error feedback, parameter servers, the
lockstep round thread), and the codecs (``communication.precision``); torch.distributed (gloo)
is the transport. :mod:`bigembed.communication.row_delta` is the encoding of compressed
partition transfers (``communication.partition_precision``).
"""

import lazy_loader

# What other packages may use: listed in __init__.pyi, imported on first use.
__getattr__, __dir__, __all__ = lazy_loader.attach_stub(__name__, __file__)
