"""Growing a trained model on FB15k-237 against a full retrain (issue 28, docs/growing.md).

10% of the training graph's entities (seeded) are held out with every training edge touching
them. The model of ``--config`` (default ``examples/fb15k237.yaml``) is trained ``--epochs``
epochs on the rest (its old-entity MRR is printed: what freezing the old rows would keep); then
the held-out entities come back: ``bigembed import --extend`` with the whole training graph and
``bigembed train`` for ``--update-epochs`` more epochs (``growth.init``, ``growth.freeze``,
``growth.edges``, ``growth.replay_fraction``, ``growth.init_state`` as given). A full retrain
imports the whole training graph and trains ``--epochs`` epochs from scratch. Both are ranked by
the same filtered evaluation (``bigembed eval``: test edges against every entity, both sides,
filtered by train + valid + test) on the test edges touching a new entity and on the others
(both ends old).
Printed: each MRR and the wall time of the update (extension import + growth training) against
the retrain (import + training), also in CPU seconds (robust to the machine's other load); the
base training is not counted in either. Several ``--update-epochs`` / ``--replay-fraction``
values run one update each, every one from its own copy of the base model. ``--steps`` runs a
part (the others' models and timings are those of an earlier run in ``--work``).

    python bench/grow_bench.py --epochs 20 --update-epochs 4 --edges new --replay-fraction 0.5
    python bench/grow_bench.py --update-epochs 4 8 --replay-fraction 0 0.1 --steps updates,eval
    python bench/grow_bench.py --epochs 20 --update-epochs 4 --edges all   # every edge
    python bench/grow_bench.py --epochs 20 --update-epochs 4 --freeze old_entities
    python bench/grow_bench.py --quick    # seconds: a check that it runs (tiny model, 1 epoch)
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gzip
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import yaml

from bigembed.datasets import fb15k237_files

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "examples" / "fb15k237.yaml"
QUICK = {"dimension": 16, "num_uniform_negs": 50, "workers": 1}


@dataclass
class Timing:
    """Wall seconds and CPU seconds of a block: user + system time of the processes it ran,
    which the machine's other load inflates far less than the wall time."""

    wall: float = 0.0
    cpu: float = 0.0
    at: str = ""
    load: str = ""


class Timings:
    """The timed steps of this and earlier runs in the same ``--work`` (a JSON file), so that a
    run with ``--steps`` reuses the models and timings of the steps it leaves out."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.done = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
        # Adopt the commands' orphans (multiprocessing's fork server, which reaps the Hogwild
        # workers, outlives a command's main process) so that their CPU time is counted.
        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER

    @contextlib.contextmanager
    def of(self, name: str) -> Iterator[None]:
        wall, cpu = time.perf_counter(), _children_cpu()
        yield
        spent = Timing(
            time.perf_counter() - wall,
            _children_cpu() - cpu,
            time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            " ".join(f"{x:.1f}" for x in os.getloadavg()),
        )
        self.done[name] = asdict(spent)
        self.path.write_text(json.dumps(self.done, indent=1), encoding="utf-8")
        print(
            f"{name}: {spent.wall:.1f} s wall, {spent.cpu:.1f} s CPU (finished {spent.at}, "
            f"load {spent.load})",
            flush=True,
        )

    def get(self, name: str) -> Timing | None:
        return Timing(**self.done[name]) if name in self.done else None


def _children_cpu() -> float:
    """CPU seconds of the finished child processes (and of the orphans adopted), after reaping
    the orphans still exiting."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            time.sleep(0.1)
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _read(path: Path) -> list[tuple[str, str, str]]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [tuple(line.rstrip("\n").split("\t")) for line in f if line.strip()]  # type: ignore[misc]


def _write(path: Path, edges: list[tuple[str, str, str]]) -> Path:
    path.write_text("".join("\t".join(e) + "\n" for e in edges), encoding="utf-8")
    return path


