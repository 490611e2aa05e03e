"""Benchmark of ``bigembed import``: edges/s end to end and peak memory.

Generates a random graph as TSV (2M entities, 3 relation types; cached under
/tmp/bigembed-bench, generation not timed) and imports it into 4 partitions, once through
the Python API in a fresh process and once through the ``bigembed`` CLI, for each edge count.
Peak RSS comes from the kernel (wait4) for the process that ran the import.

    python bench/import_bench.py                 # 5M and 20M edges
    python bench/import_bench.py --edges 20000000
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import yaml

CACHE = Path(os.environ.get("BIGEMBED_BENCH_CACHE", "/tmp/bigembed-bench"))
RELATIONS = ["rel_a", "rel_b", "rel_c"]


def generate(num_edges: int, num_entities: int) -> Path:
    """A TSV of uniformly random edges (the hardest case for the CPU caches); cached."""
    path = CACHE / f"graph_{num_entities}_{num_edges}.tsv"
    if path.exists():
        return path
    CACHE.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    names = pa.array([f"ent_{i:08d}" for i in range(num_entities)], pa.string())
    rels = pa.array(RELATIONS, pa.string())
    tmp = path.with_suffix(".partial")
    with pa.OSFile(str(tmp), "wb") as sink:
        options = pacsv.WriteOptions(include_header=False, delimiter="\t", quoting_style="none")
        for start in range(0, num_edges, 2_000_000):
            n = min(2_000_000, num_edges - start)
            table = pa.table(
                {
                    "h": names.take(pa.array(rng.integers(0, num_entities, n))),
                    "r": rels.take(pa.array(rng.integers(0, len(RELATIONS), n))),
                    "t": names.take(pa.array(rng.integers(0, num_entities, n))),
                }
            )
            pacsv.write_csv(table, sink, options)
    tmp.rename(path)
    return path


def write_config(work: Path, partitions: int) -> Path:
    config = {
        "entities": {"node": {"num_partitions": partitions}},
        "relations": [{"name": r, "lhs": "node", "rhs": "node"} for r in RELATIONS],
        "entity_path": str(work / "entities"),
        "edge_paths": [str(work / "edges")],
        "checkpoint_path": str(work / "model"),
        "dimension": 16,
    }
    path = work / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def run_measured(argv: list[str]) -> tuple[float, float, float, str]:
    """(wall seconds, CPU seconds, peak RSS MiB, stdout) of a child process."""
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    out = proc.stdout.read()
    _pid, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"command failed ({proc.returncode}): {' '.join(argv)}\n{out}")
    return seconds, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024, out


def child(config: str, data: str) -> None:
    """Run one import through the Python API and print its own timing as JSON."""
    from bigembed.config import load_config
    from bigembed.importing import ImportOptions, run_import

    cfg = load_config(config)
    start = time.perf_counter()
    summary = run_import(cfg, ImportOptions(inputs=[Path(data)], progress=False))
    seconds = time.perf_counter() - start
    print(json.dumps({"seconds": seconds, "edges": summary.total_edges}))


def measure(
    mode: str, num_edges: int, data: Path, partitions: int, cli: str
) -> tuple[float, float, float]:
    """(seconds, CPU seconds, peak RSS MiB) of one import in a fresh process."""
    work = Path(tempfile.mkdtemp(prefix="bigembed-bench-", dir=CACHE))
    try:
        config = write_config(work, partitions)
        if mode == "api":
            argv = [sys.executable, __file__, "--child", str(config), str(data)]
            _wall, cpu, rss, out = run_measured(argv)
            result = json.loads(out.strip().splitlines()[-1])
            assert result["edges"] == num_edges
            return result["seconds"], cpu, rss
        argv = [cli, "import", str(config), str(data), "--no-progress"]
        seconds, cpu, rss, _out = run_measured(argv)
        return seconds, cpu, rss
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--edges", type=int, nargs="+", default=[5_000_000, 20_000_000])
    parser.add_argument("--entities", type=int, default=2_000_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument(
        "--repeat", type=int, default=1, help="runs per case; the fastest is reported (noisy hosts)"
    )
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(*args.child)
        return
    cli = shutil.which("bigembed") or str(Path(sys.executable).with_name("bigembed"))
    rows = []
    for num_edges in args.edges:
        data = generate(num_edges, args.entities)
        size_mb = data.stat().st_size / 2**20
        for mode in ("api", "cli"):
            best: tuple[float, float, float] | None = None
            for _ in range(args.repeat):
                seconds, cpu, rss = measure(mode, num_edges, data, args.partitions, cli)
                print(f"  {mode} {num_edges:,} edges: {seconds:.1f} s", file=sys.stderr)
                if best is None or seconds < best[0]:
                    best = (seconds, cpu, max(rss, best[2] if best else 0.0))
                else:
                    best = (best[0], best[1], max(rss, best[2]))
            assert best is not None
            seconds, cpu, rss = best
            rows.append((num_edges, size_mb, mode, seconds, num_edges / seconds, cpu, rss))
    print(
        f"\nbigembed import: {args.entities:,} entities, {len(RELATIONS)} relation types, "
        f"{args.partitions} partitions, TSV input, {os.cpu_count()} CPUs"
    )
    columns: tuple[tuple[str, int], ...] = (
        ("edges", 12),
        ("input MB", 9),
        ("mode", 4),
        ("seconds", 8),
        ("edges/s", 11),
    )
    columns += (("CPU s", 6),)
    header = " ".join(f"{name:>{width}}" for name, width in columns) + " peak RSS MB"
    print(
        f"(1-min load average at the end: {os.getloadavg()[0]:.1f}; CPU s = user + sys of the run)"
    )
    print(header)
    print("-" * len(header))
    for num_edges, size_mb, mode, seconds, rate, cpu, rss in rows:
        line = f"{num_edges:>12,} {size_mb:>9,.0f} {mode:>4} {seconds:>8.2f} {rate:>11,.0f}"
        line += f" {cpu:>6.1f}"
        print(f"{line} {rss:>11,.0f}")


if __name__ == "__main__":
    main()
