"""Partitioned against data-parallel training, per strategy x precision (issue 25).

Every row trains one graph (bench/dp_graphs.py) from the same seed for the same epochs and
ranks its test edges with ``bigembed eval`` (filtered MRR, against every entity):

* ``one machine``: ``bigembed train``, 1 worker, pinned to one core (the reference);
* ``independent``: N one-machine trainings at once, each pinned to its own core and training
  the whole graph: the ceiling of N cores on this machine (shared caches, memory bandwidth,
  a virtual machine's cores); its speed-up counts all N trainings' epochs;
* ``partitioned``: N ranks x 1 worker, PBG's mode (buckets under partition locks; on a
  1-partition graph one rank trains while the others wait);
* ``data_parallel``: N ranks x 1 worker, every rank trains its share of the same bucket's
  batches (``communication.edge_split``) and ``communication.strategy`` keeps every parameter
  in step (``precision``; ``sparse_rows``: row-sparse deltas or whole tables).

Ranks are started by hand, each pinned to its own core (bench/rank_runs.py); as root each is a
network namespace whose link is shaped by ``tc`` (``--link``, default 1gbit) and the bytes per
epoch are the interfaces' counters (everything on the wire); otherwise ranks meet on loopback
and the bytes are bigembed's own count. Columns: epoch time (the steps' seconds in
training_stats.json, epochs 2+ when there are several), its speed-up over the one-machine
row of the same graph, filtered test MRR, MB per epoch, and the seconds per epoch the
trainers' workers waited at the synchronous strategies' gate (``gate_wait_seconds``, summed
over trainers) and, of it, the seconds the gate stayed closed because the other trainer had not
reached the round yet (``peer_wait_seconds``: what the split of the edges decides; the rest is
the round itself). On the ``skewed`` graph (one relation per batch, a ``linear`` one costing
many times a ``diagonal`` one) the data-parallel rows compare the load-balancing sampler with
an even split of the bucket's batches. A few target lines follow the table.

    sudo python bench/dp_bench.py --quick          # the reduced matrix (~20 min on 2 cores)
    sudo python bench/dp_bench.py                  # every strategy x precision x sparse
    sudo python bench/dp_bench.py --graphs skewed --skew-strategies allreduce,decentralized
    python bench/dp_bench.py --smoke               # tiny graphs, 1 epoch: does it all run
    python bench/dp_bench.py --quick --list        # the rows a choice of flags runs
    python bench/dp_bench.py --table-from a.json b.json   # one table of saved rows
    sudo python bench/dp_bench.py --graphs fb15k237 --repeats 3   # medians of 3 runs per row

A virtual machine's speed drifts by tens of percent over minutes (the one-machine row of
FB15k-237 measured 4.36 s and 3.10 s per epoch a few minutes apart on an idle machine), which
moves every speed-up: ``--repeats N`` runs the whole list of rows N times, interleaved, and
reports each row's medians with its epoch times' range.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import dp_graphs
import torch
from dp_table import INDEPENDENT, Row, combine, markdown, target_lines
from peaks import mm_peak, peaks_line
from rank_runs import CLI, ROOT, bench_env, machine_name, pinned, run_ranks

from bigembed.checkpoints import CheckpointStore
from bigembed.config import STRATEGY_NAMES
from support import netns

PORT = 29670
SYNCHRONOUS = ("allreduce", "decentralized")
STEAL = "steal"  # the edge split column's mark of communication.replica_stealing
#: What the skewed graph's rows compare (the table's caption says it).
EDGE_SPLITS = (
    "even = equal contiguous slices of the bucket's batch plan (the batches in the plan's random "
    "order, one relation per batch on the skewed graph), load_balancing = Bagua's sampler over "
    "the batches' costs (the cost model's); +steal: communication.replica_stealing, a "
    "replica that is done takes the others' unstarted batches"
)


@dataclass
class Plan:
    """One row to run (a ``Row`` before it is measured)."""

    graph: dp_graphs.Graph
    mode: str
    ranks: int
    strategy: str = "-"
    precision: str = "-"
    sparse: str = "-"
    edge_split: str = "-"

    def params(self) -> list[str]:
        if self.mode in ("one machine", INDEPENDENT):
            return []
        out = [f"distributed_mode={self.mode}", f"communication.strategy={self.strategy}"]
        out.append(f"communication.precision={self.precision}")
        if self.mode == "data_parallel":
            out.append(f"communication.sparse_rows={str(self.sparse == 'rows').lower()}")
            split, _, steal = self.edge_split.partition("+")
            out.append(f"communication.edge_split={split}")
            out.append(f"communication.replica_stealing={str(steal == STEAL).lower()}")
        return out


def step_stats(ckpt: Path) -> tuple[float, float | None, float | None, float]:
    """(mean epoch seconds, epochs 2+ when there are several; gate wait and, of it, peer wait
    seconds per epoch, each None when the records have none; bigembed's own network bytes per
    epoch)."""
    steps = [r for r in CheckpointStore(ckpt).read_stats() if r["type"] == "step"]
    epochs = sorted({int(r["epoch_idx"]) for r in steps})
    steady = [r for r in steps if r["epoch_idx"] != epochs[0]] if len(epochs) > 1 else steps
    n = max(len(epochs) - 1, 1) if len(epochs) > 1 else 1
    seconds = sum(float(r["seconds"]) for r in steady) / n

    def per_epoch(key: str) -> float | None:
        waits = [r.get(key) for r in steps]
        return None if all(w is None for w in waits) else sum(w or 0.0 for w in waits) / len(epochs)

    net = sum(int(r.get("net_bytes") or 0) for r in steps) / len(epochs)
    return seconds, per_epoch("gate_wait_seconds"), per_epoch("peer_wait_seconds"), net


def lone_trainings(
    config: Path, ckpts: list[Path], params: list[str], work: Path, timeout: float
) -> None:
    """``bigembed train`` into each of ``ckpts`` at once, the K-th pinned to core K, 1 worker
    (``params`` are the ``-p`` overrides besides ``checkpoint_path``)."""
    runs = []
    for k, ckpt in enumerate(ckpts):
        shutil.rmtree(ckpt, ignore_errors=True)
        argv = [*CLI, "train", str(config), "--no-progress", "-p", f"checkpoint_path={ckpt}"]
        argv += [a for p in params for a in ("-p", p)]
        log = work / f"rank{k}.log"
        with log.open("w") as out:  # the child keeps its own copy of the descriptor
            proc = subprocess.Popen(
                pinned(argv, k), cwd=ROOT, env=bench_env(), stdout=out, stderr=out
            )
        runs.append((proc, log))
    for proc, log in runs:
        if proc.wait(timeout=timeout):
            raise RuntimeError(f"one machine failed:\n{log.read_text()[-2000:]}")


def run_one(plan: Plan, args: argparse.Namespace, use_netns: bool) -> Row:
    work = Path(args.workdir) / "runs"
    ckpt = work / "ckpt"
    shutil.rmtree(ckpt, ignore_errors=True)
    work.mkdir(parents=True, exist_ok=True)
    settings = [f"num_epochs={args.epochs}", *args.param, *plan.params()]
    params = [f"checkpoint_path={ckpt}", *settings]
    started = time.perf_counter()
    wire: int | None = None
    if plan.mode in ("one machine", INDEPENDENT):
        ckpts = [ckpt] + [work / f"ckpt{k}" for k in range(1, plan.ranks)]
        lone_trainings(plan.graph.config, ckpts, settings, work, args.row_timeout)
        source = "-"
    else:
        link = None if args.link == "unshaped" else args.link
        run = run_ranks(
            plan.graph.config,
            plan.ranks,
            params,
            work,
            use_netns=use_netns,
            link=link,
            delay=args.delay,
            port=PORT,
            pin=True,
            timeout=args.row_timeout,
        )
        wire = run.wire_bytes
        source = "interface counters" if wire is not None else "bigembed's count"
    wall = time.perf_counter() - started
    seconds, gate, peer, net = step_stats(ckpt)
    if plan.mode == INDEPENDENT:  # the mean of the trainings' epochs
        seconds = sum(step_stats(c)[0] for c in ckpts) / len(ckpts)
    mrr = dp_graphs.filtered_mrr(plan.graph, ckpt, work / "eval.json")
    mb = (
        None
        if plan.mode in ("one machine", INDEPENDENT)
        else (wire / args.epochs if wire is not None else net) / 1e6
    )
    return Row(
        graph=plan.graph.name,
        partitions=plan.graph.partitions,
        mode=plan.mode,
        ranks=plan.ranks,
        strategy=plan.strategy,
        precision=plan.precision,
        sparse=plan.sparse,
        edge_split=plan.edge_split,
        epoch_s=seconds,
        wall_s=wall,
        mrr=mrr,
        mb_per_epoch=mb,
        bytes_source=source,
        gate_wait_s=gate,
        peer_wait_s=peer,
    )


def plans(args: argparse.Namespace, graphs: list[dp_graphs.Graph]) -> list[Plan]:
    """The rows to run: per graph the one-machine reference, then per rank count the
    partitioned row(s) and the data-parallel matrix (on ``skewed``: each synchronous
    strategy with each edge split)."""
    strategies, precisions = args.strategies.split(","), args.precisions.split(",")
    sparse = ["rows" if s == "true" else "dense" for s in args.sparse.split(",")]
    stealing = ["+" + STEAL if s == "true" else "" for s in args.stealing.split(",")]
    out = []
    for g in graphs:
        out.append(Plan(g, "one machine", 1))
        for n in (int(r) for r in args.ranks.split(",")):
            if args.ceiling and g.name != "skewed":
                out.append(Plan(g, INDEPENDENT, n))
            if g.name == "skewed":
                out += [
                    Plan(g, "data_parallel", n, s, args.skew_precision, "rows", split + steal)
                    for s in args.skew_strategies.split(",")
                    for split in args.edge_splits.split(",")
                    for steal in stealing
                ]
                continue
            if "partitioned" in args.modes:
                out.append(Plan(g, "partitioned", n, args.partitioned_strategy, "fp32"))
            if "data_parallel" in args.modes:
                out += [
                    Plan(g, "data_parallel", n, s, p, sp, "load_balancing" + steal)
                    for s in strategies
                    for p in precisions
                    for sp in sparse
                    for steal in stealing
                ]
    return out


def stand_ins(args: argparse.Namespace) -> list[dp_graphs.Graph]:
    """The graphs ``args`` choose, by name and partition count only (nothing generated nor
    imported): enough for :func:`plans`."""
    return [
        dp_graphs.Graph(name, int(p), Path(), Path(), Path())
        for name in args.graphs.split(",")
        for p in (args.slashdot_partitions.split(",") if name == "slashdot" else ["1"])
    ]


PRESETS: dict[str, dict[str, Any]] = {
    # the reduced matrix: ~20 minutes on a 2-core machine
    "quick": {
        "epochs": 3,
        "strategies": "allreduce",
        "precisions": "fp32,int8",
        "sparse": "false,true",
        "skew_strategies": "allreduce",
        # Slashdot's nodes, a quarter of its edges: a round's rows stay a small share of the
        # table (about 30%, as on the whole graph), which is what row-sparse deltas save on
        "slashdot_edges": 240_000,
    },
    # does every path run: tiny graphs, 1 epoch (a few minutes)
    "smoke": {
        "epochs": 1,
        "dimension": 16,
        "strategies": "allreduce",
        "precisions": "int8",
        "sparse": "true",
        "skew_strategies": "allreduce",
        "fb_train_edges": 20_000,
        "slashdot_nodes": 2_000,
        "slashdot_edges": 20_000,
        "slashdot_partitions": "1",
        "test_edges": 500,
        "skew_nodes": 1_000,
        "skew_edges": 20_000,
        "skew_dimension": 64,
        "param": ["communication.sync_every=4"],  # a few rounds even in tiny buckets
    },
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add = parser.add_argument
    add("--graphs", default="fb15k237,slashdot,skewed")
    add("--slashdot-partitions", default="1,4")
    add("--modes", default="partitioned,data_parallel")
    add("--ranks", default="2", help="comma-separated rank counts, e.g. 2,4")
    add("--strategies", default=",".join(STRATEGY_NAMES), help="data-parallel rows")
    add("--precisions", default="fp32,fp16,bf16,int8", help="data-parallel rows")
    add("--sparse", default="false,true", help="communication.sparse_rows values")
    add(
        "--stealing",
        default="false",
        help="communication.replica_stealing values of the data-parallel rows (the edge "
        "split column says +steal)",
    )
    add(
        "--no-ceiling",
        dest="ceiling",
        action="store_false",
        help="skip the rows of N independent trainings at once (this machine's ceiling)",
    )
    add("--partitioned-strategy", default="async_ps", help="of the partitioned rows (fp32)")
    add("--skew-strategies", default=",".join(SYNCHRONOUS), help="rows on the skewed graph")
    add("--skew-precision", default="int8")
    add("--edge-splits", default="load_balancing,even", help="rows on the skewed graph")
    add("--epochs", type=int, default=5)
    add("--dimension", type=int, default=100)
    add("--fb-train-edges", type=int, default=0, help="first N FB15k-237 edges (0: all)")
    add("--slashdot-nodes", type=int, default=82_168)
    add("--slashdot-edges", type=int, default=948_464)
    add("--test-edges", type=int, default=5_000, help="withheld from generated graphs")
    add("--skew-nodes", type=int, default=1_000)
    add("--skew-edges", type=int, default=300_000)
    add("--skew-linear-share", type=float, default=0.2)
    add("--skew-dimension", type=int, default=512)
    add("-p", "--param", action="append", default=[], help="KEY=VALUE for every run")
    add(
        "--repeats",
        type=int,
        default=1,
        help="run the whole list of rows N times, interleaved; each row is the median",
    )
    add("--row-timeout", type=float, default=1800, help="seconds a row's training may take")
    add("--link", default="1gbit", help="tc rate of every link, or unshaped")
    add("--delay", default="1ms", help="netem delay each way (if netem exists)")
    add("--loopback", action="store_true", help="no namespaces even as root")
    add("--quick", action="store_true", help="the reduced matrix (~20 min on 2 cores)")
    add("--smoke", action="store_true", help="tiny graphs, 1 epoch")
    add("--workdir", default="/tmp/bigembed_dp_bench")
    add("--list", action="store_true", help="print the rows the flags choose, run nothing")
    add("--json", help="also write the rows here")
    add("--markdown", help="also write the caption and the table here")
    add("--table-from", nargs="+", metavar="JSON", help="one table of saved rows (no training)")
    args = parser.parse_args(argv)
    for name in [n for n in PRESETS if getattr(args, n)]:
        for key, value in PRESETS[name].items():
            if getattr(args, key) == parser.get_default(key):  # an explicit flag wins
                setattr(args, key, value)
    return args


def prepare(args: argparse.Namespace) -> list[dp_graphs.Graph]:
    root = Path(args.workdir)
    common = {"dimension": args.dimension, "batch_size": 1000, "lr": 0.1}
    common |= {"num_batch_negs": 50, "num_uniform_negs": 50}
    out = []
    for name in args.graphs.split(","):
        if name == "fb15k237":
            out.append(dp_graphs.fb15k237(root, common, args.fb_train_edges))
        elif name == "slashdot":
            for p in (int(x) for x in args.slashdot_partitions.split(",")):
                n, e, t = args.slashdot_nodes, args.slashdot_edges, args.test_edges
                out.append(dp_graphs.slashdot(root, common, p, n, e, t))
        elif name == "skewed":
            skew = dp_graphs.skewed_settings(common, args.skew_dimension)
            n, e, share = args.skew_nodes, args.skew_edges, args.skew_linear_share
            out.append(dp_graphs.skewed(root, skew, n, e, share, args.test_edges))
        else:
            raise SystemExit(f"--graphs: unknown graph {name!r} (fb15k237, slashdot, skewed)")
    return out


def main() -> int:
    args = parse_args()
    if args.table_from:
        saved = [Row(**r) for f in args.table_from for r in json.loads(Path(f).read_text())]
        print(markdown(f"dp_bench: rows of {', '.join(args.table_from)}", saved))
        print("\n".join(target_lines(saved)))
        return 0
    Path(args.workdir).mkdir(parents=True, exist_ok=True)
    use_netns = not args.loopback and netns.available()
    if args.list:
        todo = plans(args, stand_ins(args))
        for plan in todo:
            print(plan.graph.name, plan.graph.partitions, plan.ranks, plan.mode, *plan.params())
        print(f"{len(todo)} rows, {args.epochs} epochs each")
        return 0
    graphs = prepare(args)
    peak32, peak16 = mm_peak(torch.float32), mm_peak(torch.bfloat16)
    todo = plans(args, graphs)
    runs: list[list[Row]] = [[] for _ in todo]
    failed: list[str] = []
    for repeat in range(args.repeats):  # the rows interleaved: each repeat runs every row
        for plan, done in zip(todo, runs, strict=True):
            try:
                done.append(run_one(plan, args, use_netns))
            except (RuntimeError, subprocess.SubprocessError) as exc:  # the others still run
                what = f"{plan.graph.name} p{plan.graph.partitions} {plan.mode} {plan.params()}"
                failed.append(f"{what} (run {repeat + 1})")
                print(f"FAILED: {what}: {exc}", flush=True)
                continue
            print(json.dumps(asdict(done[-1])), flush=True)
            if args.json:  # saved as it goes: a long matrix stopped midway keeps its rows
                rows = [combine(d) for d in runs if d]
                Path(args.json).write_text(json.dumps([asdict(r) for r in rows], indent=1))
    rows = [combine(d) for d in runs if d]
    shaping = "loopback (bytes: bigembed's count)"
    if use_netns:
        link = None if args.link == "unshaped" else args.link
        with netns.machines(1, link, args.delay) as m:
            shaping = f"network namespaces on a bridge, each link: {m[0].shaping}"
    epochs = f"{args.epochs} epochs (epoch s: epochs 2+)" if args.epochs > 1 else "1 epoch"
    if args.repeats > 1:
        epochs += (
            f"; every row run {args.repeats} times, the rows interleaved: medians, the epoch "
            "times' range in brackets"
        )
    cores = os.cpu_count() or 1
    pinning = "each rank pinned to its own core"
    if max(int(r) for r in args.ranks.split(",")) > cores:
        pinning = f"rank k pinned to core k mod {cores} (more ranks than cores share them)"
    notes = "; ".join(g.note for g in graphs if g.note and g.partitions == 1)
    caption = (
        f"dp_bench: {machine_name()}; {peaks_line(peak32, peak16)}; {shaping}; {pinning}, "
        f"1 worker; {epochs}, "
        f"d={args.dimension} (skewed: d={args.skew_dimension}, 5+5 negatives), 50+50 "
        f"negatives, batch 1000; {notes}; MRR: filtered, test edges against every entity; "
        "MB/epoch: all the interfaces sent in the run (rendezvous and heartbeats included) "
        "over the epochs; gate wait: seconds per epoch, summed over trainers, and of it waiting "
        "for the slower trainer; edge split "
        f"{EDGE_SPLITS}"
    )
    table = markdown(caption, rows) + "\n" + "\n".join(target_lines(rows))
    if failed:
        table += "\n\nFailed (their last lines are printed above):\n" + "\n".join(failed)
    print("\n" + table)
    if args.markdown:
        Path(args.markdown).write_text(table + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
