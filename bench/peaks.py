"""torch.mm's peak FLOP rate on this machine, measured in bounded time.

A fixed 2048^3 product takes minutes where bf16 is emulated (CPUs without AVX512_BF16/AMX: about
1 GFLOP/s on an AVX2-only EPYC), so the size grows from 256 until one product takes
``min_seconds`` (or reaches ``max_n``), then the product is repeated for ``budget`` seconds. The
largest size's rate is the peak. Worst case: a few products of the last size, about
``8 * min_seconds + budget``.
"""

from __future__ import annotations

import time

import torch


def mm_peak(
    dtype: torch.dtype, budget: float = 0.5, min_seconds: float = 0.05, max_n: int = 2048
) -> tuple[float, int]:
    """(GFLOP/s, n) of square ``n x n`` products in ``dtype`` with torch's current threads."""
    n = 256
    while True:
        a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
        t = time.perf_counter()
        a @ b  # also the warm-up of this size
        once = time.perf_counter() - t
        if once >= min_seconds or n >= max_n:
            break
        n *= 2
    reps = 0
    t = time.perf_counter()
    while True:
        a @ b
        reps += 1
        elapsed = time.perf_counter() - t
        if elapsed >= budget:
            break
    return 2 * n**3 * reps / elapsed / 1e9, n


def peaks_line(peak32: tuple[float, int], peak16: tuple[float, int]) -> str:
    """The one line a bench prints about the peaks it measured."""
    return (
        f"torch.mm peak in this run ({torch.get_num_threads()} threads): fp32 {peak32[0]:.0f} "
        f"GFLOP/s (n={peak32[1]}), bf16 {peak16[0]:.1f} GFLOP/s (n={peak16[1]})"
    )
