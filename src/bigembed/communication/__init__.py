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

from bigembed.communication.codecs import (
    INT8_CHUNK,
    PRECISIONS,
    Codec,
    Encoded,
    ErrorFeedback,
    NonFiniteError,
    get_codec,
    wire_bytes,
)
from bigembed.communication.row_delta import TRANSFER_DTYPE, RowDelta, to_transfer
from bigembed.communication.strategies import SharedTensors, StrategyEnv, make_strategy

__all__ = [
    "INT8_CHUNK",
    "PRECISIONS",
    "TRANSFER_DTYPE",
    "Codec",
    "Encoded",
    "ErrorFeedback",
    "NonFiniteError",
    "RowDelta",
    "SharedTensors",
    "StrategyEnv",
    "get_codec",
    "make_strategy",
    "to_transfer",
    "wire_bytes",
]
