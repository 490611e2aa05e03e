"""Security of the distributed run and of what bigembed reads.

* Nothing read from the network or a file is unpickled (a source-tree AST check).
* The opt-in shared secret: its loading, the sealed control messages (a request without a
  valid MAC is dropped, a forged reply stops the client), and real 2-rank runs: a stranger who
  connects to the store and tries to join or send a lock request is refused while the run
  completes; a rank with the wrong secret is refused with a one-line error.
* ``BIGEMBED_BIND``: rank 0's store listens on the chosen address only.
"""

from __future__ import annotations

import ast
import json
import os
import socket
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
import torch.distributed as dist

from bigembed.config import config_to_dict
from bigembed.distributed import rpc as rpc_module
from bigembed.distributed.auth import (
    BadMac,
    Secret,
    load_secret,
)
from bigembed.distributed.lock_server import BucketScheduler, LockServer, PassPlan
from bigembed.distributed.partition_server import PartitionServer
from bigembed.distributed.rpc import RpcClient, RpcServer
from bigembed.distributed.store import StoreAddress
from bigembed.errors import ConfigError, PeerError
from support.graphs import graph_config, write_graph
from support.ranks import SECRET, connect_store, free_port, start_rank

SRC = Path(__file__).resolve().parents[1] / "src"
CLI = [sys.executable, "-m", "bigembed.cli"]
ENV = {
    **os.environ,
    "OMP_NUM_THREADS": "1",
    "TORCH_CPP_LOG_LEVEL": "ERROR",
    "PYTHONUNBUFFERED": "1",
}
for _k in ("BIGEMBED_SECRET", "BIGEMBED_SECRET_FILE", "BIGEMBED_BIND"):
    ENV.pop(_k, None)


# ---------------------------------------------------------------------- no unpickling anywhere
def _kw(call: ast.Call, name: str) -> ast.expr | None:
    return next((k.value for k in call.keywords if k.arg == name), None)


def _is_true(node: ast.expr | None) -> bool:
    return isinstance(node, ast.Constant) and node.value is True


