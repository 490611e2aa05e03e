"""Faults a cluster operator meets, with real processes: every rank must exit, and soon.

Each test starts the ranks by hand (as an operator would), injects one fault while they train
or join, and checks what every rank does: it exits non-zero within ``distributed_timeout`` plus
a margin (counted from the fault: starting Python and torch is slow on a loaded machine), with
one ``error:`` line naming the rank or the cause, and no traceback. The network partition runs
in two network namespaces joined by a veth pair whose link is set down.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bigembed.checkpoints.store import CheckpointStore
from support.ranks import CLI, ENV, free_port, make_graph, read_events, start_rank, worker_of

pytestmark = pytest.mark.integration  # distributed ranks as subprocesses

T = 8.0  # distributed_timeout of these runs
MARGIN = 12.0  # after T: the exit path (at most ~4 s) plus a loaded 2-core machine
#: every fault must stop both distributed modes alike
MODES = pytest.mark.parametrize("mode", ["partitioned", "data_parallel"])


def _wait_exit(proc: subprocess.Popen[str], within: float, what: str) -> str:
    """The output of ``proc``, which must have exited within ``within`` seconds."""
    start = time.monotonic()
    try:
        out, _ = proc.communicate(timeout=within)
        print(f"{what}: exited with {proc.returncode} after {time.monotonic() - start:.1f}s")
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"{what} still running {within:.0f}s after the fault:\n{out}")
    return out


def _one_error(out: str, *expected: str) -> str:
    """The rank printed exactly one error line, containing every ``expected`` text."""
    errors = [line for line in out.splitlines() if "error:" in line]
    assert len(errors) == 1, out
    assert "Traceback" not in out, out
    for text in expected:
        assert text in errors[0], out
    return errors[0]


def _wait_training(cfg: Any, procs: list[subprocess.Popen[str]], version: int = 1) -> None:
    """Until the run committed ``version`` (so the fault hits it mid-training)."""
    store = CheckpointStore(cfg.checkpoint_path)
    deadline = time.monotonic() + 240
    while store.committed_version() < version:
        assert time.monotonic() < deadline, "the run did not start training"
        for p in procs:
            if p.poll() is not None:
                pytest.fail(f"a rank ended early: {p.communicate()[0]}")
        time.sleep(0.1)


def _kill_all(procs: list[subprocess.Popen[str]]) -> None:
    for p in procs:
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.communicate()


# ---------------------------------------------------------------------- rank 0 frozen
@MODES
def test_sigstop_of_rank0_stops_everybody(tmp_path: Path, mode: str) -> None:
    cfg_path, cfg = make_graph(
        tmp_path, num_epochs=500, distributed_timeout=T, distributed_mode=mode
    )
    port = free_port()
    procs = [start_rank(cfg_path, r, port) for r in (0, 1)]
    try:
        _wait_training(cfg, procs)
        os.kill(procs[0].pid, signal.SIGSTOP)
        out1 = _wait_exit(procs[1], T + MARGIN, "rank 1 with rank 0 frozen")
        assert procs[1].returncode != 0
        _one_error(out1, "cannot reach the rendezvous store", "rank 0 (trainer")
        os.kill(procs[0].pid, signal.SIGCONT)
        # Frozen longer than the timeout, rank 0 knows it was suspended; frozen a little less
        # (rank 1 gave up as soon as it could), it sees rank 1's heartbeat stay silent.
        out0 = _wait_exit(procs[0], T + MARGIN, "rank 0 after SIGCONT")
        assert procs[0].returncode != 0
        line = _one_error(out0)
        assert "rank 0 (trainer, lock server, store host) was suspended" in line or (
            "rank 1 (trainer) is gone" in line
        ), out0
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(procs[0].pid, signal.SIGCONT)
        _kill_all(procs)


# ---------------------------------------------------------------------- a foreign listener
@contextlib.contextmanager
def _silent_listener(port: int) -> Iterator[None]:
    """Another program on the store's port: accepts connections, never answers."""
    server = socket.socket()
    server.bind(("127.0.0.1", port))
    server.listen()
    held: list[socket.socket] = []
    stop = threading.Event()

    def serve() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            with contextlib.suppress(OSError):
                held.append(server.accept()[0])

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        for s in [*held, server]:
            s.close()


