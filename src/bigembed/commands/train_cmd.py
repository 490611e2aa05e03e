"""``bigembed train CONFIG``: train, or resume from the last complete checkpoint."""

from __future__ import annotations

import argparse
import json
import logging
from typing import TYPE_CHECKING

from bigembed.config import ConfigSchema, add_config_arguments
from bigembed.errors import ConfigError

if TYPE_CHECKING:
    from bigembed.train import TrainResult

logger = logging.getLogger(__name__)


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "train",
        help="train embeddings (resumes from the last complete checkpoint by itself)",
        description="Train embeddings as CONFIG says. If checkpoint_path holds a checkpoint, "
        "training resumes after its last complete (epoch, edge set, chunk) step; its model must "
        "have the config's shape (dimension, entity types and partitions, relations and their "
        "operators, comparator...: one line names any difference), other changed keys (lr, "
        "negatives, epochs...) are logged and used.",
    )
    add_config_arguments(p)
    p.add_argument(
        "--rank",
        type=int,
        default=None,
        help="this machine's rank in distributed mode (default: torchrun's RANK, else SLURM's "
        "SLURM_PROCID, else 0)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument(
        "--fresh",
        action="store_true",
        help="start over: delete the checkpoint in checkpoint_path first (only a checkpoint "
        "bigembed provably wrote, and only its own files) instead of resuming it",
    )
    from bigembed.distributed import add_security_arguments

    add_security_arguments(p)  # distributed mode: shared secret, bind address
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from bigembed.commands.launched import placed_config
    from bigembed.config import held_out_warnings
    from bigembed.selection import train_model

    cfg, placed = placed_config(args)
    rank = placed or 0
    progress = not args.no_progress
    if args.fresh:
        if cfg.num_machines > 1:
            raise ConfigError(
                "--fresh: single machine only (every rank would delete the shared checkpoint); "
                "start a distributed run in a new checkpoint_path"
            )
        from bigembed.checkpoints import start_over
        from bigembed.writer_lock import hold

        with hold(cfg.checkpoint_path, "training"):  # not while another run writes it
            if start_over(cfg.checkpoint_path):
                print(f"--fresh: deleted the checkpoint in {cfg.checkpoint_path}; training anew")
    if rank == 0:  # once per run
        for line in held_out_warnings(cfg):
            logger.warning("%s", line)
    if cfg.num_machines > 1:
        from bigembed.distributed import apply_security_arguments, serve_partitions

        apply_security_arguments(args)
        if rank >= cfg.num_machines:  # a launcher's extra ranks: the partition servers
            return serve_partitions(cfg, index=rank - cfg.num_machines)
        result = train_model(cfg, rank=rank, progress=progress, report=tqdm.write)
        if rank == 0:
            _print_summary(cfg, result, trainers=cfg.num_machines)
        return 0
    _print_summary(cfg, train_model(cfg, progress=progress, report=tqdm.write), trainers=1)
    return 0


def _print_summary(cfg: ConfigSchema, result: TrainResult, *, trainers: int) -> None:
    if result.steps_run == 0:
        if result.stopped is not None:
            print(f"Nothing to do: {result.stopped}.")
        else:
            print(f"Nothing to do: {cfg.checkpoint_path} already holds all {result.version} steps.")
            _print_best(cfg, result.version)
        return
    last = result.last_step
    loss = last.stats.loss if last is not None else float("nan")
    by = f" with {trainers} trainers" if trainers > 1 else ""
    print(
        f"Trained {result.steps_run} step(s) to checkpoint version {result.version}{by} in "
        f"{result.seconds:.1f}s ({result.edges_per_sec:,.0f} edges/s); last loss "
        f"{loss:.4f}. Checkpoint: {cfg.checkpoint_path}"
    )
    if result.stopped is not None:
        print(f"Stopped early: {result.stopped}.")
    _print_best(cfg, result.version)
    after = last.eval_after if last is not None else None
    if after:
        print(
            "Withheld-edge eval after the last step (sampled negatives, raw ranks; "
            "`bigembed eval` for filtered full ranking): "
            + json.dumps({k: round(v, 4) for k, v in after.items() if k != "count"})
        )


def _print_best(cfg: ConfigSchema, latest: int) -> None:
    """The version early stopping kept, if any: the one the reading commands use by default."""
    from bigembed.checkpoints import CheckpointStore, describe_best

    best = CheckpointStore(cfg.checkpoint_path).read_best()
    if best is None:
        return
    metric, where = describe_best(best), f"{cfg.checkpoint_path}/best"
    if int(best["version"]) == latest:
        print(f"Best version: {latest}, the latest ({metric}; also kept in {where}).")
        return
    print(
        f"Best version: {best['version']} ({metric}), kept in {where}; predict, similar, eval, "
        f"export and convert use it by default (--version latest for version {latest})."
    )