def unpickling_calls(tree: ast.AST) -> list[tuple[int, str]]:
    """Calls that may unpickle: torch.load without weights_only=True, pickle/dill/cloudpickle
    load(s), numpy load with allow_pickle=True, pandas read_pickle."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        owner = node.func.value
        base = owner.id if isinstance(owner, ast.Name) else getattr(owner, "attr", "")
        attr = node.func.attr
        if base == "torch" and attr == "load" and not _is_true(_kw(node, "weights_only")):
            found.append((node.lineno, "torch.load without weights_only=True"))
        elif base in ("pickle", "cPickle", "dill", "cloudpickle", "joblib") and attr in (
            "load",
            "loads",
            "Unpickler",
        ):
            found.append((node.lineno, f"{base}.{attr}"))
        elif base in ("np", "numpy") and attr == "load" and not _is_false_or_absent(node):
            found.append((node.lineno, "np.load with allow_pickle"))
        elif attr == "read_pickle":
            found.append((node.lineno, "read_pickle"))
    return found


def _is_false_or_absent(call: ast.Call) -> bool:
    value = _kw(call, "allow_pickle")
    return value is None or (isinstance(value, ast.Constant) and value.value is False)


def test_checker_finds_unpickling() -> None:
    bad = (
        "import torch, pickle, numpy as np\n"
        "torch.load(p)\ntorch.load(p, weights_only=False)\npickle.loads(b)\n"
        "np.load(p, allow_pickle=True)\n"
        "torch.load(p, weights_only=True)\nnp.load(p)\nnp.load(p, allow_pickle=False)\n"
    )
    assert [line for line, _ in unpickling_calls(ast.parse(bad))] == [2, 3, 4, 5]


def test_source_tree_never_unpickles() -> None:
    problems = []
    files = sorted(SRC.rglob("*.py"))
    assert len(files) > 50
    for path in files:
        for line, what in unpickling_calls(ast.parse(path.read_text(), str(path))):
            problems.append(f"{path.relative_to(SRC)}:{line}: {what}")
    assert problems == []


# ---------------------------------------------------------------------- the secret
def test_load_secret(tmp_path: Path) -> None:
    assert load_secret({}) is None
    assert load_secret({"BIGEMBED_SECRET": SECRET}) == SECRET.encode()
    path = tmp_path / "secret"
    path.write_text(SECRET + "\n")
    path.chmod(0o600)
    assert load_secret({"BIGEMBED_SECRET_FILE": str(path)}) == SECRET.encode()
    with pytest.raises(ConfigError, match="not both"):
        load_secret({"BIGEMBED_SECRET": SECRET, "BIGEMBED_SECRET_FILE": str(path)})
    with pytest.raises(ConfigError, match="at least 16 bytes"):
        load_secret({"BIGEMBED_SECRET": "short"})
    with pytest.raises(ConfigError, match=r"BIGEMBED_SECRET_FILE .*missing: cannot read it"):
        load_secret({"BIGEMBED_SECRET_FILE": str(tmp_path / "missing")})


def test_proofs_and_session_keys() -> None:
    a, b = Secret(SECRET.encode()), Secret(b"another secret of enough length")
    assert a.join_proof("n", 1, "c") == Secret(SECRET.encode()).join_proof("n", 1, "c")
    assert a.join_proof("n", 1, "c") != b.join_proof("n", 1, "c")
    assert a.join_proof("n", 1, "c") != a.join_proof("n", 2, "c")  # bound to the rank
    assert a.join_proof("n", 1, "c") != a.welcome_proof("n", 1, "c")  # no reflection
    assert SECRET not in a.join_proof("n", 1, "c")
    session = a.session("nonce")
    sealed = session.seal("lock/req/1", '{"op": "acquire"}')
    assert session.open("lock/req/1", sealed) == b'{"op": "acquire"}'
    with pytest.raises(BadMac):  # a message is bound to its store key
        session.open("lock/req/2", sealed)
    with pytest.raises(BadMac):
        b.session("nonce").open("lock/req/1", sealed)
    with pytest.raises(BadMac):
        session.open("lock/req/1", b'{"op": "acquire"}')
    with pytest.raises(BadMac):
        session.open("lock/req/1", sealed.replace(b"acquire", b"release"))


@pytest.fixture
def store():
    master = dist.TCPStore(
        "127.0.0.1", 0, 1, is_master=True, timeout=timedelta(seconds=5), wait_for_workers=False
    )
    yield master
    del master


def _client(master: dist.TCPStore) -> dist.Store:
    return dist.TCPStore("127.0.0.1", master.port, is_master=False, timeout=timedelta(seconds=5))


def test_rpc_drops_requests_without_a_valid_mac(store, monkeypatch) -> None:
    monkeypatch.setattr(rpc_module, "GAP_S", 0.3)
    session = Secret(SECRET.encode()).session("nonce")
    handled: list[dict] = []
    errors: list[str] = []

    def handler(req: dict) -> dict | None:
        handled.append(req)
        return None if req["op"] == "silent" else {"granted": req["op"]}

    server = RpcServer(_client(store), "lock", handler, errors.append, poll=0.1, session=session)
    server.start()
    try:
        stranger = _client(store)
        RpcClient(stranger, "lock", 2.0, "rank 0").send({"op": "unsigned"})
        wrong = Secret(b"a wrong secret, long enough").session("nonce")
        RpcClient(stranger, "lock", 2.0, "rank 0", wrong).send({"op": "wrong-key"})
        stranger.set("lock/req/3", b"\x80not json")  # garbage
        stranger.add("lock/seq", 1)  # a number taken and never written (request 3's slot)
        stranger.add("lock/seq", 1)  # request 4 is never written either
        legit = RpcClient(_client(store), "lock", 5.0, "rank 0", session)
        assert legit.call({"op": "acquire"}) == {"granted": "acquire"}
        assert [r["op"] for r in handled] == ["acquire"]
        assert server.dropped == 3 and errors == []
        # an answer not sealed with the session stops the client
        n = legit.send({"op": "silent"})  # the server never answers this one
        stranger.set(f"lock/rep/{n}", json.dumps({"granted": "forged"}))
        with pytest.raises(PeerError, match="not signed with the run's secret"):
            legit.receive(n)
    finally:
        server.stop()


def test_bind_limits_the_store_to_one_address(monkeypatch) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("BIGEMBED_BIND", "127.0.0.2")
    address = StoreAddress.parse(f"tcp://127.0.0.2:{port}")
    master = address.open(0, 2, 5.0)
    try:
        address.client(2.0).set("k", "v")  # reachable on the bound address
        with pytest.raises(PeerError, match="cannot reach the rendezvous store"):
            StoreAddress.parse(f"tcp://127.0.0.1:{port}").client(1.0)
    finally:
        del master
    monkeypatch.setenv("BIGEMBED_BIND", "192.0.2.77")  # TEST-NET: not on this machine
    with pytest.raises(PeerError, match=r"BIGEMBED_BIND 192\.0\.2\.77: rank 0 cannot listen"):
        StoreAddress.parse(f"tcp://127.0.0.1:{port}").open(0, 2, 1.0)


def test_store_listens_only_on_the_host_of_the_uri(monkeypatch) -> None:
    """Without --bind the store binds to the host tcp://HOST:PORT names, not every interface."""
    monkeypatch.delenv("BIGEMBED_BIND", raising=False)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    address = StoreAddress.parse(f"tcp://127.0.0.2:{port}")
    master = address.open(0, 2, 5.0)
    try:
        address.client(2.0).set("k", "v")
        with pytest.raises(PeerError, match="cannot reach the rendezvous store"):
            StoreAddress.parse(f"tcp://127.0.0.1:{port}").client(1.0)
    finally:
        del master