def test_foreign_listener_on_the_store_port(tmp_path: Path) -> None:
    cfg_path, _ = make_graph(tmp_path, distributed_timeout=T)
    port = free_port()
    with _silent_listener(port):
        procs = [start_rank(cfg_path, r, port) for r in (0, 1)]
        try:
            # Starting Python and torch takes up to ~30 s here; the fault is there from the start.
            outs = [_wait_exit(p, 40 + T + MARGIN, f"rank {r}") for r, p in enumerate(procs)]
        finally:
            _kill_all(procs)
    assert [p.returncode != 0 for p in procs] == [True, True]
    _one_error(outs[0], f"port {port} is already in use")
    _one_error(outs[1], "accepts connections but does not answer", f"127.0.0.1:{port}")


# ---------------------------------------------------------------------- SIGTERM, wrong shape
@MODES
def test_sigterm_stops_the_run_naming_the_rank(tmp_path: Path, mode: str) -> None:
    """Also: ranks started by hand, without OMP_NUM_THREADS and TORCH_CPP_LOG_LEVEL (which
    launch sets), share the cores and print no c10d warnings."""
    cfg_path, cfg = make_graph(
        tmp_path, num_epochs=500, distributed_timeout=T, distributed_mode=mode
    )
    port = free_port()
    bare = {k: v for k, v in ENV.items() if k not in ("OMP_NUM_THREADS", "TORCH_CPP_LOG_LEVEL")}
    procs = [start_rank(cfg_path, r, port, env=bare) for r in (0, 1)]
    try:
        _wait_training(cfg, procs)
        os.kill(procs[1].pid, signal.SIGTERM)
        outs = [_wait_exit(p, T + MARGIN, f"rank {r}") for r, p in enumerate(procs)]
    finally:
        _kill_all(procs)
    assert [p.returncode != 0 for p in procs] == [True, True]
    if mode == "data_parallel":  # the replica removed its scratch copy on its way out
        scratch = re.findall(r"keeps its swapped partitions in (\S+)", outs[1])
        assert scratch and not Path(scratch[0]).exists(), outs[1]
    _one_error(outs[1], "interrupted by SIGTERM")
    _one_error(outs[0], "rank 1 (trainer) failed: interrupted by SIGTERM")
    share = max(1, (os.cpu_count() or 1) // 2)
    for out in outs:
        assert f"{share} torch threads (2 trainers on this machine" in out, out
        assert "[c10d]" not in out, out


def test_wrong_num_machines_is_named_on_every_rank(tmp_path: Path) -> None:
    cfg_path, _ = make_graph(tmp_path, distributed_timeout=T)
    port = free_port()
    procs = [
        start_rank(cfg_path, 0, port),
        start_rank(cfg_path, 1, port, "-p", "num_machines=3"),
    ]
    try:
        outs = [_wait_exit(p, 40 + T + MARGIN, f"rank {r}") for r, p in enumerate(procs)]
    finally:
        _kill_all(procs)
    assert [p.returncode != 0 for p in procs] == [True, True]
    for out in outs:
        _one_error(
            out, "rank 1 (trainer) was started with num_machines=3", "rank 0 with num_machines=2"
        )


# ---------------------------------------------------------------------- restarts
def test_interrupted_snapshot_then_restart_with_fewer_ranks(tmp_path: Path) -> None:
    """A kill of rank 0 while it snapshots leaves ``.epoch_N.tmp/``: the 2-rank restart
    cleans it up and resumes; then one machine (fewer ranks) resumes the same checkpoint. (The
    first 2 epochs, which only make the snapshot, train in this process.)"""
    from bigembed.cli import main as cli_main

    cfg_path, cfg = make_graph(tmp_path, num_epochs=2, checkpoint_preservation_interval=1)
    assert cli_main(["train", str(cfg_path), "--no-progress"]) == 0
    ck = Path(cfg.checkpoint_path)
    assert (ck / "epoch_2").is_dir()

    def interrupted_snapshot() -> Path:
        """What a kill during preserve(2) leaves: a half-filled snapshot directory."""
        tmp = ck / ".epoch_2.tmp"
        tmp.mkdir()
        some = sorted(p for p in (ck / "epoch_2").iterdir() if p.name.endswith(".npy"))[0]
        os.link(some, tmp / some.name)
        return tmp

    tmp = interrupted_snapshot()
    two = subprocess.run(
        [*CLI, "launch", str(cfg_path), "-n", "2", "-p", "num_epochs=3"],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=300,
    )
    assert two.returncode == 0 and "Traceback" not in two.stdout, two.stdout + two.stderr
    assert not tmp.exists()
    tmp = interrupted_snapshot()
    # fewer ranks: one machine takes over (num_machines=1), in this process
    assert cli_main(["train", str(cfg_path), "--no-progress", "-p", "num_epochs=4"]) == 0
    assert not tmp.exists()
    store = CheckpointStore(cfg.checkpoint_path)
    assert store.committed_version() == 4
    steps = [r["version"] for r in store.read_stats() if r["type"] == "step"]
    assert steps == [1, 2, 3, 4], "no step lost or trained twice across the restarts"


def test_launch_max_restarts_restarts_after_a_kill(tmp_path: Path) -> None:
    """Partitioned mode (a data-parallel resume: test_data_parallel, test_no_shared_disk)."""
    cfg_path, cfg = make_graph(tmp_path, num_epochs=6, distributed_timeout=T)
    launcher = subprocess.Popen(
        [*CLI, "launch", str(cfg_path), "-n", "2", "--max-restarts", "1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=ENV,
        start_new_session=True,
    )
    try:
        _wait_training(cfg, [launcher], version=2)
        os.kill(worker_of(launcher.pid, rank=1), signal.SIGKILL)
        out = _wait_exit(launcher, 400, "launch --max-restarts 1")
    finally:
        _kill_all([launcher])
    assert launcher.returncode == 0, out
    assert "restart 1 of 1" in out and "all ranks finished" in out, out
    store = CheckpointStore(cfg.checkpoint_path)
    assert store.committed_version() == 6
    steps = [r["version"] for r in store.read_stats() if r["type"] == "step"]
    assert steps == list(range(1, 7)), "no step lost or trained twice across the restart"
    events = read_events(Path(cfg.checkpoint_path) / "lock_events.jsonl")
    starts = [e["committed"] for e in events if e["event"] == "run_start"]
    assert len(starts) == 2 and starts[0] == 0 and starts[1] >= 2, starts


# ---------------------------------------------------------------------- a network partition
NS = (f"bgf{os.getpid() % 100000}a", f"bgf{os.getpid() % 100000}b")
DEV = (f"bgf{os.getpid() % 100000}va", f"bgf{os.getpid() % 100000}vb")
ADDR = ("10.232.0.1", "10.232.0.2")


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=20)


def _netns_available() -> bool:
    if os.geteuid() != 0 or shutil.which("ip") is None:
        return False
    probe = f"bgfprobe{os.getpid()}"
    ok = subprocess.run(["ip", "netns", "add", probe], capture_output=True).returncode == 0
    if ok:
        subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return ok


@pytest.fixture
def namespace_pair() -> Iterator[tuple[str, str]]:
    """Two namespaces joined by a veth pair (deleted on exit, also after an error)."""
    if not _netns_available():
        pytest.skip("needs root and `ip netns`")
    try:
        for ns in NS:
            _ip("netns", "add", ns)
        _ip("link", "add", DEV[0], "type", "veth", "peer", "name", DEV[1])
        for ns, dev, addr in zip(NS, DEV, ADDR, strict=True):
            _ip("link", "set", dev, "netns", ns)
            _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", dev)
            _ip("-n", ns, "link", "set", dev, "up")
            _ip("-n", ns, "link", "set", "lo", "up")
        yield NS
    finally:
        for ns in NS:  # deleting a namespace deletes its end of the veth pair
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


@MODES
def test_link_down_between_the_ranks_stops_both(tmp_path: Path, namespace_pair, mode: str) -> None:
    cfg_path, cfg = make_graph(
        tmp_path, num_epochs=500, distributed_timeout=T, distributed_mode=mode
    )
    method = f"distributed_init_method=tcp://{ADDR[0]}:29533"
    procs = [
        subprocess.Popen(
            [
                *("ip", "netns", "exec", ns, *CLI, "train", str(cfg_path), "--rank", str(r)),
                *("--no-progress", "-p", "num_machines=2", "-p", method),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=ENV,
            start_new_session=True,
        )
        for r, ns in enumerate(namespace_pair)
    ]
    try:
        _wait_training(cfg, procs)
        _ip("-n", namespace_pair[1], "link", "set", DEV[1], "down")
        outs = [_wait_exit(p, T + MARGIN, f"rank {r}") for r, p in enumerate(procs)]
    finally:
        _kill_all(procs)
    assert [p.returncode != 0 for p in procs] == [True, True]
    _one_error(outs[0], "rank 1 (trainer) is gone")
    _one_error(outs[1], "cannot reach the rendezvous store", ADDR[0])


# ---------------------------------------------------------------------- a forged abort
def test_forged_abort_is_named_as_such_with_a_secret(tmp_path: Path) -> None:
    """With a secret, a stranger can still stop the run (the store is open), but cannot make
    the ranks print its text as if a member had failed."""
    from support.ranks import SECRET, connect_store

    cfg_path, cfg = make_graph(tmp_path, num_epochs=500, distributed_timeout=T)
    port = free_port()
    env = {**ENV, "BIGEMBED_SECRET": SECRET}
    procs = [start_rank(cfg_path, r, port, env=env) for r in (0, 1)]
    try:
        _wait_training(cfg, procs)
        connect_store(port).set("abort", "rank 1 (trainer) failed: disk on fire")
        outs = [_wait_exit(p, T + MARGIN, f"rank {r}") for r, p in enumerate(procs)]
    finally:
        _kill_all(procs)
    assert [p.returncode != 0 for p in procs] == [True, True]
    for out in outs:
        _one_error(out, "somebody else wrote an abort", "not signed with the run's secret")


def test_a_failed_rank_prints_its_error_once_when_threads_fail_together() -> None:
    """The watchdog's verdict and the main thread's failed call (waiting for that verdict in
    ``fail``) both end the run: one ends the process, the others wait, one line is printed
    (test_sigstop_of_rank0_stops_everybody once saw the line three times)."""
    from bigembed.distributed.context import DistContext

    ctx = DistContext.__new__(DistContext)  # only the shutdown path
    ctx.timeout, ctx.watchdog, ctx.store = 1.0, None, None
    ctx._ending = threading.Lock()
    cleaned: list[int] = []
    ctx._cleanups = [lambda: cleaned.append(1)]  # a data-parallel replica's scratch, say
    ended: list[str] = []

    def end(message: str) -> None:  # stands for printing the line and os._exit
        time.sleep(0.2)
        ended.append(message)

    ctx._exit = end
    threads = [
        threading.Thread(target=ctx.on_fatal, args=(f"failure {i}",), daemon=True) for i in range(3)
    ]
    for t in threads:
        t.start()
    time.sleep(1.5)
    assert len(ended) == 1, ended
    assert cleaned == [1]  # the cleanups ran once, before the end
