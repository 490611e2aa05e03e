"""Starting ranks the way torch.distributed users do: torchrun, SLURM's variables.

First the rule that says where a rank's place comes from (``--rank`` > torch's variables >
SLURM's, :mod:`bigembed.distributed.launch_env`), as a pure function; then real runs on
127.0.0.1: a rank killed under ``torchrun --max-restarts 1`` (the run resumes from the last
committed version), 2 ranks started with SLURM's variables alone, and a distributed ``bigembed
eval`` under torchrun (the one-machine report). torchrun's 2 local processes training like one
machine is test_dist's test_two_and_four_ranks_match_single_machine.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from bigembed.checkpoints import CheckpointStore
from bigembed.distributed import host_agent_store, place, read_launch_env
from bigembed.distributed.launch_env import SLURM_PORT_BASE, first_host
from bigembed.errors import ConfigError
from bigembed.eval import evaluate_checkpoint
from support.checkpoints import TrainedRing
from support.ranks import (
    CLI,
    TIMEOUT,
    check_events,
    clean_env,
    free_port,
    make_graph,
    read_events,
    torchrun,
    worker_of,
)

TORCH = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "MASTER_ADDR": "h", "MASTER_PORT": "9"}
SLURM = {
    "SLURM_PROCID": "3",
    "SLURM_NTASKS": "4",
    "SLURM_LOCALID": "1",
    "SLURM_JOB_ID": "123456",
    "SLURM_JOB_NODELIST": "gpu[07-09,12],cpu1",
}


# ---------------------------------------------------------------------- where the rank comes from
def test_first_host_of_a_slurm_nodelist() -> None:
    assert first_host("node07") == "node07"
    assert first_host("gpu[07-09,12],cpu1") == "gpu07"
    assert first_host("a[3,5-6]-ib,b1") == "a3-ib"
    assert first_host("10.0.0.5,10.0.0.6") == "10.0.0.5"
    with pytest.raises(ConfigError, match="node list"):
        first_host("[]")


def test_torch_variables_win_over_slurm() -> None:
    env = read_launch_env({**SLURM, **TORCH})
    assert env is not None
    assert (env.launcher, env.rank, env.world_size, env.local_rank) == ("torchrun", 1, 2, 1)
    assert env.master == {}, "torchrun's MASTER_ADDR/PORT are used as they are"
    assert read_launch_env({"RANK": "0", "WORLD_SIZE": "1"}) is None, "a world of one"
    assert read_launch_env({}) is None
    with pytest.raises(ConfigError, match="rank 2 is outside a world of 2"):
        read_launch_env({**TORCH, "RANK": "2"})


def test_slurm_variables() -> None:
    env = read_launch_env(SLURM)
    assert env is not None
    assert (env.launcher, env.rank, env.world_size, env.local_rank) == ("SLURM", 3, 4, 1)
    port = SLURM_PORT_BASE + 123456 % 20000
    assert env.master == {"MASTER_ADDR": "gpu07", "MASTER_PORT": str(port)}
    step = read_launch_env({**SLURM, "SLURM_STEP_NODELIST": "n[2-3]", "MASTER_PORT": "7"})
    assert step is not None and step.master == {"MASTER_ADDR": "n2"}, "the step's nodes first"
    assert read_launch_env({**SLURM, "SLURM_NTASKS": "1", "SLURM_PROCID": "0"}) is None
    step = read_launch_env({**SLURM, "SLURM_STEP_NUM_TASKS": "8"})
    assert step is not None and step.world_size == 8, "srun's step, not the whole job"


def test_place_precedence_and_num_machines() -> None:
    cfg: dict[str, Any] = {}  # a config that leaves the distributed keys at their defaults
    explicit = place(cfg, 0, {**TORCH})
    assert (explicit.rank, explicit.overrides, explicit.launch) == (0, [], None), "--rank wins"
    assert place(cfg, None, {}).rank == 0
    p = place(cfg, None, TORCH)
    assert p.rank == 1 and p.environ == {}
    assert p.overrides == ["num_machines=2", "distributed_init_method=env://"]
    s = place({"num_machines": 1}, None, SLURM)
    assert s.rank == 3 and s.overrides[0] == "num_machines=4" and s.environ["MASTER_ADDR"]
    # the world holds the partition servers after the trainers
    servers = {"num_partition_servers": 1, "distributed_init_method": "env://"}
    assert place(servers, None, TORCH).overrides == ["num_machines=1"]
    both = {"num_machines": 2, "distributed_init_method": "tcp://h:1"}
    assert place(both, None, TORCH).overrides == [], "a config that agrees is left alone"
    other = {"num_machines": 3, "distributed_init_method": "env://"}
    with pytest.raises(ConfigError, match=r"num_machines is 3 .* torchrun started 2 processes"):
        place(other, None, TORCH)
    too_many = {"num_partition_servers": 2}
    with pytest.raises(ConfigError, match="num_partition_servers is 2"):
        place(too_many, None, TORCH)


# ---------------------------------------------------------------------- bigembed launch's store
def _listening(port: int) -> set[str]:
    """The addresses a TCP socket of this machine listens on at ``port`` (/proc/net/tcp*)."""
    found = set()
    for table, family in (("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6)):
        for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, _, hex_port = local.partition(":")
            if state == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
                raw = bytes.fromhex(address)
                words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
                found.add(socket.inet_ntop(family, words))
    return found


def test_the_agent_store_listens_on_the_launch_host_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch's static rendezvous (what ``bigembed launch``'s agent runs) opens its TCPStore
    master at the endpoint, on every interface; it must find bigembed's bound one instead."""
    from torch.distributed.elastic.rendezvous import RendezvousParameters
    from torch.distributed.elastic.rendezvous.static_tcp_rendezvous import create_rdzv_handler

    monkeypatch.delenv("BIGEMBED_BIND", raising=False)
    store, host, port = host_agent_store(5.0)
    assert host == "127.0.0.1"
    params = RendezvousParameters("static", f"127.0.0.1:{port}", "run", 1, 1, rank=0)
    info = create_rdzv_handler(params).next_rendezvous()
    info.store.set("key", "value")
    assert store.get("run/key") == b"value", "the rendezvous uses the bound store"
    assert _listening(port) == {"127.0.0.1"}


