"""Never destroy or corrupt what the user has: checkpoints, training state and write errors.

Each test damages a trained checkpoint (or its environment) the way a user or a crash would and
checks that bigembed refuses with one line naming the file, deletes nothing it did not write,
and that what was committed stays readable and resumable.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from bigembed.checkpoints import VERSION_FILE, CheckpointStore
from bigembed.checkpoints.layout import FRESH_MARKER, STATS_FILE
from bigembed.checkpoints.reading import load_trained
from bigembed.cli import main as cli_main
from bigembed.config import ConfigSchema, config_to_dict
from bigembed.errors import CheckpointError
from bigembed.train.single_machine import train
from support.graphs import graph_config, write_graph


def _config_file(cfg: ConfigSchema, path: Path) -> Path:
    path.write_text(json.dumps(config_to_dict(cfg)))
    return path


def _trained(tmp_path: Path, **overrides) -> tuple[ConfigSchema, Path]:
    """A graph and a checkpoint trained for one epoch; returns its config and config file."""
    write_graph(tmp_path, num_partitions=overrides.get("num_partitions", 1))
    cfg = graph_config(tmp_path, num_epochs=1, **overrides)
    train(cfg, progress=False)
    return cfg, _config_file(graph_config(tmp_path, num_epochs=2, **overrides), tmp_path / "c.json")


def _listing(path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(path.iterdir()) if p.is_file()}


def _one_line_error(capsys: pytest.CaptureFixture[str], command: str) -> str:
    err = capsys.readouterr().err.strip()
    lines = [line for line in err.splitlines() if f"bigembed {command}: error:" in line]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


# ---------------------------------------------------------------------- the version file
@pytest.mark.parametrize("content", [None, b"", b"0\n", b"\xff\xfe\x00garbage"])
def test_bad_version_file_next_to_trained_files_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes | None
) -> None:
    cfg, cfg_file = _trained(tmp_path)
    ck = Path(cfg.checkpoint_path)
    vfile = ck / VERSION_FILE
    if content is None:
        vfile.unlink()
    else:
        vfile.write_bytes(content)
    before = _listing(ck)
    assert cli_main(["train", str(cfg_file), "--no-progress"]) != 0
    line = _one_line_error(capsys, "train")
    assert str(vfile) in line and "versions found: 1" in line and "write the newest" in line
    assert _listing(ck) == before, "nothing is deleted or written"
    # The recovery the message describes works and loses nothing.
    vfile.write_text("1\n")
    assert cli_main(["train", str(cfg_file), "--no-progress"]) == 0
    assert CheckpointStore(ck).committed_version() == 2


def test_readers_give_the_recovery_hint(tmp_path: Path) -> None:
    cfg, _ = _trained(tmp_path)
    (Path(cfg.checkpoint_path) / VERSION_FILE).unlink()
    with pytest.raises(CheckpointError, match=r"versions found: 1.*write the newest"):
        load_trained(cfg.checkpoint_path)


def test_too_small_version_number_does_not_delete_newer_files(tmp_path: Path) -> None:
    cfg, _ = _trained(tmp_path)
    ck = Path(cfg.checkpoint_path)
    (ck / VERSION_FILE).write_text("7\n")  # no files of version 7: not a valid commit
    for name in list(_listing(ck)):
        if ".v1." in name:
            shutil.copyfile(ck / name, ck / name.replace(".v1.", ".v9."))
    before = _listing(ck)
    with pytest.raises(CheckpointError, match="says version 7"):
        train(graph_config(tmp_path, num_epochs=9), progress=False)
    assert _listing(ck) == before


def test_interrupted_first_step_is_cleaned(tmp_path: Path) -> None:
    """A run that started from nothing and died before its first commit left version-1 files
    and the fresh-run marker: those files are provably bigembed's and are removed."""
    write_graph(tmp_path)
    cfg = graph_config(tmp_path, num_epochs=1)
    ck = Path(cfg.checkpoint_path)
    ck.mkdir()
    store = CheckpointStore(ck)
    assert store.discard_uncommitted() == 0
    assert (ck / FRESH_MARKER).exists(), "a fresh run marks the directory before writing"
    (ck / "model.v1.pt").write_bytes(b"half written by a killed run")
    assert train(cfg, progress=False).version == 1
    assert not (ck / FRESH_MARKER).exists(), "the first commit removes the marker"
    load_trained(ck)


