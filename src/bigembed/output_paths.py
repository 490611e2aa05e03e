"""Where a command may write, and what ``--force`` may replace: the one owner of these rules.

* An output that is, holds or lies inside an input is refused (:func:`refuse_overlap`): a
  ``--force`` replacement of such an output would delete the input.
* ``--force`` replaces only what carries bigembed's own marker (:func:`check_replaceable`):
  a store's ``manifest.json`` with the right ``format``, or the marker file
  :data:`MARKER` that every whole-directory output (export, convert) is written with.
  Nothing is deleted that the program cannot prove it wrote.
* Hidden staging directories of a run (the importer's) carry :data:`STAGING_MARKER`, locked
  with ``flock`` for the life of the run and naming the owner process; a later run removes
  only those whose owner is provably dead (:func:`remove_dead_staging`).
* File-system errors while writing become one-line :class:`OutputError` s naming the path
  (:func:`writing`).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import shutil
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bigembed.errors import BigembedError, OutputExistsError

logger = logging.getLogger(__name__)

PathLike = str | os.PathLike[str]

MARKER = ".bigembed-output.json"  # in every directory bigembed writes and replaces as a whole
STAGING_MARKER = ".bigembed-staging.json"  # in every staging directory of a running import
WRITER = "bigembed"

# Kinds of output that --force may replace, and what proves an existing one is bigembed's.
STORE_FORMATS = {"entity store": "bigembed-entities", "edge store": "bigembed-edges"}
MARKED_KINDS = (
    "export",
    "checkpoint",
    "entities",
    "pbg-checkpoint",
    "pbg-entities",
    "split",
    "tune",
    "dataset",
)
FILE_KINDS = ("eval-report", "png")
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
EVAL_REPORT_KEYS = ("protocol", "checkpoint", "version", "overall")


class OutputError(BigembedError):
    """An output cannot be written: it overlaps an input, is not bigembed's to replace, or
    the file system refused the write. The message names the path."""


# ---------------------------------------------------------------------- overlap


def _real(path: PathLike) -> Path:
    return Path(os.path.realpath(os.path.abspath(os.fspath(path))))


def path_within(inner: PathLike, outer: PathLike) -> bool:
    """True when ``inner`` is ``outer`` or lies below it (symbolic links resolved)."""
    a, b = _real(inner), _real(outer)
    return a == b or a.is_relative_to(b)


def refuse_overlap(outputs: Iterable[PathLike], inputs: Iterable[PathLike]) -> None:
    """Refuse any output that is, holds or lies inside an input (one line naming both)."""
    ins = [(p, _real(p)) for p in inputs if p is not None]
    for out in outputs:
        ro = _real(out)
        for inp, ri in ins:
            if ro == ri:
                how = "is"
            elif ri.is_relative_to(ro):
                how = "holds"
            elif ro.is_relative_to(ri):
                how = "lies inside"
            else:
                continue
            raise OutputError(
                f"{out}: this output {how} the input {inp}; write outputs apart from the inputs"
            )


# ---------------------------------------------------------------------- markers


def write_marker(directory: PathLike, kind: str) -> None:
    """Mark ``directory`` (being built) as a whole-directory output of ``kind``."""
    data = {"written_by": WRITER, "kind": kind}
    (Path(directory) / MARKER).write_text(json.dumps(data) + "\n", encoding="utf-8")


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None


def read_marker(directory: PathLike) -> str | None:
    """The kind recorded in ``directory``'s marker, or None when it has no valid marker."""
    data = _read_json(Path(directory) / MARKER)
    if isinstance(data, dict) and data.get("written_by") == WRITER:
        kind = data.get("kind")
        return kind if isinstance(kind, str) else None
    return None


def store_format(directory: PathLike) -> str | None:
    """The ``format`` in ``directory/manifest.json`` when it is a bigembed store's, else None."""
    data = _read_json(Path(directory) / "manifest.json")
    if isinstance(data, dict) and data.get("format") in STORE_FORMATS.values():
        return str(data["format"])
    return None


def _why_not_ours(path: Path, kind: str) -> str | None:
    """None when the existing ``path`` provably is bigembed's output of ``kind``, else why not."""
    if path.is_symlink():
        return "it is a symbolic link"
    if kind in FILE_KINDS:
        if not path.is_file():
            return "it is not a regular file"
        if kind == "png":
            with open(path, "rb") as f:
                ok = f.read(len(PNG_SIGNATURE)) == PNG_SIGNATURE
            return None if ok else "it is not a PNG image"
        data = _read_json(path)
        if isinstance(data, dict) and all(k in data for k in EVAL_REPORT_KEYS):
            return None
        return "it is not a bigembed eval report"
    if not path.is_dir():
        return "it is not a directory"
    if kind in STORE_FORMATS:
        if store_format(path) == STORE_FORMATS[kind]:
            return None
        if not any(path.iterdir()):
            return None  # an empty directory holds nothing to lose
        return f"it holds no bigembed {kind} manifest.json"
    if kind not in MARKED_KINDS:
        raise ValueError(f"unknown output kind {kind!r}")
    found = read_marker(path)
    if found == kind:
        return None
    if found is None and not any(path.iterdir()):
        return None
    if found is None:
        return f"it has no {MARKER} marker"
    return f"its {MARKER} marker says {found!r}, not {kind!r}"


