"""Run a bigembed command with bf16 matrix products simulated in fp32, for quality checks on
CPUs without bf16 units (where torch emulates bf16 products tens of times slower).

A bf16 product with fp32 accumulation (what oneDNN runs on AVX-512 BF16 / AMX) is, up to the
order of the additions, the fp32 product of the bf16 inputs (a product of two bf16 values is
exact in fp32) rounded to bf16 at the end. This script replaces torch's matrix products
(``mm``, ``matmul``, ``bmm``, ``@``) so that those whose inputs are bf16 are computed that way:
a ``compute_dtype: bfloat16`` run here gives the scores, losses and MRR a bf16 machine would
(at fp32's speed). It runs the command in this process: use ``workers: 1`` (Hogwild worker
processes would not be patched). ``--check`` compares simulated and real bf16 products.

    python bench/bf16_sim.py --check        # simulated against real bf16 products
    python bench/bf16_sim.py train examples/fb15k237_kvsall.yaml -p compute_dtype=bfloat16 \
        -p workers=1
"""

from __future__ import annotations

import runpy
import sys

import torch

_NAMES = ("mm", "matmul", "bmm")
_TENSOR_NAMES = ("mm", "matmul", "bmm", "__matmul__")


class SimulatedBf16:
    """While active: bf16 x bf16 products computed as fp32 products of the same values,
    rounded to bf16. Patches the torch functions themselves (a TorchFunctionMode does not
    reach the products of custom autograd backwards), in this process only."""

    products = 0

    def __enter__(self) -> SimulatedBf16:
        owners: list[tuple[object, tuple[str, ...]]] = [(torch, _NAMES)]
        owners.append((torch.Tensor, _TENSOR_NAMES))
        self.saved = [(owner, n, getattr(owner, n)) for owner, names in owners for n in names]
        for owner, name, func in self.saved:
            setattr(owner, name, self._wrap(func))
        return self

    def __exit__(self, *exc: object) -> None:
        for owner, name, func in self.saved:
            setattr(owner, name, func)

    @staticmethod
    def _wrap(func):
        def product(*args, **kwargs):
            tensors = [a for a in args if isinstance(a, torch.Tensor)]
            if not tensors or any(t.dtype != torch.bfloat16 for t in tensors):
                return func(*args, **kwargs)
            SimulatedBf16.products += 1
            out = kwargs.pop("out", None)
            res = func(*[a.float() for a in tensors], **kwargs).to(torch.bfloat16)
            return res if out is None else out.copy_(res)

        return product


def check() -> None:
    """Simulated against real bf16 products on random data: the share of differing results."""
    torch.manual_seed(0)
    a = torch.randn(256, 512).bfloat16()
    c = torch.randn(512, 2000).bfloat16()
    real = torch.mm(a, c)
    with SimulatedBf16():
        sim = torch.mm(a, c)
    diff = (real != sim).float().mean().item()
    ulp = ((real.float() - sim.float()).abs() / real.float().abs().clamp_min(1e-30)).max().item()
    print(f"simulated vs real bf16 mm: {diff:.4%} of results differ, max relative gap {ulp:.2e}")


if __name__ == "__main__":
    if sys.argv[1:] == ["--check"]:
        check()
    else:
        sys.argv = ["bigembed", *sys.argv[1:]]
        try:
            with SimulatedBf16():
                runpy.run_module("bigembed", run_name="__main__", alter_sys=True)
        finally:
            print(f"bf16 products simulated: {SimulatedBf16.products}", file=sys.stderr)
