"""Hogwild workers (and their helper processes) do not outlive a trainer killed with SIGKILL.

Every process started for one run is found through a unique environment variable that the
trainer's children inherit (``/proc/PID/environ``), so no parent chain needs to be followed.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from bigembed.checkpoints.reading import load_trained
from bigembed.checkpoints.store import CheckpointStore
from bigembed.config import config_to_dict
from support.graphs import graph_config, write_graph

pytestmark = [
    pytest.mark.integration,  # `bigembed train` as a subprocess, killed
    pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs /proc"),
]

MARK = "BIGEMBED_ORPHAN_TEST"
# How long the orphans may take to notice and exit: a worker killed before its guard is in
# place exits once it reaches the guard, which on a loaded CI machine (two test files at once,
# each starting processes) took more than 5 s once. The check returns as soon as none is left;
# a worker without a guard waits for tasks forever and fails it whatever the grace.
GRACE_SECONDS = 20.0


def _marked(mark: str) -> dict[int, str]:
    """pid -> command line of every live process whose environment holds ``mark``."""
    needle = f"{MARK}={mark}".encode()
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle not in f.read().split(b"\0"):
                    continue
            with open(f"/proc/{entry}/stat", "rb") as f:
                if f.read().rsplit(b")", 1)[1].split()[0] == b"Z":
                    continue  # a zombie holds no memory; its parent (us) reaps it
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                found[int(entry)] = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # gone meanwhile, or not ours to read
            continue
    return found


@pytest.fixture(scope="module")
def config_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("orphans")
    write_graph(root, num_entities=2000, num_edges=40000)
    cfg = graph_config(root, num_epochs=100, dimension=64, workers=2)
    path = root / "config.json"
    path.write_text(json.dumps(config_to_dict(cfg)))
    return path


def _start(config: Path, mark: str) -> subprocess.Popen:
    env = dict(os.environ, **{MARK: mark})
    cmd = [sys.executable, "-m", "bigembed.cli", "train", str(config), "--no-progress"]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _wait_for(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def _kill_and_check(proc: subprocess.Popen, mark: str) -> None:
    before = _marked(mark)
    assert len(before) >= 3, f"expected the trainer and its workers, found {before}"
    proc.kill()  # SIGKILL to the trainer alone: its children get no signal from us
    proc.wait()
    deadline = time.monotonic() + GRACE_SECONDS
    left = _marked(mark)
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = _marked(mark)
    for pid in left:  # do not leak them into the rest of the test session
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    assert not left, f"still alive {GRACE_SECONDS}s after the trainer was killed: {left}"


def _workers_starting(mark: str) -> bool:
    """The workers' forkserver (or a spawned worker) exists: it may still be importing."""
    return any("forkserver" in cmd or "spawn_main" in cmd for cmd in _marked(mark).values())


@pytest.mark.parametrize("delay", [0.0, 0.2, 0.6])
def test_kill_during_worker_startup_leaves_no_process(config_file: Path, delay: float) -> None:
    """Killed while the workers are still importing and unpickling (the old leak)."""
    mark = uuid.uuid4().hex
    proc = _start(config_file, mark)
    try:
        _wait_for(lambda: _workers_starting(mark), 60, "the Hogwild workers to be spawned")
        time.sleep(delay)
    except BaseException:
        proc.kill()
        raise
    _kill_and_check(proc, mark)


def test_kill_mid_training_leaves_no_process(config_file: Path) -> None:
    mark = uuid.uuid4().hex
    store = CheckpointStore(config_file.parent / "model")
    start = store.committed_version()
    proc = _start(config_file, mark)
    try:
        _wait_for(lambda: store.committed_version() > start, 120, "a committed training step")
    except BaseException:
        proc.kill()
        raise
    _kill_and_check(proc, mark)


def test_sigterm_to_the_process_group_ends_the_run_cleanly(config_file: Path, tmp_path) -> None:
    """`kill -- -PGID`, `systemctl stop` or a scheduler's preemption: SIGTERM reaches the
    trainer and its workers at once. The trainer stops them as Ctrl-C does (one line, exit
    128 + 15, the committed checkpoint intact); no worker dies first and turns it into a
    "worker died" error, and none is left behind."""
    mark = uuid.uuid4().hex
    store = CheckpointStore(config_file.parent / "model")
    start = store.committed_version()
    env = dict(os.environ, **{MARK: mark})
    cmd = [sys.executable, "-m", "bigembed.cli", "train", str(config_file), "--no-progress"]
    with open(tmp_path / "err", "w+") as err:
        proc = subprocess.Popen(
            cmd, env=env, stdout=subprocess.DEVNULL, stderr=err, start_new_session=True
        )
        try:
            _wait_for(lambda: store.committed_version() > start, 120, "a committed training step")
            workers = [pid for pid in _marked(mark) if pid != proc.pid]
            assert len(workers) >= 2, "the trainer and its workers"
            # The signal may reach a worker before the trainer acts on it: the worker must
            # leave stopping to the trainer, not die (the trainer would report a dead worker).
            for pid in workers:
                os.kill(pid, signal.SIGTERM)
            time.sleep(1.0)
            alive = _marked(mark)
            assert all(pid in alive for pid in workers), "a worker died of the SIGTERM"
            os.killpg(proc.pid, signal.SIGTERM)
            code = proc.wait(timeout=60)
        finally:
            with contextlib.suppress(OSError):
                os.killpg(proc.pid, signal.SIGKILL)
        err.seek(0)
        lines = err.read().strip().splitlines()
    assert code == 128 + signal.SIGTERM, lines[-5:]
    assert lines[-1] == "bigembed train: interrupted by SIGTERM", lines[-5:]
    assert not any("Traceback" in line or "leaked" in line for line in lines), lines
    _wait_for(lambda: not _marked(mark), GRACE_SECONDS, "the workers to exit")
    assert store.committed_version() > start
    load_trained(config_file.parent / "model")  # the committed version is whole
