"""Generate a graph whose embeddings are several times a memory limit, and import it.

Writes a TSV of random edges (``n<id> <rel> n<id>``; uniform heads, tails near the head so a
model has something to learn), a config (d=128, one entity type split into ``--partitions``),
and runs ``bigembed import`` on it, timed (the import time is one of the out-of-core figures).

    python bench/ooc_graph.py --entities 20000000 --edges 100000000 --workdir /tmp/ooc
    python bench/ooc_graph.py --entities 2000000 --edges 20000000 --workdir /tmp/ooc_small

Embeddings take ``entities x (dimension + 1) x 4`` bytes (the +1 is the Adagrad row state):
20M x 129 x 4 = 10.3 GB. Nothing is timed but the import; the TSV is kept for a re-import and
deleted with ``--delete-tsv``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import yaml

RELATIONS = ["r0", "r1", "r2", "r3"]


def write_tsv(path: Path, num_entities: int, num_edges: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    names = pa.array(np.char.add("n", np.arange(num_entities).astype(str)).astype(object))
    rels = pa.array(RELATIONS, pa.string())
    tmp = path.with_suffix(".partial")
    options = pacsv.WriteOptions(include_header=False, delimiter="\t", quoting_style="none")
    with pa.OSFile(str(tmp), "wb") as sink:
        for start in range(0, num_edges, 4_000_000):
            n = min(4_000_000, num_edges - start)
            heads = rng.integers(0, num_entities, n)
            rel = rng.integers(0, len(RELATIONS), n)
            tails = (heads * (rel + 2) + rng.integers(0, 16, n)) % num_entities
            table = pa.table(
                {
                    "h": names.take(pa.array(heads)),
                    "r": rels.take(pa.array(rel)),
                    "t": names.take(pa.array(tails)),
                }
            )
            pacsv.write_csv(table, sink, options)
    tmp.rename(path)


def write_config(work: Path, partitions: int, dimension: int) -> Path:
    config = {
        "entities": {"node": {"num_partitions": partitions}},
        "relations": [
            {"name": r, "lhs": "node", "rhs": "node", "operator": "diagonal"} for r in RELATIONS
        ],
        "entity_path": str(work / "entities"),
        "edge_paths": [str(work / "edges")],
        "checkpoint_path": str(work / "model"),
        "dimension": dimension,
        "comparator": "dot",
        "loss_fn": "softmax",
        "num_epochs": 1,
        "lr": 0.1,
        "bucket_order": "inside_out",
        "workers": 2,
    }
    path = work / "config.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--entities", type=int, default=20_000_000)
    parser.add_argument("--edges", type=int, default=100_000_000)
    parser.add_argument("--partitions", type=int, default=16)
    parser.add_argument("--dimension", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--delete-tsv", action="store_true")
    args = parser.parse_args()

    work = args.workdir
    work.mkdir(parents=True, exist_ok=True)
    tsv = work / "edges.tsv"
    if not tsv.exists():
        t = time.perf_counter()
        write_tsv(tsv, args.entities, args.edges, args.seed)
        seconds = time.perf_counter() - t
        print(f"generated {tsv} ({tsv.stat().st_size / 1e9:.2f} GB) in {seconds:.0f} s")
    config = write_config(work, args.partitions, args.dimension)
    t = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "bigembed.cli", "import", str(config), str(tsv), "--no-progress"],
        check=True,
    )
    seconds = time.perf_counter() - t
    emb = args.entities * (args.dimension + 1) * 4
    summary = {
        "entities": args.entities,
        "edges": args.edges,
        "partitions": args.partitions,
        "dimension": args.dimension,
        "embedding_bytes": emb,
        "tsv_bytes": tsv.stat().st_size,
        "import_seconds": round(seconds, 1),
        "import_edges_per_sec": round(args.edges / seconds),
    }
    (work / "graph.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary))
    if args.delete_tsv:
        tsv.unlink()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
