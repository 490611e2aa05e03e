"""What crosses the network in the distributed mode: precision codecs and error feedback.

It sits below :mod:`bigembed.distributed` (which chooses when and to whom tensors travel) and
knows nothing of ranks or process groups: it only turns tensors into what is sent and back.

``communication.precision`` (config) selects the codec of the shared-parameter exchange
(:mod:`bigembed.communication.sharer`); partition transfers still travel in float32.
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
