"""How many partitions a single-machine run holds: the memory budget and its model.

What is resident during training (docs/training.md, "Memory model"):

* a fixed part: the interpreter, torch and the model (``BASE_BYTES``), plus each Hogwild
  worker process's own interpreter and torch (``WORKER_BYTES``; the tables are shared);
* the unpartitioned entity types' tables (pinned: every bucket needs them);
* the edges: preparing a bucket chunk (the loaded arrays, their int64 copies, the shuffle and
  the batch plan: ``EDGE_BYTES`` per edge of the largest bucket chunk) and the prepared
  edges held for the workers (``EDGE_BUFFER_BYTES`` per edge each; see
  :mod:`bigembed.train.memory.edge_buffers`): one bucket's, or with read-ahead
  (``partition_prefetch``) two, the one training and the next one, prepared meanwhile;
* ``capacity`` partitioned tables (embeddings + one Adagrad float per row): the resident
  partitions, the one being read ahead and the one being written back all count.

The budget is the ``memory_budget`` key, or half the memory available when training starts
(the smaller of ``MemAvailable`` and the cgroup's limit less its usage).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from bigembed.errors import ConfigError

logger = logging.getLogger(__name__)

BASE_BYTES = 450 * 2**20
WORKER_BYTES = 120 * 2**20
EDGE_BYTES = 96
#: A prepared bucket's edges: three int64 ids and a float32 weight, 25% headroom (the buffers
#: are reused, and grown by 25% when a larger chunk comes).
EDGE_BUFFER_BYTES = 36


def edge_bytes(read_ahead: bool) -> int:
    """Bytes per edge of the largest bucket chunk: preparing one chunk, and holding one
    prepared chunk (two with read-ahead: the next is prepared while one trains)."""
    return EDGE_BYTES + (2 if read_ahead else 1) * EDGE_BUFFER_BYTES


_CGROUP_FILES = (
    ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),  # v2
    (
        "/sys/fs/cgroup/memory/memory.limit_in_bytes",
        "/sys/fs/cgroup/memory/memory.usage_in_bytes",
    ),  # v1
)


def _read_int(path: str) -> int | None:
    try:
        text = Path(path).read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _own_cgroup_v1() -> tuple[str, str] | None:
    """The v1 memory cgroup files of this process (it may be in a child, e.g. a limited run)."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) == 3 and "memory" in parts[1].split(","):
            base = "/sys/fs/cgroup/memory" + parts[2].rstrip("/")
            return f"{base}/memory.limit_in_bytes", f"{base}/memory.usage_in_bytes"
        if len(parts) == 3 and parts[1] == "":
            base = "/sys/fs/cgroup" + parts[2].rstrip("/")
            return f"{base}/memory.max", f"{base}/memory.current"
    return None


def available_memory() -> int:
    """Bytes this process could still use: MemAvailable, or less if its cgroup limits it."""
    avail = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                avail = int(line.split()[1]) * 1024
    except OSError:
        pass
    best = avail if avail is not None else 4 * 2**30
    candidates = [c for c in (_own_cgroup_v1(),) if c is not None] + list(_CGROUP_FILES)
    for limit_file, usage_file in candidates:
        limit, usage = _read_int(limit_file), _read_int(usage_file)
        if limit is not None and limit < 2**60 and usage is not None:
            best = min(best, max(limit - usage, 0))
            break
    return best


@dataclass(frozen=True)
class MemoryPlan:
    budget: int
    derived: bool
    fixed: int
    table_bytes: int
    capacity: int

    def describe(self) -> str:
        how = "derived from the machine" if self.derived else "memory_budget"
        held = (
            f"{self.capacity} partitions of {self.table_bytes / 2**20:.0f} MiB resident"
            if self.table_bytes
            else "no partitioned tables (every table stays in memory)"
        )
        return (
            f"memory budget {self.budget / 2**30:.2f} GiB ({how}): {held}, "
            f"{self.fixed / 2**20:.0f} MiB fixed"
        )


def plan_memory(
    budget: int | None,
    table_bytes: list[int],
    pinned_bytes: int,
    max_chunk_edges: int,
    workers: int,
    per_bucket: int,
    read_ahead: bool = True,
) -> MemoryPlan:
    """The capacity (partitioned tables held at once) that fits ``budget``.

    ``read_ahead``: the next bucket's edges are prepared while one trains
    (``partition_prefetch``), so two buckets' prepared edges are held.

    ``per_bucket`` is the most partitioned tables one bucket needs: the capacity is never below
    it. A budget that cannot hold even that is a config error naming the key.
    """
    derived = budget is None
    if budget is None:
        budget = available_memory() // 2
    edges = max_chunk_edges * edge_bytes(read_ahead)
    fixed = BASE_BYTES + workers * WORKER_BYTES + pinned_bytes + edges
    largest = max(table_bytes, default=0)
    if largest == 0:
        return MemoryPlan(budget, derived, fixed, 0, 0)
    fits = (budget - fixed) // largest
    need = fixed + per_bucket * largest
    if fits < per_bucket and not derived:
        raise ConfigError(
            f"memory_budget: {budget / 2**20:.0f} MiB holds no bucket; one needs about "
            f"{need / 2**20:.0f} MiB ({per_bucket} partitions of {largest / 2**20:.0f} MiB "
            f"and {fixed / 2**20:.0f} MiB fixed): raise it or use more partitions"
        )
    if fits < per_bucket:
        logger.warning(
            "the memory available (%.0f MiB budget) holds no bucket (needs about %.0f MiB); "
            "training with one bucket's partitions",
            budget / 2**20,
            need / 2**20,
        )
    capacity = int(min(max(fits, per_bucket), len(table_bytes)))
    return MemoryPlan(budget, derived, fixed, largest, capacity)
