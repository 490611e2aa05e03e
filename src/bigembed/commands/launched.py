"""The config and rank of a ``train`` or ``eval`` process, wherever its rank comes from.

``--rank``, else a launcher's variables (torchrun, a PyTorchJob, SLURM's ``srun``), whose world
size also gives ``num_machines``: the rule is :func:`bigembed.distributed.place`'s
(docs/distributed.md, "Launching with torchrun, SLURM or Kubernetes").
"""

from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path

from bigembed.config import (
    ConfigSchema,
    apply_overrides,
    config_from_args,
    normalize_keys,
    read_config_file,
)

logger = logging.getLogger(__name__)


def placed_config(
    args: argparse.Namespace, *, partition_servers: bool = True
) -> tuple[ConfigSchema, int | None]:
    """The config (with the launcher's ``num_machines`` and ``env://`` when it leaves them out)
    and this process's rank: ``args.rank``, else the launcher's, else None (no launcher).

    ``partition_servers``: whether the launcher's world holds the config's partition servers
    after the trainers (training), or only ranks of the command (evaluation)."""
    from bigembed.distributed import place

    raw = normalize_keys(read_config_file(Path(args.config)), args.config)
    params = [p for item in args.param or [] for p in (item if isinstance(item, list) else [item])]
    settings = apply_overrides(raw, params, ConfigSchema, args.config)
    if not partition_servers:
        settings["num_partition_servers"] = 0
    placement = place(settings, args.rank)
    os.environ.update(placement.environ)  # SLURM: where rank 0's store listens
    args.param = [*params, *placement.overrides]
    cfg = config_from_args(args)
    env = placement.launch
    if env is None:
        return cfg, args.rank
    again = "resuming from the last committed checkpoint" if partition_servers else "starting over"
    logger.info(
        "%s: rank %d of %d (local rank %d%s)",
        env.launcher,
        env.rank,
        env.world_size,
        env.local_rank,
        f", restart {env.restart} of {env.max_restarts}: {again}" if env.restart else "",
    )
    return cfg, placement.rank
