"""One writer per directory: the lock every run holds on what it writes, for its whole life.

A run that writes a checkpoint directory (training, a tune trial, ``convert``), a store
(``import``) or an output (``eval --output``, ``export``, ``tune``) holds :func:`hold` on it;
a second writer of the same path is refused with one :class:`WriterLockError` line naming the
holder (pid, host, command, start time), before it writes anything. A run that only *reads* a
store for its whole life (a training reads its entity and edge stores) holds it ``shared``:
other readers get in, a writer (an import over it) is refused, and a reader is refused while a
writer holds it. Queries, eval and export read committed versions and take no lock.

Mechanism:

* ``flock`` on a lock file *beside* the target, ``PARENT/.NAME.bigembed-lock`` (not inside:
  stores and whole-directory outputs are renamed into place). The kernel drops a flock when its
  process ends, ``kill -9`` included, so a dead holder's lock is simply free; its stale record
  is overwritten by the next holder.
* The lock file holds the holders' records, one JSON line each (an exclusive holder's only).
  The last holder removes the file when it lets go (while holding it exclusively); an acquirer
  checks after locking that the path still names the file it locked, and retries otherwise.
* Where the lock file cannot be made beside the target, an existing directory is locked by
  ``.bigembed-lock`` inside it (a checkpoint made for the user in a directory they may not
  write); any other writer goes on unlocked, as its own write will fail with the command's
  message (a read-only disk, a file where a directory belongs), and so does a reader.
* Holds are re-entrant within a process (``train_model`` around ``Trainer.train``).
* Where ``flock`` is not supported (``ENOLCK``, ``EOPNOTSUPP``), the records decide, as for
  import staging directories (:mod:`bigembed.output_paths`): a record of a live process on this
  host (same boot, same pid start time) or of another host refuses; others are stale.

Network file systems: Linux NFS clients (NFSv4, or NFSv3 with ``lockd``) turn ``flock`` into
NFS byte-range locks, so exclusion holds across machines and a crashed machine's lock is freed
when its lease ends (about 90 s on NFSv4). A mount with ``nolock`` or ``local_lock=flock``
keeps locks on each machine: two machines can then both write (docs/training.md says so).
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import fcntl
import json
import logging
import os
import socket
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bigembed.errors import BigembedError
from bigembed.output_paths import WRITER, _boot_id, _pid_alive, _start_time

__all__ = ["LOCK_SUFFIX", "WriterLockError", "hold", "holders", "lock_file"]

logger = logging.getLogger(__name__)

LOCK_SUFFIX = ".bigembed-lock"
INSIDE = ".bigembed-lock"  # the lock file inside a directory whose parent is not writable
NO_FLOCK = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL)
COMMAND_CHARS = 160  # the holder's command line in a refusal is cut to this


class WriterLockError(BigembedError):
    """Another process writes (or reads, for a writer) this path now; the message names it."""


def lock_file(target: str | os.PathLike[str]) -> Path:
    """The lock file of ``target``: ``.NAME.bigembed-lock`` beside it (symbolic links
    resolved, so that two names of one directory share one lock)."""
    real = Path(os.path.realpath(os.path.abspath(os.fspath(target))))
    return real.parent / f".{real.name}{LOCK_SUFFIX}"


def _command() -> str:
    """This process's command line, ``bigembed ...`` however it was started."""
    argv = list(sys.argv)
    if argv and "bigembed" in (Path(argv[0]).name, Path(argv[0]).parent.name):
        argv[0] = "bigembed"  # the script, python -m bigembed(.cli)
    text = " ".join(argv) or "python"
    return text if len(text) <= COMMAND_CHARS else text[: COMMAND_CHARS - 3] + "..."


def _record(what: str, shared: bool) -> dict[str, Any]:
    return {
        "written_by": WRITER,
        "what": what,
        "mode": "read" if shared else "write",
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "boot_id": _boot_id(),
        "start_time": _start_time(os.getpid()),
        "started": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "command": _command(),
    }