# ---------------------------------------------------------------------- real processes
# torchrun's 2 processes train like `bigembed launch -n 2`: test_dist's
# test_two_and_four_ranks_match_single_machine starts its 2 ranks with torchrun.


@pytest.mark.integration
def test_torchrun_restarts_a_killed_rank_and_resumes(tmp_path: Path) -> None:
    epochs = 6  # killed after 2, the rest after the restart
    path, cfg = make_graph(tmp_path, num_epochs=epochs)
    store = CheckpointStore(cfg.checkpoint_path)
    argv = [*torchrun("--max-restarts", "1", "--master_port", str(free_port()))]
    agent = subprocess.Popen(
        [*argv, "-m", "bigembed", "train", str(path), "--no-progress"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=clean_env(),
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        while store.committed_version() < 2 and time.monotonic() < deadline:
            assert agent.poll() is None, agent.communicate()[0]
            time.sleep(0.05)
        killed = worker_of(agent.pid, rank=1)
        os.kill(killed, signal.SIGKILL)
        out, _ = agent.communicate(timeout=90)
    finally:
        if agent.poll() is None:
            os.killpg(agent.pid, signal.SIGKILL)
    assert agent.returncode == 0, out
    assert "restart 1" in out, out
    assert store.committed_version() == epochs
    steps = [r["version"] for r in store.read_stats() if r["type"] == "step"]
    assert steps == list(range(1, epochs + 1)), "no step lost or trained twice across the restart"
    events = read_events(Path(cfg.checkpoint_path) / "lock_events.jsonl")
    runs = [e["committed"] for e in events if e["event"] == "run_start"]
    assert len(runs) == 2 and runs[0] == 0 and runs[1] >= 2, runs
    check_events(events)


@pytest.mark.integration
def test_slurm_variables_alone_start_two_ranks(tmp_path: Path) -> None:
    from bigembed.distributed.store import port_is_free

    path, cfg = make_graph(tmp_path, num_epochs=2)
    job = next(j for j in range(4242, 24242, 97) if port_is_free("127.0.0.1", SLURM_PORT_BASE + j))
    slurm = {"SLURM_NTASKS": "2", "SLURM_JOB_ID": str(job), "SLURM_JOB_NODELIST": "127.0.0.1"}
    procs = [
        subprocess.Popen(
            [*CLI, "train", str(path), "--no-progress"],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=clean_env(**slurm, SLURM_PROCID=str(r), SLURM_LOCALID=str(r)),
        )
        for r in (0, 1)
    ]
    outs = [p.communicate(timeout=90)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert "SLURM: rank 1 of 2" in outs[1], outs[1]
    assert "run at env://" in outs[0] and "Trained 2 step(s)" in outs[0], outs[0]
    assert CheckpointStore(cfg.checkpoint_path).committed_version() == 2


@pytest.mark.integration
def test_torchrun_runs_a_distributed_eval(trained_checkpoint: TrainedRing, tmp_path: Path) -> None:
    """``bigembed eval`` under torchrun: 2 ranks (torchrun's), the one-machine report."""
    ring = trained_checkpoint
    test, out = str(ring.root / "test"), tmp_path / "report.json"
    argv = [*torchrun("--master_port", str(free_port()), "-m", "bigembed", "eval")]
    argv += [str(ring.config_file), "--no-progress", "-p", f"distributed_timeout={TIMEOUT}"]
    done = subprocess.run(
        [*argv, "--edges", test, "--output", str(out)],
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    one = evaluate_checkpoint(ring.config, [test]).to_json()
    mine = json.loads(out.read_text())
    assert {k: v for k, v in mine.items() if k != "seconds"} == {
        k: v for k, v in one.items() if k != "seconds"
    }
    assert done.stdout.count("ranked 12 of the 24 edges") == 2, done.stdout
