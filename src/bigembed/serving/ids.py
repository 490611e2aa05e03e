"""Entity names <-> global ids: a type's entities numbered partition by partition (the
partition's base plus the entity's offset in it)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from bigembed.checkpoints import EntityTables
from bigembed.serving.errors import UnknownNameError, check_name, show_values
from bigembed.storage import EntityStore


def names_to_ids(
    store: EntityStore, tables: EntityTables, etype: str, names: Sequence[str]
) -> np.ndarray:
    """The global ids of ``names`` of type ``etype``; :class:`UnknownNameError` for a name the
    entity store does not hold."""
    for name in names:
        check_name(name)
    parts, offsets = store.lookup(etype, list(names))
    if (parts < 0).any():
        bad = [names[i] for i in np.flatnonzero(parts < 0).tolist()]
        what = f"entity {bad[0]!r}" if len(bad) == 1 else f"entities {show_values(bad)}"
        raise UnknownNameError(f"unknown {what} (not among the {etype!r} names of {store.path})")
    return tables.bases(etype)[parts] + offsets


def ids_to_names(
    store: EntityStore, tables: EntityTables, etype: str, ids: np.ndarray
) -> list[str]:
    """The names of global ids ``ids`` of type ``etype``, in order."""
    bases = tables.bases(etype)
    parts = np.searchsorted(bases, ids, side="right") - 1
    out: list[str] = [""] * len(ids)
    for part in np.unique(parts).tolist():
        sel = np.flatnonzero(parts == part)
        found = store.names_array(etype, part).take(ids[sel] - bases[part]).to_pylist()
        for i, n in zip(sel.tolist(), found, strict=True):
            out[i] = n
    return out
