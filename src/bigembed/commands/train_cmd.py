"""``bigembed train CONFIG``: train, or resume from the last complete checkpoint."""

from __future__ import annotations

import argparse
import json

from bigembed.config import add_config_arguments, config_from_args


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "train",
        help="train embeddings (resumes from the last complete checkpoint by itself)",
        description="Train embeddings as CONFIG says. If checkpoint_path holds a checkpoint, "
        "training resumes after its last complete (epoch, edge set, chunk) step.",
    )
    add_config_arguments(p)
    p.add_argument("--rank", type=int, default=0, help="this machine's rank in distributed mode")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    from bigembed.distributed.auth import add_security_arguments

    add_security_arguments(p)  # distributed mode: shared secret, bind address
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from bigembed.train.loop import train

    cfg = config_from_args(args)
    if cfg.num_machines > 1:
        from bigembed.distributed.auth import apply_security_arguments
        from bigembed.distributed.rank_main import (
            train_distributed,  # distributed mode lands separately
        )

        apply_security_arguments(args)

        return train_distributed(cfg, rank=args.rank, progress=not args.no_progress)
    result = train(cfg, progress=not args.no_progress)
    if result.steps_run == 0:
        print(f"Nothing to do: {cfg.checkpoint_path} already holds all {result.version} steps.")
        return 0
    stats = result.last_stats.get("stats", {})
    print(
        f"Trained {result.steps_run} step(s) to checkpoint version {result.version} in "
        f"{result.seconds:.1f}s ({result.edges_per_sec:,.0f} edges/s); last loss "
        f"{stats.get('loss', float('nan')):.4f}. Checkpoint: {cfg.checkpoint_path}"
    )
    after = result.last_stats.get("eval_stats_after")
    if after:
        print(
            "Withheld-edge eval after the last step: "
            + json.dumps({k: round(v, 4) for k, v in after.items() if k != "count"})
        )
    return 0
