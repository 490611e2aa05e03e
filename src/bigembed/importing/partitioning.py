"""Deterministic, seeded assignment of entities to partitions.

Names are sorted (so the result does not depend on the input order), permuted with a
generator seeded from (seed, entity type), and cut into ``num_partitions`` contiguous
ranges: partition p gets positions ``[p*n//P, (p+1)*n//P)`` and the offset of an entity is its
position minus the range start.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


@dataclass
class Assignment:
    """Where every entity id of one type went; -1 for entities dropped by min-count."""

    part_of: np.ndarray  # int32, per entity id
    offset_of: np.ndarray  # int64, per entity id
    names: list[pa.Array]  # per partition, in offset order

    @property
    def counts(self) -> list[int]:
        return [len(a) for a in self.names]


def type_rng(seed: int, entity_type: str) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence([seed, zlib.crc32(entity_type.encode())]))


def assign_partitions(
    names: pa.Array, keep: np.ndarray | None, num_partitions: int, seed: int, entity_type: str
) -> Assignment:
    """Assign the kept entity ids (all when ``keep`` is None) to partitions."""
    total = len(names)
    kept = np.arange(total, dtype=np.int64) if keep is None else np.flatnonzero(keep)
    kept_names = names if keep is None else names.take(pa.array(kept))
    order = pc.sort_indices(kept_names).to_numpy()
    sorted_ids = kept[order]
    shuffled = sorted_ids[type_rng(seed, entity_type).permutation(len(sorted_ids))]
    part_of = np.full(total, -1, dtype=np.int32)
    offset_of = np.full(total, -1, dtype=np.int64)
    n = len(shuffled)
    per_part = []
    for p in range(num_partitions):
        lo, hi = p * n // num_partitions, (p + 1) * n // num_partitions
        ids = shuffled[lo:hi]
        part_of[ids] = p
        offset_of[ids] = np.arange(hi - lo, dtype=np.int64)
        per_part.append(names.take(pa.array(ids)))
    return Assignment(part_of, offset_of, per_part)
