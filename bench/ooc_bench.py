"""Out-of-core training under a hard memory limit, measured as a user would run it.

Trains one config (e.g. the graph of ``bench/ooc_graph.py``) with ``bigembed train`` in a child
process and reports: edges/s, partition bytes read and written, the fraction of step time the
trainer waited on partition I/O, the peak memory of the whole process tree (RSS and PSS,
sampled from /proc every 0.2 s, each peak from a snapshot taken with the tree stopped:
see ``tests/support/tree_memory.py``), and the disk the run used.

With ``--limit`` the trainer runs inside a memory cgroup of that size: cgroup v1 (a child of
this process's memory cgroup with ``memory.limit_in_bytes``, and ``memory.memsw.limit_in_bytes``
when the kernel has it, so swap cannot hide an overrun) or v2 (``memory.max``); it needs root.
The cgroup's ``failcnt``, ``max_usage_in_bytes`` and OOM-kill count are reported, and the run
fails if the limit killed it. Without root, run it under ``systemd-run --scope -p
MemoryMax=2.5G`` instead (and read the peak from this report's /proc figures).

    python bench/ooc_bench.py /tmp/ooc/config.yaml --limit 2.5G -p memory_budget=2.1GB \\
        -p bucket_order=buffer
    python bench/ooc_bench.py /tmp/ooc_small/config.yaml       # a graph that fits in memory

Choose ``memory_budget`` from docs/training.md's memory model ("Memory model") so that the
model's total stays below the limit.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import support_path  # noqa: F401  (tests/ on sys.path, for support)

from support.tree_memory import TreeMemory

V1 = Path("/sys/fs/cgroup/memory")


def _units(text: str) -> int:
    from pydantic import TypeAdapter

    from bigembed.config import Bytes

    return int(TypeAdapter(Bytes).validate_python(text))


class TreeSampler:
    """Peak of the summed RSS and PSS of a process tree (PSS counts shared tables once), from
    consistent snapshots (:class:`support.tree_memory.TreeMemory`).

    With a cgroup it also keeps the peak of the cgroup's anonymous memory plus shared memory
    (``rss + shmem`` of ``memory.stat``: what the kernel cannot reclaim without swap, each page
    counted once), the figure to compare with the memory model; the page cache the cgroup also
    charges is reclaimable and left out.
    """

    def __init__(self, pid: int, group: Cgroup | None = None) -> None:
        self.pid = pid
        self.group = group
        self.tree = TreeMemory(pid, interval=0.2).__enter__()
        self.peak_unreclaimable = 0
        self.at_peak: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            if self.group is not None:
                with contextlib.suppress(OSError, ValueError):
                    stat = self.group.stat()
                    held = stat["rss"] + stat["shmem"]
                    if held > self.peak_unreclaimable:
                        self.peak_unreclaimable = held
                        self.at_peak = {k: stat[k] for k in ("rss", "shmem", "cache")}
            time.sleep(0.2)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self.tree.__exit__()


class Cgroup:
    """A memory cgroup of ``limit`` bytes that a child process joins before it executes."""

    def __init__(self, limit: int) -> None:
        own = ""
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            parts = line.split(":", 2)
            if len(parts) == 3 and "memory" in parts[1].split(","):
                own = parts[2].strip("/")
        if not V1.is_dir():
            raise SystemExit("no cgroup v1 memory controller; use systemd-run (see --help)")
        self.path = V1 / own / f"bigembed_ooc_{os.getpid()}"
        self.path.mkdir()
        (self.path / "memory.limit_in_bytes").write_text(str(limit))
        memsw = self.path / "memory.memsw.limit_in_bytes"
        if memsw.exists():
            memsw.write_text(str(limit))

    def join(self) -> None:
        (self.path / "cgroup.procs").write_text(str(os.getpid()))

    def read(self, name: str) -> str:
        return (self.path / name).read_text().strip()

    def stat(self) -> dict[str, int]:
        return {
            k: int(v) for k, v in (line.split() for line in self.read("memory.stat").splitlines())
        }

    def figures(self) -> dict[str, int]:
        oom = dict(line.split() for line in self.read("memory.oom_control").splitlines())
        return {
            "limit": int(self.read("memory.limit_in_bytes")),
            "max_usage": int(self.read("memory.max_usage_in_bytes")),
            "failcnt": int(self.read("memory.failcnt")),
            "oom_kill": int(oom.get("oom_kill", 0)),
        }

    def remove(self) -> None:
        for _ in range(20):  # the kernel may still be releasing the last process
            try:
                self.path.rmdir()
                return
            except OSError:
                time.sleep(0.5)


def _du(path: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for f in files:
            with contextlib.suppress(OSError):
                st = os.lstat(os.path.join(root, f))
                total += st.st_blocks * 512
    return total


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("config", type=Path)
    parser.add_argument("--limit", help="memory cgroup limit, e.g. 2.5G (needs root)")
    parser.add_argument("-p", "--param", action="append", default=[], help="config override")
    parser.add_argument("--keep", action="store_true", help="keep the checkpoint")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument(
        "--progress", action="store_true", help="show the trainer's progress bar (stderr)"
    )
    args = parser.parse_args()

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
    from bigembed.checkpoints import CheckpointStore
    from bigembed.config import load_config
    from bigembed.train import read_training_log

    cfg = load_config(args.config, overrides=args.param)
    ckpt = Path(cfg.checkpoint_path)
    shutil.rmtree(ckpt, ignore_errors=True)
    overrides = [x for p in args.param for x in ("-p", p)]
    argv = [sys.executable, "-m", "bigembed.cli", "train", str(args.config), *overrides]
    if not args.progress:
        argv.append("--no-progress")
    group = Cgroup(_units(args.limit)) if args.limit else None
    started = time.perf_counter()
    proc = subprocess.Popen(argv, preexec_fn=group.join if group else None)
    sampler = TreeSampler(proc.pid, group)
    code = proc.wait()
    wall = time.perf_counter() - started
    sampler.stop()
    figures: dict[str, object] = {"command": " ".join(argv), "exit": code, "wall_s": round(wall)}
    if group is not None:
        figures["cgroup"] = group.figures()
        figures["cgroup_peak_rss_plus_shmem"] = sampler.peak_unreclaimable
        figures["cgroup_stat_at_that_peak"] = sampler.at_peak
        group.remove()
    figures["peak_tree_rss"] = sampler.tree.peak_rss
    figures["peak_tree_pss"] = sampler.tree.peak_pss
    if code == 0:
        steps = read_training_log(CheckpointStore(ckpt)).steps
        edges = sum(s.stats.count for s in steps)
        seconds = sum(s.seconds for s in steps)
        wait = sum(s.io_wait_seconds or 0.0 for s in steps)
        figures.update(
            edges=edges,
            train_s=round(seconds, 1),
            edges_per_s=round(edges / seconds),
            io_bytes_read=steps[-1].io_bytes_read,
            io_bytes_written=steps[-1].io_bytes_written,
            io_wait_s=round(wait, 1),
            io_wait_fraction=round(wait / seconds, 4),
            checkpoint_disk=_du(ckpt),
            edges_disk=sum(_du(Path(p)) for p in cfg.edge_paths),
            entities_disk=_du(Path(cfg.entity_path)),
        )
    if not args.keep:
        shutil.rmtree(ckpt, ignore_errors=True)
    print(json.dumps(figures, indent=1))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1))
    return 0 if code == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
