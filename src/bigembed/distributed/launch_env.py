"""Where a rank's place in the run comes from: the command line, torchrun, or SLURM.

One rule for every way of starting ranks (docs/distributed.md):

1. ``--rank R`` on the command line wins: the config then says the rest (``num_machines``,
   ``distributed_init_method``), as with ``bigembed launch`` or ranks started by hand;
2. otherwise torch's launcher variables (``torchrun``, a Kubernetes ``PyTorchJob``, any launcher
   following torch.distributed's ``env://`` convention): ``RANK``, ``WORLD_SIZE``,
   ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``;
3. otherwise SLURM's (a task of ``srun``): ``SLURM_PROCID``, ``SLURM_STEP_NUM_TASKS`` (else
   ``SLURM_NTASKS``), ``SLURM_LOCALID``, and the first host of the step's node list as the
   store's host (``MASTER_ADDR`` and ``MASTER_PORT`` win when set; the port otherwise derives
   from the job id, so every task of the job agrees on it without talking).

A launcher's world holds the trainers first, then the partition servers: ``num_machines`` is
``WORLD_SIZE - num_partition_servers`` when the config leaves it at 1 (its default), and a
config naming another count is refused in one line. ``distributed_init_method`` defaults to
``env://`` there. A world of one process is no distributed run: the variables are ignored.

Nothing here touches the network or torch: :func:`place` is a pure function of the config's
keys and the environment.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from bigembed.errors import ConfigError

#: SLURM jobs without MASTER_PORT use ``SLURM_PORT_BASE + job id % SLURM_PORT_SPAN``
SLURM_PORT_BASE = 20000
SLURM_PORT_SPAN = 20000


@dataclass(frozen=True)
class LaunchEnv:
    """What a launcher told this process about its place in the run."""

    launcher: str  # "torchrun" (torch's variables) or "SLURM"
    rank: int
    world_size: int
    local_rank: int
    restart: int = 0  # torchrun's TORCHELASTIC_RESTART_COUNT
    max_restarts: int = 0  # torchrun's TORCHELASTIC_MAX_RESTARTS
    master: dict[str, str] = field(default_factory=dict)  # MASTER_ADDR/PORT to export


@dataclass(frozen=True)
class Placement:
    """This process's world rank and the config overrides and variables that follow from it."""

    rank: int
    overrides: list[str] = field(default_factory=list)  # -p overrides to load the config with
    environ: dict[str, str] = field(default_factory=dict)  # variables to export first
    launch: LaunchEnv | None = None


def _int(environ: Mapping[str, str], name: str, launcher: str) -> int:
    value = environ.get(name, "")
    try:
        return int(value)
    except ValueError:
        raise ConfigError(f"{launcher}: {name}={value!r} is not a number") from None


def read_launch_env(environ: Mapping[str, str] = os.environ) -> LaunchEnv | None:
    """torch's launcher variables, else SLURM's, else None (also for a world of one)."""
    if "RANK" in environ and "WORLD_SIZE" in environ:
        env = LaunchEnv(
            "torchrun",
            rank=_int(environ, "RANK", "torchrun"),
            world_size=_int(environ, "WORLD_SIZE", "torchrun"),
            local_rank=_int(environ, "LOCAL_RANK", "torchrun") if "LOCAL_RANK" in environ else 0,
            restart=int(environ.get("TORCHELASTIC_RESTART_COUNT") or 0),
            max_restarts=int(environ.get("TORCHELASTIC_MAX_RESTARTS") or 0),
        )
    elif "SLURM_PROCID" in environ and "SLURM_NTASKS" in environ:
        master = {}
        if not environ.get("MASTER_ADDR"):
            nodes = environ.get("SLURM_STEP_NODELIST") or environ.get("SLURM_JOB_NODELIST")
            nodes = nodes or environ.get("SLURM_NODELIST") or ""
            if not nodes:
                raise ConfigError(
                    "SLURM: neither MASTER_ADDR nor SLURM_STEP_NODELIST / SLURM_JOB_NODELIST is "
                    "set: cannot tell where rank 0's store listens"
                )
            master["MASTER_ADDR"] = first_host(nodes)
        if not environ.get("MASTER_PORT"):
            job = _int(environ, "SLURM_JOB_ID", "SLURM") if "SLURM_JOB_ID" in environ else 0
            master["MASTER_PORT"] = str(SLURM_PORT_BASE + job % SLURM_PORT_SPAN)
        tasks = "SLURM_STEP_NUM_TASKS" if "SLURM_STEP_NUM_TASKS" in environ else "SLURM_NTASKS"
        env = LaunchEnv(
            "SLURM",
            rank=_int(environ, "SLURM_PROCID", "SLURM"),
            world_size=_int(environ, tasks, "SLURM"),
            local_rank=_int(environ, "SLURM_LOCALID", "SLURM") if "SLURM_LOCALID" in environ else 0,
            master=master,
        )
    else:
        return None
    if env.world_size <= 1:
        return None
    if not 0 <= env.rank < env.world_size:
        raise ConfigError(
            f"{env.launcher}: rank {env.rank} is outside a world of {env.world_size} processes"
        )
    return env


def first_host(nodelist: str) -> str:
    """The first host of a SLURM node list: ``node[07-09,12],gpu1`` gives ``node07`` (the same
    as the first line of ``scontrol show hostnames``, without needing scontrol)."""
    match = re.match(r"\s*([^,\[\s]*)(?:\[([^\]]*)\]([^,\s]*))?", nodelist)
    if match is None or not (match.group(1) or match.group(2)):
        raise ConfigError(f"SLURM: cannot read the node list {nodelist!r}")
    prefix, ranges, suffix = match.group(1), match.group(2), match.group(3) or ""
    if ranges is None:
        return prefix
    first = ranges.split(",")[0].split("-")[0].strip()
    if not first:
        raise ConfigError(f"SLURM: cannot read the node list {nodelist!r}")
    return f"{prefix}{first}{suffix}"


def place(
    settings: Mapping[str, Any], rank: int | None, environ: Mapping[str, str] = os.environ
) -> Placement:
    """This process's world rank, from ``--rank`` (``rank``), else the launcher's variables
    (see the module docstring), else 0; with the overrides the config needs under a launcher.

    ``settings``: the config's keys as read from its file with the ``-p`` overrides, before
    validation (which would warn about keys that only a distributed run uses); a missing key
    has its default."""
    if rank is not None:
        return Placement(rank)
    env = read_launch_env(environ)
    if env is None:
        return Placement(0)
    num_machines = int(settings.get("num_machines") or 1)
    servers = max(int(settings.get("num_partition_servers", -1)), 0)
    trainers = env.world_size - servers
    if trainers < 1:
        raise ConfigError(
            f"{env.launcher} started {env.world_size} processes but num_partition_servers is "
            f"{servers}: start num_machines + num_partition_servers processes"
        )
    overrides = []
    if num_machines == 1:
        overrides.append(f"num_machines={trainers}")
    elif num_machines != trainers:
        raise ConfigError(
            f"num_machines is {num_machines} (+ {servers} partition servers) but "
            f"{env.launcher} started {env.world_size} processes (WORLD_SIZE): make them agree, "
            "or leave num_machines out of the config"
        )
    if not settings.get("distributed_init_method"):
        overrides.append("distributed_init_method=env://")
    return Placement(env.rank, overrides, dict(env.master), env)