def test_marker_does_not_cover_other_versions(tmp_path: Path) -> None:
    write_graph(tmp_path)
    cfg = graph_config(tmp_path, num_epochs=1)
    ck = Path(cfg.checkpoint_path)
    ck.mkdir()
    (ck / FRESH_MARKER).write_text("x")
    (ck / "model.v3.pt").write_bytes(b"user's")
    with pytest.raises(CheckpointError, match="refusing to delete"):
        train(cfg, progress=False)
    assert (ck / "model.v3.pt").read_bytes() == b"user's"


# ---------------------------------------------------------------------- missing partition files
@pytest.mark.parametrize("kind", ["embeddings", "optimizer"])
def test_missing_partition_file_is_refused(tmp_path: Path, kind: str) -> None:
    cfg, _ = _trained(tmp_path, num_partitions=2)
    ck = Path(cfg.checkpoint_path)
    (ck / f"{kind}_node_1.v1.npy").unlink()
    with pytest.raises(CheckpointError, match=f"{kind}_node_1.v1.npy: missing"):
        train(graph_config(tmp_path, num_epochs=2, num_partitions=2), progress=False)
    assert CheckpointStore(ck).committed_version() == 1
    assert (ck / "embeddings_node_0.v1.npy").exists(), "the committed files are kept"


# ---------------------------------------------------------------------- leftover temporaries
def test_leftover_temporaries_are_cleaned_foreign_ones_kept(tmp_path: Path) -> None:
    cfg, cfg_file = _trained(tmp_path)
    ck = Path(cfg.checkpoint_path)
    snap = ck / ".epoch_1.tmp"
    snap.mkdir()
    os.link(ck / "model.v1.pt", snap / "model.v1.pt")
    (snap / ".checkpoint_version.txt.ab12cd34.tmp").write_text("1")
    (ck / ".metadata.v2.json.k3j4h5g6.tmp").write_text("{")
    (ck / ".embeddings_node_0.v2.npy.tmp").write_bytes(b"")
    (ck / ".notes.tmp").write_text("mine")  # not a name bigembed creates
    assert cli_main(["train", str(cfg_file), "--no-progress"]) == 0
    left = sorted(p.name for p in ck.iterdir() if p.name.endswith(".tmp"))
    assert left == [".notes.tmp"]


def test_foreign_file_in_leftover_snapshot_is_refused(tmp_path: Path) -> None:
    cfg, _ = _trained(tmp_path)
    snap = Path(cfg.checkpoint_path) / ".epoch_1.tmp"
    snap.mkdir()
    (snap / "thesis.tex").write_text("do not lose")
    with pytest.raises(CheckpointError, match=r"thesis\.tex"):
        train(graph_config(tmp_path, num_epochs=2), progress=False)
    assert (snap / "thesis.tex").exists()


# ---------------------------------------------------------------------- training stats
def test_damaged_stats_do_not_block_training(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    cfg, cfg_file = _trained(tmp_path)
    stats = Path(cfg.checkpoint_path) / STATS_FILE
    good = stats.read_bytes()
    stats.write_bytes(good + b'{"type": "step", "vers\n\xff\xfe not json\n')
    assert cli_main(["train", str(cfg_file), "--no-progress"]) == 0
    assert "ignoring 2 unreadable line(s)" in caplog.text
    rewritten = stats.read_text()  # valid UTF-8 JSON lines again, the damage dropped
    records = [json.loads(line) for line in rewritten.splitlines()]
    assert [r["version"] for r in records if r["type"] == "step"] == [1, 2]
    assert rewritten.startswith(good.decode())

    stats.write_bytes(stats.read_bytes() + b"\x00\x01garbage\n")
    out = tmp_path / "curves.png"
    assert cli_main(["plot", cfg.checkpoint_path, "-o", str(out)]) == 0
    assert out.read_bytes()[:4] == b"\x89PNG"


# ---------------------------------------------------------------------- metadata vs files
def _rewrite_metadata(cfg: ConfigSchema, change) -> Path:
    path = Path(cfg.checkpoint_path) / "metadata.v1.json"
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize(
    "change",
    [
        lambda d: d["config"].__setitem__("dimension", 10**9),
        lambda d: d["entity_counts"].__setitem__("node_0", 10**12),
        lambda d: d.__setitem__("num_relations", 10**9),
    ],
    ids=["dimension", "count", "relations"],
)
def test_metadata_claiming_huge_sizes_is_refused_before_allocating(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], change
) -> None:
    cfg, _ = _trained(
        tmp_path, relations=[{"name": "all", "lhs": "node", "rhs": "node", "operator": "linear"}]
    )
    meta = _rewrite_metadata(cfg, change)
    with pytest.raises(CheckpointError, match=r"metadata\.v1\.json"):
        load_trained(cfg.checkpoint_path)
    for argv in (
        ["eval", str(_config_file(cfg, tmp_path / "e.json")), "--no-progress"],
        ["export", cfg.checkpoint_path, "--format", "npy", "--output", str(tmp_path / "x")],
    ):
        assert cli_main(argv) != 0
        assert str(meta) in _one_line_error(capsys, argv[0])


