"""Growing a trained model on FB15k-237 against a full retrain (issue 28, docs/growing.md).

10% of the training graph's entities (seeded) are held out with every training edge touching
them. The model of ``--config`` (default ``examples/fb15k237.yaml``) is trained ``--epochs``
epochs on the rest; then the held-out entities come back: ``bigembed import --extend`` with the
whole training graph and ``bigembed train`` for ``--update-epochs`` more epochs
(``growth.init``, ``growth.freeze`` as given). A full retrain imports the whole training graph
and trains ``--epochs`` epochs from scratch. Both are ranked by the same filtered evaluation
(``bigembed eval``: test edges against every entity, both sides, filtered by train + valid +
test) on the test edges touching a new entity and on the others (both ends old). Printed: each
MRR and the wall time of the update (extension import + growth training) against the retrain
(import + training); the base training is not counted in either.

    python bench/grow_bench.py --epochs 20 --update-epochs 4 --init neighbors
    python bench/grow_bench.py --epochs 20 --update-epochs 4 --freeze old_entities
    python bench/grow_bench.py --quick    # seconds: a check that it runs (tiny model, 1 epoch)
"""

from __future__ import annotations

import argparse
import gzip
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import yaml

from bigembed.datasets import fb15k237_files

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "examples" / "fb15k237.yaml"
QUICK = {"dimension": 16, "num_uniform_negs": 50, "workers": 1}


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


def _mrr(config: Path, edges: Path, filters: list[Path], work: Path) -> float:
    report = work / f"eval-{config.stem}-{edges.stem}.json"
    _cli("eval", str(config), "--edges", str(edges), "--filter-edges", *map(str, filters),
         "--output", str(report), "--force", "--no-progress", "--version", "latest")  # fmt: skip
    data = json.loads(report.read_text(encoding="utf-8"))
    return float(data["overall"]["filtered"]["mrr"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, default=CONFIG)
    parser.add_argument("--work", type=Path, default=ROOT / "bench" / "work" / "grow")
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--update-epochs", type=int, default=4)
    parser.add_argument("--held-out", type=float, default=0.10)
    parser.add_argument("--init", choices=("random", "neighbors"), default="neighbors")
    parser.add_argument("--freeze", default="", help="growth.freeze, comma-separated")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="tiny model, 1+1 epochs, 500 tests")
    args = parser.parse_args()
    if args.quick:
        args.epochs, args.update_epochs = 1, 1
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

    growth = {"init": args.init, "freeze": [f for f in args.freeze.split(",") if f]}
    grow = _config(work, "grow", base, {"num_epochs": args.epochs, "growth": growth})
    full = _config(work, "retrain", base, {"num_epochs": args.epochs})
    quiet = ["--no-progress"]
    _cli("import", str(grow), str(old_path), "--force", "--allow-orphans", *quiet)
    t0 = time.perf_counter()
    _cli("train", str(grow), "--fresh", *quiet)
    base_s = time.perf_counter() - t0

    t0 = time.perf_counter()
    _cli("import", str(grow), str(full_path), "--extend", *quiet)
    _cli("train", str(grow), "-p", f"num_epochs={args.epochs + args.update_epochs}", *quiet)
    update_s = time.perf_counter() - t0

    t0 = time.perf_counter()
    _cli("import", str(full), str(full_path), "--force", "--allow-orphans", *quiet)
    _cli("train", str(full), "--fresh", *quiet)
    retrain_s = time.perf_counter() - t0

    rows = {}
    for label, config in (("grown", grow), ("retrain", full)):
        rows[label] = (
            _mrr(config, new_path, filters, work),
            _mrr(config, olds_path, filters, work),
        )
    print(f"base training ({args.epochs} epochs on the old graph): {base_s:.1f} s")
    print(f"{'model':<10} {'new-entity MRR':>15} {'old-entity MRR':>15} {'wall s':>8}")
    print(f"{'grown':<10} {rows['grown'][0]:>15.4f} {rows['grown'][1]:>15.4f} {update_s:>8.1f}")
    print(
        f"{'retrain':<10} {rows['retrain'][0]:>15.4f} {rows['retrain'][1]:>15.4f} {retrain_s:>8.1f}"
    )
    print(
        f"update/retrain time {update_s / retrain_s:.0%}; new-entity MRR gap "
        f"{rows['retrain'][0] - rows['grown'][0]:+.4f}, old-entity "
        f"{rows['retrain'][1] - rows['grown'][1]:+.4f} (retrain - grown)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
