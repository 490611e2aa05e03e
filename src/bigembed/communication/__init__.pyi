from .codecs import (
    INT8_CHUNK,
    PRECISIONS,
    Codec,
    Encoded,
    ErrorFeedback,
    NonFiniteError,
    get_codec,
    wire_bytes,
)
from .row_delta import TRANSFER_DTYPE, RowDelta, to_transfer
from .strategies import SharedTensors, Strategy, StrategyEnv, make_strategy

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
    "Strategy",
    "StrategyEnv",
    "get_codec",
    "make_strategy",
    "to_transfer",
    "wire_bytes",
]
