"""The real memory of a process tree (a trainer and its Hogwild workers), sampled from /proc.

The peak that matters is the memory alive *at one instant*. Reading the smaps of four
processes one after the other is not one instant: on a loaded machine the sampler may be
descheduled between the trainer and a worker, and see the trainer still mapping the table it
is about to free and, a moment later, a worker already mapping the table that replaced it --
two tables that were never alive together (on 2 busy cores this overstated the peak by a
whole table in about one run of two). So every sample that would raise a peak is taken again
with the whole tree stopped (SIGSTOP, then SIGCONT): only such consistent snapshots count.
Cheap samples run between them, so a table that outlives its release for as long as a few
milliseconds still raises a snapshot.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the sampler itself is standard library only (bench/ooc_bench.py loads it)
    from bigembed.config import ConfigSchema


def process_tree(root: int) -> list[int]:
    """``root`` and all its descendants (from /proc/*/stat)."""
    parent: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                stat = (entry / "stat").read_text()
                parent[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    out, frontier = [root], [root]
    while frontier:
        frontier = [pid for pid, pp in parent.items() if pp in frontier]
        out += frontier
    return out


def shm_pages(pid: int) -> dict[tuple[str, str], int]:
    """Resident bytes of each shared-memory file a process maps, by (device, inode)."""
    out: dict[tuple[str, str], int] = {}
    key = None
    with contextlib.suppress(OSError):
        for line in (Path(f"/proc/{pid}") / "smaps").read_text().splitlines():
            head = line.split(maxsplit=5)
            if len(head) >= 5 and "-" in head[0] and ":" in head[3]:  # a mapping's first line
                path = head[5] if len(head) == 6 else ""
                shm = path.startswith(("/dev/shm/", "/memfd:"))
                key = (head[3], head[4]) if shm else None
            elif key is not None and line.startswith("Rss:"):
                out[key] = out.get(key, 0) + int(line.split()[1]) * 1024
    return out


def rollup(pid: int) -> dict[str, int]:
    """A process's memory totals in bytes (``Rss``, ``Pss``, ``Pss_Anon``, ...)."""
    out: dict[str, int] = {}
    with contextlib.suppress(OSError):
        for line in (Path(f"/proc/{pid}") / "smaps_rollup").read_text().splitlines():
            field, _, rest = line.partition(":")
            words = rest.split()
            if len(words) == 2 and words[1] == "kB":
                out[field] = int(words[0]) * 1024
    return out


def _stopped(pid: int) -> bool:
    """Every thread of ``pid`` is stopped (or gone)."""
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return True
    for task in tasks:
        with contextlib.suppress(OSError, IndexError):
            if (task / "stat").read_text().rsplit(")", 1)[1].split()[0] not in "TtZX":
                return False
    return True


@contextlib.contextmanager
def frozen(root: int, limit: float = 2.0) -> Iterator[list[int] | None]:
    """The tree of ``root`` stopped for the block (yields its pids), resumed after it, even on
    error. Yields None if some thread did not stop within ``limit`` seconds (e.g. blocked in
    the kernel): no consistent snapshot then."""
    stopped: list[int] = []
    try:
        while True:  # a process forked while stopping the others is stopped too
            new = [pid for pid in process_tree(root) if pid not in stopped]
            if not new:
                break
            for pid in new:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGSTOP)
                stopped.append(pid)
        deadline = time.monotonic() + limit
        while not all(_stopped(pid) for pid in stopped):
            if time.monotonic() > deadline:
                yield None
                return
            time.sleep(0.0002)
        yield stopped
    finally:
        for pid in stopped:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)


@dataclass
class Snapshot:
    shmem: int  # resident bytes of every shared-memory file, each counted once
    pss: int  # proportional set size summed over the tree
    rss: int  # resident set size summed over the tree (shared pages counted in each process)

    @staticmethod
    def of(pids: list[int]) -> Snapshot:
        files: dict[tuple[str, str], int] = {}
        pss = rss = 0
        for pid in pids:
            for key, size in shm_pages(pid).items():
                files[key] = max(files.get(key, 0), size)
            totals = rollup(pid)
            pss, rss = pss + totals.get("Pss", 0), rss + totals.get("Rss", 0)
        return Snapshot(sum(files.values()), pss, rss)


class TreeMemory:
    """Samples a process tree every few milliseconds (a context manager around the run).

    ``peak_shmem``: the peak of its shared memory (the Hogwild tables live there), ``peak_pss``
    and ``peak_rss``: of its summed proportional and resident set sizes, all from consistent
    snapshots (see the module's docstring); ``peak_anon``: of the root's private memory
    (Pss_Anon). ``unconfirmed_*``: the peaks of the cheap samples, for the message of a
    failing assertion. ``interval``: seconds between samples."""

    def __init__(self, pid: int, interval: float = 0.005) -> None:
        self.pid = pid
        self.interval = interval
        self.peak_shmem = self.peak_pss = self.peak_rss = self.peak_anon = 0
        self.unconfirmed_shmem = self.unconfirmed_pss = 0
        self.pids: set[int] = set()
        self.samples = self.snapshots = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            pids = process_tree(self.pid)
            self.pids.update(pids)
            cheap = Snapshot.of(pids)
            self.unconfirmed_shmem = max(self.unconfirmed_shmem, cheap.shmem)
            self.unconfirmed_pss = max(self.unconfirmed_pss, cheap.pss)
            if (
                cheap.shmem > self.peak_shmem
                or cheap.pss > self.peak_pss
                or cheap.rss > self.peak_rss
            ):
                with frozen(self.pid) as still:
                    if still is not None:
                        snap = Snapshot.of(still)
                        self.peak_shmem = max(self.peak_shmem, snap.shmem)
                        self.peak_pss = max(self.peak_pss, snap.pss)
                        self.peak_rss = max(self.peak_rss, snap.rss)
                        self.snapshots += 1
            self.peak_anon = max(self.peak_anon, rollup(self.pid).get("Pss_Anon", 0))
            self.samples += 1
            time.sleep(self.interval)

    def summary(self, part: int) -> dict[str, float]:
        """The peaks in MiB and in partitions of ``part`` bytes (for assertion messages)."""
        return {
            "shmem_MiB": self.peak_shmem / 2**20,
            "pss_MiB": self.peak_pss / 2**20,
            "anon_MiB": self.peak_anon / 2**20,
            "shmem_tables": self.peak_shmem / part,
            "unconfirmed_shmem_tables": self.unconfirmed_shmem / part,
            "unconfirmed_pss_MiB": self.unconfirmed_pss / 2**20,
            "snapshots": self.snapshots,
            "samples": self.samples,
        }

    def __enter__(self) -> TreeMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def train_measured(cfg: ConfigSchema, tmp_path: Path) -> tuple[str, TreeMemory]:
    """``bigembed train`` on ``cfg`` (one torch thread per process) with its process tree's
    memory sampled throughout; its stderr and the sampler, once it succeeded."""
    from bigembed.config import config_to_dict

    path = tmp_path / "config.json"
    path.write_text(json.dumps(config_to_dict(cfg)))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "bigembed.cli", "train", str(path), "--no-progress"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    with TreeMemory(proc.pid) as mem:
        out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, out + err
    return err, mem
