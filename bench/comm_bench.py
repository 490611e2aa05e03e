"""Communication strategies and precisions compared on the same work (issue 10).

Two graphs, each trained by every configuration for the same epochs from the same seed:

* ``shared``: users in 4 partitions -> 100,000 items, one unpartitioned type (the item table,
  51 MB at d = 128, and its Adagrad state are shared parameters every bucket touches);
* ``parts``: one type in 8 partitions of 25,000 (12.8 MB each at d = 128), dynamic relations:
  partition transfers dominate, the shared parameters are only the relation operators.

Each distributed run starts one ``bigembed train --rank K`` per machine. As root with
iproute2, every machine is a network namespace on a bridge whose link is shaped by ``tc``
(:mod:`netns`; ``--link 100mbit`` or ``1gbit``, ``--delay``), and the bytes on the wire are
the interfaces' counters (everything: TCP/IP headers, the rendezvous store, heartbeats);
otherwise ranks talk over loopback (``bigembed launch``) and the bytes are bigembed's own
count (partition transfers and shared-parameter rounds). The single-machine row is
``bigembed train`` with as many Hogwild workers as the machines have ranks (up to the cores).

Columns: wire MB per epoch and its ratio to fp32 of the same strategy; mean epoch time (the
steps' seconds from training_stats.json, checkpoints included); end-to-end wall time of the
slowest rank and the speed-up over fp32 ``async_ps`` on the same graph and link; the withheld
MRR (``eval_fraction`` edges, ranked after each bucket of the last epoch, averaged over the
epoch) and its difference from fp32 of the same strategy.

    sudo python bench/comm_bench.py                     # both graphs, 2 ranks, 100 Mbit/s
    sudo python bench/comm_bench.py --ranks 4 --graphs shared --strategies async_ps,allreduce
    sudo python bench/comm_bench.py --link 1gbit
    python bench/comm_bench.py --quick                  # a smoke run of a couple of minutes
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import support_path  # noqa: F401  (tests/ on sys.path, for support)
from rank_runs import bench_env, machine_name, run_ranks

from bigembed.checkpoints import CheckpointStore
from bigembed.config import STRATEGY_NAMES, config_to_dict
from bigembed.train import read_training_log
from support import netns
from support.graphs import graph_config, planted, write_buckets

ROOT = Path(__file__).resolve().parent.parent

PORT = 29650
_SHARED = re.compile(
    r"shared parameters \((\w+), \w+\): (\d+) rounds, (\d+) bytes sent, (\d+) bytes received"
)


def shared_bytes(output: str) -> tuple[int, int]:
    """(the strategy's bytes, each counted once; its rounds, summed over the trainers).

    async_ps's sharers count their pushes and the servers' replies; the collective strategies
    count what every trainer sends. An asynchronous strategy runs as many rounds as the link
    and the pacer allow, so its bytes per epoch follow the link's speed, not the codec: the
    bytes per round say what the codec saves."""
    total = rounds = 0
    for strategy, n, sent, received in _SHARED.findall(output):
        total += int(sent) + (int(received) if strategy == "async_ps" else 0)
        rounds += int(n)
    return total, rounds


@dataclass
class Graph:
    name: str
    root: Path
    settings: dict[str, Any]


def make_shared_graph(root: Path, users: int, items: int, edges: int) -> Graph:
    if not (root / "edges").exists():
        shutil.rmtree(root, ignore_errors=True)
        rng = np.random.default_rng(7)
        write_buckets(
            root,
            {"user": [users] * 4, "item": [items]},
            ["buys"],
            False,
            {(p, 0): planted(rng, users, items, edges // 4, 0) for p in range(4)},
            (4, 1),
        )
    return Graph(
        "shared",
        root,
        {
            "entities": {"user": {"num_partitions": 4}, "item": {"num_partitions": 1}},
            "relations": [{"name": "buys", "lhs": "user", "rhs": "item", "operator": "diagonal"}],
            "dynamic_relations": False,
        },
    )


def make_parts_graph(root: Path, nodes: int, edges: int, parts: int = 8) -> Graph:
    if not (root / "edges").exists():
        shutil.rmtree(root, ignore_errors=True)
        rng = np.random.default_rng(8)
        per = edges // (parts * parts)
        write_buckets(
            root,
            {"node": [nodes] * parts},
            ["r0", "r1"],
            True,
            {
                (i, j): planted(rng, nodes, nodes, per, (i + j) % 2)
                for i in range(parts)
                for j in range(parts)
            },
            (parts, parts),
        )
    return Graph("parts", root, {"num_partitions": parts})


def write_config(graph: Graph, workdir: Path, dimension: int, epochs: int) -> Path:
    cfg = graph_config(
        graph.root,
        **graph.settings,
        dimension=dimension,
        num_epochs=epochs,
        eval_fraction=0.05,
        batch_size=1000,
        num_batch_negs=50,
        num_uniform_negs=50,
        lr=0.1,
        workers=1,
        hogwild_delay=0,  # no head start for the first worker: epoch times compare like for like
        distributed_timeout=120,
    )
    path = workdir / f"{graph.name}.json"
    path.write_text(json.dumps(config_to_dict(cfg)))
    return path


@dataclass
class Row:
    graph: str
    ranks: int
    link: str
    strategy: str
    precision: str
    partition_precision: str
    wire_mb_per_epoch: float
    shared_mb_per_epoch: float  # the strategy's own messages (from each rank's log line)
    shared_kb_per_round: float  # the same bytes over the trainers' rounds
    epoch_s: float
    wall_s: float
    mrr: float
    bytes_source: str


def _stats(ckpt: Path, epochs: int) -> tuple[float, float, float]:
    """(net MB per epoch by bigembed's count, mean step seconds, last epoch's withheld MRR)."""
    store = CheckpointStore(ckpt)
    steps = read_training_log(store).steps
    net = sum(s.net_bytes or 0 for s in steps) / epochs / 1e6
    seconds = sum(s.seconds for s in steps) / len(steps)
    rows = [r for r in store.read_stats() if r["type"] == "bucket" and r["epoch_idx"] == epochs - 1]
    count = sum(r["eval_stats_after"]["count"] for r in rows)
    mrr = sum(r["eval_stats_after"]["mrr"] * r["eval_stats_after"]["count"] for r in rows) / count
    return net, seconds, mrr


def run_one(
    cfg_path: Path,
    ckpt: Path,
    graph: str,
    ranks: int,
    link: str,
    delay: str | None,
    strategy: str,
    precision: str,
    partition_precision: str,
    epochs: int,
    use_netns: bool,
    sparse_rows: str = "false",
) -> Row:
    shutil.rmtree(ckpt, ignore_errors=True)
    params = [
        f"checkpoint_path={ckpt}",
        f"communication.strategy={strategy}",
        f"communication.precision={precision}",
        f"communication.partition_precision={partition_precision}",
        f"communication.sparse_rows={sparse_rows}",
    ]
    cli = [sys.executable, "-m", "bigembed.cli"]
    env = bench_env()
    source = "bigembed's count"
    started = time.perf_counter()
    if ranks == 1:
        workers = min(2, os.cpu_count() or 1)
        argv = [*cli, "train", str(cfg_path), "--no-progress", "-p", f"workers={workers}"]
        for p in params:
            argv += ["-p", p]
        subprocess.run(argv, check=True, cwd=ROOT, env=env, stdout=subprocess.DEVNULL)
        wire = 0.0
        output = ""
    elif use_netns:
        run = run_ranks(
            cfg_path,
            ranks,
            params,
            ckpt.parent,
            use_netns=True,
            link=None if link == "unshaped" else link,
            delay=delay,
            port=PORT,
        )
        output = "\n".join(run.outputs)
        wire = (run.wire_bytes or 0) / 1e6
        source = "interface counters"
    else:
        argv = [*cli, "launch", str(cfg_path), "-n", str(ranks)]
        for p in params:
            argv += ["-p", p]
        res = subprocess.run(argv, check=True, cwd=ROOT, env=env, capture_output=True, text=True)
        output = res.stdout + res.stderr
        wire = -1.0
    wall = time.perf_counter() - started
    net, seconds, mrr = _stats(ckpt, epochs)
    shared, rounds = shared_bytes(output)
    return Row(
        graph,
        ranks,
        link if ranks > 1 else "-",
        strategy if ranks > 1 else "one machine",
        precision if ranks > 1 else "-",
        partition_precision if ranks > 1 else "-",
        wire / epochs if wire >= 0 else net,
        shared / epochs / 1e6,
        shared / rounds / 1e3 if rounds else 0.0,
        seconds,
        wall,
        mrr,
        source if ranks > 1 else "-",
    )


def print_table(rows: list[Row], header: str) -> None:
    print("\n" + header + "\n")
    cols = (
        "graph",
        "ranks",
        "link",
        "strategy",
        "precision",
        "partitions",
        "wire MB/epoch",
        "fp32 bytes / these",
        "shared-param MB/epoch",
        "fp32 / these",
        "shared-param kB/round",
        "fp32 / these (per round)",
        "epoch s",
        "wall s",
        "speed-up vs fp32 async_ps",
        "MRR",
        "MRR - fp32 same strategy",
        "one-machine MRR",
    )
    print("| " + " | ".join(cols) + " |")
    print("|" + "|".join("---" for _ in cols) + "|")

    def find(r: Row, **kw: Any) -> Row | None:
        for o in rows:
            if (
                o.graph == r.graph
                and o.ranks == r.ranks
                and o.link == r.link
                and all(getattr(o, k) == v for k, v in kw.items())
            ):
                return o
        return None

    for r in rows:
        base = find(r, strategy=r.strategy, precision="fp32", partition_precision="fp32")
        ps = find(r, strategy="async_ps", precision="fp32", partition_precision="fp32")
        single = next((o for o in rows if o.graph == r.graph and o.ranks == 1), None)
        ratio = (
            f"{base.wire_mb_per_epoch / r.wire_mb_per_epoch:.2f}" if base and r.ranks > 1 else ""
        )
        shared = (
            f"{base.shared_mb_per_epoch / r.shared_mb_per_epoch:.2f}"
            if base and r.ranks > 1 and r.shared_mb_per_epoch > 0
            else ""
        )
        per_round = (
            f"{base.shared_kb_per_round / r.shared_kb_per_round:.2f}"
            if base and r.ranks > 1 and r.shared_kb_per_round > 0
            else ""
        )
        speed = f"{ps.wall_s / r.wall_s:.2f}" if ps and r.ranks > 1 else ""
        dmrr = f"{r.mrr - base.mrr:+.4f}" if base and r.ranks > 1 else ""
        one = f"{single.mrr:.4f}" if single else ""
        print(
            f"| {r.graph} | {r.ranks} | {r.link} | {r.strategy} | {r.precision} | "
            f"{r.partition_precision} | {r.wire_mb_per_epoch:.1f} | {ratio} | "
            f"{r.shared_mb_per_epoch:.1f} | {shared} | {r.shared_kb_per_round:.1f} | "
            f"{per_round} | {r.epoch_s:.1f} | "
            f"{r.wall_s:.1f} | {speed} | {r.mrr:.4f} | {dmrr} | {one} |"
        )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--graphs", default="shared,parts")
    parser.add_argument("--ranks", default="2", help="comma-separated, e.g. 2,4")
    parser.add_argument("--link", default="100mbit", help="tc rate of every link, or unshaped")
    parser.add_argument("--delay", default="2ms", help="netem delay each way (if netem exists)")
    parser.add_argument("--strategies", default=",".join(STRATEGY_NAMES))
    parser.add_argument("--precisions", default="fp32,int8")
    parser.add_argument("--partition-precisions", default="fp32")
    parser.add_argument(
        "--sparse-rows",
        default="false",
        help="communication.sparse_rows (false: whole tables, as issue 10 measured the codecs)",
    )
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--dimension", type=int, default=128)
    parser.add_argument("--quick", action="store_true", help="small graphs, 1 epoch, loopback")
    parser.add_argument("--loopback", action="store_true", help="no namespaces even as root")
    parser.add_argument("--workdir", default="/tmp/bigembed_comm_bench")
    parser.add_argument("--json", help="also write the rows here")
    parser.add_argument(
        "--table-from",
        nargs="+",
        metavar="JSON",
        help="print one table of the rows saved by earlier runs' --json (no training)",
    )
    args = parser.parse_args()
    if args.table_from:
        saved = [Row(**r) for f in args.table_from for r in json.loads(Path(f).read_text())]
        print_table(saved, f"comm_bench: rows of {', '.join(args.table_from)}")
        return 0

    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    if args.quick:
        args.epochs, args.dimension, args.loopback = 1, 32, True
        sizes = {"users": 2000, "items": 5000, "shared_edges": 40_000}
        sizes |= {"nodes": 2000, "parts_edges": 64_000}
    else:
        sizes = {"users": 25_000, "items": 100_000, "shared_edges": 400_000}
        sizes |= {"nodes": 25_000, "parts_edges": 320_000}
    use_netns = not args.loopback and netns.available()
    graphs = {
        "shared": lambda: make_shared_graph(
            workdir / f"shared_{sizes['users']}_{sizes['items']}_{sizes['shared_edges']}",
            sizes["users"],
            sizes["items"],
            sizes["shared_edges"],
        ),
        "parts": lambda: make_parts_graph(
            workdir / f"parts_{sizes['nodes']}_{sizes['parts_edges']}",
            sizes["nodes"],
            sizes["parts_edges"],
        ),
    }
    link = args.link if use_netns else "loopback"
    rows: list[Row] = []
    for name in args.graphs.split(","):
        graph = graphs[name]()
        cfg_path = write_config(graph, workdir, args.dimension, args.epochs)
        plan = [(1, "async_ps", "fp32", "fp32")]
        for ranks in (int(r) for r in args.ranks.split(",")):
            plan += [
                (ranks, s, p, pp)
                for s in args.strategies.split(",")
                for p in args.precisions.split(",")
                for pp in args.partition_precisions.split(",")
            ]
        for ranks, strategy, precision, pp in plan:
            row = run_one(
                cfg_path,
                workdir / "ckpt",
                name,
                ranks,
                link,
                args.delay,
                strategy,
                precision,
                pp,
                args.epochs,
                use_netns,
                args.sparse_rows,
            )
            rows.append(row)
            print(json.dumps(asdict(row)), flush=True)
    shaping = "loopback (bytes: bigembed's count)"
    if use_netns:
        with netns.machines(1, None if args.link == "unshaped" else args.link, args.delay) as m:
            shaping = f"network namespaces on a bridge, each link: {m[0].shaping}"
    header = (
        f"comm_bench: {machine_name()}; {shaping}; {args.epochs} epochs, d={args.dimension}, "
        f"sparse_rows {args.sparse_rows}; "
        f"graphs: shared = {sizes['users'] * 4:,} users (4 partitions) x {sizes['items']:,} "
        f"items (unpartitioned), {sizes['shared_edges']:,} edges; parts = 8 x "
        f"{sizes['nodes']:,} nodes, {sizes['parts_edges']:,} edges; MRR: withheld edges "
        "(eval_fraction 0.05) of the last epoch"
    )
    print_table(rows, header)
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(r) for r in rows], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
