"""Benchmark of ``bigembed index``: recall@10 against the exact scan, queries/s of both, build
time and memory, on a generated table.

The table (default 10M rows x d=128, one entity type, a ``cos`` model) is written as a
bigembed checkpoint (generation not timed): rows lie near a random ``--intrinsic``-dimensional
subspace (default 24; trained embeddings, like the usual ANN benchmark sets, have a low
intrinsic dimension), plus noise; ``--intrinsic 0`` draws plain Gaussian rows, the hardest case
for any index. Queries are fresh draws of the same kind. Both searches go through the public API
(``model.similar(vectors, k=10)`` with and without ``exact=True``), so the figures include the
exact rescoring of the index's candidates and the id -> name lookups.

    python bench/ann_bench.py                           # 10M x 128, the kind chosen by size
    python bench/ann_bench.py --rows 1000000 --kind hnsw --queries 2000
"""

from __future__ import annotations

import argparse
import json
import resource
import tempfile
import time
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
from bigembed.serving import IndexKnobs, build_indexes
from bigembed.storage import write_entity_store


def table(rows: int, dim: int, intrinsic: int, seed: int) -> np.ndarray:
    """``rows`` vectors of ``dim`` values: a random linear image of ``intrinsic``-dimensional
    Gaussian points plus 10% isotropic noise (0: plain Gaussian, no structure at all). The
    basis is the same for every seed, so queries (another seed) come from the same space."""
    rng = np.random.default_rng(seed)
    basis = np.random.default_rng(12345).standard_normal((max(intrinsic, 1), dim))
    basis = (basis / np.sqrt(max(intrinsic, 1))).astype(np.float32)
    out = np.empty((rows, dim), np.float32)
    for lo in range(0, rows, 1 << 20):
        n = min(1 << 20, rows - lo)
        noise = rng.standard_normal((n, dim), dtype=np.float32)
        if intrinsic:
            latent = rng.standard_normal((n, intrinsic), dtype=np.float32)
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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=10_000_000)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--intrinsic", type=int, default=24)
    p.add_argument("--queries", type=int, default=1000, help="queries through the index")
    p.add_argument("--exact-queries", type=int, default=200, help="queries of the exact scan")
    p.add_argument("--kind", default="auto", choices=("auto", "flat", "hnsw", "ivfpq"))
    p.add_argument("--m", type=int, default=32)
    p.add_argument("--ef-construction", type=int, default=200)
    p.add_argument("--ef-search", type=int, default=128)
    p.add_argument("--nprobe", type=int)
    p.add_argument("--rerank", type=int, default=10)
    p.add_argument("--dir", help="work folder (default: a temporary one)")
    args = p.parse_args()

    work = Path(args.dir or tempfile.mkdtemp(prefix="ann_bench_"))
    emb = table(args.rows, args.dim, args.intrinsic, seed=0)
    ckpt = write_model(work, emb)
    del emb
    queries = table(max(args.queries, args.exact_queries), args.dim, args.intrinsic, seed=1)
    knobs = IndexKnobs(
        kind=args.kind,
        m=args.m,
        ef_construction=args.ef_construction,
        ef_search=args.ef_search,
        nprobe=args.nprobe,
        rerank=args.rerank,
    )
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    (_, (info,)), build_s = timed(lambda: build_indexes(ckpt, knobs=knobs))
    build_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss

    model = bigembed.load(ckpt)
    model.similar(queries[:10], k=10)  # read the index and the table once
    approx, index_s = timed(lambda: model.similar(queries[: args.queries], k=10))
    exact, exact_s = timed(lambda: model.similar(queries[: args.exact_queries], k=10, exact=True))
    hits = sum(
        len({x.name for x in a} & {x.name for x in b})
        for a, b in zip(approx[: args.exact_queries], exact, strict=True)
    )
    index_qps, exact_qps = args.queries / index_s, args.exact_queries / exact_s
    result = {
        "rows": args.rows,
        "dim": args.dim,
        "intrinsic": args.intrinsic,
        "kind": info.kind,
        "params": info.params,
        "recall@10": round(hits / (10 * args.exact_queries), 4),
        "index_qps": round(index_qps, 1),
        "exact_qps": round(exact_qps, 2),
        "speedup": round(index_qps / exact_qps, 1),
        "build_s": round(build_s, 1),
        "index_mb": round(info.bytes / 2**20, 1),
        "build_peak_rss_growth_mb": round((build_rss - rss0) / 1024, 1),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "threads": torch.get_num_threads(),
    }
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
