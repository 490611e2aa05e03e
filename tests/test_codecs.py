"""Precision codecs and error feedback (bigembed.communication.codecs)."""

from __future__ import annotations

import pytest
import torch

from bigembed.communication.codecs import (
    INT8_CHUNK,
    PRECISIONS,
    ErrorFeedback,
    Fp16Codec,
    Int8Codec,
    NonFiniteError,
    get_codec,
    wire_bytes,
)


def _int8_bound(x: torch.Tensor, chunk: int) -> torch.Tensor:
    """Per-value bound of the int8 round trip: half the chunk's scale plus float32 rounding."""
    flat = x.reshape(-1)
    n = flat.numel()
    k = -(-n // chunk)
    pad = torch.cat([flat, flat[-1:].expand(k * chunk - n)]).view(k, chunk)
    lo, hi = pad.amin(1), pad.amax(1)
    mag = torch.maximum(lo.abs(), hi.abs())
    per_chunk = (hi - lo) / 255 / 2 + 8 * torch.finfo(torch.float32).eps * mag
    return per_chunk.repeat_interleave(chunk)[:n].view(x.shape)


@pytest.mark.parametrize("n", [1, 7, 1024, 1025, 5000])
def test_int8_round_trip_within_half_a_scale(n: int) -> None:
    gen = torch.Generator().manual_seed(n)
    x = torch.randn(n, generator=gen) * torch.logspace(-3, 3, n)  # chunks of very different ranges
    codec = Int8Codec()
    encoded = codec.encode(x)
    decoded = codec.decode(encoded)
    assert decoded.shape == x.shape and decoded.dtype == torch.float32
    err = (decoded - x).abs()
    assert bool((err <= _int8_bound(x, INT8_CHUNK)).all())
    # the bound is tight enough to mean something: errors reach a fair share of it
    if n > 100:
        assert float((err / _int8_bound(x, INT8_CHUNK)).max()) > 0.4


def test_int8_small_chunks_and_shapes() -> None:
    x = torch.randn(6, 5, generator=torch.Generator().manual_seed(1))
    codec = Int8Codec(chunk=4)
    decoded = codec.decode(codec.encode(x))
    assert decoded.shape == (6, 5)
    assert bool(((decoded - x).abs() <= _int8_bound(x, 4)).all())


def test_int8_constant_chunks_are_exact() -> None:
    x = torch.cat([torch.full((1024,), 3.25), torch.full((1024,), -1e-7), torch.zeros(10)])
    codec = Int8Codec()
    assert torch.equal(codec.decode(codec.encode(x)), x)


@pytest.mark.parametrize("name", ["fp16", "bf16"])
def test_half_precisions_relative_bound(name: str) -> None:
    x = torch.randn(10_000, generator=torch.Generator().manual_seed(2)) * 100
    x = x[x.abs() > 1e-3]  # normal range of fp16
    rel = {"fp16": 2.0**-11, "bf16": 2.0**-8}[name]
    decoded = get_codec(name).decode(get_codec(name).encode(x))
    assert bool(((decoded - x).abs() <= rel * x.abs()).all())
    assert float(((decoded - x).abs() / x.abs()).max()) > rel / 4  # it really is lossy


def test_fp32_is_identity_and_passes_non_finite() -> None:
    x = torch.tensor([1.0, float("nan"), float("inf"), -0.0])
    codec = get_codec("fp32")
    encoded = codec.encode(x)
    assert encoded.wire().dtype == torch.float32
    out = codec.decode(encoded)
    assert torch.equal(out.view(torch.int32), x.view(torch.int32))


@pytest.mark.parametrize("name", ["fp16", "bf16", "int8"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_lossy_codecs_refuse_non_finite(name: str, bad: float) -> None:
    x = torch.ones(2000)
    x[1500] = bad
    with pytest.raises(NonFiniteError, match=f"{name} codec: .*1 NaN/inf value"):
        get_codec(name).encode(x)


def test_fp16_refuses_overflow_and_int8_refuses_huge_range() -> None:
    with pytest.raises(NonFiniteError, match="exceeds fp16's range"):
        Fp16Codec().encode(torch.tensor([1.0, 70000.0]))
    with pytest.raises(NonFiniteError, match="overflows float32"):
        Int8Codec().encode(torch.tensor([-3e38, 3e38]))


@pytest.mark.parametrize("name", PRECISIONS)
def test_empty_tensors(name: str) -> None:
    codec = get_codec(name)
    encoded = codec.encode(torch.empty(0, 3))
    assert wire_bytes(encoded) == 0
    assert codec.decode(encoded).shape == (0, 3)


@pytest.mark.parametrize("name", PRECISIONS)
def test_receive_buffer_round_trip(name: str) -> None:
    """What a receiver allocates (empty) and fills through wire() decodes like the original."""
    codec = get_codec(name)
    x = torch.randn(3001, generator=torch.Generator().manual_seed(3))
    sent = codec.encode(x)
    received = codec.empty(x.numel())
    assert received.wire().shape == sent.wire().shape
    assert received.wire().dtype == sent.wire().dtype
    received.wire().copy_(sent.wire())
    assert torch.equal(codec.decode(received), codec.decode(sent).view(-1))


def test_int8_wire_bytes_at_least_3_5x_smaller() -> None:
    x = torch.randn(1_000_000)
    fp32 = wire_bytes(get_codec("fp32").encode(x))
    int8 = wire_bytes(get_codec("int8").encode(x))
    assert fp32 == 4_000_000
    assert int8 == 1_000_000 + 8 * -(-1_000_000 // INT8_CHUNK)
    assert fp32 / int8 >= 3.5
    assert wire_bytes(get_codec("fp16").encode(x)) == 2_000_000


def _biased_message(n: int = 4096) -> torch.Tensor:
    """Every chunk spans [0, 1] but most values sit at 0.4 of a step above the min: nearest
    rounding sends them all to the min, a bias of the same sign in every message."""
    x = torch.full((n,), 0.4 / 255)
    x[::INT8_CHUNK] = 0.0
    x[1::INT8_CHUNK] = 1.0
    return x


def _sums(messages: list[torch.Tensor], feedback: bool) -> tuple[torch.Tensor, torch.Tensor]:
    codec = get_codec("int8")
    ef = ErrorFeedback(codec)
    orig = torch.zeros(messages[0].shape, dtype=torch.float64)
    got = torch.zeros_like(orig)
    for x in messages:
        if feedback:
            _, decoded = ef.encode(x)
        else:
            decoded = codec.decode(codec.encode(x))
        orig += x.double()
        got += decoded.double()
    return orig, got


def test_error_feedback_keeps_sum_of_1000_messages() -> None:
    gen = torch.Generator().manual_seed(4)
    messages = [torch.randn(3000, generator=gen) * 0.1 + 0.05 for _ in range(1000)]
    one_message = max(float(_int8_bound(x, INT8_CHUNK).max()) for x in messages)
    orig, got = _sums(messages, feedback=True)
    assert float((got - orig).abs().max()) <= one_message
    orig, got = _sums([_biased_message()] * 1000, feedback=True)
    assert float((got - orig).abs().max()) <= float(_int8_bound(_biased_message(), 1024).max())


def test_without_error_feedback_the_bias_accumulates() -> None:
    x = _biased_message()
    one_message = float(_int8_bound(x, INT8_CHUNK).max())
    errors = []
    for count in (10, 100, 1000):
        orig, got = _sums([x] * count, feedback=False)
        errors.append(float((got - orig).abs().max()))
    assert errors[0] < errors[1] < errors[2]
    assert errors[2] > 100 * one_message  # linear growth: 1000 x 0.4 step vs half a step
    orig, got = _sums([x] * 1000, feedback=True)
    assert float((got - orig).abs().max()) <= one_message


def test_error_feedback_is_a_no_op_for_fp32() -> None:
    ef = ErrorFeedback(get_codec("fp32"))
    x = torch.tensor([-0.0, 1e-30, 3.0])
    for _ in range(3):
        encoded, decoded = ef.encode(x)
        assert torch.equal(encoded.data.view(torch.int32), x.view(torch.int32))
        assert torch.equal(decoded.view(torch.int32), x.view(torch.int32))
    assert ef.residual is None


def test_unknown_precision() -> None:
    with pytest.raises(ValueError, match="unknown precision 'int4'"):
        get_codec("int4")


# ----------------------------------------------------------------------- config