def _cli(*argv: str) -> None:
    """One ``bigembed`` command as its own process (as a user runs it), its output shown only
    when it fails."""
    done = subprocess.run(
        [sys.executable, "-m", "bigembed.cli", *argv], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise SystemExit(f"bigembed {' '.join(argv)} failed:\n{done.stdout}{done.stderr}")


def _config(work: Path, name: str, base: dict, overrides: dict) -> Path:
    data = dict(base)
    data.update(overrides)
    data["entity_path"] = str(work / name / "entities")
    data["edge_paths"] = [str(work / name / "train")]
    data["checkpoint_path"] = str(work / name / "model")
    data["eval_fraction"] = 0
    path = work / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


def _mrr(config: Path, edges: Path, filters: list[Path], work: Path, *extra: str) -> float:
    """Filtered MRR of ``edges`` on the latest version of ``config``'s model (an evaluation
    newer than that version is reused)."""
    report = work / f"eval-{config.stem}-{edges.stem}.json"
    version = work / config.stem / "model" / "checkpoint_version.txt"
    if not report.exists() or report.stat().st_mtime < version.stat().st_mtime:
        flags = ["--output", str(report), "--force", "--no-progress", "--version", "latest", *extra]
        _cli(
            "eval", str(config), "--edges", str(edges), "--filter-edges", *map(str, filters), *flags
        )
    data = json.loads(report.read_text(encoding="utf-8"))
    return float(data["overall"]["filtered"]["mrr"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, default=CONFIG)
    parser.add_argument("--work", type=Path, default=ROOT / "bench" / "work" / "grow")
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument(
        "--update-epochs", type=int, nargs="+", default=[4], help="one update per value"
    )
    parser.add_argument("--held-out", type=float, default=0.10)
    parser.add_argument("--init", choices=("random", "neighbors"), default="neighbors")
    parser.add_argument(
        "--init-state", choices=("zero", "old_mean"), default="zero", help="growth.init_state"
    )
    parser.add_argument("--freeze", default="", help="growth.freeze, comma-separated")
    parser.add_argument("--edges", choices=("all", "new"), default="new", help="growth.edges")
    parser.add_argument(
        "--replay-fraction", type=float, nargs="+", default=[0.5], help="one update per value"
    )
    parser.add_argument(
        "--steps",
        default="base,updates,retrain,eval",
        help="the steps to run; the others' models and timings are those of an earlier run in "
        "--work (same --epochs, seed and config)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="tiny model, 1+1 epochs, 500 tests")
    args = parser.parse_args()
    if args.quick:
        args.epochs, args.update_epochs = 1, [1]
    work = args.work
    work.mkdir(parents=True, exist_ok=True)
    base = yaml.safe_load(args.config.read_text(encoding="utf-8"))
    if args.quick:
        base.update(QUICK)

    files = fb15k237_files()
    train, valid, test = (_read(files[s]) for s in ("train", "valid", "test"))
    names = sorted({e[0] for e in train} | {e[2] for e in train})
    rng = np.random.default_rng(args.seed)
    held = set(rng.choice(names, int(len(names) * args.held_out), replace=False).tolist())
    old_train = [e for e in train if e[0] not in held and e[2] not in held]
    known = set(names)
    test = [e for e in test if e[0] in known and e[2] in known]
    test_new = [e for e in test if e[0] in held or e[2] in held]
    test_old = [e for e in test if e[0] not in held and e[2] not in held]
    if args.quick:
        test_new, test_old = test_new[:500], test_old[:500]
    old_path = _write(work / "old_train.tsv", old_train)
    full_path = _write(work / "train.tsv", train)
    valid = [e for e in valid if e[0] in known and e[2] in known]
    filters = [full_path, _write(work / "valid.tsv", valid), _write(work / "test.tsv", test)]
    new_path = _write(work / "test_new.tsv", test_new)
    olds_path = _write(work / "test_old.tsv", test_old)
    print(
        f"{len(held):,} of {len(names):,} entities held out; training edges {len(old_train):,} "
        f"-> {len(train):,}; test edges {len(test_new):,} touching a new entity, "
        f"{len(test_old):,} old",
        flush=True,
    )

    quiet = ["--no-progress"]
    steps = set(args.steps.split(","))
    timings = Timings(work / "timings.json")
    start = _config(work, "base", base, {"num_epochs": args.epochs})
    if "base" in steps:
        _cli("import", str(start), str(old_path), "--force", "--allow-orphans", *quiet)
        with timings.of("base"):
            _cli("train", str(start), "--fresh", *quiet)

    # Each update starts from its own copy of the base (its entity store, edges and model).
    updates: dict[str, Path] = {}
    for epochs in args.update_epochs:
        for replay in args.replay_fraction:
            growth = {
                "init": args.init,
                "init_state": args.init_state,
                "freeze": [f for f in args.freeze.split(",") if f],
                "edges": args.edges,
                "replay_fraction": replay,
            }
            name = f"grow-{epochs}-{args.edges}-{replay:g}"
            if args.freeze:
                name += "-frozen-" + args.freeze.replace(",", "-")
            if args.init_state != "zero":
                name += f"-state-{args.init_state}"
            grow = _config(work, name, base, {"num_epochs": args.epochs, "growth": growth})
            updates[name] = grow
            if "updates" not in steps:
                continue
            shutil.rmtree(work / name, ignore_errors=True)
            shutil.copytree(work / "base", work / name)
            with timings.of(name):
                _cli("import", str(grow), str(full_path), "--extend", *quiet)
                _cli("train", str(grow), "-p", f"num_epochs={args.epochs + epochs}", *quiet)

    full = _config(work, "retrain", base, {"num_epochs": args.epochs})
    if "retrain" in steps:
        with timings.of("retrain"):
            _cli("import", str(full), str(full_path), "--force", "--allow-orphans", *quiet)
            _cli("train", str(full), "--fresh", *quiet)
    if "eval" not in steps:
        return 0

    base_old = _mrr(start, olds_path, filters, work, "--skip-unknown")  # filters: new entities
    print(f"base model ({args.epochs} epochs on the old graph): old-entity MRR {base_old:.4f}")
    retrain = timings.get("retrain")
    print(
        f"{'model':<28} {'new MRR':>8} {'old MRR':>8} {'wall s':>8} {'CPU s':>8} "
        f"{'wall':>6} {'CPU':>6}"
    )
    for name, config in [*updates.items(), ("retrain", full)]:
        if not (work / name / "model").exists():
            print(f"{name:<28} (not trained in this --work)")
            continue
        new, old = _mrr(config, new_path, filters, work), _mrr(config, olds_path, filters, work)
        spent, times = timings.get(name), "  (not timed in this --work)"
        if spent is not None:
            times = f" {spent.wall:>8.1f} {spent.cpu:>8.1f}"
            if retrain is not None:
                times += f" {spent.wall / retrain.wall:>6.1%} {spent.cpu / retrain.cpu:>6.1%}"
        print(f"{name:<28} {new:>8.4f} {old:>8.4f}{times}", flush=True)
    print(
        "grow-EPOCHS-EDGES-REPLAY: the update (extension import + training) and its share of the "
        "retrain (import + training), wall and CPU; targets: new MRR >= retrain - 0.02, old MRR "
        ">= retrain - 0.01, time <= 20%"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
