"""``bigembed import --extend``: the new entities of an import appended to the existing store.

Every entity of the existing store keeps its (partition, offset), whether or not the new edge
lists mention it. Entities it does not know are new: per type they are sorted by name, permuted
by the import's seeded generator (so the result depends only on the set of names, as in
:mod:`~bigembed.importing.partitioning`) and appended to the partitions, the smallest filled
first (:func:`fill_smallest_first`), so partition sizes stay balanced. The relation types keep
their ids: the new edge lists may use fewer of them, never others. The new store records the
imports it extends (:class:`bigembed.storage.Extension`), so the checkpoints trained on the old
store are recognised as prefixes of it, not orphans.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from bigembed.errors import InputError
from bigembed.importing.partitioning import Assignment, type_rng
from bigembed.storage import EntityStore, Extension


def fill_smallest_first(counts: Sequence[int], n: int) -> list[int]:
    """How many of ``n`` new entities each partition gets: the smallest partitions are raised
    first, so the sizes end as even as they can (the ones left over go to the lowest indices
    among the smallest)."""
    size = np.asarray(counts, dtype=np.int64)
    parts = len(size)
    order = np.argsort(size, kind="stable")
    ranked = size[order]
    adds = np.zeros(parts, dtype=np.int64)
    if n <= 0 or parts == 0:
        return adds.tolist()
    for k in range(1, parts + 1):
        # raise the k smallest to the next size up (or as far as n goes when k is all of them)
        cost = int(ranked[k] * k - ranked[:k].sum()) if k < parts else n
        if cost >= n:
            level, extra = divmod(int(ranked[:k].sum()) + n, k)
            chosen = np.sort(order[:k])
            final = np.full(k, level, dtype=np.int64)
            final[:extra] += 1
            adds[chosen] = final - size[chosen]
            break
    return adds.tolist()


def extend_assignment(
    old: EntityStore,
    entity_type: str,
    names: pa.Array,
    keep: np.ndarray | None,
    seed: int,
) -> Assignment:
    """Where every entity id of ``names`` goes in the extended store: the store's own entities
    where they are, the kept new ones appended (see the module docstring)."""
    found_part, found_offset = old.lookup(entity_type, names)
    part_of = found_part.astype(np.int32)
    offset_of = found_offset.astype(np.int64)
    new = found_part < 0
    if keep is not None:
        new &= keep
    new_ids = np.flatnonzero(new)
    order = pc.sort_indices(names.take(pa.array(new_ids))).to_numpy()
    shuffled = new_ids[order][type_rng(seed, entity_type).permutation(len(new_ids))]
    counts = old.counts(entity_type)
    per_part = []
    start = 0
    for part, add in enumerate(fill_smallest_first(counts, len(shuffled))):
        ids = shuffled[start : start + add]
        start += add
        part_of[ids] = part
        offset_of[ids] = counts[part] + np.arange(add, dtype=np.int64)
        old_names = old.names_array(entity_type, part)
        per_part.append(pa.concat_arrays([old_names, names.take(pa.array(ids)).cast(pa.string())]))
    return Assignment(part_of, offset_of, per_part)


def extended_relations(
    old: EntityStore, names: list[str], remap: np.ndarray, dynamic: bool
) -> tuple[list[str], np.ndarray]:
    """The old store's relation names, and ``remap`` (relation code -> id in ``names``) turned
    into codes -> ids of the old store; a relation type the old store lacks is an error."""
    known = old.relation_names()
    missing = [n for n in names if n not in known]
    if missing or (not dynamic and names != known):
        shown = ", ".join(repr(n) for n in (missing or names)[:3])
        raise InputError(
            f"{old.path}: --extend adds entities only, but the relation types differ "
            f"(e.g. {shown} is not among the store's {len(known)}); import into another "
            "entity_path to change relation types"
        )
    position = {n: i for i, n in enumerate(known)}
    to_old = np.array([position[n] for n in names], dtype=remap.dtype)
    return known, np.where(remap >= 0, to_old[np.maximum(remap, 0)], -1).astype(remap.dtype)


def extension_record(old: EntityStore, grown: bool) -> dict[str, Any]:
    """The manifest entries of the extended store: the imports it extends (the old store's own,
    plus the old store itself when entities were added)."""
    if old.import_id is None:
        raise InputError(
            f"{old.path}: was imported before import ids existed, so no model can be matched "
            "to an extension of it; re-import it (`bigembed import --force`) first"
        )
    chain = list(old.extends)
    if grown:
        counts = {t: tuple(old.counts(t)) for t in old.entity_types}
        chain.append(Extension(old.import_id, counts))
    return {"extends": [e.to_json() for e in chain]} if chain else {}
