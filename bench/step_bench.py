"""One training step, one thread: the hot path without the loop, the disk or Hogwild.

Builds the model of examples/fb15k237.yaml (ComplEx d=400, 237 dynamic relations, softmax, 1000
uniform + 50 batch negatives, batch 1000) over a 14,541-row table and times
``BatchTrainer.step`` on random batches: fp32 and bf16, each with the fused tiled softmax loss
(what training uses) and with the unfused score-block path (the previous implementation), in
the same run, interleaved, best of ``--rounds``. Prints ms/step, edges/s per thread, the
fused/unfused ratio and the products' FLOP rate against torch.mm's one-thread peak in the same
dtype, measured in the same run (bench/peaks.py). Where bf16 is emulated (no AVX512_BF16/AMX) a
bf16 step takes seconds: use ``--rounds 1 --steps 2`` there.

    python bench/step_bench.py
    python bench/step_bench.py --rounds 10 --steps 30
"""

from __future__ import annotations

import argparse
import contextlib
import time
from pathlib import Path
from unittest import mock

import torch
from peaks import mm_peak, peaks_line

from bigembed.buckets import Batch, negative_settings
from bigembed.config import load_config, model_spec
from bigembed.kernels import BatchTrainer, Table
from bigembed.model import ScoringModel
from bigembed.train import keep_freed_memory

CONFIG = Path(__file__).resolve().parent.parent / "examples" / "fb15k237.yaml"
ENTITIES, RELATIONS = 14_541, 237


def make_trainer(dtype: str) -> BatchTrainer:
    cfg = load_config(CONFIG, overrides=[f"compute_dtype={dtype}"])
    model = ScoringModel(model_spec(cfg, RELATIONS))
    states = [torch.zeros_like(p) for p in model.parameters()]
    negs = negative_settings(cfg)
    return BatchTrainer(model, states, negs, cfg.lr, cfg.lr, torch.Generator().manual_seed(0))


def random_batch(size: int = 1000) -> Batch:
    return Batch(
        torch.randint(ENTITIES, (size,)),
        torch.randint(ENTITIES, (size,)),
        torch.randint(RELATIONS, (size,)),
        0,
        None,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    torch.set_num_threads(1)
    keep_freed_memory()
    table = Table(torch.randn(ENTITIES, 400) * 1e-3, torch.zeros(ENTITIES))
    variants = [(d, f) for d in ("float32", "bfloat16") for f in (False, True)]
    trainers = {d: make_trainer(d) for d in ("float32", "bfloat16")}
    peak = {"float32": mm_peak(torch.float32), "bfloat16": mm_peak(torch.bfloat16)}
    best = dict.fromkeys(variants, float("inf"))
    for _ in range(args.rounds):
        for dtype, fused in variants:
            trainer = trainers[dtype]
            unfused = mock.patch.object(ScoringModel, "_fusable", return_value=False)
            with contextlib.nullcontext() if fused else unfused:
                for _ in range(2):
                    trainer.step(random_batch(), table, table)
                t0 = time.perf_counter()
                for _ in range(args.steps):
                    trainer.step(random_batch(), table, table)
                seconds = (time.perf_counter() - t0) / args.steps
            best[(dtype, fused)] = min(best[(dtype, fused)], seconds)
    print(
        f"\nBatchTrainer.step, FB15k-237 example model, batch 1000, 1 thread, best of "
        f"{args.rounds} x {args.steps} steps"
    )
    print(peaks_line(peak["float32"], peak["bfloat16"]))
    # 6 products of 1000 x 1050 x 400 per side pair: 2 sides x 3 (forward + 2 backward).
    flop = 6.0 * 400 * 1050 * 2 * 1000
    print("| dtype | loss path | ms/step | edges/s per thread | fused / unfused | of mm peak |")
    print("|---|---|---|---|---|---|")
    for dtype, fused in variants:
        s = best[(dtype, fused)]
        ratio = f"{best[(dtype, False)] / s:.2f}x" if fused else ""
        name = "fused tiles" if fused else "unfused blocks"
        of_peak = flop / s / 1e9 / peak[dtype][0]
        print(
            f"| {dtype} | {name} | {s * 1e3:.1f} | {1 / s * 1000:,.0f} | {ratio} | {of_peak:.0%} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
