"""One training step of the small-dimension sparse work (bench/sparse_bench.py), one thread.

The model of bench/sparse_bench.py's config (d=100, cos, 50 batch + 50 uniform negatives, batch
1000, one relation) over two 20,542-row partitions (82,168 / 4), random batches; prints ms/step
and edges/s per thread for the ranking and softmax losses, best of ``--rounds``, for the native
step kernel (bigembed.kernels.native.step; when it can be built) and the eager path, interleaved.
Run it with two source trees interleaved for a before/after (the hot path without the Hogwild
pool, the loop, the evaluation or the disk):

    for i in 1 2 3; do
      PYTHONPATH=/path/to/before/src python bench/sparse_step_bench.py
      PYTHONPATH=src python bench/sparse_step_bench.py
    done
    python bench/sparse_step_bench.py --profile ranking   # torch.profiler table of 50 steps
    python bench/sparse_step_bench.py --profile ranking --eager   # the same, eager path
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch
from sparse_bench import NODES, write_config

from bigembed.buckets import Batch, negative_settings
from bigembed.config import load_config, model_spec
from bigembed.kernels import BatchTrainer, Table, choose_kernel
from bigembed.model import ScoringModel
from bigembed.train import keep_freed_memory

ROWS = NODES // 4


def trainer(config: Path, loss: str, native: bool) -> BatchTrainer:
    cfg = load_config(config, overrides=[f"loss_fn={loss}"])
    model = ScoringModel(model_spec(cfg, 1))
    states = [torch.zeros_like(p) for p in model.parameters()]
    gen = torch.Generator().manual_seed(0)
    negs = negative_settings(cfg)
    kernel = choose_kernel("native" if native else "eager", model, negs)
    step = kernel.step_kernel(model, negs)
    return BatchTrainer(model, states, negs, cfg.lr, cfg.lr, gen, native=step)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--profile", choices=["ranking", "softmax"])
    parser.add_argument("--eager", action="store_true", help="profile the eager path")
    args = parser.parse_args()
    torch.set_num_threads(1)
    keep_freed_memory()
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "config.yaml"
        write_config(config, Path(tmp), 100)
        losses = [args.profile] if args.profile else ["ranking", "softmax"]
        trainers = {
            (loss, path): trainer(config, loss, path == "native")
            for loss in losses
            for path in ("native", "eager")
        }
    if any(tr.native is None for (_, path), tr in trainers.items() if path == "native"):
        print("native step kernel unavailable here: both rows run the eager path")
    lhs = Table(torch.randn(ROWS, 100) * 1e-3, torch.zeros(ROWS))
    rhs = Table(torch.randn(ROWS, 100) * 1e-3, torch.zeros(ROWS))
    zeros = torch.zeros(1000, dtype=torch.long)
    batches = [
        Batch(torch.randint(ROWS, (1000,)), torch.randint(ROWS, (1000,)), zeros, 0, None)
        for _ in range(args.steps)
    ]
    if args.profile:
        from torch.profiler import profile

        tr = trainers[args.profile, "eager" if args.eager else "native"]
        for b in batches[:5]:
            tr.step(b, lhs, rhs)
        with profile() as prof:
            for b in batches:
                tr.step(b, lhs, rhs)
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))
        return 0
    best = dict.fromkeys(trainers, float("inf"))
    for _ in range(args.rounds):
        for key, tr in trainers.items():
            for b in batches[:3]:
                tr.step(b, lhs, rhs)
            t0 = time.perf_counter()
            for b in batches:
                tr.step(b, lhs, rhs)
            best[key] = min(best[key], (time.perf_counter() - t0) / len(batches))
    print(f"\nBatchTrainer.step, sparse_bench model, batch 1000, 1 thread, best of {args.rounds}")
    print("| loss | path | ms/step | edges/s per thread | eager / native |")
    print("|---|---|---|---|---|")
    for (loss, path), s in best.items():
        ratio = best[loss, "eager"] / s
        print(f"| {loss} | {path} | {s * 1e3:.2f} | {1000 / s:,.0f} | {ratio:.2f}x |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
