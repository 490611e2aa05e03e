"""Benchmark of ``bigembed index``: recall@10 against the exact scan, queries/s of both, build
time and memory, on a generated table.

The table (default 10M rows x d=128, one entity type, a ``cos`` model) is written as a
bigembed checkpoint (generation not timed; ``--dir`` keeps it for the next run): rows look like
trained embeddings, clustered around ``--clusters`` centres (default rows / 1000, of lognormal
sizes: communities of very different sizes) in a random ``--intrinsic``-dimensional subspace
(default 24; trained embeddings, like the usual ANN benchmark sets, have a low intrinsic
dimension), each row its centre plus a ``--spread`` (default 0.5 of the centres' spread)
Gaussian offset in the subspace plus 10% isotropic noise. ``--clusters 0`` drops the clusters
(Gaussian rows near the subspace), ``--intrinsic 0`` draws plain Gaussian rows, the hardest
case for any index. Queries are fresh draws of the same kind. The index is built in a child
process (its peak memory is the child's); both searches go through the public API
(``model.similar(vectors, k=10)`` with and without ``exact=True``), so the figures include the
exact rescoring of the index's candidates and the id -> name lookups.

    python bench/ann_bench.py --dir /tmp/ann10m          # 10M x 128, the kind chosen by size
    python bench/ann_bench.py --rows 1000000 --kind hnsw --queries 2000
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import resource
import shutil
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pyarrow as pa
import torch

import bigembed
from bigembed.checkpoints import (
    VERSION_FILE,
    CheckpointMetadata,
    CheckpointStore,
    IterationPosition,
)
from bigembed.config import config_to_dict, model_spec, parse_config_dict
from bigembed.model import ScoringModel
from bigembed.serving import BuildWatch, IndexKnobs, build_indexes
from bigembed.storage import write_entity_store


def table(
    rows: int, dim: int, intrinsic: int, seed: int, clusters: int = 0, spread: float = 0.5
) -> np.ndarray:
    """``rows`` vectors of ``dim`` values: a random linear image of ``intrinsic``-dimensional
    points plus 10% isotropic noise (``intrinsic`` 0: plain Gaussian, no structure at all).
    The points are Gaussian, or with ``clusters`` a centre (chosen with lognormal weights)
    plus ``spread`` times a Gaussian offset. The basis, centres and weights are the same for
    every seed, so queries (another seed) come from the same distribution."""
    rng = np.random.default_rng(seed)
    fixed = np.random.default_rng(12345)
    basis = fixed.standard_normal((max(intrinsic, 1), dim))
    basis = (basis / np.sqrt(max(intrinsic, 1))).astype(np.float32)
    centres = fixed.standard_normal((max(clusters, 1), max(intrinsic, 1))).astype(np.float32)
    weights = fixed.lognormal(0.0, 1.0, max(clusters, 1))
    weights /= weights.sum()
    out = np.empty((rows, dim), np.float32)
    for lo in range(0, rows, 1 << 20):
        n = min(1 << 20, rows - lo)
        noise = rng.standard_normal((n, dim), dtype=np.float32)
        if intrinsic:
            latent = rng.standard_normal((n, intrinsic), dtype=np.float32)
            if clusters:
                latent = centres[rng.choice(clusters, size=n, p=weights)] + spread * latent
            out[lo : lo + n] = latent @ basis + 0.1 * noise
        else:
            out[lo : lo + n] = noise
    return out


def write_model(root: Path, emb: np.ndarray) -> Path:
    """A committed one-version ``cos`` checkpoint of ``emb`` (one type, one partition)."""
    names = pa.array([f"e{i}" for i in range(len(emb))], pa.string())
    write_entity_store(
        root / "entities", names={"node": [names]}, relation_names=["r"], dynamic_relations=False,
        seed=0,
    )  # fmt: skip
    cfg = parse_config_dict(
        {
            "entities": {"node": {"num_partitions": 1}},
            "relations": [{"name": "r", "lhs": "node", "rhs": "node", "operator": "none"}],
            "entity_path": str(root / "entities"),
            "edge_paths": [str(root / "edges")],  # none: only the table is read
            "checkpoint_path": str(root / "model"),
            "dimension": emb.shape[1],
            "comparator": "cos",
        }
    )
    store = CheckpointStore(cfg.checkpoint_path)
    store.path.mkdir(parents=True)
    t = torch.from_numpy(emb)
    store.save_partition("node", 0, 1, t, torch.zeros(len(emb)))
    store.save_model(1, {"model": ScoringModel(model_spec(cfg, 1)).state_dict(), "optimizer": None})
    store.write_metadata(
        CheckpointMetadata(
            version=1,
            config=config_to_dict(cfg),
            iteration=IterationPosition(num_edge_chunks=1),
            entity_counts={("node", 0): len(emb)},
            num_relations=1,
            relation_names=["r"],
        )
    )
    (store.path / VERSION_FILE).write_text("1\n")  # the commit point, written last
    return store.path


def timed(fn):
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def in_child(fn, *args):
    """``fn(*args)`` in a forked process (its peak memory is its own); its return value."""
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    proc = ctx.Process(target=lambda: queue.put(fn(*args)))
    proc.start()
    out = queue.get()
    proc.join()
    if proc.exitcode:
        raise SystemExit(f"child failed ({proc.exitcode})")
    return out


def generate(work: Path, spec: dict) -> dict:
    """Write the table's checkpoint under ``work`` (kept: ``spec.json`` says what it holds)."""
    (emb, gen_s) = timed(
        lambda: table(spec["rows"], spec["dim"], spec["intrinsic"], 0, spec["clusters"],
                      spec["spread"])
    )  # fmt: skip
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    write_model(work, emb)
    (work / "spec.json").write_text(json.dumps(spec))
    return {"generate_s": round(gen_s, 1), "generate_peak_rss_mb": round(peak_mb(), 1)}


