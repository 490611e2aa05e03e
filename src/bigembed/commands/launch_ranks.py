"""``bigembed launch CONFIG -n N``: every rank of a distributed run on this one machine, started
by torch's elastic agent.

A thin layer over ``torch.distributed.launcher.api`` (what ``torchrun`` runs): the agent
(``LocalElasticAgent``, static rendezvous, this machine the only node) starts N trainers plus
the config's external partition servers as its workers, each ``bigembed train CONFIG`` (or
``bigembed eval CONFIG EVAL_ARGS`` with ``--eval``) with torch's ``RANK`` / ``WORLD_SIZE`` /
``MASTER_ADDR`` / ``MASTER_PORT``, so a rank takes its place exactly as under torchrun
(:func:`bigembed.commands.launched.placed_config`). When a worker fails, the agent stops the
others; ``--max-restarts`` is the agent's ``max_restarts``: it starts every worker again and they
resume from the last committed checkpoint. The same run:
``torchrun --nnodes 1 --nproc_per_node N+S --master_addr 127.0.0.1 --master_port PORT
--max-restarts R -m bigembed train CONFIG --no-progress`` (S: the partition servers).

What this adds to torchrun: the rendezvous store (the agent's TCPStore) listens on a free port of
127.0.0.1 (or the ``--bind`` address) only, instead of every interface; the ``-p`` overrides
and the shared secret reach every worker; every output line (stdout and stderr) comes on
stdout prefixed by its rank (``[rank 2] ...``); and a few ``[launch]`` lines say what happened.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import uuid
from collections.abc import Sequence
from pathlib import Path

from bigembed.config import (
    ConfigSchema,
    apply_overrides,
    load_config,
    normalize_keys,
    read_config_file,
)
from bigembed.errors import ConfigError

INTERRUPTED = 130
ROLE = "bigembed"
PREFIX = "[rank ${rank}] "  # torch's log_line_prefix_template: one prefix per worker


def resolve(
    config: str, params: Sequence[str], nproc: int | None
) -> tuple[ConfigSchema, list[str]]:
    """The validated config of the run and the ``-p`` list every rank gets: the config's
    ``distributed_init_method`` if it names one, else ``env://`` (the agent's store, as under
    torchrun)."""
    raw = normalize_keys(read_config_file(Path(config)), config)
    data = apply_overrides(raw, params, ConfigSchema, config)
    n = nproc if nproc is not None else int(data.get("num_machines") or 1)
    if n < 2:
        raise ConfigError(
            f"{config}: launch needs at least 2 ranks: pass -n N or set num_machines >= 2"
        )
    forwarded = [*params, f"num_machines={n}"]
    if not data.get("distributed_init_method"):
        forwarded.append("distributed_init_method=env://")
    return load_config(config, forwarded), forwarded


def launch(
    config: str,
    params: Sequence[str],
    nproc: int | None,
    max_restarts: int = 0,
    eval_args: Sequence[str] | None = None,
) -> int:
    """Run every rank under torch's elastic agent until they all finish, or one fails
    ``max_restarts + 1`` times. Returns 0, the failed rank's exit status (1 for a signal), or
    130 after an interrupt. With ``eval_args`` (a list, maybe empty) the ranks run ``bigembed
    eval CONFIG EVAL_ARGS`` instead of training (no partition servers)."""
    if max_restarts < 0:
        raise ConfigError(f"--max-restarts {max_restarts}: must be 0 or more")
    cfg, forwarded = resolve(config, params, nproc)
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, SignalException, Std
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    from bigembed.distributed import host_agent_store

    servers = max(cfg.num_partition_servers, 0) if eval_args is None else 0
    world = cfg.num_machines + servers
    store, host, port = host_agent_store(cfg.distributed_timeout)
    command = ["train" if eval_args is None else "eval", config, "--no-progress"]
    args = [
        "-m",
        "bigembed.cli",
        *command,
        *(arg for p in forwarded for arg in ("-p", p)),
        *(eval_args if eval_args is not None else []),
    ]
    os.environ["PYTHONUNBUFFERED"] = "1"  # the agent tails the workers' log files
    kind = "trainers" if eval_args is None else "eval ranks"
    where = {0: "", 1: f" (rank {world - 1})"}.get(
        servers, f" (ranks {cfg.num_machines}-{world - 1})"
    )
    restarts = f", up to {max_restarts} restarts" if max_restarts else ""
    print(
        f"[launch] {cfg.num_machines} {kind} + {servers} partition servers{where} at "
        f"{cfg.distributed_init_method}, torch's elastic agent on {host}:{port}{restarts}",
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="bigembed-launch-") as logs:
        launch_config = LaunchConfig(
            min_nodes=1,
            max_nodes=1,
            nproc_per_node=world,
            run_id=f"bigembed-{uuid.uuid4().hex[:12]}",
            role=ROLE,
            rdzv_backend="static",
            rdzv_endpoint=f"{host}:{port}",
            rdzv_configs={"rank": 0},
            max_restarts=max_restarts,
            logs_specs=DefaultLogsSpecs(log_dir=logs, tee=Std.ALL),
            log_line_prefix_template=PREFIX,
        )
        line_by_line = getattr(sys.stdout, "reconfigure", None)  # live lines through a pipe
        if line_by_line is not None:
            line_by_line(line_buffering=True)
        try:
            # the workers' stderr joins their stdout on ours, as one rank-prefixed stream
            with contextlib.redirect_stderr(sys.stdout):
                elastic_launch(launch_config, sys.executable)(*args)
        except ChildFailedError as exc:
            rank, failure = next(iter(exc.failures.items()))
            print(f"[launch] rank {rank} exited with code {failure.exitcode}; stopped the others")
            if max_restarts:
                print(f"[launch] giving up after {max_restarts} restarts")
            return failure.exitcode if failure.exitcode > 0 else 1
        except SignalException as exc:
            print(f"[launch] interrupted by {exc.sigval.name}: stopped every rank")
            return INTERRUPTED
        finally:
            del store  # the agent's store server lives as long as this reference
    print("[launch] all ranks finished", flush=True)
    return 0
