"""A distributed run with no disk shared between the machines (docs/distributed.md, "Without a
shared disk"), with real processes.

Each "machine" is a network namespace plus a mount namespace in which its own directory tree
is bind-mounted at the configured paths: both ranks read their own copy of the imported graph,
rank 0 writes the checkpoint into its tree, rank 1's ``checkpoint_path`` is another, empty,
directory. What the run wrote is checked, not assumed: rank 0's checkpoint is complete and
evaluates, every partition in it was trained (so rank 0 did pull the partitions held by rank
1's partition server), rank 1's directory stays empty, and a resume works.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from bigembed.checkpoints import CheckpointStore
from bigembed.storage import EntityStore
from bigembed.train.memory.partition_values import init_embeddings
from support.ranks import CLI, ENV, check_events, free_port, make_graph, read_events, run

pytestmark = pytest.mark.integration

ADDRS = ("10.233.0.1", "10.233.0.2")
PORT = 29533


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=20)


def _usable() -> bool:
    if os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("unshare"):
        return False
    probe = f"bnsp{os.getpid() % 100000}"
    ok = subprocess.run(["ip", "netns", "add", probe], capture_output=True).returncode == 0
    if ok:
        subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return ok


@pytest.fixture
def namespaces() -> Iterator[tuple[str, str]]:
    """Two network namespaces joined by a veth pair (names unique to this process)."""
    if not _usable():
        pytest.skip("needs root, `ip netns` and unshare(1)")
    tag = os.getpid() % 100000
    names = (f"bns{tag}a", f"bns{tag}b")
    devs = (f"bnv{tag}a", f"bnv{tag}b")
    try:
        for ns in names:
            _ip("netns", "add", ns)
        _ip("link", "add", devs[0], "type", "veth", "peer", "name", devs[1])
        for ns, dev, addr in zip(names, devs, ADDRS, strict=True):
            _ip("link", "set", dev, "netns", ns)
            _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", dev)
            _ip("-n", ns, "link", "set", dev, "up")
            _ip("-n", ns, "link", "set", "lo", "up")
        yield names
    finally:
        for ns in names:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def _machines(tmp_path: Path, **overrides: object) -> tuple[Path, Path, list[Path], Any]:
    """The configured tree ``run/`` (empty on the host: each machine mounts its own copy there),
    its config, and the copies: rank 0's (the graph), rank 1's (the graph, an empty
    checkpoint_path)."""
    mount = tmp_path / "run"
    cfg_path, cfg = make_graph(mount, **overrides)
    copies = [tmp_path / "machine0", tmp_path / "machine1"]
    for copy in copies:
        shutil.copytree(mount, copy)
    (copies[1] / "model").mkdir()
    shutil.rmtree(mount)
    mount.mkdir()
    return mount, cfg_path, copies, cfg


def _rank(
    ns: str | None,
    tree: Path,
    mount: Path,
    cfg_path: Path,
    rank: int,
    *extra: str,
    port: int = PORT,
    command: tuple[str, ...] = ("train", "--no-progress"),
) -> subprocess.Popen[str]:
    """Trainer ``rank`` (or another ``command``) on its own machine: its namespace (None: the
    host's network), its ``tree`` mounted at ``mount``."""
    host = ADDRS[0] if ns is not None else "127.0.0.1"
    argv = [
        *(*CLI, command[0], str(cfg_path), "--rank", str(rank), *command[1:]),
        *("-p", "num_machines=2", "-p", f"distributed_init_method=tcp://{host}:{port}", *extra),
    ]
    mounted = ["unshare", "-m", "sh", "-c", 'mount --bind "$1" "$2" && shift 2 && exec "$@"']
    cmd = [*mounted, "sh", str(tree), str(mount), *argv]
    if ns is not None:
        cmd = ["ip", "netns", "exec", ns, *cmd]
    return subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=ENV
    )


