"""Distributed training on one machine: 2 ranks x 1 worker against 1 rank x 2 workers.

Same planted graph (tests/support/graphs.py), same config and epochs for every row; only the way
the two cores are used differs. Each run is a subprocess exactly as a user would start it
(`bigembed train` or `bigembed launch`). Prints one table: wall time, training edges/s (from
training_stats.json, checkpoints included), bytes sent over the network (partition transfers
and shared-parameter rounds) and partition bytes loaded + saved (from/to disk or a partition
server) per epoch, and the last step's loss. Edges/s leaves out the first epoch, which pays for
starting the Hogwild worker processes and the first touch of every partition.

    python bench/dist_bench.py                       # 20k entities, 400k edges, 4 partitions
    python bench/dist_bench.py --edges 100000 --epochs 1
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import support_path  # noqa: F401  (tests/ on sys.path, for support)

from bigembed.checkpoints import CheckpointStore
from bigembed.config import config_to_dict
from bigembed.train import read_training_log
from support.graphs import graph_config, write_graph

ROOT = Path(__file__).resolve().parent.parent

RUNS = [
    # label, command, extra -p overrides
    ("1 rank x 1 worker (reference)", "train", ["workers=1"]),
    ("1 rank x 2 workers", "train", ["workers=2"]),
    (
        "2 ranks x 1 worker, partition servers on the trainers (-1)",
        "launch",
        ["workers=1", "num_partition_servers=-1"],
    ),
    (
        "2 ranks x 1 worker, swap through the checkpoint dir (0)",
        "launch",
        ["workers=1", "num_partition_servers=0"],
    ),
]


def run_one(
    cfg_path: Path, ckpt: Path, label: str, command: str, extra: list[str], epochs: int
) -> dict[str, float | str]:
    shutil.rmtree(ckpt, ignore_errors=True)
    params = [f"checkpoint_path={ckpt}", *extra]
    argv = [sys.executable, "-m", "bigembed.cli", command, str(cfg_path)]
    argv += ["-n", "2"] if command == "launch" else ["--no-progress"]
    for p in params:
        argv += ["-p", p]
    env = dict(os.environ)
    env.pop("OMP_NUM_THREADS", None)  # each command picks its own thread count
    started = time.perf_counter()
    subprocess.run(argv, check=True, cwd=ROOT, env=env, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - started
    steps = read_training_log(CheckpointStore(ckpt)).steps
    warm = [s for s in steps if s.at.epoch_idx > 0] or steps  # the first epoch starts workers
    edges = sum(s.stats.count for s in warm)
    seconds = sum(s.seconds for s in warm)
    return {
        "run": label,
        "wall_s": wall,
        "edges_per_s": edges / seconds,
        "net_mb_per_epoch": sum(s.net_bytes or 0 for s in steps) / epochs / 1e6,
        "part_mb_per_epoch": sum(s.io_bytes_read + s.io_bytes_written for s in steps)
        / epochs
        / 1e6,
        "loss": steps[-1].stats.loss,
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--entities", type=int, default=20_000)
    parser.add_argument("--edges", type=int, default=400_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--dimension", type=int, default=32)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--workdir", default="/tmp/bigembed_dist_bench")
    args = parser.parse_args()

    workdir = Path(args.workdir)
    graph = workdir / f"graph_{args.entities}_{args.edges}_{args.partitions}"
    if not (graph / "edges").exists():
        shutil.rmtree(graph, ignore_errors=True)
        write_graph(
            graph,
            num_entities=args.entities,
            num_edges=args.edges,
            num_partitions=args.partitions,
            num_relations=10,
            seed=1,
        )
    cfg = graph_config(
        graph,
        num_partitions=args.partitions,
        num_epochs=args.epochs,
        dimension=args.dimension,
        batch_size=1000,
        num_batch_negs=50,
        num_uniform_negs=50,
        lr=0.1,
    )
    cfg_path = workdir / "config.json"
    cfg_path.write_text(json.dumps(config_to_dict(cfg)))

    rows = [
        run_one(cfg_path, workdir / f"ckpt{k}", label, cmd, extra, args.epochs)
        for k, (label, cmd, extra) in enumerate(RUNS)
    ]
    print(
        f"\n{args.entities:,} entities, {args.edges:,} edges, {args.partitions} partitions, "
        f"dimension {args.dimension}, {args.epochs} epochs, {os.cpu_count()} CPUs\n"
    )
    head = (
        "run",
        "wall s",
        "edges/s (epochs 2+)",
        "net MB/epoch",
        "partition I/O MB/epoch",
        "last loss",
    )
    print("| " + " | ".join(head) + " |")
    print("|" + "|".join("---" for _ in head) + "|")
    for r in rows:
        print(
            f"| {r['run']} | {r['wall_s']:.1f} | {r['edges_per_s']:,.0f} | "
            f"{r['net_mb_per_epoch']:.1f} | {r['part_mb_per_epoch']:.1f} | {r['loss']:.4f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
