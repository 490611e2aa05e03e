"""Relation names -> relation ids, in PBG's two modes.

* non-dynamic: the names and ids come from the config (id = index in ``relations``); a name
  in the data that the config does not list is a bad row;
* dynamic: the names come from the data. Ids are provisional while reading (order of first
  appearance) and become final in :meth:`RelationMapper.finish`: names sorted, those below
  ``--relation-type-min-count`` dropped.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from bigembed.edgelists import (
    BAD_UTF8,
    EMPTY_RELATION,
    NUL_BYTE,
    UNKNOWN_RELATION,
    Problem,
    as_strings,
    has_nul,
)
from bigembed.importing.dictionary import GrowingDictionary


def _valid_utf8(values: pa.Array) -> np.ndarray:
    try:
        values.validate(full=True)
        return np.ones(len(values), dtype=bool)
    except pa.ArrowInvalid:
        out = np.ones(len(values), dtype=bool)
        for i, item in enumerate(values.view(pa.binary()).to_pylist()):
            try:
                item.decode("utf-8")
            except UnicodeDecodeError:
                out[i] = False
        return out


KNOWN_SHOWN = 5  # relation names listed in an "unknown relation" message


class RelationMapper:
    """Maps a batch's relation column to int32 ids and counts edges per relation."""

    def __init__(self, config_names: Sequence[str], *, dynamic: bool) -> None:
        self.dynamic = dynamic
        self.config_names = list(config_names)
        self._index = {name: i for i, name in enumerate(self.config_names)}
        self.dictionary = GrowingDictionary()
        self.counts = np.zeros(len(config_names), dtype=np.int64)

    def constant(self, n: int) -> np.ndarray:
        """Ids when the input has no relation column: everything is relation 0."""
        if self.dynamic and len(self.dictionary) == 0:
            self.dictionary.encode(pa.array(self.config_names[:1], pa.string()))
        return np.zeros(n, dtype=np.int32)

    def map(self, column: pa.Array) -> tuple[np.ndarray, list[Problem]]:
        """Relation id per row (-1 for bad rows) and the problems found.

        Checks run on the batch's distinct names (dictionary-encoded), not on every row.
        """
        values = as_strings(column)
        if values.null_count:
            values = pc.fill_null(values, "")
        encoded = pc.dictionary_encode(values)
        local = encoded.dictionary
        indices = encoded.indices.to_numpy()
        empty = pc.binary_length(local).to_numpy() == 0
        bad_utf8 = ~_valid_utf8(local)
        nul = has_nul(local)
        good = ~empty & ~bad_utf8 & ~nul
        local_ids = np.full(len(local), -1, dtype=np.int32)
        problems = []
        if empty.any():
            problems.append(Problem(empty[indices], EMPTY_RELATION))
        if bad_utf8.any():
            problems.append(Problem(bad_utf8[indices], BAD_UTF8))
        if nul.any():
            problems.append(Problem(nul[indices], NUL_BYTE))
        if self.dynamic:
            if good.any():
                local_ids[good] = self.dictionary.encode(local.filter(pa.array(good)))
        else:
            names = local.view(pa.binary()).to_pylist()
            for i, raw in enumerate(names):
                if good[i]:
                    local_ids[i] = self._index.get(raw.decode("utf-8"), -1)
            unknown_local = good & (local_ids < 0)
            if unknown_local.any():
                mask = unknown_local[indices]
                rows = np.flatnonzero(mask)[:5]
                detail = {int(r): self._unknown(names[indices[r]].decode("utf-8")) for r in rows}
                problems.append(Problem(mask, UNKNOWN_RELATION, detail))
        return local_ids[indices], problems

    def _unknown(self, name: str) -> str:
        """Why ``name`` is refused, and what would work: the known names (a few), the closest
        one, or ``dynamic_relations: true`` (relation names taken from the data)."""
        known = self.config_names
        shown = ", ".join(known[:KNOWN_SHOWN])
        if len(known) > KNOWN_SHOWN:
            shown += f" and {len(known) - KNOWN_SHOWN} more"
        close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
        mean = f"did you mean {close[0]!r}? Otherwise " if close else ""
        return (
            f"{name!r} is not in the config's relations [{shown}]; {mean}add it to relations "
            "or set dynamic_relations: true to take relation names from the data"
        )

    def add_counts(self, ids: np.ndarray) -> None:
        size = max(len(self.counts), len(self.dictionary))
        counts = np.bincount(ids, minlength=size)
        if len(self.counts) < size:
            self.counts = np.concatenate([self.counts, np.zeros(size - len(self.counts), np.int64)])
        self.counts += counts

    def finish(self, min_count: int) -> tuple[list[str], np.ndarray, list[str]]:
        """(final names, provisional id -> final id or -1, dropped names)."""
        if not self.dynamic:
            return self.config_names, np.arange(len(self.config_names), dtype=np.int32), []
        names = self.dictionary.values.to_pylist()
        counts = self.counts[: len(names)]
        kept = [
            i for i in sorted(range(len(names)), key=lambda i: names[i]) if counts[i] >= min_count
        ]
        dropped = sorted(names[i] for i in range(len(names)) if counts[i] < min_count)
        remap = np.full(len(names), -1, dtype=np.int32)
        remap[np.array(kept, dtype=np.int64)] = np.arange(len(kept), dtype=np.int32)
        return [names[i] for i in kept], remap, dropped