def _train(
    names: tuple[str, str] | tuple[None, None],
    mount: Path,
    cfg_path: Path,
    copies: list[Path],
    *extra: str,
) -> list[str]:
    procs = [_rank(ns, copies[r], mount, cfg_path, r, *extra) for r, ns in enumerate(names)]
    outs = [p.communicate(timeout=240)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    return outs


def _partitions(model: Path, entities: Path, version: int) -> dict[int, torch.Tensor]:
    ck, counts = CheckpointStore(model), EntityStore(entities).counts("node")
    out = {}
    for part, count in enumerate(counts):
        emb, state = torch.empty((count, 16)), torch.empty(count)
        ck.load_partition("node", part, version, emb, state, require_state=True)
        out[part] = emb
    return out


def _check_rank1_wrote_nothing(copy: Path) -> None:
    assert list((copy / "model").iterdir()) == [], "rank 1 wrote into its checkpoint_path"


def test_two_machines_without_a_shared_disk_train_and_resume(
    tmp_path: Path, namespaces: tuple[str, str]
) -> None:
    mount, cfg_path, copies, cfg = _machines(tmp_path, num_epochs=1)
    model0, entities0 = copies[0] / "model", copies[0] / "entities"
    outs = _train(namespaces, mount, cfg_path, copies)
    assert "is not shared with rank 0: running without a shared disk" in outs[1], outs[1]
    _check_rank1_wrote_nothing(copies[1])
    ck = CheckpointStore(model0)
    assert ck.committed_version() == 1
    # Every partition was trained, those held by rank 1's partition server (odd ones) too:
    # rank 0 wrote what it pulled over the network, not initial values.
    v1 = _partitions(model0, entities0, 1)
    for part, emb in v1.items():
        init = init_embeddings(emb.shape[0], 16, cfg.init_scale, cfg.seed, "node", part)
        assert not torch.allclose(emb, init), f"partition {part} was never trained"
    stats = ck.read_stats()
    assert {r["trainer"] for r in stats if r["type"] == "bucket"} == {0, 1}
    check_events(read_events(model0 / "lock_events.jsonl"))
    relayed = read_events(model0 / "partition_transfers_rank1.jsonl")
    assert {e["event"] for e in relayed} >= {"load_start", "load_end", "write_end"}

    # Resume: one more epoch; rank 1 starts with nothing but rank 0's seeded servers.
    outs = _train(namespaces, mount, cfg_path, copies, "-p", "num_epochs=2")
    assert "seeded the partition servers" in outs[0], outs[0]
    _check_rank1_wrote_nothing(copies[1])
    assert ck.committed_version() == 2
    v2 = _partitions(model0, entities0, 2)
    assert all(not torch.equal(v1[p], v2[p]) for p in v1), "a partition was not trained in v2"
    steps = [r for r in ck.read_stats() if r["type"] == "step"]
    assert [s["version"] for s in steps] == [1, 2]
    # resumed from version 1's values (not from the initial ones): the loss kept falling
    assert steps[1]["stats"]["loss"] < steps[0]["stats"]["loss"], steps
    buckets = [r for r in ck.read_stats() if r["type"] == "bucket" and r["version"] == 2]
    assert {r["trainer"] for r in buckets} == {0, 1}

    # The checkpoint is complete: it evaluates, from rank 0's tree.
    cfg0_path = tmp_path / "eval.json"
    text = (copies[0] / cfg_path.name).read_text()
    cfg0_path.write_text(text.replace(str(mount), str(copies[0])))
    res = run(["eval", str(cfg0_path), "--no-progress"], timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "mrr" in res.stdout.lower(), res.stdout


def test_another_import_of_the_graph_is_refused(tmp_path: Path) -> None:
    """Each machine may have its own copy of the graph, but it must be the same import."""
    if not _usable():
        pytest.skip("needs root, `ip netns` and unshare(1)")
    mount, cfg_path, copies, _ = _machines(tmp_path)
    manifest = copies[1] / "entities" / "manifest.json"
    data = json.loads(manifest.read_text())
    data["import_id"] = "another-import"
    manifest.write_text(json.dumps(data))
    port = free_port()
    procs = [_rank(None, copies[r], mount, cfg_path, r, port=port) for r in (0, 1)]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode != 0 for p in procs] == [True, True], outs
    for out in outs:
        assert "reads another graph than rank 0: the manifest of entity_path" in out, out
        assert "Traceback" not in out


def test_external_partition_server_without_a_shared_disk(
    tmp_path: Path, namespaces: tuple[str, str]
) -> None:
    """num_partition_servers: 1 (its own process, on rank 1's machine) with compressed
    transfers: rank 0 seeds it in fp32, the trainers swap bf16 copies and int8 changes, and
    rank 0 pulls every partition from it in fp32 for the checkpoint."""
    mount, cfg_path, copies, cfg = _machines(tmp_path, num_epochs=1)
    extra = ("-p", "num_partition_servers=1", "-p", "communication.partition_precision=compressed")
    server = _rank(
        namespaces[1], copies[1], mount, cfg_path, 0, *extra, command=("partition-server",)
    )
    _train(namespaces, mount, cfg_path, copies, *extra)
    out = server.communicate(timeout=60)[0]
    assert server.returncode == 0, out
    _check_rank1_wrote_nothing(copies[1])
    assert CheckpointStore(copies[0] / "model").committed_version() == 1
    v1 = _partitions(copies[0] / "model", copies[0] / "entities", 1)
    for part, emb in v1.items():
        init = init_embeddings(emb.shape[0], 16, cfg.init_scale, cfg.seed, "node", part)
        assert not torch.allclose(emb, init), f"partition {part} was never trained"


def test_data_parallel_replicas_without_a_shared_disk(
    tmp_path: Path, namespaces: tuple[str, str]
) -> None:
    """distributed_mode: data_parallel needs no shared disk by construction: rank 1 keeps its
    replica's swapped partitions in a scratch directory of its own (removed at the end), never
    in its checkpoint_path, and takes rank 0's values over the network when resuming."""
    mount, cfg_path, copies, cfg = _machines(tmp_path, num_epochs=1)
    extra = ("-p", "distributed_mode=data_parallel", "-p", "communication.strategy=allreduce")
    outs = _train(namespaces, mount, cfg_path, copies, *extra)
    _check_rank1_wrote_nothing(copies[1])
    model0, entities0 = copies[0] / "model", copies[0] / "entities"
    ck = CheckpointStore(model0)
    assert ck.committed_version() == 1
    v1 = _partitions(model0, entities0, 1)
    for part, emb in v1.items():
        init = init_embeddings(emb.shape[0], 16, cfg.init_scale, cfg.seed, "node", part)
        assert not torch.allclose(emb, init), f"partition {part} was never trained"
    buckets = [r for r in ck.read_stats() if r["type"] == "bucket"]
    assert {r["trainer"] for r in buckets} == {0, 1}  # every bucket by both replicas
    outs = _train(namespaces, mount, cfg_path, copies, *extra, "-p", "num_epochs=2")
    assert "resuming from checkpoint version 1" in outs[0], outs[0]
    for out in outs:  # rank 1 started from rank 0's values: the replicas agree exactly
        assert ", 0 repairs" in out, out
    _check_rank1_wrote_nothing(copies[1])
    assert ck.committed_version() == 2
    steps = [r for r in ck.read_stats() if r["type"] == "step"]
    assert steps[1]["stats"]["loss"] < steps[0]["stats"]["loss"], steps
