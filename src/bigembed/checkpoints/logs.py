"""The JSON-lines logs of a checkpoint directory: training stats and early stopping's
evaluations, one record per line, each tagged with its checkpoint version.

A log is not training state: a damaged line is left out (the callers warn), never a reason to
stop. Each rewrite is atomic and drops the records of versions that were never committed.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from bigembed.atomic import atomic_write_text
from bigembed.checkpoints.layout import write_error
from bigembed.errors import CheckpointError

logger = logging.getLogger(__name__)


def read_stats_lines(
    path: Path, max_version: int | None = None
) -> tuple[list[dict[str, Any]], list[int]]:
    """The readable records (of versions up to ``max_version``) and the (1-based) numbers of
    the lines that are not a JSON object with an integer ``version``."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return [], []
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot read: {exc.strerror or exc}") from None
    records, bad = [], []
    for number, line in enumerate(raw.split(b"\n"), start=1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError):
            rec = None
        if not isinstance(rec, dict) or not isinstance(rec.get("version", 0), int):
            bad.append(number)
            continue
        if max_version is None or rec.get("version", 0) <= max_version:
            records.append(rec)
    return records, bad


def read_validation_lines(path: Path, max_version: int | None = None) -> list[dict[str, Any]]:
    """Early stopping's evaluation records, up to ``max_version``; a damaged line (or file) is
    skipped with a warning."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    except (OSError, UnicodeDecodeError) as exc:
        logger.warning("%s: unreadable (%s); ignoring it", path, exc)
        return []
    out = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            logger.warning("%s:%d: not JSON; line skipped", path, number)
            continue
        if not isinstance(record, dict) or not isinstance(record.get("version"), int):
            logger.warning("%s:%d: no version; line skipped", path, number)
            continue
        if max_version is None or record["version"] <= max_version:
            out.append(record)
    return out


def write_lines(path: Path, records: list[dict[str, Any]]) -> None:
    """Replace the log at ``path`` with ``records``, one JSON object a line (atomically)."""
    text = "".join(json.dumps(r, sort_keys=True) + "\n" for r in records)
    try:
        atomic_write_text(path, text)
    except OSError as exc:
        raise write_error(path, exc) from None
