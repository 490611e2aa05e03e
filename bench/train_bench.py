"""Training speed on FB15k-237 with PBG's FB15k example config (examples/fb15k237.yaml).

Imports the bundled dataset (once), trains in a subprocess exactly as `bigembed train` does, and
prints one table: seconds per epoch, edges/s, peak RSS, the FLOP rate the training achieved and
torch.mm's fp32 / bf16 peaks measured in the same run, and the filtered test MRR.

    python bench/train_bench.py --epochs 1                 # fp32
    python bench/train_bench.py --epochs 5 --dtype both    # fp32 and bf16, with quality
    python bench/train_bench.py --config bench/fb15k237_pbg_defaults.yaml  # PBG defaults
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "examples" / "fb15k237.yaml"
DATA = ROOT / "src" / "bigembed" / "datasets" / "fb15k237"


def mm_peak(dtype: torch.dtype, n: int = 2048, reps: int = 5) -> float:
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    a @ b
    t = time.perf_counter()
    for _ in range(reps):
        a @ b
    return 2 * n**3 * reps / (time.perf_counter() - t) / 1e9


def flop_per_edge(cfg) -> float:
    """Matmul FLOPs of one edge: forward + 2 backward products, per corrupted side."""
    negs = cfg.num_batch_negs + cfg.num_uniform_negs
    sides = 2 - int(cfg.disable_lhs_negs) - int(cfg.disable_rhs_negs)
    return 6.0 * cfg.dimension * negs * sides


def run(cmd: list[str]) -> None:
    subprocess.run(cmd, check=True, cwd=ROOT)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--config",
        type=Path,
        default=CONFIG,
        help="config to train (default: examples/fb15k237.yaml); its paths are overridden",
    )
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--dtype", choices=["float32", "bfloat16", "both"], default="float32")
    parser.add_argument("--workdir", default="/tmp/bigembed_bench")
    parser.add_argument("--no-eval", action="store_true", help="skip the filtered test MRR")
    args = parser.parse_args()

    from bigembed.config import load_config

    work = Path(args.workdir)
    ents = work / "entities"
    paths = [work / s for s in ("train", "valid", "test")]
    common = ["-p", f"entity_path={ents}", "-p", f"workers={args.workers}"]
    if not (ents / "manifest.json").exists():
        run(
            [
                sys.executable,
                "-m",
                "bigembed.cli",
                "import",
                str(args.config),
                *common,
                "-p",
                "edge_paths=" + ",".join(map(str, paths)),
                *(str(DATA / f"{s}.txt.gz") for s in ("train", "valid", "test")),
                "--no-progress",
                "--force",
            ]
        )

    peak32, peak16 = mm_peak(torch.float32), mm_peak(torch.bfloat16)
    rows = []
    for dtype in ["float32", "bfloat16"] if args.dtype == "both" else [args.dtype]:
        ckpt = work / f"model_{dtype}_{args.epochs}ep"
        overrides = [
            *common,
            "-p",
            f"edge_paths={paths[0]}",
            "-p",
            f"checkpoint_path={ckpt}",
            "-p",
            f"num_epochs={args.epochs}",
            "-p",
            f"compute_dtype={dtype}",
        ]
        cfg = load_config(args.config, overrides=[o for o in overrides if o != "-p"])
        subprocess.run(["rm", "-rf", str(ckpt)], check=True)
        t0 = time.perf_counter()
        run(
            [
                sys.executable,
                "-m",
                "bigembed.cli",
                "train",
                str(args.config),
                *overrides,
                "--no-progress",
            ]
        )
        wall = time.perf_counter() - t0
        rss_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
        from bigembed.checkpoints.store import CheckpointStore
        from bigembed.train.records import read_training_log

        steps = read_training_log(CheckpointStore(ckpt)).steps
        edges = sum(s.stats.count for s in steps)
        train_s = sum(s.seconds for s in steps)
        eps = edges / train_s
        gflops = eps * flop_per_edge(cfg) / 1e9
        mrr = hits10 = float("nan")
        if not args.no_eval:
            mrr, hits10 = filtered_test(ckpt, paths)
        rows.append(
            (
                dtype,
                args.epochs,
                train_s / args.epochs,
                wall,
                eps,
                gflops,
                gflops / (peak16 if dtype == "bfloat16" else peak32),
                rss_mb,
                mrr,
                hits10,
            )
        )

    print()
    print(
        f"FB15k-237, {args.config.name}: d={cfg.dimension}, {cfg.num_uniform_negs} uniform + "
        f"{cfg.num_batch_negs} batch negatives, workers={args.workers}, {os.cpu_count()} cores; "
        f"{flop_per_edge(cfg) / 1e6:.2f} MFLOP/edge"
    )
    print(f"torch.mm peak in this run: fp32 {peak32:.0f} GFLOP/s, bf16 {peak16:.0f} GFLOP/s")
    head = (
        "mode",
        "epochs",
        "s/epoch",
        "wall s",
        "edges/s",
        "GFLOP/s",
        "of mm peak",
        "peak RSS MB",
        "filtered MRR",
        "Hits@10",
    )
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for r in rows:
        print(
            f"| {r[0]} | {r[1]} | {r[2]:.1f} | {r[3]:.1f} | {r[4]:,.0f} | {r[5]:.0f} | "
            f"{r[6]:.0%} | {r[7]:.0f} | {r[8]:.4f} | {r[9]:.4f} |"
        )
    return 0


def filtered_test(ckpt: Path, paths: list[Path]) -> tuple[float, float]:
    from bigembed.buckets.metrics import RankingSums
    from bigembed.checkpoints.reading import load_trained
    from bigembed.eval.filters import KnownEdges
    from bigembed.eval.ranking import EvalEdges, rank_edges
    from bigembed.storage.edges import EdgeStore

    tm = load_trained(ckpt)

    def edges(p: Path) -> EvalEdges:
        c = EdgeStore(p).load_bucket(0, 0)
        return EvalEdges(c.lhs.astype(np.int64), c.rel.astype(np.int64), c.rhs.astype(np.int64))

    sets = [edges(p) for p in paths]
    known = KnownEdges(
        *(np.concatenate([getattr(e, k) for e in sets]) for k in ("lhs", "rel", "rhs")),
        num_relations=len(tm.relation_names),
    )
    cache: dict = {}

    def source(t: str, p: int) -> torch.Tensor:
        return cache.setdefault((t, p), tm.embeddings(t, p).clone())

    res = rank_edges(tm.model, source, tm.partition_bases, sets[2], known)
    sums = RankingSums()
    sums.add_ranks(torch.from_numpy(np.concatenate([res.lhs.filtered, res.rhs.filtered])))
    s = sums.summary()
    return s["mrr"], s["hits@10"]


if __name__ == "__main__":
    sys.exit(main())