def check_replaceable(path: PathLike, kind: str, *, force: bool) -> bool:
    """Whether ``path`` exists (and may be replaced); refuse what may not be.

    Without ``force`` an existing output is refused; with it, only one that provably is
    bigembed's output of ``kind``.
    """
    p = Path(path)
    if not p.exists() and not p.is_symlink():
        return False
    if not force:
        raise OutputExistsError(f"{p}: already exists; pass --force to replace it")
    why = _why_not_ours(p, kind)
    if why is not None:
        raise OutputError(
            f"{p}: not replaced, {why}: --force replaces only bigembed's own {kind} outputs; "
            f"remove it yourself or choose another path"
        )
    return True


def check_output_file(
    path: PathLike, kind: str, *, force: bool, inputs: Iterable[PathLike]
) -> None:
    """All checks of a single-file output (``eval --output``, ``plot -o``) before any work."""
    p = Path(path)
    refuse_overlap([p], inputs)
    if p.is_dir():
        raise OutputError(f"{p}: is a directory; give a file name")
    if kind == "png" and (p.exists() or p.is_symlink()):
        why = _why_not_ours(p, "png")  # a PNG drawn before is redrawn (the default output is)
        if why is not None:
            raise OutputError(f"{p}: not replaced, {why}; choose another output file")
        return
    check_replaceable(p, kind, force=force)


@contextlib.contextmanager
def writing(path: PathLike, what: str = "output") -> Iterator[None]:
    """Turn a file-system error while writing ``path`` into a one-line OutputError."""
    try:
        yield
    except OSError as exc:
        if isinstance(exc, BigembedError):
            raise
        raise write_error(exc, path, what) from None


def write_error(exc: OSError, path: PathLike, what: str = "output") -> OutputError:
    where: PathLike = path
    if exc.filename is not None and not Path(os.fsdecode(exc.filename)).name.startswith("."):
        where = os.fsdecode(exc.filename)  # a hidden name is one of our temporaries: say ``path``
    reason = exc.strerror or type(exc).__name__
    if exc.errno == errno.EROFS:
        reason = "read-only file system"
    return OutputError(f"{where}: cannot write the {what} ({reason})")


# ---------------------------------------------------------------------- staging directories


def _boot_id() -> str | None:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None


def _start_time(pid: int) -> str | None:
    """The process's start time (clock ticks since boot) from /proc, None if unknown/dead."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]  # field 22 of the whole line


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclass
class StagingClaim:
    """A staging directory owned by this process: its marker stays locked until release."""

    path: Path
    fd: int | None

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing drops the flock
            self.fd = None


def claim_staging(directory: PathLike) -> StagingClaim:
    """Mark a new (empty) staging directory as this process's: lock first, then describe."""
    path = Path(directory)
    fd = os.open(path / STAGING_MARKER, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        info = {
            "written_by": WRITER,
            "pid": os.getpid(),
            "start_time": _start_time(os.getpid()),
            "boot_id": _boot_id(),
        }
        os.write(fd, (json.dumps(info) + "\n").encode())
    except BaseException:
        os.close(fd)
        raise
    return StagingClaim(path, fd)


def _owner_alive(info: dict[str, Any]) -> bool:
    """Whether the process named by a staging marker may still be running."""
    pid = info.get("pid")
    if not isinstance(pid, int):
        return True  # cannot tell: treat as live
    boot = _boot_id()
    if boot is not None and info.get("boot_id") not in (None, boot):
        return False  # written before the last reboot
    if not _pid_alive(pid):
        return False
    start = info.get("start_time")
    now = _start_time(pid)
    return not (start is not None and now is not None and start != now)  # pid reused?


@contextlib.contextmanager
def _dead_staging(directory: Path) -> Iterator[bool]:
    """Yield True (holding the owner's lock) when ``directory`` is a dead run's staging dir.

    Unmarked directories, unreadable markers and live owners all give False.
    """
    try:
        fd = os.open(directory / STAGING_MARKER, os.O_RDWR)
    except OSError:
        yield False  # not ours (no marker) or unreadable: never touched
        return
    try:
        try:
            raw = os.read(fd, 1 << 16)
            info = json.loads(raw.decode("utf-8"))
        except (OSError, UnicodeDecodeError, ValueError):
            yield False  # an owner still writing its marker, or not ours
            return
        if not isinstance(info, dict) or info.get("written_by") != WRITER:
            yield False
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False  # the owner holds its lock: alive
            return
        except OSError:
            yield not _owner_alive(info)  # no flock here: judge by pid and start time
            return
        yield not _owner_alive(info)
    finally:
        os.close(fd)


def remove_dead_staging(parent: PathLike, prefixes: Iterable[str]) -> list[Path]:
    """Remove the staging dirs below ``parent`` named ``prefix*`` that a dead run left.

    Returns what was removed. Only directories with a valid :data:`STAGING_MARKER` whose
    owner is dead are touched.
    """
    root = Path(parent)
    removed: list[Path] = []
    if not root.is_dir():
        return removed
    prefixes = tuple(prefixes)
    try:
        entries = sorted(root.iterdir())
    except OSError:
        return removed
    for entry in entries:
        if not entry.name.startswith(prefixes) or entry.is_symlink() or not entry.is_dir():
            continue
        with _dead_staging(entry) as dead:
            if dead:
                shutil.rmtree(entry, ignore_errors=True)
                removed.append(entry)
                logger.info("removed %s, left behind by an import that did not finish", entry)
    return removed
