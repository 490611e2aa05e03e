"""What crosses the network in the distributed mode: precision codecs and error feedback.

It sits below :mod:`bigembed.distributed` (which chooses when and to whom tensors travel) and
knows nothing of ranks or process groups: it only turns tensors into what is sent and back.

Status: the codecs are complete and tested, but the distributed trainer does not use them yet.
Issue 10 wires them into the shared-parameter exchange and the partition transfers, with the
config section ``communication:``; until then no config key selects them.
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

__all__ = [
    "INT8_CHUNK",
    "PRECISIONS",
    "Codec",
    "Encoded",
    "ErrorFeedback",
    "NonFiniteError",
    "get_codec",
    "wire_bytes",
]