def test_partition_header_is_checked_before_allocating(tmp_path: Path, monkeypatch) -> None:
    """A partition file of another shape is refused by the trainer's partition store before
    the partition's memory is allocated."""
    from bigembed.train.memory.partitions import PartitionStore

    cfg, _ = _trained(tmp_path)
    path = Path(cfg.checkpoint_path) / "embeddings_node_0.v1.npy"
    np.save(path, np.zeros((3, 16), np.float32))
    allocated = []
    real = PartitionStore._allocate
    monkeypatch.setattr(
        PartitionStore, "_allocate", lambda self, key: allocated.append(key) or real(self, key)
    )
    with pytest.raises(CheckpointError, match=r"embeddings_node_0.v1.npy: shape \(3, 16\)"):
        train(graph_config(tmp_path, num_epochs=2), progress=False)
    assert allocated == []


@pytest.mark.parametrize("damage", [b"{not json", b"\xff\xfe\xfd", b"[1, 2]"])
def test_corrupt_metadata_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], damage: bytes
) -> None:
    cfg, cfg_file = _trained(tmp_path)
    meta = Path(cfg.checkpoint_path) / "metadata.v1.json"
    meta.write_bytes(damage)
    for argv in (["train", str(cfg_file), "--no-progress"], ["eval", str(cfg_file)]):
        assert cli_main(argv) != 0
        assert str(meta) in _one_line_error(capsys, argv[0])


# ---------------------------------------------------------------------- import ids
@pytest.mark.integration
def test_checkpoint_refuses_another_import(tmp_path: Path, capsys) -> None:
    """Import, train, re-import other names (new ids, orphaning allowed): eval, export, similar
    and train all refuse, naming `bigembed remap` (tests/test_import_identity.py runs it)."""
    from bigembed.storage.entities import EntityStore
    from support.imports import random_edges, write_config, write_tsv

    config = write_config(tmp_path, entities={"node": 1})
    tsv = write_tsv(tmp_path / "edges.tsv", random_edges(300, 40, ["r"]))
    assert cli_main(["import", str(config), str(tsv)]) == 0
    if getattr(EntityStore(tmp_path / "out" / "entities"), "import_id", None) is None:
        pytest.skip("the entity store has no import_id yet")
    assert cli_main(["train", str(config), "--no-progress", "-p", "num_epochs=1"]) == 0
    ck = tmp_path / "out" / "model"
    assert cli_main(["eval", str(config), "--no-progress"]) == 0
    # other names: the same 40 would be the same import (ids are derived from the entities)
    tsv2 = write_tsv(tmp_path / "edges2.tsv", random_edges(300, 50, ["r"], seed=7))
    assert cli_main(["import", str(config), str(tsv2), "--force", "--allow-orphans"]) == 0
    capsys.readouterr()
    expected = (
        f"{ck} was trained on a different import of {tmp_path / 'out' / 'entities'} "
        f"(import ids differ: the entity names changed); run `bigembed remap {ck}`"
    )
    for argv in (
        ["eval", str(config), "--no-progress"],
        ["export", str(ck), "--format", "tsv", "--output", str(tmp_path / "exp")],
        ["similar", str(ck), "e1"],
        ["train", str(config), "--no-progress", "-p", "num_epochs=2"],
    ):
        assert cli_main(argv) != 0, argv
        assert expected in _one_line_error(capsys, argv[0])


