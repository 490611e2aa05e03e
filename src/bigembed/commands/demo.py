"""``bigembed demo``: import the bundled FB15k-237, train on it, evaluate it, show the results.

Every stage runs the same code as the corresponding command (`import`, `train`, `eval`), so the
demo is also a smoke test of a real installation. Re-running it reuses what is already there
(the import and a finished checkpoint); ``--fresh`` starts over: it imports again (replacing
only the demo's own stores) and starts the checkpoint over (deleting only what bigembed
provably wrote there), never the rest of the work directory.
"""

from __future__ import annotations

import argparse
import contextlib
import time
from pathlib import Path

from tqdm import tqdm

from bigembed.datasets import fb15k237_demo_config, fb15k237_files


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "demo",
        help="train and evaluate on the bundled FB15k-237 (the main job of the README)",
        description="Import the bundled FB15k-237, train PBG's FB15k config (smaller) on it, "
        "evaluate filtered link prediction on its test set and show a few predictions.",
    )
    p.add_argument("--workdir", default="demo_out", help="where data, model and results go")
    p.add_argument("--epochs", type=int, default=None, help="override num_epochs")
    p.add_argument("--dimension", type=int, default=None, help="override dimension")
    p.add_argument("--workers", type=int, default=None, help="override workers")
    p.add_argument(
        "--fresh",
        action="store_true",
        help="import and train again (replaces the demo's own stores and checkpoint, nothing else)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=run)


def _overrides(args: argparse.Namespace, work: Path, edge_paths: list[Path]) -> list[str]:
    out = [
        f"entity_path={work / 'entities'}",
        "edge_paths=" + ",".join(str(p) for p in edge_paths),
        f"checkpoint_path={work / 'model'}",
    ]
    for key in ("epochs", "dimension", "workers"):
        value = getattr(args, key)
        if value is not None:
            out.append(f"{'num_epochs' if key == 'epochs' else key}={value}")
    return out


def run(args: argparse.Namespace) -> int:
    from bigembed.checkpoints import ModelMismatchError, start_over
    from bigembed.config import load_config
    from bigembed.importing import ImportOptions, run_import
    from bigembed.train import train
    from bigembed.writer_lock import hold

    work = Path(args.workdir).resolve()
    if args.fresh and (work / "model").exists():
        with hold(work / "model", "training"):  # not while another demo trains it
            start_over(work / "model")  # refuses a directory it cannot prove is a checkpoint
    work.mkdir(parents=True, exist_ok=True)
    files = fb15k237_files()
    config_path = fb15k237_demo_config()
    splits = [work / split for split in files]
    progress = not args.no_progress
    started = time.perf_counter()

    print(f"== 1/3 Import FB15k-237 (bundled) into {work}")
    import_cfg = load_config(config_path, _overrides(args, work, splits))
    if (
        not args.fresh
        and (work / "entities" / "manifest.json").exists()
        and all((p / "manifest.json").exists() for p in splits)
    ):
        print("   already imported; reusing it (use --fresh to start over)")
    else:
        with contextlib.ExitStack() as held:  # one writer per store (bigembed.writer_lock)
            for store in [import_cfg.entity_path, *import_cfg.edge_paths]:
                held.enter_context(hold(store, "import"))
            summary = run_import(
                import_cfg,
                ImportOptions(inputs=[files[s] for s in files], force=True, progress=progress),
            )
        print(summary.format())

    print(f"\n== 2/3 Train ({config_path.name}: ComplEx, dynamic relations, softmax loss)")
    cfg = load_config(config_path, _overrides(args, work, splits[:1]))
    print(
        f"   dimension {cfg.dimension}, {cfg.num_epochs} epochs, {cfg.num_uniform_negs} uniform "
        f"negatives, {cfg.resolved_workers()} Hogwild workers; checkpoint {cfg.checkpoint_path}"
    )
    try:
        result = train(cfg, progress=progress, report=lambda line: tqdm.write(f"   {line}"))
    except ModelMismatchError as exc:
        raise exc.with_remedy(
            f"run the demo with --fresh to start over in {work} (replaces its model), or give "
            "another "
            "--workdir; or repeat the options of the run that trained it"
        ) from None
    if result.steps_run:
        print(
            f"   trained {result.steps_run} epoch(s) in {result.seconds:.1f}s "
            f"({result.edges_per_sec:,.0f} edges/s)"
        )
    else:
        print("   already trained; reusing the checkpoint")

    print("\n== 3/3 Evaluate: filtered link prediction on the test set (full ranking)")
    _evaluate_and_show(cfg, work, splits, progress)
    curves = _plot_curves(cfg, work)
    print(f"\nDone in {time.perf_counter() - started:.0f}s. Results and model in {work}.")
    if curves is not None:
        print(f"Training curves: {curves}")
    return 0


def _plot_curves(cfg, work: Path) -> Path | None:
    """The loss curve of the run as a PNG next to the results (None if there are no stats)."""
    from bigembed.checkpoints import CheckpointStore
    from bigembed.train import plot_training, read_training_log

    store = CheckpointStore(cfg.checkpoint_path)
    log = read_training_log(store, max_version=store.committed_version())
    if not log.steps and not log.buckets:
        return None
    out = work / "training.png"
    plot_training(log, out)
    return out


def _evaluate_and_show(cfg, work: Path, splits: list[Path], progress: bool) -> None:
    from bigembed.eval import evaluate_checkpoint

    report = evaluate_checkpoint(
        cfg, edge_paths=[splits[2]], filter_paths=splits, progress=progress
    )
    print(report.table())
    out = work / "eval_test.json"
    report.write_json(out)
    print(f"   written to {out}")
    from bigembed.serving import example_predictions, load

    print()
    print(example_predictions(load(cfg.checkpoint_path), n=5, edge_path=splits[2]))
