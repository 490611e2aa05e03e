"""Lossy messages over a server's segments: each segment is encoded on its own.

A parameter server's shard is the concatenation of segments of different tensors (a relation
operator, its Adagrad accumulator, an entity table, its row accumulator, ...: see
:class:`~bigembed.communication.param_server.ShardPlan`). Encoding the concatenation as one tensor
would let an int8 chunk hold the end of one tensor and the start of the next, so the scale of a
parameter delta would set the quantization error of an accumulator delta (and push accumulators
near 0 below 0: ``sqrt`` then gives NaN). :class:`SegmentStream` encodes each segment as its own
message, with its own error feedback, and concatenates their bytes into one buffer, so one
``send`` still carries a whole round.

The parameter-server exchange uses it for the lossy codecs only (``fp32`` there keeps the exact
exchange of one float32 vector); the collective strategies use it for every codec.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from bigembed.communication.codecs import Codec, Encoded, ErrorFeedback, wire_bytes


class SegmentStream:
    """One direction of messages of ``sizes`` values per segment (a sender to one receiver).

    The sender calls :meth:`encode`, the receiver :meth:`empty` then :meth:`decode`; both build
    the stream from the same codec and sizes, so they agree on the layout.
    """

    def __init__(self, codec: Codec, sizes: Sequence[int], feedback: bool = True) -> None:
        """``feedback=False``: no error feedback (for a sender that tracks what the receiver
        holds itself and sends the difference, which already carries the last error)."""
        self.codec = codec
        self.sizes = list(sizes)
        self.feedback = [ErrorFeedback(codec) for _ in self.sizes] if feedback else None
        self._inbox = [codec.empty(n) for n in self.sizes]  # per-segment receive buffers
        self._spans = [wire_bytes(e) for e in self._inbox]  # bytes, whatever the codec
        self.nbytes = sum(self._spans)

    def empty(self) -> Tensor:
        """A buffer to receive one message into."""
        return torch.empty(self.nbytes, dtype=torch.uint8)

    def encode(self, x: Tensor) -> Tensor:
        """The bytes of ``x`` (the segments' values, concatenated), each segment encoded with
        its own error feedback."""
        out = self.empty()
        offset = start = 0
        for k, (n, span) in enumerate(zip(self.sizes, self._spans, strict=True)):
            part = x[start : start + n]
            if self.feedback is None:
                encoded = self.codec.encode(part)
            else:
                encoded, _ = self.feedback[k].encode(part)
            out[offset : offset + span].copy_(encoded.wire().view(torch.uint8).view(-1))
            offset, start = offset + span, start + n
        return out

    def decode(self, buf: Tensor) -> Tensor:
        """The values a received buffer encodes (one flat float32 vector)."""
        parts = []
        offset = 0
        for encoded, span in zip(self._inbox, self._spans, strict=True):
            encoded.wire().view(torch.uint8).view(-1).copy_(buf[offset : offset + span])
            parts.append(self._decode(encoded))
            offset += span
        return torch.cat(parts) if parts else torch.empty(0)

    def _decode(self, encoded: Encoded) -> Tensor:
        return self.codec.decode(encoded).reshape(-1)
