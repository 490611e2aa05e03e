"""Time to quality on FB15k-237: wall time from `bigembed train` start to a filtered test MRR.

bigembed trains a recipe of ``examples/`` (default ``examples/fb15k237.yaml``) with a snapshot
of the checkpoint after every epoch (``checkpoint_preservation_interval: 1``); PBG 1.0 trains
the same config translated by bench/pbg_peer.py (PBG's own keys; the ones it lacks, such as
the N3 regularizer, are named and dropped) on the same imported edges, keeping every epoch's
version the same way. The time of epoch e is the wall time from the training process's start
to the line the trainer prints when epoch e is done (bigembed: its committed-step summary;
PBG: "Finished epoch e", before PBG writes that epoch's checkpoint). After both runs, each
epoch's checkpoint (PBG's converted by ``bigembed.interop.pbg.from_pbg``) is ranked by the same
filtered evaluation (test edges against every entity, both sides, filtered by train + valid +
test), outside the timed runs: evaluation time is not in the training clock. Prints one table:
each system's first epoch reaching ``--threshold`` (default 0.30) and its time, PBG's best
epoch (its plateau, if the curve flattened), and both curves.

``--lock FILE`` takes an exclusive ``flock`` on FILE around each training process only (so
each hold stays short: ``--epochs`` and ``--pbg-epochs`` bound them); the evaluations run
after both runs, at nice 19 (they are not timed).

    python bench/time_to_quality.py --epochs 8 --pbg-epochs 7 --lock /work/cpu.lock
    python bench/time_to_quality.py --epochs 6 --no-pbg
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pbg_peer
from side_by_side import ROOT, pbg_to_bigembed, run_pbg
from train_bench import DATA, filtered_test

CONFIG = ROOT / "examples" / "fb15k237.yaml"
_EPOCH_DONE = re.compile(r"^\s*epoch (\d+)/\d+: loss")


@contextlib.contextmanager
def locked(path: Path | None) -> Iterator[None]:
    """An exclusive flock on ``path`` (the same lock as ``flock -x path``) while inside."""
    if path is None:
        yield
        return
    with path.open("a") as f:
        waited = time.perf_counter()
        fcntl.flock(f, fcntl.LOCK_EX)
        print(f"lock {path} taken after {time.perf_counter() - waited:.0f} s wait", flush=True)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def train_timed(config: Path, overrides: list[str], ckpt: Path, log: Path) -> dict[int, float]:
    """Run ``bigembed train`` (fresh ``ckpt``); returns {epoch: seconds from the process start
    to the epoch's summary line}."""
    subprocess.run(["rm", "-rf", str(ckpt)], check=True)
    args = [x for o in overrides for x in ("-p", o)]
    cmd = [sys.executable, "-u", "-m", "bigembed.cli", "train", str(config), *args]
    done: dict[int, float] = {}
    t0 = time.perf_counter()
    with (
        log.open("w") as out,
        subprocess.Popen(
            [*cmd, "--no-progress"], cwd=ROOT, stdout=subprocess.PIPE, text=True
        ) as proc,
    ):
        assert proc.stdout is not None
        for line in proc.stdout:
            now = time.perf_counter() - t0
            out.write(f"{now:9.3f} {line}")
            if m := _EPOCH_DONE.match(line):
                done[int(m[1])] = now
    if proc.returncode != 0:
        sys.exit(f"bigembed train failed (exit {proc.returncode}); its log: {log}")
    return done


def pbg_epoch_checkpoint(ckpt: Path, epoch: int, out: Path) -> Path:
    """A PBG checkpoint directory whose committed version is ``epoch`` (one edge path and one
    chunk: version = epoch), made of symlinks to the files PBG kept (preservation interval 1)."""
    subprocess.run(["rm", "-rf", str(out)], check=True)
    out.mkdir(parents=True)
    for f in ckpt.iterdir():
        if f.is_file() and f.name != "checkpoint_version.txt":
            (out / f.name).symlink_to(f.resolve())
    (out / "checkpoint_version.txt").write_text(f"{epoch}\n")
    return out


def first_reaching(curve: dict[int, float], threshold: float) -> int | None:
    return next((e for e in sorted(curve) if curve[e] >= threshold), None)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", type=Path, default=CONFIG)
    parser.add_argument("--epochs", type=int, default=8, help="bigembed's epochs (a cap)")
    parser.add_argument("--pbg-epochs", type=int, default=7, help="PBG's epochs (a cap)")
    parser.add_argument("--threshold", type=float, default=0.30)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/bigembed_ttq"))
    parser.add_argument("--lock", type=Path, default=None, help="flock this file per training")
    pbg_peer.add_arguments(parser)
    args = parser.parse_args()

    from bigembed.config import load_config

    work: Path = args.workdir
    work.mkdir(parents=True, exist_ok=True)
    ents = work / "entities"
    paths = [work / s for s in ("train", "valid", "test")]
    common = [f"entity_path={ents}", f"workers={args.workers}"]
    if not (ents / "manifest.json").exists():
        cmd = [sys.executable, "-m", "bigembed.cli", "import", str(args.config)]
        cmd += [x for o in common for x in ("-p", o)]
        cmd += ["-p", "edge_paths=" + ",".join(map(str, paths))]
        cmd += [str(DATA / f"{s}.txt.gz") for s in ("train", "valid", "test")]
        subprocess.run([*cmd, "--no-progress", "--force"], check=True, cwd=ROOT)

    ckpt = work / "model"
    overrides = [
        *common,
        f"edge_paths={paths[0]}",
        f"checkpoint_path={ckpt}",
        f"num_epochs={args.epochs}",
        "checkpoint_preservation_interval=1",
    ]
    with locked(args.lock):
        be_time = train_timed(args.config, overrides, ckpt, work / "bigembed_train.log")
    times: dict[str, dict[int, float]] = {"bigembed": be_time}
    pbg_done = None
    if not args.no_pbg:
        cfg = load_config(
            args.config,
            overrides=[
                *common,
                f"num_epochs={args.pbg_epochs}",
                "checkpoint_preservation_interval=1",
            ],
        )
        with locked(args.lock):
            pbg_done = run_pbg(args.pbg_venv, cfg, ents, paths[0], work / "pbg")

    os.nice(19)  # the evaluations are not timed: out of the lock, they yield the CPU
    curves: dict[str, dict[int, float]] = {"bigembed": {}}
    for e in sorted(be_time):
        curves["bigembed"][e] = filtered_test(ckpt / f"epoch_{e}", paths)[0]
        print(f"bigembed epoch {e}: {be_time[e]:.1f} s, filtered MRR {curves['bigembed'][e]:.4f}")
    if pbg_done is not None:
        pbg, pbg_ckpt, pbg_ents = pbg_done
        curves["PBG 1.0"], times["PBG 1.0"] = {}, {}
        for e in range(1, len(pbg.epoch_end) + 1):
            times["PBG 1.0"][e] = pbg.epoch_end[e - 1]
            one = pbg_epoch_checkpoint(pbg_ckpt, e, work / "pbg" / f"epoch_{e}")
            converted = pbg_to_bigembed(one, pbg_ents, work / "pbg" / f"epoch_{e}_conv")
            curves["PBG 1.0"][e] = filtered_test(converted, paths)[0]
            print(f"PBG epoch {e}: {times['PBG 1.0'][e]:.1f} s, MRR {curves['PBG 1.0'][e]:.4f}")

    print()
    print(
        f"FB15k-237 time to quality, {args.config.name}: {args.workers} workers, "
        f"{os.cpu_count()} cores, fp32; filtered test MRR (both sides, train+valid+test filter)"
    )
    head = ("system", "epochs run", f"first epoch >= {args.threshold}", "time to it s", "best")
    print("| " + " | ".join(head) + " | curve (epoch: s, MRR) |")
    print("|" + "---|" * (len(head) + 1))
    for name, curve in curves.items():
        first = first_reaching(curve, args.threshold)
        best = max(curve, key=lambda e: curve[e])
        reach = "not reached" if first is None else str(first)
        at = "—" if first is None else f"{times[name][first]:.1f}"
        best_text = f"{curve[best]:.4f} (epoch {best}, {times[name][best]:.1f} s)"
        pts = ", ".join(f"{e}: {times[name][e]:.0f} s {curve[e]:.4f}" for e in sorted(curve))
        print(f"| {name} | {len(curve)} | {reach} | {at} | {best_text} | {pts} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
