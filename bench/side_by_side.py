"""The rows and the table of the training benches: bigembed's runs and PBG's, same run.

Steady state is epochs 2+ (epoch 1 alone when the run has one epoch): epoch 1 also starts the
Hogwild workers, and PBG sleeps ``hogwild_delay`` per bucket in it.
"""

from __future__ import annotations

import math
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pbg_peer

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Row:
    mode: str
    epochs: int
    s_per_epoch: float  # steady state
    wall: float  # the whole training process
    eps: float  # edges/s, steady state
    gflops: float
    of_peak: float
    mrr: float = math.nan
    hits10: float = math.nan


HEAD = (
    "system / mode",
    "epochs",
    "s/epoch (2+)",
    "wall s",
    "edges/s (2+)",
    "GFLOP/s",
    "of mm peak",
    "filtered MRR",
    "Hits@10",
    "vs PBG",
)


def flop_per_edge(cfg: Any) -> float:
    """Matmul FLOPs of one edge: forward + 2 backward products, per corrupted side."""
    negs = cfg.num_batch_negs + cfg.num_uniform_negs
    sides = 2 - int(cfg.disable_lhs_negs) - int(cfg.disable_rhs_negs)
    return 6.0 * cfg.dimension * negs * sides


def steady(epoch_seconds: list[float], epoch_edges: list[int]) -> tuple[float, float]:
    """(seconds per epoch, edges/s) over epochs 2+ (epoch 1 if it is the only one)."""
    first = 1 if len(epoch_seconds) > 1 else 0
    secs, edges = epoch_seconds[first:], epoch_edges[first:]
    return sum(secs) / len(secs), sum(edges) / sum(secs)


def bigembed_epochs(ckpt: Path) -> tuple[list[float], list[int]]:
    """Each epoch's seconds and edges from a bigembed checkpoint's training log."""
    from bigembed.checkpoints import CheckpointStore
    from bigembed.train import read_training_log

    steps = read_training_log(CheckpointStore(ckpt)).steps
    return [s.seconds for s in steps], [s.stats.count for s in steps]


def train(config: Path, overrides: list[str], ckpt: Path) -> float:
    """Run ``bigembed train`` (a fresh ``ckpt``) in a subprocess; returns its wall time."""
    subprocess.run(["rm", "-rf", str(ckpt)], check=True)
    args = [x for o in overrides for x in ("-p", o)]
    cmd = [sys.executable, "-m", "bigembed.cli", "train", str(config), *args, "--no-progress"]
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, cwd=ROOT)
    return time.perf_counter() - t0


def run_pbg(
    venv: Path, cfg: Any, entity_path: Path, edge_path: Path, work: Path
) -> tuple[pbg_peer.PbgRun, Path, Path] | None:
    """Train PBG on ``cfg`` over bigembed's imported edges; prints what it does. Returns the
    run, PBG's checkpoint and PBG's entity dir, or None (no venv)."""
    py = pbg_peer.pbg_python(venv)
    if py is None:
        print(pbg_peer.skip_line(venv))
        return None
    work.mkdir(parents=True, exist_ok=True)
    ent_dir, edge_dir = pbg_peer.export_edges(py, entity_path, edge_path, work / "data")
    ckpt = work / "model"
    config, dropped = pbg_peer.pbg_config(py, cfg, ent_dir, edge_dir, ckpt)
    if dropped:
        print(f"PBG 1.0 has no key for: {', '.join(dropped)} (not applied to PBG)")
    run = pbg_peer.train(py, config, work, work / "train.log")
    return run, ckpt, ent_dir


def pbg_to_bigembed(ckpt: Path, ent_dir: Path, work: Path) -> Path:
    """PBG's checkpoint converted to bigembed's layout (for the same evaluation)."""
    from bigembed.interop import from_pbg

    out = work / "converted"
    from_pbg(ckpt, ent_dir, out / "model", out / "entities", force=True)
    return out / "model"


def print_table(title: list[str], rows: list[Row], pbg_eps: dict[str, float]) -> None:
    """The title lines, then the table; ``pbg_eps``: PBG's steady edges/s of each row's mode
    (rows without one get no ratio)."""
    print()
    for line in title:
        print(line)
    print("| " + " | ".join(HEAD) + " |")
    print("|" + "---|" * len(HEAD))
    for r in rows:
        ratio = f"{r.eps / pbg_eps[r.mode]:.2f}x" if r.mode in pbg_eps else "—"
        quality = "— | —" if math.isnan(r.mrr) else f"{r.mrr:.4f} | {r.hits10:.4f}"
        print(
            f"| {r.mode} | {r.epochs} | {r.s_per_epoch:.1f} | {r.wall:.1f} | {r.eps:,.0f} | "
            f"{r.gflops:.0f} | {r.of_peak:.0%} | {quality} | {ratio} |"
        )


def epoch_breakdown(ckpt: Path) -> str:
    """Where bigembed's steady-state epoch time goes, from the per-bucket timing of its training
    log (epochs 2+): loading buckets, the workers' busy time (mean over workers), the pool's
    idle time (the workers' wall time less their mean busy time: dispatch, start-up, the last
    batches' imbalance), the withheld-edge eval and the observers (the rest of each bucket),
    and the step's own work outside buckets (saving the checkpoint)."""
    from bigembed.checkpoints import CheckpointStore
    from bigembed.train import read_training_log

    log = read_training_log(CheckpointStore(ckpt))
    steps = log.steps[1:] if len(log.steps) > 1 else log.steps
    parts = {"load": 0.0, "workers busy": 0.0, "pool idle": 0.0, "eval + observers": 0.0}
    total = outside = 0.0
    for step in steps:
        total += step.seconds
        buckets = log.buckets_of(step.at.version)
        outside += step.seconds - sum(b.seconds for b in buckets)
        for b in buckets:
            if b.timing is None:
                continue
            t = b.timing
            busy = sum(t.worker_seconds) / max(len(t.worker_seconds), 1)
            parts["load"] += t.load_seconds
            parts["workers busy"] += busy
            parts["pool idle"] += t.train_seconds - busy
            parts["eval + observers"] += b.seconds - t.load_seconds - t.train_seconds
    parts["step outside buckets"] = outside
    n = max(len(steps), 1)
    body = ", ".join(f"{k} {v / n:.2f} s ({v / max(total, 1e-9):.0%})" for k, v in parts.items())
    return f"epoch {total / n:.2f} s = {body}"
