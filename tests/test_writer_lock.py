"""One writer per directory (bigembed.writer_lock): the lock module in one process.

Another process's hold is stood in for by a second open of the lock file (flock conflicts
between open files, also within one process) with that process's record in it. The real
processes are in tests/test_concurrent_writers.py.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from bigembed import writer_lock
from bigembed.output_paths import _start_time
from bigembed.writer_lock import WriterLockError, hold, holders, lock_file


def _other_record(**changes: object) -> dict[str, object]:
    """A record of a live process other than this one (our parent: pytest's launcher)."""
    rec: dict[str, object] = {
        "written_by": "bigembed",
        "what": "training",
        "mode": "write",
        "pid": os.getppid(),
        "host": socket.gethostname(),
        "boot_id": None,
        "start_time": _start_time(os.getppid()),
        "started": "2026-11-28T09:00:00+00:00",
        "command": "bigembed train people.yaml",
    }
    rec.update(changes)
    return rec


def _enter(target: Path, what: str, *, shared: bool = False) -> None:
    with hold(target, what, shared=shared):
        pass


@contextmanager
def held_elsewhere(target: Path, *, shared: bool = False, **changes: object) -> Iterator[None]:
    path = lock_file(target)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
        rec = _other_record(mode="read" if shared else "write", **changes)
        os.write(fd, (json.dumps(rec) + "\n").encode())
        yield
    finally:
        os.close(fd)


def test_a_hold_writes_its_record_beside_the_target_and_removes_it(tmp_path: Path) -> None:
    target = tmp_path / "ck"
    with hold(target, "training"):
        path = tmp_path / ".ck.bigembed-lock"
        assert lock_file(target) == path
        (rec,) = holders(target)
        assert rec["pid"] == os.getpid() and rec["what"] == "training"
        assert rec["mode"] == "write" and rec["host"] == socket.gethostname()
        assert not target.exists()  # the lock creates nothing but its own file
    assert not path.exists()


def test_a_second_writer_is_refused_in_one_line_naming_the_holder(tmp_path: Path) -> None:
    target = tmp_path / "ck"
    with held_elsewhere(target), pytest.raises(WriterLockError) as err:
        _enter(target, "training")
    msg = str(err.value)
    assert "\n" not in msg
    assert msg.startswith(f"{target}: being written by training: bigembed train people.yaml")
    assert f"pid {os.getppid()} on {socket.gethostname()}" in msg
    assert "started 2026-11-28T09:00:00+00:00" in msg


def test_a_dead_holders_lock_is_taken_over(tmp_path: Path) -> None:
    """A process that died left its file and record; the kernel dropped its flock."""
    target = tmp_path / "ck"
    stale = _other_record(pid=os.getpid(), start_time="1")  # our pid, another start: reused
    lock_file(target).write_text(json.dumps(stale) + "\n")
    assert holders(target) == []
    with hold(target, "export"):
        (rec,) = holders(target)
        assert rec["what"] == "export" and rec["start_time"] == _start_time(os.getpid())
    assert not lock_file(target).exists()


def test_readers_share_and_exclude_writers(tmp_path: Path) -> None:
    store = tmp_path / "entities"
    with held_elsewhere(store, shared=True):
        with hold(store, "training", shared=True):  # two readers at once
            assert len(holders(store)) == 2
        assert lock_file(store).exists()  # the other reader still holds it: not removed
        with pytest.raises(WriterLockError, match=r"entities: read by training: bigembed train"):
            _enter(store, "import")
    with held_elsewhere(store), pytest.raises(WriterLockError, match="wait until it ends to read"):
        _enter(store, "training", shared=True)


def test_holds_are_reentrant_within_a_process(tmp_path: Path) -> None:
    target = tmp_path / "ck"
    with hold(target, "training"):
        _enter(target, "training")
        assert lock_file(target).exists()  # the outer hold still holds it
        assert len(holders(target)) == 1
    assert not lock_file(target).exists()
    with hold(target, "training", shared=True), pytest.raises(WriterLockError, match="reads it"):
        _enter(target, "training")


def test_directories_made_for_the_lock_file_are_removed_with_it(tmp_path: Path) -> None:
    """A refused or finished run leaves no empty directory behind (nothing written)."""
    target = tmp_path / "new" / "deeper" / "ck"
    with hold(target, "training"):
        assert lock_file(target).parent == tmp_path / "new" / "deeper"
    assert not (tmp_path / "new").exists()
    with hold(target, "training"):
        target.mkdir()  # the run wrote its output: the directories stay
    assert target.is_dir() and not lock_file(target).exists()


def test_two_names_of_one_directory_share_one_lock(tmp_path: Path) -> None:
    real = tmp_path / "ck"
    real.mkdir()
    (tmp_path / "alias").symlink_to(real)
    with held_elsewhere(real), pytest.raises(WriterLockError):
        _enter(tmp_path / "alias", "training")


def test_where_no_lock_file_can_be_made_beside_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An output that cannot be written goes unlocked (its own write fails with the command's
    message); an existing directory in an unwritable parent is locked inside."""
    blocked = tmp_path / "a_file"
    blocked.write_text("not a directory\n")
    _enter(blocked / "out", "export")
    _enter(blocked / "store", "training", shared=True)
    ck = tmp_path / "ck"
    ck.mkdir()
    real_open = writer_lock._open

    def no_sibling(path: Path) -> int:
        if path.parent == tmp_path:
            raise writer_lock._NoLockFile(f"{path} (Permission denied)")
        return real_open(path)

    monkeypatch.setattr(writer_lock, "_open", no_sibling)
    with hold(ck, "training"):
        fd = os.open(ck / ".bigembed-lock", os.O_RDONLY)
        try:
            with pytest.raises(BlockingIOError):  # another process could not take it
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(fd)
    assert not (ck / ".bigembed-lock").exists()
    monkeypatch.setattr(writer_lock, "_open", lambda path: no_sibling(tmp_path / "x"))
    with pytest.raises(WriterLockError, match=r"ck: cannot write its lock file .*Permission"):
        _enter(ck, "training")


def test_without_flock_the_records_decide(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_flock(fd: int, op: int) -> None:
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(writer_lock.fcntl, "flock", no_flock)
    target = tmp_path / "ck"
    lock_file(target).write_text(json.dumps(_other_record()) + "\n")  # a live writer
    with pytest.raises(WriterLockError, match="being written by training"):
        _enter(target, "training")
    lock_file(target).write_text(json.dumps(_other_record(start_time="1")) + "\n")  # dead
    with hold(target, "training"):
        assert [r["pid"] for r in holders(target)] == [os.getpid()]
    assert not lock_file(target).exists()


# ---------------------------------------------------------------------- readers


def test_a_load_that_a_commit_overtakes_starts_again_from_the_new_version(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A training commits (and deletes the files of the version a reader has just read) between
    the reader's version read and its opening of the files: the load starts again."""
    from bigembed.checkpoints import CheckpointStore, load_trained
    from bigembed.checkpoints import reading as reading_module
    from bigembed.cli import main as cli_main
    from support.graphs import graph_config, save_config, write_graph

    write_graph(tmp_path, num_entities=50, num_edges=200)
    cfg = graph_config(tmp_path, num_epochs=1)
    assert cli_main(["train", "--no-progress", str(save_config(tmp_path, cfg))]) == 0
    store = CheckpointStore(cfg.checkpoint_path)
    for old in store.files_of(1):  # version 2: the same files under the next version's names
        os.link(old, old.with_name(old.name.replace(".v1.", ".v2.")))
    real_open = reading_module._open_embeddings
    overtaken: list[int] = []

    def commit_first(store: CheckpointStore, version: int, keys: list) -> dict:
        if not overtaken:
            overtaken.append(version)
            store.commit(2)  # the version file says 2, the files of 1 are gone
        return real_open(store, version, keys)

    monkeypatch.setattr(reading_module, "_open_embeddings", commit_first)
    trained = load_trained(cfg.checkpoint_path)
    assert overtaken == [1] and trained.version == 2
    assert trained.embeddings("node", 0).shape == (50, 16)
