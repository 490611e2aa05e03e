"""Precision codecs for tensors that cross the network, and error feedback (Bagua's ByteGrad).

A codec turns a float32 tensor into an :class:`Encoded` (one flat tensor to send, plus the
shape) and back. The receiver of a message of ``n`` values allocates :meth:`Codec.empty` and
receives into :meth:`Encoded.wire`, a view of the same storage (a ``uint8`` view for every
codec but ``fp32``, so the transport only moves bytes).

Codecs and their round-trip error ``|x - decode(encode(x))|``:

* ``fp32``: identity, exact (no copy, non-finite values pass through).
* ``fp16``: half precision, relative error <= 2**-11 for normal values; values whose magnitude
  exceeds fp16's range (65504) are refused rather than sent as inf.
* ``bf16``: bfloat16, relative error <= 2**-8, fp32's range.
* ``int8``: chunk-wise min/max quantization. The flat tensor is cut into chunks of
  ``chunk`` values (the last one may be shorter); per chunk ``min`` and
  ``scale = (max - min) / 255`` are stored as float32 and every value as the uint8 code
  ``round((x - min) / scale)``; decoding is ``min + code * scale``. The error is at most
  ``scale / 2`` of the value's chunk (plus float32 rounding, a few ulp of the chunk's largest
  magnitude); a constant chunk (scale 0) is exact. Wire layout: ``k`` mins, ``k`` scales
  (float32 bytes), then the ``n`` codes: ``n + 8 * ceil(n / chunk)`` bytes, ~3.97x fewer than
  fp32 for ``chunk = 1024``.

The lossy codecs refuse NaN and inf (:class:`NonFiniteError`): a diverged model must stop the
run with a clear message, not be quantized into garbage.

:class:`ErrorFeedback` keeps what a sender's quantization lost and adds it to its next message
(residual ``r``; send ``q = Q(x + r)``; ``r = x + r - D(q)``), so the sum of what arrives
follows the sum of what was meant to be sent with an error bounded by one message's error,
instead of a bias that grows with the number of messages.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from bigembed.config import PRECISIONS

INT8_CHUNK = 1024
_LEVELS = 255
_FP16_MAX = float(torch.finfo(torch.float16).max)


class NonFiniteError(ValueError):
    """A tensor to send holds NaN or inf (or values a codec cannot represent)."""


@dataclass(frozen=True)
class Encoded:
    """One message: ``data`` is what travels, ``numel`` and ``shape`` what it decodes to."""

    codec: str
    data: Tensor
    numel: int
    shape: tuple[int, ...]

    def wire(self) -> Tensor:
        """The tensor to send or receive into: ``data`` itself for float32, else its bytes."""
        if self.data.dtype == torch.float32:
            return self.data
        return self.data.view(torch.uint8)


def wire_bytes(encoded: Encoded) -> int:
    """Bytes this message occupies on the wire."""
    return encoded.data.numel() * encoded.data.element_size()


def _check_finite(x: Tensor, codec: str) -> None:
    if x.numel() and not bool(torch.isfinite(x).all()):
        bad = int((~torch.isfinite(x)).sum())
        raise NonFiniteError(
            f"{codec} codec: the tensor to send holds {bad} NaN/inf value(s) of {x.numel()} "
            "(the model diverged? try a lower lr)"
        )


class Codec:
    """Base of the codecs: float32 in, :class:`Encoded` out."""

    lossless = False

    @property
    def name(self) -> str:
        """Its ``communication.precision`` name (the registry's, not a copy)."""
        return PRECISIONS.name_of(type(self))

    def encode(self, x: Tensor) -> Encoded:
        raise NotImplementedError

    def decode(self, encoded: Encoded) -> Tensor:
        raise NotImplementedError

    def empty(self, numel: int, shape: tuple[int, ...] | None = None) -> Encoded:
        """A message of ``numel`` values to receive into."""
        raise NotImplementedError


class Fp32Codec(Codec):
    lossless = True

    def encode(self, x: Tensor) -> Encoded:
        return Encoded(self.name, x.reshape(-1), x.numel(), tuple(x.shape))

    def decode(self, encoded: Encoded) -> Tensor:
        return encoded.data.view(encoded.shape)

    def empty(self, numel: int, shape: tuple[int, ...] | None = None) -> Encoded:
        return Encoded(self.name, torch.empty(numel), numel, shape or (numel,))


class CastCodec(Codec):
    """fp16 / bf16: a plain cast to ``dtype``."""

    dtype: torch.dtype

    def encode(self, x: Tensor) -> Encoded:
        _check_finite(x, self.name)
        if self.dtype == torch.float16 and x.numel() and float(x.abs().max()) > _FP16_MAX:
            raise NonFiniteError(
                f"fp16 codec: a value of magnitude {float(x.abs().max()):.3g} exceeds fp16's "
                f"range ({_FP16_MAX:g}); use bf16 or int8"
            )
        data = x.detach().reshape(-1).to(self.dtype)
        return Encoded(self.name, data, x.numel(), tuple(x.shape))

    def decode(self, encoded: Encoded) -> Tensor:
        return encoded.data.to(torch.float32).view(encoded.shape)

    def empty(self, numel: int, shape: tuple[int, ...] | None = None) -> Encoded:
        data = torch.empty(numel, dtype=self.dtype)
        return Encoded(self.name, data, numel, shape or (numel,))


class Fp16Codec(CastCodec):
    dtype = torch.float16


class Bf16Codec(CastCodec):
    dtype = torch.bfloat16


class Int8Codec(Codec):
    """Chunk-wise min/max quantization to uint8 codes (see the module docstring)."""

    def __init__(self, chunk: int = INT8_CHUNK) -> None:
        if chunk <= 0:
            raise ValueError(f"int8 codec: chunk must be > 0, not {chunk}")
        self.chunk = chunk

    def _chunks(self, numel: int) -> int:
        return -(-numel // self.chunk)

    def encode(self, x: Tensor) -> Encoded:
        _check_finite(x, self.name)
        flat = x.detach().reshape(-1).to(torch.float32)
        n, k = flat.numel(), self._chunks(flat.numel())
        data = torch.empty(8 * k + n, dtype=torch.uint8)
        if n:
            pad = k * self.chunk - n  # repeat the last value: it changes no chunk's min or max
            rows = torch.cat([flat, flat[-1:].expand(pad)]).view(k, self.chunk)
            lo = rows.amin(dim=1)
            span = rows.amax(dim=1) - lo
            if not bool(torch.isfinite(span).all()):
                raise NonFiniteError(
                    "int8 codec: a chunk's range (max - min) overflows float32 "
                    "(values near ±3.4e38)"
                )
            scale = span / _LEVELS
            safe = torch.where(scale > 0, scale, torch.ones_like(scale))
            codes = ((rows - lo[:, None]) / safe[:, None]).round_().clamp_(0, _LEVELS)
            data[: 4 * k].view(torch.float32).copy_(lo)
            data[4 * k : 8 * k].view(torch.float32).copy_(scale)
            data[8 * k :].copy_(codes.view(-1)[:n].to(torch.uint8))
        return Encoded(self.name, data, n, tuple(x.shape))

    def decode(self, encoded: Encoded) -> Tensor:
        n, k = encoded.numel, self._chunks(encoded.numel)
        data = encoded.data
        if n == 0:
            return torch.empty(encoded.shape)
        lo = data[: 4 * k].view(torch.float32)
        scale = data[4 * k : 8 * k].view(torch.float32)
        codes = torch.zeros(k * self.chunk)
        codes[:n] = data[8 * k :]
        rows = torch.addcmul(lo[:, None], codes.view(k, self.chunk), scale[:, None])
        return rows.view(-1)[:n].view(encoded.shape)

    def empty(self, numel: int, shape: tuple[int, ...] | None = None) -> Encoded:
        data = torch.empty(8 * self._chunks(numel) + numel, dtype=torch.uint8)
        return Encoded(self.name, data, numel, shape or (numel,))


def get_codec(name: str) -> Codec:
    """The codec of a ``communication.precision`` value."""
    codec: Codec = PRECISIONS.get(name)()
    return codec


class ErrorFeedback:
    """A sender's error compensation: what quantization dropped goes into the next message.

    One instance per stream of messages of the same size (a sender to one receiver). With a
    lossless codec it adds nothing, so fp32 messages stay bit-identical to the input.
    """

    def __init__(self, codec: Codec) -> None:
        self.codec = codec
        self.residual: Tensor | None = None

    def encode(self, x: Tensor) -> tuple[Encoded, Tensor]:
        """Encode ``x`` plus the kept residual; returns the message and what it decodes to."""
        if self.codec.lossless:
            encoded = self.codec.encode(x)
            return encoded, self.codec.decode(encoded)
        target = x if self.residual is None else x + self.residual
        encoded = self.codec.encode(target)
        decoded = self.codec.decode(encoded)
        self.residual = target - decoded
        return encoded, decoded
