"""Evaluation speed: filtered full ranking of FB15k-237 test (20,466 edges x 14,541 entities x 2).

Imports the bundled dataset once (like train_bench.py, into the same work directory), takes a
checkpoint (``--checkpoint``, else the train benchmark's 1-epoch model if it exists, else an
untrained one with the example config's shapes: ranking costs the same whatever the values),
and prints one table: the stages of an in-process evaluation and the wall time of the whole
``bigembed eval`` command (Python and torch start-up included), best and median of
``--repeat`` runs, plus the load average (the machine may be shared).

    python bench/eval_bench.py
    python bench/eval_bench.py --checkpoint /tmp/bigembed_bench/model_float32_1ep --repeat 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "examples" / "fb15k237.yaml"
DATA = ROOT / "src" / "bigembed" / "datasets" / "fb15k237"
SPLITS = ("train", "valid", "test")


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "bigembed.cli", *args]


def ensure_import(work: Path) -> None:
    ents = work / "entities"
    if (ents / "manifest.json").exists() and all(
        (work / s / "manifest.json").exists() for s in SPLITS
    ):
        return
    paths = ",".join(str(work / s) for s in SPLITS)
    subprocess.run(
        cli(
            "import",
            str(CONFIG),
            "-p",
            f"entity_path={ents}",
            "-p",
            f"edge_paths={paths}",
            *(str(DATA / f"{s}.txt.gz") for s in SPLITS),
            "--no-progress",
            "--force",
        ),
        check=True,
        cwd=ROOT,
    )


def untrained_checkpoint(work: Path, cfg) -> Path:
    """A committed checkpoint with random embeddings and the config's model (not trained)."""
    from bigembed.checkpoints import (
        VERSION_FILE,
        CheckpointMetadata,
        CheckpointStore,
        IterationPosition,
    )
    from bigembed.config import config_to_dict, model_spec
    from bigembed.model import ScoringModel
    from bigembed.storage import EntityStore

    path = Path(cfg.checkpoint_path)
    if (path / VERSION_FILE).exists():
        return path
    ents = EntityStore(cfg.entity_path)
    model = ScoringModel(model_spec(cfg, ents.num_relations))
    gen = torch.Generator().manual_seed(0)
    store = CheckpointStore(path)
    counts = {}
    for t in cfg.entities:
        for p in range(ents.num_partitions(t)):
            n = ents.count(t, p)
            emb = torch.randn((n, cfg.entity_dimension(t)), generator=gen) * 0.1
            store.save_partition(t, p, 1, emb, torch.zeros(n))
            counts[(t, p)] = n
    store.save_model(1, {"model": model.state_dict(), "optimizer": None})
    store.write_metadata(
        CheckpointMetadata(
            version=1,
            config=config_to_dict(cfg),
            iteration=IterationPosition(),
            entity_counts=counts,
            num_relations=ents.num_relations,
            relation_names=ents.relation_names(),
        )
    )
    store.commit(1)
    return path


def in_process(cfg, ckpt: Path, work: Path) -> dict[str, float]:
    """Stage timings of one evaluation, with the same parts `bigembed eval` uses."""
    from bigembed.checkpoints import EntityTables, load_trained
    from bigembed.eval import EdgeLoader
    from bigembed.ranking import EvalEdges, KnownEdges, rank_edges, summarize

    t0 = time.perf_counter()
    trained = load_trained(ckpt)
    loader = EdgeLoader(trained, entity_path=cfg.entity_path)
    sets = {s: loader.load(work / s).edges for s in SPLITS}
    t1 = time.perf_counter()
    every = EvalEdges.concat(list(sets.values()))
    known = KnownEdges(every.lhs, every.rel, every.rhs, trained.model.num_relations)
    t2 = time.perf_counter()
    res = rank_edges(
        trained.model, EntityTables(trained), trained.partition_bases, sets["test"], known
    )
    t3 = time.perf_counter()
    assert res.lhs is not None and res.rhs is not None  # both sides ranked
    ranks = np.concatenate([res.lhs.filtered, res.rhs.filtered])
    return {
        "open": t1 - t0,
        "filters": t2 - t1,
        "ranking": t3 - t2,
        "total": t3 - t0,
        "edges": len(sets["test"]),
        "known": known.num_edges,
        "entities": int(trained.partition_bases[cfg.relations[0].rhs][-1]),
        "mrr": summarize(ranks)["mrr"],
    }


def command(ckpt: Path, cfg, work: Path, out: Path) -> float:
    t = time.perf_counter()
    subprocess.run(
        cli(
            "eval",
            str(CONFIG),
            "-p",
            f"entity_path={cfg.entity_path}",
            "-p",
            f"checkpoint_path={ckpt}",
            "-p",
            f"edge_paths={work / 'train'}",
            "--edges",
            str(work / "test"),
            "--filter-edges",
            str(work / "train"),
            str(work / "valid"),
            "--no-progress",
            "--output",
            str(out),
            "--force",  # the report of the previous repeat is replaced
        ),
        check=True,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
    )
    return time.perf_counter() - t


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workdir", default="/tmp/bigembed_bench")
    parser.add_argument("--checkpoint", help="a trained FB15k-237 checkpoint directory")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    from bigembed.config import load_config

    work = Path(args.workdir)
    ensure_import(work)
    trained_default = work / "model_float32_1ep"
    ckpt = (
        Path(args.checkpoint)
        if args.checkpoint
        else (trained_default if trained_default.exists() else work / "model_untrained")
    )
    cfg = load_config(
        CONFIG,
        [
            f"entity_path={work / 'entities'}",
            f"edge_paths={work / 'train'}",
            f"checkpoint_path={ckpt}",
        ],
    )
    untrained = not (ckpt / "checkpoint_version.txt").exists()
    if untrained:
        untrained_checkpoint(work, cfg)
    load_before = os.getloadavg()[0]
    runs = [in_process(cfg, ckpt, work) for _ in range(args.repeat)]
    cmd = [command(ckpt, cfg, work, work / "eval_bench.json") for _ in range(args.repeat)]
    report = json.loads((work / "eval_bench.json").read_text())

    def cell(values: list[float]) -> str:
        return f"{min(values):8.2f} {statistics.median(values):8.2f}"

    r0 = runs[0]
    pairs = 2 * r0["edges"] * r0["entities"]
    print(
        f"FB15k-237 test, filtered full ranking: {r0['edges']:,} edges x 2 sides x "
        f"{r0['entities']:,} entities; {r0['known']:,} known edges; "
        f"{torch.get_num_threads()} threads, "
        f"load average {load_before:.2f} at start"
    )
    print(f"checkpoint: {ckpt}{' (untrained: timing only)' if untrained else ''}")
    print(f"{'stage':<44}{'best s':>8} {'median':>8}")
    for key, label in (
        ("open", "open checkpoint + load edge sets"),
        ("filters", "filter index"),
        ("ranking", "ranking (both sides, raw + filtered)"),
        ("total", "in-process total"),
    ):
        print(f"{label:<44}{cell([r[key] for r in runs])}")
    print(f"{'`bigembed eval` command (wall, incl. start-up)':<44}{cell(cmd)}")
    best = min(r["ranking"] for r in runs)
    print(f"{'scores per second (ranking)':<44}{pairs / best / 1e6:8.0f}M")
    print(f"{'filtered MRR (command report)':<44}{report['overall']['filtered']['mrr']:8.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