def test_lock_server_refuses_strangers_requests(store) -> None:
    """Without a secret: a made-up trainer, malformed fields and oversized requests change
    nothing (no grant, no event) and a member's request is then served as usual."""
    weights = {(i, j): 1 for i in range(2) for j in range(2)}
    scheduler = BucketScheduler(
        lambda b: (frozenset({("node", b[0])}), frozenset({("node", b[1])})),
        lambda it: PassPlan(it, weights, False),
    )
    errors: list[str] = []
    server = LockServer(_client(store), scheduler, errors.append, trainers=2)
    server.rpc.poll = 0.1
    server.start()
    try:
        stranger = RpcClient(_client(store), "lock", 5.0, "the lock server")
        bad = [
            {"op": "acquire", "trainer": 7, "iteration": 0, "finished": None},
            {"op": "acquire", "trainer": -1, "iteration": 0, "finished": None},
            {"op": "acquire", "trainer": True, "iteration": 0, "finished": None},
            {"op": "acquire", "trainer": 0, "iteration": "0", "finished": None},
            {"op": "acquire", "trainer": 0, "iteration": 0, "finished": [0, 1, 2]},
            {"op": "release", "trainer": 0, "iteration": 0, "keys": [["node"]]},
            {"op": "shutdown", "trainer": 0, "iteration": 0},
        ]
        for req in bad:
            with pytest.raises(PeerError, match="refused a request: bad"):
                stranger.call(req)
        # an oversized request is dropped unanswered
        n = stranger.send({"op": "acquire", "pad": "x" * (2 << 20)})
        with pytest.raises(PeerError, match="did not answer"):
            stranger.receive(n, timeout=1.0)
        assert scheduler.iteration == -1 and not scheduler.active and not scheduler.owner
        member = RpcClient(_client(store), "lock", 5.0, "the lock server")
        reply = member.call({"op": "acquire", "trainer": 1, "iteration": 0, "finished": None})
        assert reply["kind"] == "bucket" and list(scheduler.active) == [1]
        assert errors == []
    finally:
        server.stop()


def test_partition_server_refuses_strangers_requests(store) -> None:
    address = StoreAddress.parse(f"tcp://127.0.0.1:{store.port}")
    errors: list[str] = []
    server = PartitionServer(3, address, 5.0, errors.append, trainers=2)
    server.rpc.poll = 0.1
    server.start()
    try:
        stranger = RpcClient(address.namespaced(_client(store)), "parts/3", 5.0, "server 3")
        base = {"op": "put", "key": ["node", 0], "client": 0, "shape": [10, 4]}
        for change in (
            {"client": 5},  # not a trainer of the run
            {"shape": [1 << 30, 1 << 15]},  # larger than any partition
            {"shape": [-1, 4]},
            {"key": ["node", -3]},
            {"form": "pickle"},
            {"op": "evict"},
        ):
            with pytest.raises(PeerError, match=r"refused a request: (bad|a put of)"):
                stranger.call({**base, **change})
        assert server.tables == {} and errors == [] and not server.stopped.is_set()
    finally:
        server.stop()


# ---------------------------------------------------------------------- real runs
def _graph(root: Path, timeout: float) -> Path:
    write_graph(root, num_entities=120, num_edges=2000, num_partitions=2, seed=5)
    cfg = graph_config(
        root,
        num_partitions=2,
        num_epochs=1,
        dimension=8,
        eval_fraction=0.0,
        distributed_timeout=timeout,
    )
    path = root / "config.json"
    path.write_text(json.dumps(config_to_dict(cfg)))
    return path


