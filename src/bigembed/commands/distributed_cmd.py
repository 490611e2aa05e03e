"""``bigembed launch`` (all ranks on one machine) and ``bigembed partition-server``.

The trainers themselves are ``bigembed train CONFIG --rank R`` (see train_cmd); docs in
docs/distributed.md.
"""

from __future__ import annotations

import argparse

from bigembed.config import add_config_arguments, config_from_args
from bigembed.distributed import add_security_arguments, apply_security_arguments


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "launch",
        help="run every rank of a distributed training on this machine (torch's elastic agent)",
        description="Start N trainer ranks (and the partition servers, if num_partition_servers "
        "> 0, as ranks N and up) of a distributed run on this machine with torch's elastic "
        "agent, as torchrun would, with rank-prefixed output. Without a distributed_init_method "
        "in the config the ranks meet in the agent's store, on a free port of 127.0.0.1 (or the "
        "--bind address). If a rank fails, the others are stopped and the exit status is "
        "non-zero.",
    )
    add_config_arguments(p)
    p.add_argument(
        "-n",
        "--nproc",
        type=int,
        default=None,
        help="number of trainer ranks (default: num_machines of the config)",
    )
    p.add_argument(
        "--max-restarts",
        type=int,
        default=0,
        metavar="N",
        help="after a rank fails, stop the others and start every rank again, up to N times "
        "(torch's elastic agent's max_restarts; each attempt resumes from the last committed "
        "checkpoint; default 0: no restart)",
    )
    p.add_argument(
        "--eval",
        nargs=argparse.REMAINDER,
        default=None,
        metavar="EVAL_ARGS",
        help="evaluate on the ranks instead of training: every argument after --eval goes to "
        "`bigembed eval CONFIG` on every rank (e.g. --eval --edges test.tsv --output report.json; "
        "-p overrides go before --eval); rank 0 prints and writes the report",
    )
    add_security_arguments(p)
    p.set_defaults(func=run_launch)

    s = subparsers.add_parser(
        "partition-server",
        help="serve partitions to the trainers of a distributed run",
        description="Run partition server RANK (0 <= RANK < num_partition_servers) of a "
        "distributed run; only needed when num_partition_servers > 0. It stops by itself at "
        "the end of training, and when any rank of the run dies.",
    )
    add_config_arguments(s)
    s.add_argument("--rank", type=int, required=True, help="index of this partition server")
    add_security_arguments(s)
    s.set_defaults(func=run_partition_server)


def run_launch(args: argparse.Namespace) -> int:
    from bigembed.commands.launch_ranks import launch

    apply_security_arguments(args)
    return launch(
        args.config,
        args.param or [],
        args.nproc,
        max_restarts=args.max_restarts,
        eval_args=args.eval,
    )


def run_partition_server(args: argparse.Namespace) -> int:
    from bigembed.distributed import serve_partitions
    from bigembed.errors import ConfigError

    apply_security_arguments(args)
    cfg = config_from_args(args)
    if cfg.num_partition_servers <= 0:
        raise ConfigError(
            f"num_partition_servers is {cfg.num_partition_servers}: this run has no external "
            "partition servers (set it to N > 0 to use them)"
        )
    return serve_partitions(cfg, index=args.rank)
