"""Training speed on FB15k-237 with PBG's FB15k example config (examples/fb15k237.yaml).

Imports the bundled dataset (once), trains in a subprocess exactly as `bigembed train` does, and
prints one table: seconds per epoch and edges/s in steady state (epochs 2+; epoch 1 when it is
the only one), wall time, peak RSS, the FLOP rate the training achieved and torch.mm's fp32 /
bf16 peaks measured in the same run (bounded in time, see bench/peaks.py), and the filtered
test MRR. When PBG 1.0's venv exists (``--pbg-venv``, default ``.peer/pbg-venv``, made by
``/work/shared/tools/setup_pbg.sh .peer/pbg-venv``), PBG trains the same config on the same
imported edges in the same run (bench/pbg_peer.py) and the table gets its row and the ratio;
its checkpoint is converted with ``bigembed`` and ranked by the same filtered evaluation.

    python bench/train_bench.py --epochs 1                 # fp32
    python bench/train_bench.py --epochs 5 --dtype both    # fp32 and bf16, with quality
    python bench/train_bench.py --config bench/fb15k237_pbg_defaults.yaml  # PBG defaults
    python bench/train_bench.py --epochs 3 --no-pbg        # bigembed only
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
from pathlib import Path

import numpy as np
import pbg_peer
import torch
from peaks import mm_peak, peaks_line
from side_by_side import (
    Row,
    bigembed_epochs,
    flop_per_edge,
    pbg_to_bigembed,
    print_table,
    run_pbg,
    steady,
)
from side_by_side import train as train_bigembed

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "examples" / "fb15k237.yaml"
DATA = ROOT / "src" / "bigembed" / "datasets" / "fb15k237"


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
    pbg_peer.add_arguments(parser)
    args = parser.parse_args()

    from bigembed.config import load_config

    work = Path(args.workdir)
    ents = work / "entities"
    paths = [work / s for s in ("train", "valid", "test")]
    common = [f"entity_path={ents}", f"workers={args.workers}"]
    if not (ents / "manifest.json").exists():
        run(
            [
                sys.executable,
                "-m",
                "bigembed.cli",
                "import",
                str(args.config),
                *(x for o in common for x in ("-p", o)),
                "-p",
                "edge_paths=" + ",".join(map(str, paths)),
                *(str(DATA / f"{s}.txt.gz") for s in ("train", "valid", "test")),
                "--no-progress",
                "--force",
            ]
        )

    peak32, peak16 = mm_peak(torch.float32), mm_peak(torch.bfloat16)
    peak = {"float32": peak32, "bfloat16": peak16}
    rss_mb = 0.0
    rows: list[Row] = []
    for dtype in ["float32", "bfloat16"] if args.dtype == "both" else [args.dtype]:
        ckpt = work / f"model_{dtype}_{args.epochs}ep"
        overrides = [
            *common,
            f"edge_paths={paths[0]}",
            f"checkpoint_path={ckpt}",
            f"num_epochs={args.epochs}",
            f"compute_dtype={dtype}",
        ]
        cfg = load_config(args.config, overrides=overrides)
        wall = train_bigembed(args.config, overrides, ckpt)
        rss_mb = max(rss_mb, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024)
        s_epoch, eps = steady(*bigembed_epochs(ckpt))
        gflops = eps * flop_per_edge(cfg) / 1e9
        row = Row(dtype, args.epochs, s_epoch, wall, eps, gflops, gflops / peak[dtype][0])
        if not args.no_eval:
            row.mrr, row.hits10 = filtered_test(ckpt, paths)
        rows.append(row)

    pbg_eps: dict[str, float] = {}
    if not args.no_pbg:
        cfg = load_config(args.config, overrides=[*common, f"num_epochs={args.epochs}"])
        done = run_pbg(args.pbg_venv, cfg, ents, paths[0], work / "pbg")
        if done is not None:
            pbg, pbg_ckpt, pbg_ents = done
            s_epoch, eps = steady(pbg.epoch_seconds, pbg.epoch_edges)
            pbg_eps = {r.mode: eps for r in rows} | {"PBG 1.0 fp32": eps}
            gflops = eps * flop_per_edge(cfg) / 1e9
            of_peak = gflops / peak32[0]
            row = Row("PBG 1.0 fp32", args.epochs, s_epoch, pbg.wall, eps, gflops, of_peak)
            if not args.no_eval:
                converted = pbg_to_bigembed(pbg_ckpt, pbg_ents, work / "pbg")
                row.mrr, row.hits10 = filtered_test(converted, paths)
            rows.append(row)

    title = [
        f"FB15k-237, {args.config.name}: d={cfg.dimension}, {cfg.num_uniform_negs} uniform + "
        f"{cfg.num_batch_negs} batch negatives, workers={args.workers}, {os.cpu_count()} cores; "
        f"{flop_per_edge(cfg) / 1e6:.2f} MFLOP/edge; bigembed peak RSS {rss_mb:.0f} MB",
        peaks_line(peak32, peak16),
    ]
    print_table(title, rows, pbg_eps)
    return 0


def filtered_test(ckpt: Path, paths: list[Path]) -> tuple[float, float]:
    from bigembed.checkpoints import load_trained
    from bigembed.ranking import EvalEdges, KnownEdges, RankingSums, rank_edges
    from bigembed.storage import EdgeStore

    tm = load_trained(ckpt)

    def edges(p: Path) -> EvalEdges:
        c = EdgeStore(p).load_bucket(0, 0)
        return EvalEdges(c.lhs.astype(np.int64), c.rel.astype(np.int64), c.rhs.astype(np.int64))

    sets = [edges(p) for p in paths]
    lhs, rel, rhs = (np.concatenate([getattr(e, k) for e in sets]) for k in ("lhs", "rel", "rhs"))
    known = KnownEdges(lhs, rel, rhs, num_relations=len(tm.relation_names))
    cache: dict = {}

    def source(t: str, p: int) -> torch.Tensor:
        return cache.setdefault((t, p), tm.embeddings(t, p).clone())

    res = rank_edges(tm.model, source, tm.partition_bases, sets[2], known)
    assert res.lhs is not None and res.rhs is not None  # both sides ranked
    sums = RankingSums()
    sums.add_ranks(torch.from_numpy(np.concatenate([res.lhs.filtered, res.rhs.filtered])))
    s = sums.summary()
    return s["mrr"], s["hits@10"]


if __name__ == "__main__":
    sys.exit(main())
