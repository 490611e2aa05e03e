"""Multi-process runs on 127.0.0.1: the ``bigembed`` command line, ranks started one by one, the
lock server's event log replayed, the rendezvous store reached from outside.

Shared by the distributed tests (test_dist, test_dist_sharing, test_faults, test_security,
test_strategies, test_load_balancing, test_launchers, ...): each rank is a subprocess with one
torch thread and a short ``distributed_timeout`` (:data:`TIMEOUT`), so a hung run fails within
seconds.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch.distributed as dist

from bigembed.checkpoints import CheckpointStore
from bigembed.config import config_to_dict
from support.graphs import graph_config, write_graph

CLI = [sys.executable, "-m", "bigembed.cli"]
ENV = {
    **os.environ,
    "OMP_NUM_THREADS": "1",
    "TORCH_CPP_LOG_LEVEL": "ERROR",
    "PYTHONUNBUFFERED": "1",
}
TIMEOUT = 5.0  # distributed_timeout of the multi-process tests


def read_events(path: Path) -> list[dict[str, Any]]:
    """The lock server's event log (one JSON object a line)."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def check_events(events: list[dict[str, Any]]) -> dict[int, Counter]:
    """Replay a lock-server log: no partition is ever held by two trainers, and every pass
    of every run hands out each bucket at most once. Returns, for the last run, the buckets
    acquired per iteration."""
    holder: dict[tuple[str, int], int] = {}
    granted: dict[int, Counter] = {}
    for e in events:  # file order is the lock server's decision order
        kind = e["event"]
        if kind == "run_start":
            holder, granted = {}, {}
        elif kind == "acquire":
            for t, p in e["partitions"]:
                other = holder.get((t, p), e["trainer"])
                assert other == e["trainer"], f"partition {(t, p)} held by {other} and {e}"
                holder[(t, p)] = e["trainer"]
            granted.setdefault(e["iteration"], Counter())[tuple(e["bucket"])] += 1
        elif kind == "release":
            for t, p in e["partitions"]:
                assert holder.get((t, p)) == e["trainer"], f"release of an unheld partition: {e}"
                del holder[(t, p)]
        elif kind == "pass_start":
            assert not holder, f"partitions still held at {e}: {holder}"
    for it, counts in granted.items():
        assert max(counts.values()) == 1, f"iteration {it}: a bucket was trained twice: {counts}"
    return granted


def free_port() -> int:
    """A TCP port of 127.0.0.1 free now (the kernel's choice)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def make_graph(root: Path, **overrides: Any) -> tuple[Path, Any]:
    """A 4-partition planted graph and its config file (num_machines is set per command)."""
    if not (root / "edges").exists():
        write_graph(root, num_entities=300, num_edges=12000, num_partitions=4, seed=3)
    settings = {
        "num_partitions": 4,
        "num_epochs": 3,
        "dimension": 16,
        "eval_fraction": 0.1,
        "distributed_timeout": TIMEOUT,
        **overrides,
    }
    cfg = graph_config(root, **settings)
    path = root / f"config_{Path(cfg.checkpoint_path).name}.json"
    path.write_text(json.dumps(config_to_dict(cfg)))
    return path, cfg


def run(args: list[str], timeout: float = 120, **kw: Any) -> subprocess.CompletedProcess[str]:
    """``bigembed ARGS`` as a subprocess with :data:`ENV`, its output captured."""
    return subprocess.run(
        [*CLI, *args], capture_output=True, text=True, env=ENV, timeout=timeout, **kw
    )


def start_rank(
    cfg_path: Path,
    rank: int,
    port: int,
    *extra: str,
    env: dict[str, str] | None = None,
    cli: list[str] = CLI,
) -> subprocess.Popen[str]:
    """Rank ``rank`` of a 2-trainer run on 127.0.0.1:``port`` (``env``: default ENV; ``cli``:
    the command line before ``train``, default ``python -m bigembed.cli``)."""
    return subprocess.Popen(
        [
            *cli,
            "train",
            str(cfg_path),
            "--rank",
            str(rank),
            "--no-progress",
            "-p",
            "num_machines=2",
            "-p",
            f"distributed_init_method=tcp://127.0.0.1:{port}",
            *extra,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=ENV if env is None else env,
        start_new_session=True,
    )


def clean_env(**extra: str) -> dict[str, str]:
    """:data:`ENV` without any launcher's variables (torchrun's, SLURM's), plus ``extra``."""
    launchers = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC")
    env = {k: v for k, v in ENV.items() if not k.startswith(("SLURM_", *launchers))}
    return {**env, **extra}


def torchrun(*args: str) -> list[str]:
    """``torchrun --nproc_per_node 2 ARGS`` (torch's launcher, 2 local processes)."""
    return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", *args]


def bucket_records(cfg: Any) -> dict[int, list[tuple[int, int]]]:
    """Per checkpoint version: the (lhs, rhs) partitions of the buckets trained, in order."""
    out: dict[int, list[tuple[int, int]]] = {}
    for r in CheckpointStore(cfg.checkpoint_path).read_stats():
        if r["type"] == "bucket":
            out.setdefault(r["version"], []).append((r["lhs_partition"], r["rhs_partition"]))
    return out


# the run secret of the tests that sign the rendezvous (BIGEMBED_SECRET)
SECRET = "correct horse battery staple 42"


def connect_store(port: int) -> dist.Store:
    """A client of the rendezvous store of 127.0.0.1:``port`` (as a stranger to the run would
    connect), retried for up to a minute while the store starts."""
    deadline = time.monotonic() + 60
    while True:
        try:
            raw = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=5))
            return dist.PrefixStore("bigembed", raw)
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def worker_of(parent: int, rank: int, within: float = 10.0) -> int:
    """The pid of the worker of global rank ``rank`` that torch's elastic agent ``parent``
    (torchrun, ``bigembed launch``) started: a child of it with ``RANK=rank`` in its
    environment."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                stat = Path(f"/proc/{pid}/stat").read_text()
                environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if int(stat.rpartition(")")[2].split()[1]) == parent and (
                f"RANK={rank}".encode() in environ
            ):
                return int(pid)
        time.sleep(0.1)
    raise AssertionError(f"no worker of rank {rank} under the elastic agent {parent}")