def _alive(rec: dict[str, Any]) -> bool:
    """Whether the process of a record may still run (another host's: cannot tell, yes)."""
    pid = rec.get("pid")
    if not isinstance(pid, int):
        return False
    if rec.get("host") != socket.gethostname():
        return True
    boot = _boot_id()
    if boot is not None and rec.get("boot_id") not in (None, boot):
        return False
    if not _pid_alive(pid):
        return False
    start, now = rec.get("start_time"), _start_time(pid)
    return start is None or now is None or start == now


def holders(target: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The records of the processes that may hold ``target`` now (dead ones left out)."""
    return _records(lock_file(target))


def _records(path: Path) -> list[dict[str, Any]]:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    out = []
    for line in text.splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict) and rec.get("written_by") == WRITER and _alive(rec):
            out.append(rec)
    return out


def _describe(rec: dict[str, Any]) -> str:
    return (
        f"{rec.get('command', '?')} (pid {rec.get('pid', '?')} on {rec.get('host', '?')}, "
        f"started {rec.get('started', '?')})"
    )


def _refusal(target: Path, recs: list[dict[str, Any]], shared: bool) -> WriterLockError:
    here = socket.gethostname()
    others = [r for r in recs if r.get("pid") != os.getpid() or r.get("host") != here]
    if others:
        rec = others[0]
        verb = "read by" if rec.get("mode") == "read" else "being written by"
        who = f"{verb} {rec.get('what', 'a bigembed run')}: {_describe(rec)}"
    else:
        who = "being written by another process (it has not said which yet)"
    if len(others) > 1:
        who += f" and {len(others) - 1} other(s)"
    then = "read it" if shared else "write it"
    return WriterLockError(f"{target}: {who}; wait until it ends to {then}, or choose another path")


@dataclass
class _Held:
    fd: int
    path: Path
    shared: bool
    flock: bool
    count: int = 1
    record: dict[str, Any] = field(default_factory=dict)
    made: list[Path] = field(default_factory=list)  # directories created for the lock file


_HELD: dict[Path, _Held] = {}
_GUARD = threading.Lock()


def _same_file(fd: int, path: Path) -> bool:
    try:
        now = os.stat(path)
    except FileNotFoundError:
        return False
    here = os.fstat(fd)
    return (here.st_dev, here.st_ino) == (now.st_dev, now.st_ino)


class _NoLockFile(Exception):
    """The lock file cannot be created where it belongs."""


def _open(path: Path) -> int:
    """Open (creating) the lock file, or :class:`_NoLockFile`."""
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise _NoLockFile(f"{path} ({exc.strerror or exc})") from None


def _write_record(fd: int, rec: dict[str, Any], shared: bool) -> None:
    """Add (shared) or write (exclusive) this holder's record. The flock is the lock, the
    record only names the holder: a failed write (a full disk) is no reason to stop."""
    line = (json.dumps(rec) + "\n").encode()
    try:
        if shared:
            os.lseek(fd, 0, os.SEEK_END)
        else:
            os.ftruncate(fd, 0)
            os.lseek(fd, 0, os.SEEK_SET)
        os.write(fd, line)
    except OSError as exc:
        logger.debug("lock record not written (%s)", exc.strerror or exc)


def _make_parents(path: Path) -> list[Path]:
    """Create the missing directories above the lock file; returns them, deepest first."""
    missing = []
    for parent in path.parents:
        if parent.exists() or parent.is_symlink():
            break
        missing.append(parent)
    for directory in reversed(missing):
        try:
            directory.mkdir()
        except FileExistsError:
            pass
        except OSError:
            break  # the lock file's open says why
    return missing


def _remove_made(made: list[Path]) -> None:
    """Remove the directories :func:`_make_parents` created that stayed empty."""
    for directory in made:
        try:
            directory.rmdir()
        except OSError:
            return


def _acquire(target: Path, what: str, shared: bool) -> _Held | None:
    """Lock ``target`` beside it; None where no lock file can be made there and none is
    needed: a reader, or a writer whose output cannot be written either (its own write then
    fails with the command's usual message). An existing directory in a directory this
    process may not write to (a checkpoint made for the user) is locked inside instead."""
    path = lock_file(target)
    made = _make_parents(path)
    try:
        held = _acquire_at(path, target, what, shared)
    except _NoLockFile as exc:
        _remove_made(made)
        real = Path(os.path.realpath(target))
        if shared or not real.is_dir():
            logger.debug("%s: not locked, cannot write %s", target, exc)
            return None
        try:
            return _acquire_at(real / INSIDE, target, what, shared)
        except _NoLockFile as inner:
            raise WriterLockError(f"{target}: cannot write its lock file {inner}") from None
    except BaseException:
        _remove_made(made)
        raise
    held.made = made
    return held


def _acquire_at(path: Path, target: Path, what: str, shared: bool) -> _Held:
    rec = _record(what, shared)
    mode = (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB
    for _ in range(100):
        fd = _open(path)
        try:
            fcntl.flock(fd, mode)
        except BlockingIOError:
            os.close(fd)
            raise _refusal(target, _wait_for_records(path), shared) from None
        except OSError as exc:
            if exc.errno not in NO_FLOCK:
                os.close(fd)
                raise
            return _acquire_by_records(fd, path, target, rec, shared)
        except BaseException:
            os.close(fd)
            raise
        if not _same_file(fd, path):  # its last holder removed it meanwhile: lock the new one
            os.close(fd)
            continue
        try:
            _write_record(fd, rec, shared)
        except BaseException:
            os.close(fd)
            raise
        return _Held(fd, path, shared, flock=True, record=rec)
    raise WriterLockError(f"{target}: its lock file {path} keeps changing; try again")


def _wait_for_records(path: Path) -> list[dict[str, Any]]:
    """The holders' records; a holder that has just locked may not have written its own yet."""
    for _ in range(20):
        recs = _records(path)
        if recs:
            return recs
        time.sleep(0.05)
    return []


def _acquire_by_records(
    fd: int, path: Path, target: Path, rec: dict[str, Any], shared: bool
) -> _Held:
    """No flock here: refuse when a live record conflicts, else add (or write) ours."""
    live = [r for r in _records(path) if r.get("pid") != os.getpid()]
    conflict = [r for r in live if not (shared and r.get("mode") == "read")]
    if conflict:
        os.close(fd)
        raise _refusal(target, conflict, shared)
    logger.info("%s: the file system does not lock files; the lock is its owner records", target)
    if shared and live:
        _write_record(fd, rec, shared=True)
    else:
        _write_record(fd, rec, shared=False)
    return _Held(fd, path, shared, flock=False, record=rec)


def _release(held: _Held) -> None:
    fd = held.fd
    try:
        if held.flock:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # last holder: remove the file
            except OSError:
                return
            if _same_file(fd, held.path):
                with contextlib.suppress(OSError):
                    held.path.unlink()
        elif not [r for r in _records(held.path) if r.get("pid") != os.getpid()]:
            with contextlib.suppress(OSError):
                held.path.unlink()
    finally:
        os.close(fd)
        _remove_made(held.made)


@contextlib.contextmanager
def hold(target: str | os.PathLike[str], what: str, *, shared: bool = False) -> Iterator[None]:
    """Hold ``target`` for the body: exclusively (a writer) or ``shared`` (a reader that must
    not see it replaced). ``what`` names this run in a refusal another process gets
    ("training", "import"). Refused at once with a :class:`WriterLockError` when held."""
    path = lock_file(target)
    tpath = Path(target)
    with _GUARD:
        held = _HELD.get(path)
        if held is not None:
            if held.shared and not shared:
                raise WriterLockError(
                    f"{tpath}: this process reads it ({held.record.get('what')}); it cannot "
                    "also write it"
                )
            held.count += 1
        else:
            held = _acquire(tpath, what, shared)
            if held is not None:
                _HELD[path] = held
    try:
        yield
    finally:
        if held is not None:
            with _GUARD:
                held.count -= 1
                if held.count == 0:
                    _HELD.pop(path, None)
                    _release(held)