# ---------------------------------------------------------------------- write errors
def test_checkpoint_path_is_a_file(tmp_path: Path, capsys) -> None:
    write_graph(tmp_path)
    cfg = graph_config(tmp_path, num_epochs=1)
    Path(cfg.checkpoint_path).write_text("a file where a directory belongs")
    assert cli_main(["train", str(_config_file(cfg, tmp_path / "c.json")), "--no-progress"]) != 0
    assert cfg.checkpoint_path in _one_line_error(capsys, "train")


def test_output_path_is_a_directory(tmp_path: Path, capsys) -> None:
    _cfg, cfg_file = _trained(tmp_path)
    out = tmp_path / "report"
    out.mkdir()
    assert cli_main(["eval", str(cfg_file), "--output", str(out)]) != 0
    assert str(out) in _one_line_error(capsys, "eval")


def test_out_of_memory_is_one_line(tmp_path: Path, capsys, monkeypatch) -> None:
    import torch

    import bigembed.selection as loop  # what `bigembed train` calls

    def huge(cfg, progress=True, report=None):
        torch.empty(2**45)  # torch raises RuntimeError("... DefaultCPUAllocator ...")

    monkeypatch.setattr(loop, "train_model", huge)
    write_graph(tmp_path)
    cfg_file = _config_file(graph_config(tmp_path), tmp_path / "c.json")
    assert cli_main(["train", str(cfg_file)]) != 0
    assert "out of memory" in _one_line_error(capsys, "train")

    def bug(cfg, progress=True, report=None):
        raise RuntimeError("a real bug")

    monkeypatch.setattr(loop, "train_model", bug)
    with pytest.raises(RuntimeError, match="a real bug"):
        cli_main(["train", str(cfg_file)])


@contextlib.contextmanager
def _tmpfs(path: Path, size: str) -> Iterator[Path]:
    path.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def _can_mount() -> bool:
    return os.geteuid() == 0 and shutil.which("mount") is not None


@pytest.mark.integration
@pytest.mark.skipif(not _can_mount(), reason="needs root to mount a tmpfs")
def test_disk_full_keeps_the_committed_checkpoint(tmp_path: Path, capsys) -> None:
    write_graph(tmp_path)
    with _tmpfs(tmp_path / "disk", "1m") as disk:
        cfg = graph_config(tmp_path, num_epochs=1, checkpoint_path=str(disk / "model"))
        train(cfg, progress=False)
        ck = Path(cfg.checkpoint_path)
        committed = _listing(ck)
        filler = disk / "filler"
        # fill the disk up to the last block
        with open(filler, "wb", buffering=0) as f, contextlib.suppress(OSError):
            while True:
                f.write(b"\0" * 4096)
        more = _config_file(
            graph_config(tmp_path, num_epochs=3, checkpoint_path=str(ck)), tmp_path / "c.json"
        )
        assert cli_main(["train", str(more), "--no-progress"]) != 0
        line = _one_line_error(capsys, "train")
        assert str(ck) in line and "No space left on device" in line
        assert "the last committed checkpoint is intact" in line
        assert CheckpointStore(ck).committed_version() == 1
        assert {k: v for k, v in _listing(ck).items() if ".v1." in k or k == VERSION_FILE} == {
            k: v for k, v in committed.items() if ".v1." in k or k == VERSION_FILE
        }
        load_trained(ck)
        filler.unlink()
        assert cli_main(["train", str(more), "--no-progress"]) == 0
        assert CheckpointStore(ck).committed_version() == 3


@pytest.mark.integration
@pytest.mark.skipif(not _can_mount(), reason="needs root to mount a tmpfs")
def test_read_only_checkpoint_dir_is_one_line(tmp_path: Path, capsys) -> None:
    write_graph(tmp_path)
    with _tmpfs(tmp_path / "disk", "4m") as disk:
        cfg = graph_config(tmp_path, num_epochs=1, checkpoint_path=str(disk / "model"))
        train(cfg, progress=False)
        subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
        more = graph_config(tmp_path, num_epochs=2, checkpoint_path=cfg.checkpoint_path)
        assert (
            cli_main(["train", str(_config_file(more, tmp_path / "c.json")), "--no-progress"]) != 0
        )
        line = _one_line_error(capsys, "train")
        assert cfg.checkpoint_path in line and "Read-only file system" in line
        assert load_trained(cfg.checkpoint_path).version == 1
