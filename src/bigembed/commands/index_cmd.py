"""``bigembed index``: build approximate-nearest-neighbour indexes for ``similar``/``predict``."""

from __future__ import annotations

import argparse
import sys

from bigembed.commands.versions import add_version_argument, checkpoint_of
from bigembed.errors import InputError


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "index",
        help="build FAISS indexes so that similar and predict need not scan every entity",
        description="Build a FAISS index of each entity type of a checkpoint version, stored in "
        "CHECKPOINT/index/vN/; similar and predict of that version then use it (--exact scans "
        "every entity). Kind by size: flat (exact) up to 100,000 rows, hnsw up to 2,000,000, "
        "ivfpq beyond (nprobe tuned to --target-recall); metric from the comparator. See "
        "docs/ann_index.md.",
    )
    p.add_argument("checkpoint_dir", help="a checkpoint directory (the config's checkpoint_path)")
    p.add_argument("--type", action="append", help="entity type (repeatable; default: all)")
    p.add_argument(
        "--kind",
        choices=("auto", "flat", "hnsw", "ivfpq"),
        default="auto",
        help="index kind (default auto: by the number of rows)",
    )
    p.add_argument(
        "--metric",
        choices=("cos", "dot", "l2"),
        help="default: the model's comparator (cos; dot; l2 for l2 and squared_l2), the one "
        "predict ranks with; similar uses the index only with the same --metric",
    )
    knobs = p.add_argument_group("knobs (hnsw / ivfpq)")
    knobs.add_argument("--m", type=int, default=32, help="hnsw: neighbours per node (32)")
    knobs.add_argument("--ef-construction", type=int, default=200, help="hnsw: build width (200)")
    knobs.add_argument("--ef-search", type=int, default=128, help="hnsw: search width (128)")
    knobs.add_argument("--nlist", type=int, help="ivfpq: inverted lists (sqrt(rows))")
    knobs.add_argument(
        "--nprobe",
        type=int,
        help="ivfpq: lists searched per query (default: tuned, the smallest reaching "
        "--target-recall on held-out rows)",
    )
    knobs.add_argument(
        "--target-recall",
        type=float,
        default=0.95,
        help="ivfpq: recall@10 the tuned nprobe reaches on a sample of the table's rows (0.95)",
    )
    knobs.add_argument("--pq", type=int, help="ivfpq: bytes per row (dimension / 4)")
    knobs.add_argument(
        "--rerank", type=int, default=10, help="ivfpq: candidates rescored per result (10)"
    )
    knobs.add_argument("--train-rows", type=int, help="ivfpq: k-means sample (40 x nlist)")
    add_version_argument(p)
    p.set_defaults(func=run_index)


def run_index(args: argparse.Namespace) -> int:
    try:
        import faiss  # noqa: F401
    except ImportError:
        raise InputError("bigembed index needs FAISS: pip install 'bigembed[ann]'") from None
    from tqdm import tqdm

    from bigembed.serving import BuildWatch, IndexKnobs, build_indexes

    for name in ("m", "ef_construction", "ef_search", "nlist", "nprobe", "pq", "rerank"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise InputError(f"--{name.replace('_', '-')} must be a positive integer")
    if args.train_rows is not None and args.train_rows < 1:
        raise InputError("--train-rows must be a positive integer")
    if not 0 < args.target_recall <= 1:
        raise InputError(f"--target-recall {args.target_recall}: must be in (0, 1]")
    knobs = IndexKnobs(
        kind=args.kind,
        m=args.m,
        ef_construction=args.ef_construction,
        ef_search=args.ef_search,
        nlist=args.nlist,
        nprobe=args.nprobe,
        pq=args.pq,
        rerank=args.rerank,
        train_rows=args.train_rows,
        target_recall=args.target_recall,
    )

    bars: dict[str, tqdm] = {}

    def added(etype: str, rows: int, total: int) -> None:
        if etype not in bars:
            bars[etype] = tqdm(total=total, desc=f"{etype}: adding", unit=" rows", leave=False)
        bars[etype].update(rows)

    def step(line: str) -> None:
        tqdm.write(line, file=sys.stderr)

    def say(info) -> None:
        if info.type in bars:
            bars.pop(info.type).close()
        knob_text = ", ".join(f"{k} {v}" for k, v in info.params.items() if v is not None)
        print(
            f"{info.type}: {info.kind} index of {info.count:,} x {info.dim} ({info.metric}"
            f"{', ' + knob_text if knob_text else ''}) built in {info.build_seconds:.1f} s"
        )

    folder, infos = build_indexes(
        checkpoint_of(args.checkpoint_dir, args),
        types=args.type,
        knobs=knobs,
        metric=args.metric,
        progress=say,
        watch=BuildWatch(step=step, rows=added),
    )
    print(
        f"wrote {folder} (checkpoint version {infos[0].version}, {len(infos)} type(s)); "
        "similar and predict of that version use it, --exact scans every entity"
    )
    return 0
