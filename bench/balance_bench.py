"""Load balancing on a skewed graph: PBG's schedule against the cost model, in the same run.

The graph (written straight into bigembed's storage format): two entity types of very
different sizes, ``user`` (many) and ``item`` (few), both in ``--partitions`` partitions, and
three relations with different operators: ``follows`` user→user (diagonal), ``likes``
user→item (linear) and ``related`` item→item (translation). Degrees follow power laws (Zipf
draws; items more skewed than users), and entities are placed in partitions at random, as the
importer does, so buckets differ in size and in relation mix.

Every configuration runs twice, ``load_balancing: pbg`` then ``load_balancing: cost``
(interleaved, ``--repeats`` times), each a subprocess as a user starts it:
1 rank x 2 Hogwild workers (``bigembed train``) and 4 ranks x 1 worker on loopback
(``bigembed launch -n 4``). From ``training_stats.json`` (epochs 2+, the first pays for
starting workers and touching every partition) it reports:

* epoch s: mean step time (one step per epoch here; distributed: the slowest trainer);
* rank idle: per trainer, the part of the step not spent training buckets (waiting for a lock,
  loading/writing partitions, waiting for the others at the end of the step), mean and max;
* worker idle: per Hogwild worker, the part of the buckets' training time it was not busy
  (waiting for the slowest worker), max over workers;
* I/O wait: time waiting for a bucket's partitions and edges to be loaded, as a part of the
  step time (mean over trainers); part. wait: of which waiting for partition reads and
  write-backs alone (the step record's ``io_wait_seconds``, summed over trainers);
* speedup: PBG's epoch time / the cost model's, same configuration and repeat;
* CPU use: CPU seconds of the whole run (all its processes) / (wall seconds x CPUs): near
  100% the machine is saturated and no schedule can shorten the epochs, only move the waiting.

``--prefetch both`` also runs every pair with ``partition_prefetch: false`` (distributed: no
look-ahead grant, partitions read and written back between buckets) to show what the overlap
buys. ``--src NAME=DIR`` (repeatable) runs every pair once per source tree (``PYTHONPATH=DIR``),
interleaved, to compare two versions of bigembed in one run (e.g. ``--src before=../main/src
--src after=src``). With ``--repeats`` above 1 a second table gives the median of each
figure over the repeats.

    python bench/balance_bench.py                      # 60k users, 3k items, 600k edges, 8 parts
    python bench/balance_bench.py --edges 100000 --epochs 2 --repeats 1   # quick look
    python bench/balance_bench.py --only "1 rank x 2 workers" -p bucket_order=buffer \
        -p memory_budget=741816408     # 8 of the 16 tables resident: swaps every epoch
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

ROOT = Path(__file__).resolve().parent.parent

from bigembed.checkpoints import CheckpointStore  # noqa: E402
from bigembed.config import config_to_dict, parse_config_dict  # noqa: E402
from bigembed.storage import (  # noqa: E402
    EdgeStore,
    bucket_dir,
    write_edge_manifest,
    write_entity_store,
)
from bigembed.train import read_training_log  # noqa: E402

RELATIONS = [
    # name, lhs, rhs, operator, share of the edges
    ("follows", "user", "user", "diagonal", 0.45),
    ("likes", "user", "item", "linear", 0.45),
    ("related", "item", "item", "translation", 0.10),
]

CONFIGS = [
    # label, command, ranks, overrides
    ("1 rank x 2 workers", "train", 1, ["workers=2"]),
    ("4 ranks x 1 worker", "launch", 4, ["workers=1", "num_partition_servers=-1"]),
]


def _zipf_ids(rng: np.random.Generator, n: int, size: int, exponent: float) -> np.ndarray:
    """``size`` ids in ``[0, n)`` with P(id k) ∝ (k + 1)^-exponent."""
    p = (np.arange(1, n + 1, dtype=np.float64)) ** -exponent
    return rng.choice(n, size=size, p=p / p.sum())


def write_skewed_graph(root: Path, users: int, items: int, edges: int, parts: int) -> None:
    rng = np.random.default_rng(11)
    sizes = {"user": users, "item": items}
    exponents = {"user": 0.8, "item": 1.1}
    place: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    names: dict[str, list[pa.Array]] = {}
    for etype, n in sizes.items():
        perm = rng.permutation(n)  # random placement, as the importer does
        bounds = np.linspace(0, n, parts + 1).astype(int)
        part_of, off_of = np.empty(n, np.int64), np.empty(n, np.int64)
        names[etype] = []
        for p in range(parts):
            members = perm[bounds[p] : bounds[p + 1]]
            part_of[members] = p
            off_of[members] = np.arange(len(members))
            names[etype].append(pa.array([f"{etype}{k}" for k in members]))
        place[etype] = (part_of, off_of)
    write_entity_store(
        root / "entities",
        names=names,
        relation_names=[r[0] for r in RELATIONS],
        dynamic_relations=False,
        seed=0,
    )
    cols: dict[tuple[int, int], list[tuple[np.ndarray, np.ndarray, np.ndarray]]] = {}
    for rid, (_, lt, rt, _, share) in enumerate(RELATIONS):
        m = int(edges * share)
        lhs = _zipf_ids(rng, sizes[lt], m, exponents[lt])
        rhs = _zipf_ids(rng, sizes[rt], m, exponents[rt])
        lp, lo = place[lt][0][lhs], place[lt][1][lhs]
        rp, ro = place[rt][0][rhs], place[rt][1][rhs]
        for i in range(parts):
            for j in range(parts):
                sel = np.nonzero((lp == i) & (rp == j))[0]
                cols.setdefault((i, j), []).append((lo[sel], ro[sel], np.full(len(sel), rid)))
    counts = np.zeros((parts, parts), np.int64)
    edir = root / "edges"
    for (i, j), parts_ in cols.items():
        lhs_o = np.concatenate([c[0] for c in parts_])
        rhs_o = np.concatenate([c[1] for c in parts_])
        rel = np.concatenate([c[2] for c in parts_])
        order = rng.permutation(len(rel))
        counts[i, j] = len(rel)
        if len(rel) == 0:
            continue
        d = edir / bucket_dir(i, j)
        d.mkdir(parents=True, exist_ok=True)
        np.save(d / "lhs.npy", lhs_o[order].astype(np.int32))
        np.save(d / "rhs.npy", rhs_o[order].astype(np.int32))
        np.save(d / "rel.npy", rel[order].astype(np.int32))
    dtypes = {k: np.dtype(np.int32) for k in ("lhs", "rhs", "rel")}
    write_edge_manifest(edir, bucket_counts=counts, dtypes=dtypes, has_weights=False)


def graph_config(root: Path, parts: int, dimension: int, epochs: int) -> dict[str, Any]:
    cfg = parse_config_dict(
        {
            "entities": {"user": {"num_partitions": parts}, "item": {"num_partitions": parts}},
            "relations": [
                {"name": n, "lhs": lt, "rhs": rt, "operator": op} for n, lt, rt, op, _ in RELATIONS
            ],
            "entity_path": str(root / "entities"),
            "edge_paths": [str(root / "edges")],
            "checkpoint_path": str(root / "model"),
            "dimension": dimension,
            "num_epochs": epochs,
            "batch_size": 1000,
            "num_batch_negs": 50,
            "num_uniform_negs": 50,
            "lr": 0.05,
            "eval_fraction": 0.0,
            "hogwild_delay": 0.0,
        }
    )
    return config_to_dict(cfg)


def run_one(
    cfg_path: Path,
    ckpt: Path,
    command: str,
    ranks: int,
    extra: list[str],
    policy: str,
    src: str | None = None,
) -> dict[str, float | None]:
    shutil.rmtree(ckpt, ignore_errors=True)
    argv = [sys.executable, "-m", "bigembed.cli", command, str(cfg_path)]
    argv += ["-n", str(ranks)] if command == "launch" else ["--no-progress"]
    for p in [f"checkpoint_path={ckpt}", f"load_balancing={policy}", *extra]:
        argv += ["-p", p]
    env = dict(os.environ)
    env.pop("OMP_NUM_THREADS", None)
    if src is not None:
        env["PYTHONPATH"] = src
    started = time.perf_counter()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(argv, check=True, cwd=ROOT, env=env, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    log = read_training_log(CheckpointStore(ckpt))
    warm = {s.at.version for s in log.steps if s.at.epoch_idx > 0} or {
        s.at.version for s in log.steps
    }
    steps = [s for s in log.steps if s.at.version in warm]
    step_s = sum(s.seconds for s in steps)
    buckets = [b for b in log.buckets if b.at.version in warm and b.timing is not None]
    trainers = sorted({b.trainer or 0 for b in buckets})
    rank_idle, io_wait, worker_idle = [], [], []
    for t in trainers:
        mine = [b for b in buckets if (b.trainer or 0) == t]
        train = sum(b.timing.train_seconds for b in mine if b.timing)
        rank_idle.append(1 - train / step_s)
        io_wait.append(sum(b.timing.load_seconds for b in mine if b.timing) / step_s)
        nworkers = max(len(b.timing.worker_seconds) for b in mine if b.timing)
        for w in range(nworkers):
            busy = sum(b.timing.worker_seconds[w] for b in mine if b.timing)
            worker_idle.append(1 - busy / train if train > 0 else 0.0)
    return {
        "wall_s": wall,
        "cpu_use": cpu / (wall * (os.cpu_count() or 1)),
        "epoch_s": step_s / len(steps),
        "rank_idle_mean": float(np.mean(rank_idle)),
        "rank_idle_max": float(np.max(rank_idle)),
        "worker_idle_max": float(np.max(worker_idle)),
        "io_wait": float(np.mean(io_wait)),
        "part_wait": (  # a distributed step's record sums its trainers' waits
            sum(s.io_wait_seconds or 0.0 for s in steps) / step_s / len(trainers)
            if all(s.io_wait_seconds is not None for s in steps)
            else None
        ),
        "edges_per_s": sum(s.stats.count for s in steps) / step_s,
        "loss": log.steps[-1].stats.loss,
    }


def bucket_skew(root: Path) -> str:
    c = EdgeStore(root / "edges").bucket_counts()
    return f"bucket edges min {c.min():,} / median {int(np.median(c)):,} / max {c.max():,}"


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--users", type=int, default=60_000)
    parser.add_argument("--items", type=int, default=3_000)
    parser.add_argument("--edges", type=int, default=600_000)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--dimension", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--only", choices=[c[0] for c in CONFIGS], default=None)
    parser.add_argument("--prefetch", choices=["on", "off", "both"], default="on")
    parser.add_argument(
        "-p", "--param", action="append", default=[], help="KEY=VALUE for every run (repeatable)"
    )
    parser.add_argument(
        "--src",
        action="append",
        default=[],
        metavar="NAME=DIR",
        help="run every pair with PYTHONPATH=DIR too (repeatable; interleaved)",
    )
    parser.add_argument("--workdir", default="/tmp/bigembed_balance_bench")
    args = parser.parse_args()
    sources: list[tuple[str, str | None]] = [
        (name, str(Path(d).resolve())) for name, _, d in (x.partition("=") for x in args.src)
    ] or [("", None)]

    workdir = Path(args.workdir)
    graph = workdir / f"graph_{args.users}_{args.items}_{args.edges}_{args.partitions}"
    if not (graph / "edges").exists():
        shutil.rmtree(graph, ignore_errors=True)
        write_skewed_graph(graph, args.users, args.items, args.edges, args.partitions)
    cfg_path = workdir / "config.json"
    cfg_path.write_text(
        json.dumps(graph_config(graph, args.partitions, args.dimension, args.epochs))
    )

    prefetch = {"on": ["true"], "off": ["false"], "both": ["true", "false"]}[args.prefetch]
    rows = []
    for rep in range(args.repeats):
        for label, command, ranks, extra in CONFIGS:
            if args.only and label != args.only:
                continue
            for pf, (name, src) in itertools.product(prefetch, sources):
                pair = {}
                tag = label if args.prefetch == "on" else f"{label}, prefetch {pf}"
                tag = f"{tag}, {name}" if name else tag
                for policy in ("pbg", "cost"):
                    ckpt = workdir / f"ckpt_{ranks}_{policy}"
                    more = [*extra, f"partition_prefetch={pf}", *args.param]
                    pair[policy] = run_one(cfg_path, ckpt, command, ranks, more, policy, src)
                    rows.append((tag, policy, rep, pair[policy]))
                pbg_s, cost_s = pair["pbg"]["epoch_s"], pair["cost"]["epoch_s"]
                assert pbg_s is not None and cost_s is not None
                pair["cost"]["speedup"] = pbg_s / cost_s
                pair["pbg"]["speedup"] = 1.0

    print(
        f"\n{args.users:,} users + {args.items:,} items, {args.edges:,} edges "
        f"({', '.join(f'{n} {op}' for n, _, _, op, _ in RELATIONS)}), {args.partitions} "
        f"partitions, dimension {args.dimension}, {args.epochs} epochs (epochs 2+ measured), "
        f"{os.cpu_count()} CPUs; {bucket_skew(graph)}\n"
    )
    head = (
        "configuration",
        "load_balancing",
        "repeat",
        "epoch s",
        "speedup vs pbg",
        "rank idle mean / max",
        "worker idle max",
        "I/O wait",
        "part. wait",
        "edges/s",
        "CPU use",
        "last loss",
    )
    print("| " + " | ".join(head) + " |")
    print("|" + "|".join("---" for _ in head) + "|")
    for label, policy, rep, r in rows:
        print(_row(label, policy, str(rep + 1), r))
    if args.repeats > 1:
        print(f"\nMedians over the {args.repeats} repeats (each figure separately):\n")
        print("| " + " | ".join(head).replace("| repeat ", "| repeats ") + " |")
        print("|" + "|".join("---" for _ in head) + "|")
        groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for label, policy, _, r in rows:
            groups.setdefault((label, policy), []).append(r)
        for (label, policy), rs in groups.items():
            med = {
                k: None if any(r[k] is None for r in rs) else float(np.median([r[k] for r in rs]))
                for k in rs[0]
            }
            print(_row(label, policy, str(len(rs)), med))
    return 0


def _row(label: str, policy: str, repeat: str, r: dict[str, Any]) -> str:
    return (
        f"| {label} | {policy} | {repeat} | {r['epoch_s']:.2f} | {r['speedup']:.2f}x | "
        f"{r['rank_idle_mean']:.1%} / {r['rank_idle_max']:.1%} | "
        f"{r['worker_idle_max']:.1%} | {r['io_wait']:.1%} | "
        f"{'n/a' if r['part_wait'] is None else format(r['part_wait'], '.1%')} | "
        f"{r['edges_per_s']:,.0f} | "
        f"{r['cpu_use']:.0%} | {r['loss']:.4f} |"
    )


if __name__ == "__main__":
    sys.exit(main())
