"""Small dimension, big sparse graph: a soc-Slashdot0902-like graph, bigembed and PBG side by side.

No network here, so the graph is generated (seeded): 82,168 nodes and 948,464 distinct directed
edges without self-loops, as soc-Slashdot0902, with power-law (Zipf-weighted, Chung-Lu) out-
and in-degrees. One relation, one entity type in 4 partitions (16 buckets), d=100, 2 workers,
PBG's defaults otherwise (cos comparator, 50 batch + 50 uniform negatives, batch 1000, lr 0.01,
margin 0.1); trained with PBG's ranking loss and with softmax. PBG 1.0 (``--pbg-venv``, default
``.peer/pbg-venv``) trains the same config on the same imported buckets in the same run (see
bench/pbg_peer.py). Prints one table: steady-state (epochs 2+) seconds per epoch and edges/s,
wall time, the FLOP rate against torch.mm's peak measured in the same run, and the ratio to PBG.

    python bench/sparse_bench.py                       # 4 epochs, ranking and softmax
    python bench/sparse_bench.py --epochs 3 --loss ranking --no-pbg
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pbg_peer
import torch
import yaml
from peaks import mm_peak, peaks_line
from side_by_side import (
    ROOT,
    Row,
    bigembed_epochs,
    epoch_breakdown,
    flop_per_edge,
    print_table,
    run_pbg,
    steady,
    train,
)

NODES, EDGES = 82_168, 948_464
# Zipf exponent of the degree weights: max out-degree a few thousand, mean 11.5, as Slashdot.
ZIPF = 0.6


def slashdot_edges(
    nodes: int = NODES, edges: int = EDGES, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """``edges`` distinct directed edges (src, dst) over ``nodes`` nodes without self-loops,
    power-law (Zipf-weighted, Chung-Lu) out- and in-degrees, in random order."""
    rng = np.random.default_rng(seed)
    w = np.arange(1, nodes + 1, dtype=np.float64) ** -ZIPF
    p = w / w.sum()
    out_rank, in_rank = rng.permutation(nodes), rng.permutation(nodes)
    keys = np.empty(0, dtype=np.int64)
    while keys.size < edges:
        n = int((edges - keys.size) * 1.3) + 1000
        src = out_rank[rng.choice(nodes, n, p=p)]
        dst = in_rank[rng.choice(nodes, n, p=p)]
        keep = src != dst
        keys = np.unique(np.concatenate([keys, src[keep] * nodes + dst[keep]]))
    keys = rng.permutation(keys)[:edges]
    src, dst = np.divmod(keys, nodes)
    return src, dst


def edge_lines(src: np.ndarray, dst: np.ndarray) -> str:
    """Edges as ``u<i>\\tu<j>`` lines (the TSV ``bigembed import --rel-col none`` reads)."""
    lines = np.char.add(np.char.add(np.char.add("u", src.astype(str)), "\tu"), dst.astype(str))
    return "\n".join(lines.tolist()) + "\n"


def write_graph(path: Path, seed: int = 0) -> None:
    """The soc-Slashdot0902-like graph: ``EDGES`` edges over ``NODES`` nodes, as a TSV."""
    path.write_text(edge_lines(*slashdot_edges(NODES, EDGES, seed)))


def write_config(path: Path, work: Path, dimension: int) -> None:
    config = {
        "entities": {"user": {"num_partitions": 4}},
        "relations": [{"name": "link", "lhs": "user", "rhs": "user"}],
        "dimension": dimension,
        "entity_path": str(work / "entities"),
        "edge_paths": [str(work / "edges")],
        "checkpoint_path": str(work / "model"),
        "workers": 2,
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False))


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--dimension", type=int, default=100)
    parser.add_argument("--loss", choices=["ranking", "softmax", "both"], default="both")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/bigembed_sparse"))
    pbg_peer.add_arguments(parser)
    args = parser.parse_args()

    from bigembed.config import load_config

    work: Path = args.workdir
    work.mkdir(parents=True, exist_ok=True)
    tsv, config = work / "edges.tsv", work / "config.yaml"
    if not tsv.exists():
        write_graph(tsv)
    write_config(config, work, args.dimension)
    if not (work / "entities" / "manifest.json").exists():
        cmd = [sys.executable, "-m", "bigembed.cli", "import", str(config), str(tsv)]
        cmd += ["--rel-col", "none", "-r", "1", "--no-progress", "--force"]
        subprocess.run(cmd, check=True, cwd=ROOT)

    peak32, peak16 = mm_peak(torch.float32), mm_peak(torch.bfloat16)
    rows: list[Row] = []
    ratios: dict[str, float] = {}
    breakdowns: list[str] = []
    for loss in ["ranking", "softmax"] if args.loss == "both" else [args.loss]:
        ckpt = work / f"model_{loss}"
        overrides = [f"num_epochs={args.epochs}", f"loss_fn={loss}", f"checkpoint_path={ckpt}"]
        cfg = load_config(config, overrides=overrides)
        wall = train(config, overrides, ckpt)
        s_epoch, eps = steady(*bigembed_epochs(ckpt))
        gflops = eps * flop_per_edge(cfg) / 1e9
        row = Row(f"bigembed {loss}", args.epochs, s_epoch, wall, eps, gflops, gflops / peak32[0])
        breakdowns.append(f"bigembed {loss}: {epoch_breakdown(ckpt)}")
        pbg_row = None
        if not args.no_pbg:
            done = run_pbg(args.pbg_venv, cfg, work / "entities", work / "edges", work / loss)
            if done is not None:
                pbg = done[0]
                s_epoch, pbg_eps = steady(pbg.epoch_seconds, pbg.epoch_edges)
                gflops = pbg_eps * flop_per_edge(cfg) / 1e9
                pbg_row = Row(
                    f"PBG 1.0 {loss}",
                    args.epochs,
                    s_epoch,
                    pbg.wall,
                    pbg_eps,
                    gflops,
                    gflops / peak32[0],
                )
                ratios[row.mode] = ratios[pbg_row.mode] = pbg_eps
        rows += [row] if pbg_row is None else [row, pbg_row]

    title = [
        f"soc-Slashdot0902-like graph ({NODES:,} nodes, {EDGES:,} edges, 4 partitions), "
        f"d={args.dimension}, {cfg.num_batch_negs} batch + {cfg.num_uniform_negs} uniform "
        f"negatives, {cfg.comparator}, workers={cfg.workers}, {os.cpu_count()} cores, fp32; "
        f"{flop_per_edge(cfg) / 1e6:.3f} MFLOP/edge",
        peaks_line(peak32, peak16),
    ]
    print_table(title, rows, ratios)
    print()
    print("Where a steady-state epoch goes (the training log's per-bucket timing):")
    for line in breakdowns:
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
