"""Ranks started by hand as a user would start them on N machines, for the distributed benches.

:func:`run_ranks` starts one ``bigembed train --rank K`` per machine and waits for all of them.
As root with iproute2 every machine is a network namespace on a bridge whose link ``tc``
shapes (:mod:`support.netns`), and the bytes on the wire are the interfaces' counters
(everything: TCP/IP headers, the rendezvous store, heartbeats); otherwise the ranks meet on
127.0.0.1 and no bytes are counted here. With ``pin``, rank K runs on core K (``taskset``) with
one torch thread, so that N ranks x 1 worker compare with one rank x 1 worker on one core.

Each rank writes to its own log file, not a pipe: a rank blocked on a full pipe nobody reads
yet (its peers' pipes are read first) would stall the whole run.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import support_path  # noqa: F401  (tests/ on sys.path, for support)

from support import netns

ROOT = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-m", "bigembed.cli"]


def machine_name() -> str:
    """The CPU's model name and this machine's CPU count (for a table's caption)."""
    model = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{model}, {os.cpu_count()} CPUs"


def pinned(argv: list[str], core: int) -> list[str]:
    """``argv`` on core ``core`` (modulo the cores there are) with one torch thread."""
    cores = os.cpu_count() or 1
    return ["taskset", "-c", str(core % cores), "env", "OMP_NUM_THREADS=1", *argv]


def bench_env() -> dict[str, str]:
    """The environment of a training subprocess: this one's, less ``OMP_NUM_THREADS`` (each
    command picks its own thread count unless :func:`pinned` sets it)."""
    env = dict(os.environ)
    env.pop("OMP_NUM_THREADS", None)
    return env


@dataclass
class RanksRun:
    outputs: list[str]  # each rank's stdout and stderr
    wire_bytes: int | None  # sent by all machines' interfaces; None on loopback
    shaping: str  # how each link was shaped, or "loopback"


def run_ranks(
    config: Path,
    ranks: int,
    params: list[str],
    logdir: Path,
    *,
    use_netns: bool,
    link: str | None = None,
    delay: str | None = None,
    port: int = 29650,
    pin: bool = False,
    timeout: float = 3600,
) -> RanksRun:
    """Train ``config`` with ``ranks`` trainers started by hand (``-p`` ``params`` on each);
    raises RuntimeError with the ranks' last lines when one fails. ``link``: a tc rate
    ("1gbit"), or None for an unshaped link."""
    logdir.mkdir(parents=True, exist_ok=True)
    env = bench_env()

    def argv(k: int, host: str) -> list[str]:
        out = [*CLI, "train", str(config), "--rank", str(k), "--no-progress"]
        out += ["-p", f"num_machines={ranks}", "-p", f"distributed_init_method=tcp://{host}:{port}"]
        for p in params:
            out += ["-p", p]
        return pinned(out, k) if pin else out

    if not use_netns:
        return RanksRun(
            _start_and_wait([argv(k, "127.0.0.1") for k in range(ranks)], logdir, env, timeout),
            None,
            "loopback",
        )
    with netns.machines(ranks, link, delay) as machines:
        before = [m.counters()[0] for m in machines]
        commands = [
            m.command(["env", f"GLOO_SOCKET_IFNAME={m.interface}", *argv(k, machines[0].address)])
            for k, m in enumerate(machines)
        ]
        outputs = _start_and_wait(commands, logdir, env, timeout)
        sent = sum(m.counters()[0] - b for m, b in zip(machines, before, strict=True))
        return RanksRun(outputs, sent, machines[0].shaping)


def _start_and_wait(
    commands: list[list[str]], logdir: Path, env: dict[str, str], timeout: float
) -> list[str]:
    procs, logs = [], []
    for k, cmd in enumerate(commands):
        log = (logdir / f"rank{k}.log").open("w+")
        logs.append(log)
        procs.append(
            subprocess.Popen(
                cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, text=True
            )
        )
    try:
        for proc in procs:
            proc.wait(timeout=timeout)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    outputs = []
    for log in logs:
        log.seek(0)
        outputs.append(log.read())
        log.close()
    if any(p.returncode for p in procs):
        raise RuntimeError("a rank failed:\n" + "\n".join(o[-2000:] for o in outputs))
    return outputs
