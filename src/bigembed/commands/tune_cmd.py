"""``bigembed tune CONFIG --output DIR``: hyperparameter search (Optuna), resumable."""

from __future__ import annotations

import argparse
from pathlib import Path

from bigembed.config import add_config_arguments, config_from_args

DESCRIPTION = """\
Search the hyperparameters named in CONFIG's tune section: each trial trains the config with
sampled values (its checkpoint in DIR/trial_N/model), is evaluated on early_stopping.valid_path
every early_stopping.every epochs, and is pruned when it falls below the median of earlier
trials. The study is kept in DIR/study.db: run the same command again to resume it (or, with
--n-trials, to extend it). At the end: a table of the trials, DIR/results.tsv and
DIR/best_config.yaml (the best trial's config, ready for `bigembed train`; its checkpoint_path
is the best trial's checkpoint, so training it reuses or continues the model tune found)."""


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "tune",
        help="hyperparameter search on the validation edges (Optuna), resumable",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_config_arguments(p)
    p.add_argument(
        "-o", "--output", required=True, type=Path, help="directory of the study and its trials"
    )
    p.add_argument("--n-trials", type=int, help="trials in all (default: tune.n_trials)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars inside trials")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from bigembed.writer_lock import hold

    with hold(args.output, "tune"):  # each trial also holds its own checkpoint
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    import yaml
    from tqdm import tqdm

    from bigembed.atomic import atomic_write_text
    from bigembed.output_paths import (
        OutputError,
        read_marker,
        refuse_overlap,
        write_marker,
        writing,
    )
    from bigembed.selection import Tuner

    cfg = config_from_args(args)
    out: Path = args.output
    inputs = [args.config, cfg.entity_path, *cfg.edge_paths]
    if cfg.early_stopping is not None:
        inputs.append(cfg.early_stopping.valid_path)
    refuse_overlap([out], inputs)
    if out.exists():
        if not out.is_dir():
            raise OutputError(f"{out}: not a directory")
        if any(out.iterdir()) and read_marker(out) != "tune":
            raise OutputError(
                f"{out}: exists and is not a bigembed tune directory; choose another --output"
            )
    if args.n_trials is not None and args.n_trials < 1:
        raise OutputError(f"--n-trials {args.n_trials}: must be at least 1")
    tuner = Tuner(
        cfg,
        out,
        source=args.config,
        report=tqdm.write,
        n_trials=args.n_trials,
        progress=not args.no_progress,
    )
    with writing(out, "tune directory"):
        out.mkdir(parents=True, exist_ok=True)
        if read_marker(out) is None:
            write_marker(out, "tune")
    result = tuner.run()
    print()
    print(f"{len(result.rows)} trial(s) ({result.ran} run now); validation {result.metric}:")
    print(result.table())
    with writing(out / "results.tsv", "results"):
        atomic_write_text(out / "results.tsv", result.tsv())
    print(f"Wrote {out / 'results.tsv'}")
    if result.best is None or result.best_config is None:
        print("No trial completed: no best config.")
        return 1
    best_path = out / "best_config.yaml"
    header = (
        f"# bigembed tune: trial {result.best.number}, validation {result.metric} "
        f"{result.best.value:.4f}; its model: {result.best.checkpoint}\n"
    )
    with writing(best_path, "best config"):
        atomic_write_text(best_path, header + yaml.safe_dump(result.best_config, sort_keys=False))
    print(
        f"Best: trial {result.best.number} ({result.metric} {result.best.value:.4f}); its model "
        f"is {result.best.checkpoint} (--version best). Config: {best_path} (its checkpoint_path "
        f"is that model: `bigembed train {best_path}` reuses it, more epochs continue it)"
    )
    return 0