def build(ckpt: Path, knobs: IndexKnobs) -> dict:
    """Build the index; its record, the build's wall time and this process's peak memory."""
    start = time.perf_counter()
    last = [start]

    def step(line: str) -> None:
        print(f"  [{time.perf_counter() - start:7.1f} s] {line}", flush=True)

    def rows(etype: str, added: int, total: int) -> None:
        if time.perf_counter() - last[0] > 60:
            last[0] = time.perf_counter()
            step(f"adding rows ({added:,} per block of {total:,})")

    _, (info,) = build_indexes(ckpt, knobs=knobs, watch=BuildWatch(step=step, rows=rows))
    return {
        "info": asdict(info),
        "build_s": round(time.perf_counter() - start, 1),
        "build_peak_rss_mb": round(peak_mb(), 1),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=10_000_000)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--intrinsic", type=int, default=24)
    p.add_argument("--clusters", type=int, help="cluster centres (default rows / 1000; 0: none)")
    p.add_argument("--spread", type=float, default=0.5, help="a cluster's spread / the centres'")
    p.add_argument("--queries", type=int, default=1000, help="queries through the index")
    p.add_argument("--exact-queries", type=int, default=100, help="queries of the exact scan")
    p.add_argument("--kind", default="auto", choices=("auto", "flat", "hnsw", "ivfpq"))
    p.add_argument("--m", type=int, default=32)
    p.add_argument("--ef-construction", type=int, default=200)
    p.add_argument("--ef-search", type=int, default=128)
    p.add_argument("--nlist", type=int)
    p.add_argument("--nprobe", type=int, help="default: tuned to --target-recall")
    p.add_argument("--target-recall", type=float, default=0.95)
    p.add_argument("--rerank", type=int, default=10)
    p.add_argument("--train-rows", type=int)
    p.add_argument("--dir", help="work folder, its table kept for the next run (default: temp)")
    args = p.parse_args()

    clusters = args.rows // 1000 if args.clusters is None else args.clusters
    spec = {
        "rows": args.rows,
        "dim": args.dim,
        "intrinsic": args.intrinsic,
        "clusters": clusters,
        "spread": args.spread,
    }
    work = Path(args.dir or tempfile.mkdtemp(prefix="ann_bench_"))
    result: dict = dict(spec)
    spec_file = work / "spec.json"
    if spec_file.exists() and json.loads(spec_file.read_text()) == spec:
        print(f"reusing the table in {work}", flush=True)
    else:
        print(f"generating the table in {work}", flush=True)
        result.update(in_child(generate, work, spec))
    ckpt = work / "model"
    knobs = IndexKnobs(
        kind=args.kind,
        m=args.m,
        ef_construction=args.ef_construction,
        ef_search=args.ef_search,
        nlist=args.nlist,
        nprobe=args.nprobe,
        rerank=args.rerank,
        train_rows=args.train_rows,
        target_recall=args.target_recall,
    )
    built = in_child(build, ckpt, knobs)
    info = built["info"]
    print(f"built: {json.dumps(built)}", flush=True)

    queries = table(
        max(args.queries, args.exact_queries), args.dim, args.intrinsic, 1, clusters, args.spread
    )
    model = bigembed.load(ckpt)
    model.similar(queries[:10], k=10)  # read the index and the table once
    approx, index_s = timed(lambda: model.similar(queries[: args.queries], k=10))
    exact, exact_s = timed(lambda: model.similar(queries[: args.exact_queries], k=10, exact=True))
    hits = sum(
        len({x.name for x in a} & {x.name for x in b})
        for a, b in zip(approx[: args.exact_queries], exact, strict=True)
    )
    index_qps, exact_qps = args.queries / index_s, args.exact_queries / exact_s
    result.update(
        {
            "kind": info["kind"],
            "params": info["params"],
            "recall@10": round(hits / (10 * args.exact_queries), 4),
            "index_qps": round(index_qps, 1),
            "exact_qps": round(exact_qps, 2),
            "speedup": round(index_qps / exact_qps, 1),
            "build_s": built["build_s"],
            "build_peak_rss_mb": built["build_peak_rss_mb"],
            "index_mb": round(info["bytes"] / 2**20, 1),
            "query_peak_rss_mb": round(peak_mb(), 1),
            "threads": torch.get_num_threads(),
        }
    )
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
