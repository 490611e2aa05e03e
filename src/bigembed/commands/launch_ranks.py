"""``bigembed launch CONFIG -n N``: every rank of a distributed run on this one machine.

For one big machine (several trainers sharing it, each with its own partitions in memory) and
for tests. It picks ``tcp://127.0.0.1:FREE_PORT`` when the config names no
``distributed_init_method``, forwards the ``-p`` overrides to every rank, starts the external
partition servers too when ``num_partition_servers`` > 0, prefixes every output line with the
rank it came from, and, when a rank fails, stops the others and exits non-zero. With
``--eval EVAL_ARGS`` the ranks are those of a distributed evaluation (``bigembed eval CONFIG
--rank R EVAL_ARGS``) instead of trainers.

``--max-restarts N`` (as torchrun's): after a failure, start every rank again, up to N times;
each attempt resumes from the last committed checkpoint, as a restart by hand would. An
interrupt (Ctrl-C, SIGTERM of the launcher) is never restarted. The same run, with torch's
elastic agent doing the restarts: ``torchrun --standalone --nproc_per_node K --max-restarts N
-m bigembed train CONFIG`` (K: the trainers plus the partition servers; docs/distributed.md).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from bigembed.config import (
    ConfigSchema,
    apply_overrides,
    load_config,
    normalize_keys,
    read_config_file,
)
from bigembed.errors import ConfigError

GRACE_S = 5.0


def free_port(host: str = "127.0.0.1") -> int:
    """A port nobody listens on right now: the rendezvous of a launch without
    ``distributed_init_method``. Here, not in the store module, so that the launcher, which only
    starts and watches processes, does not import torch (a heavy import for each launch)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


@dataclass
class Child:
    name: str
    argv: list[str]
    proc: subprocess.Popen[str] | None = None
    reader: threading.Thread | None = None


def resolve(
    config: str, params: Sequence[str], nproc: int | None
) -> tuple[ConfigSchema, list[str]]:
    """The validated config of the run and the ``-p`` list every rank gets."""
    raw = normalize_keys(read_config_file(Path(config)), config)
    data = apply_overrides(raw, params, ConfigSchema, config)
    n = nproc if nproc is not None else int(data.get("num_machines") or 1)
    if n < 2:
        raise ConfigError(
            f"{config}: launch needs at least 2 ranks: pass -n N or set num_machines >= 2"
        )
    forwarded = [*params, f"num_machines={n}"]
    if not data.get("distributed_init_method"):
        forwarded.append(f"distributed_init_method=tcp://127.0.0.1:{free_port()}")
    return load_config(config, forwarded), forwarded


def _die_with_parent() -> None:
    """In the child: get SIGTERM if the launcher dies (Linux), so no rank outlives it."""
    with contextlib.suppress(Exception):
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


def _pump(stream: IO[str], prefix: str, lock: threading.Lock) -> None:
    for line in stream:
        with lock:
            sys.stdout.write(f"{prefix} {line}" if line.endswith("\n") else f"{prefix} {line}\n")
            sys.stdout.flush()


def _stop(children: Sequence[Child], sig: int) -> None:
    for c in children:
        if c.proc is not None and c.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(c.proc.pid, sig)


INTERRUPTED = 130


def launch(
    config: str,
    params: Sequence[str],
    nproc: int | None,
    progress: bool = False,
    max_restarts: int = 0,
    eval_args: Sequence[str] | None = None,
) -> int:
    """Run every rank until they all finish; restart them all after a failure, up to
    ``max_restarts`` times. Returns the exit status of the last attempt. With ``eval_args``
    (a list, maybe empty) the ranks run ``bigembed eval CONFIG --rank R EVAL_ARGS`` instead of
    training (no partition servers)."""
    if max_restarts < 0:
        raise ConfigError(f"--max-restarts {max_restarts}: must be 0 or more")
    attempt = 0
    while True:
        cfg, forwarded = resolve(config, params, nproc)  # a fresh free port for each attempt
        code = _launch_once(config, cfg, forwarded, progress, eval_args)
        if code in (0, INTERRUPTED) or attempt >= max_restarts:
            if code not in (0, INTERRUPTED) and max_restarts:
                print(f"[launch] giving up after {max_restarts} restarts", flush=True)
            return code
        attempt += 1
        again = "training resumes from the last committed checkpoint"
        print(
            f"[launch] restart {attempt} of {max_restarts}: starting every rank again "
            f"({again if eval_args is None else 'the evaluation starts over'})",
            flush=True,
        )


def _launch_once(
    config: str,
    cfg: ConfigSchema,
    forwarded: list[str],
    progress: bool,
    eval_args: Sequence[str] | None = None,
) -> int:
    overrides = [arg for p in forwarded for arg in ("-p", p)]
    base = [sys.executable, "-m", "bigembed.cli"]
    command = ["train"] if eval_args is None else ["eval"]
    children = [
        Child(
            f"rank {r}",
            [
                *base,
                *command,
                config,
                "--rank",
                str(r),
                *overrides,
                *([] if progress and r == 0 else ["--no-progress"]),
                *(eval_args or []),
            ],
        )
        for r in range(cfg.num_machines)
    ]
    servers = max(cfg.num_partition_servers, 0) if eval_args is None else 0
    children += [
        Child(f"parts {s}", [*base, "partition-server", config, "--rank", str(s), *overrides])
        for s in range(servers)
    ]
    env = dict(os.environ)
    env.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")  # c10d warnings with C++ stack traces
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // cfg.num_machines)))
    env["PYTHONUNBUFFERED"] = "1"
    lock = threading.Lock()
    width = max(len(c.name) for c in children)
    print(
        f"[launch] {cfg.num_machines} {'trainers' if eval_args is None else 'eval ranks'} + "
        f"{servers} partition servers at {cfg.distributed_init_method}",
        flush=True,
    )
    for c in children:  # all forks before any thread starts (preexec_fn and threads mix badly)
        c.proc = subprocess.Popen(
            c.argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
            env=env,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
    for c in children:
        assert c.proc is not None and c.proc.stdout is not None
        prefix = f"[{c.name:<{width}}]"
        c.reader = threading.Thread(target=_pump, args=(c.proc.stdout, prefix, lock), daemon=True)
        c.reader.start()

    interrupted: list[int] = []

    def on_signal(signum: int, _frame: object) -> None:
        interrupted.append(signum)

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    code = 0
    try:
        while True:
            if interrupted:
                _stop(children, signal.SIGTERM)
                code = INTERRUPTED
                break
            failed = [c for c in children if c.proc is not None and c.proc.poll() not in (None, 0)]
            if failed:
                first = failed[0]
                assert first.proc is not None
                code = first.proc.returncode if first.proc.returncode > 0 else 1
                with lock:
                    print(
                        f"[launch] {first.name} exited with code {first.proc.returncode}; "
                        "stopping the others",
                        flush=True,
                    )
                _stop(children, signal.SIGTERM)
                break
            if all(c.proc is not None and c.proc.poll() == 0 for c in children):
                break
            time.sleep(0.2)
        deadline = time.monotonic() + GRACE_S
        for c in children:
            assert c.proc is not None
            try:
                c.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _stop([c], signal.SIGKILL)
                c.proc.wait()
        for c in children:
            if c.reader is not None:
                c.reader.join(timeout=2)
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
    if code == 0:
        print("[launch] all ranks finished", flush=True)
    return code