def _rank(cfg: Path, rank: int, port: int, env: dict[str, str], *extra: str):
    return start_rank(cfg, rank, port, *extra, env=env)


@pytest.mark.integration
def test_stranger_is_refused_and_the_run_completes(tmp_path: Path) -> None:
    cfg = _graph(tmp_path, timeout=5.0)
    secret_file = tmp_path / "secret"
    secret_file.write_text(SECRET)
    secret_file.chmod(0o600)
    port = free_port()
    rank0 = _rank(cfg, 0, port, {**ENV, "BIGEMBED_SECRET": SECRET})
    try:
        store = connect_store(port)
        store.wait(["auth/mode"], timedelta(seconds=60))
        assert store.get("auth/mode") == b"hmac-sha256"
        assert SECRET.encode() not in store.get("auth/nonce")
        # the stranger tries to join as rank 1 with a made-up proof
        attempt = store.add("auth/1/attempts", 1)
        store.set(f"auth/1/{attempt}", json.dumps({"client_nonce": "x", "proof": "0" * 64}))
        store.wait([f"auth/1/{attempt}/verdict"], timedelta(seconds=30))
        verdict = json.loads(store.get(f"auth/1/{attempt}/verdict"))
        assert verdict["ok"] is False and "wrong shared secret" in verdict["reason"]
        # ... and queues an unsigned lock request for the lock server
        RpcClient(store, "lock", 5.0, "rank 0").send(
            {"op": "acquire", "trainer": 1, "iteration": 0, "finished": None}
        )
        rank1 = _rank(cfg, 1, port, ENV, "--secret-file", str(secret_file))
        out1 = rank1.communicate(timeout=120)[0]
        out0 = rank0.communicate(timeout=120)[0]
    finally:
        for p in (rank0,):
            if p.poll() is None:
                p.kill()
    assert rank1.returncode == 0, out1
    assert rank0.returncode == 0, out0
    assert "Trained 1 step(s)" in out0
    assert "refused a join as 1" in out0 and "wrong shared secret" in out0
    assert "lock: dropped a request without a valid MAC" in out0
    assert SECRET not in out0 + out1


@pytest.mark.integration
def test_wrong_or_missing_secret_is_refused(tmp_path: Path) -> None:
    # The three start together, so the refused ones wait at rank 0's port (up to 5 x 2 s) while
    # it starts, and are refused as soon as it listens; rank 0 then waits its 5 x 2 s for a
    # rank 1 that never joins.
    cfg = _graph(tmp_path, timeout=2.0)
    port = free_port()
    rank0 = _rank(cfg, 0, port, {**ENV, "BIGEMBED_SECRET": SECRET})
    missing = _rank(cfg, 1, port, ENV)
    wrong = _rank(cfg, 1, port, {**ENV, "BIGEMBED_SECRET": "not the secret, but long enough"})
    out = missing.communicate(timeout=60)[0]
    assert missing.returncode != 0 and "Traceback" not in out
    assert "requires the shared secret: set BIGEMBED_SECRET" in out.strip().splitlines()[-1]
    out = wrong.communicate(timeout=60)[0]
    assert wrong.returncode != 0 and "Traceback" not in out
    assert out.strip().splitlines()[-1] == (
        "bigembed train: error: rank 0 refused this rank: wrong shared secret "
        "(BIGEMBED_SECRET / BIGEMBED_SECRET_FILE must be the same on every rank)"
    )
    out0 = rank0.communicate(timeout=60)[0]
    assert rank0.returncode != 0 and "Traceback" not in out0
    assert "rank 1 (trainer) did not join within 10s" in out0
    assert "refused a join as 1" in out0


@pytest.mark.integration
def test_launch_with_secret_and_partition_servers(tmp_path: Path) -> None:
    """Every control message (lock, partition server get/put/ack) is sealed: the run works."""
    cfg = _graph(tmp_path, timeout=5.0)
    secret_file = tmp_path / "secret"
    secret_file.write_text(SECRET)
    secret_file.chmod(0o600)
    proc = subprocess.run(
        [
            *CLI,
            "launch",
            str(cfg),
            "-n",
            "2",
            "-p",
            "num_partition_servers=1",
            "--secret-file",
            str(secret_file),
        ],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "all ranks finished" in proc.stdout and "dropped a request" not in proc.stdout
    assert SECRET not in proc.stdout + proc.stderr
