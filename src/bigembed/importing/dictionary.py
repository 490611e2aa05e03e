"""Append-only string dictionaries built from batches, vectorised with pyarrow.

pyarrow has no persistent hash table, so a batch is encoded against a dictionary by hashing
the dictionary and the batch together (``dictionary_encode`` of the chunked pair): the
dictionary comes first and has no duplicates, so its entries keep their codes and new names
are appended. Codes are therefore stable for the whole import.

Hash-table lookups of random names cost a cache miss each once the table outgrows the CPU
cache, and get several times slower per name. :class:`ShardedDictionary`
splits names into 256 shards by a cheap vectorised key computed from a few bytes of each
name, so that every table stays small; an entity's code is (shard, index in shard).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

NUM_SHARDS = 256


def _grow(array: np.ndarray, size: int) -> np.ndarray:
    if len(array) >= size:
        return array
    out = np.zeros(size, dtype=array.dtype)
    out[: len(array)] = array
    return out


class GrowingDictionary:
    """A small append-only dictionary (relation names)."""

    def __init__(self) -> None:
        self.values: pa.Array = pa.array([], pa.string())

    def __len__(self) -> int:
        return len(self.values)

    def encode(self, values: pa.Array) -> np.ndarray:
        """Codes of ``values``; unseen values are appended."""
        if len(values) == 0:
            return np.empty(0, dtype=np.int32)
        encoded = pc.dictionary_encode(pa.chunked_array([self.values, values], type=pa.string()))
        last = encoded.chunk(encoded.num_chunks - 1)
        self.values = last.dictionary
        return last.indices.to_numpy()


def shard_keys(values: pa.Array) -> np.ndarray:
    """A cheap hash (uint8) of each string from its length, first 4 and last 4 bytes.

    Only the speed depends on how well this spreads names; correctness never does, but the
    key depends on the string's own bytes only (the same name always lands in the same
    shard), which the masking of short strings below ensures.
    """
    n = len(values)
    if n == 0:
        return np.empty(0, dtype=np.uint8)
    offsets = np.frombuffer(values.buffers()[1], dtype=np.int32)[
        values.offset : values.offset + n + 1
    ]
    buffer = values.buffers()[2]
    size = 0 if buffer is None else buffer.size
    # Unaligned little-endian uint32 view starting at every byte: word[i] = bytes i..i+3.
    padded = np.zeros(size + 4, dtype=np.uint8)
    if size:
        padded[:size] = np.frombuffer(buffer, dtype=np.uint8, count=size)
    word = np.ndarray(shape=(size + 1,), dtype="<u4", buffer=padded, strides=(1,))
    start = offsets[:-1]
    end = offsets[1:]
    length = (end - start).astype(np.uint32)
    short = length < 4
    first = word[start]
    last = word[np.where(short, start, end - 4)]  # a short string reads its own first bytes
    if short.any():
        keep_bits = np.uint64(1) << (np.minimum(length, 4).astype(np.uint64) * np.uint64(8))
        mask = (keep_bits - np.uint64(1)).astype(np.uint32)
        first &= mask
        last &= mask
    h = last * np.uint32(0x9E3779B1)
    h ^= first * np.uint32(0x85EBCA6B)
    h ^= length * np.uint32(0x27D4EB2F)
    h ^= h >> np.uint32(15)
    h *= np.uint32(0x2C1B3C6D)
    h ^= h >> np.uint32(13)
    return (h >> np.uint32(24)).astype(np.uint8)


class Prepared:
    """A batch of names grouped by shard: the part of encoding that needs no dictionary."""

    __slots__ = ("bounds", "grouped", "keys", "order")

    def __init__(self, values: pa.Array) -> None:
        self.keys = shard_keys(values)
        self.order = np.argsort(self.keys, kind="stable")  # radix sort for uint8: linear
        self.bounds = np.zeros(NUM_SHARDS + 1, dtype=np.int64)
        np.cumsum(np.bincount(self.keys, minlength=NUM_SHARDS), out=self.bounds[1:])
        self.grouped = values.take(pa.array(self.order))

    def __len__(self) -> int:
        return len(self.keys)

    def piece(self, shard: int) -> pa.Array:
        lo, hi = int(self.bounds[shard]), int(self.bounds[shard + 1])
        return self.grouped.slice(lo, hi - lo)


class ShardedDictionary:
    """Entity names of one type: 256 append-only shards; a name's code is (shard, index).

    With ``count`` set, occurrences per name are counted (for --entity-min-count).
    """

    def __init__(self, *, count: bool) -> None:
        self.shards: list[pa.Array] = [pa.array([], pa.string()) for _ in range(NUM_SHARDS)]
        self.count = count
        self.counts: list[np.ndarray] = [np.zeros(0, dtype=np.int64) for _ in range(NUM_SHARDS)]

    def __len__(self) -> int:
        return sum(len(s) for s in self.shards)

    def sizes(self) -> np.ndarray:
        return np.array([len(s) for s in self.shards], dtype=np.int64)

    def encode(self, values: pa.Array) -> tuple[np.ndarray, np.ndarray]:
        """(shard, index) of each name in ``values`` (a string array without nulls)."""
        return self.encode_prepared([Prepared(values)])[0]

    def encode_prepared(self, batches: list[Prepared]) -> list[tuple[np.ndarray, np.ndarray]]:
        """(shard, index) per name of each prepared batch; one hash pass per shard for all."""
        grouped_codes = [np.empty(len(b), dtype=np.int32) for b in batches]
        for shard in range(NUM_SHARDS):
            pieces = [b.piece(shard) for b in batches]
            sizes = [len(p) for p in pieces]
            if not any(sizes):
                continue
            known = self.shards[shard]
            encoded = pc.dictionary_encode(pa.chunked_array([known, *pieces], type=pa.string()))
            dictionary = encoded.chunk(encoded.num_chunks - 1).dictionary
            if len(dictionary) < len(known):  # cannot happen: known has no duplicates
                raise AssertionError("dictionary shrank while encoding")
            self.shards[shard] = dictionary
            counts = _grow(self.counts[shard], len(dictionary)) if self.count else None
            # Output chunking need not mirror the input's (empty chunks vanish): flatten.
            flat = np.concatenate([c.indices.to_numpy() for c in encoded.chunks])
            pos = len(known)
            for b, codes, size in zip(batches, grouped_codes, sizes, strict=True):
                if size == 0:
                    continue
                values = flat[pos : pos + size]
                pos += size
                lo = int(b.bounds[shard])
                codes[lo : lo + size] = values
                if counts is not None:
                    counts += np.bincount(values, minlength=len(counts))
            if counts is not None:
                self.counts[shard] = counts
        out = []
        for b, codes in zip(batches, grouped_codes, strict=True):
            ordered = np.empty(len(b), dtype=np.int32)
            ordered[b.order] = codes
            out.append((b.keys, ordered))
        return out

    def names(self) -> pa.Array:
        """All names in entity-id order (shard by shard); id = shard base + index."""
        if not len(self):
            return pa.array([], pa.string())
        return pa.concat_arrays([s for s in self.shards if len(s)])

    def all_counts(self) -> np.ndarray:
        """Occurrences per entity id (only when counting)."""
        parts = [_grow(c, len(s))[: len(s)] for c, s in zip(self.counts, self.shards, strict=True)]
        return np.concatenate(parts)

    def bases(self) -> np.ndarray:
        """Entity id of index 0 of each shard."""
        out = np.zeros(NUM_SHARDS, dtype=np.int64)
        np.cumsum(self.sizes()[:-1], out=out[1:])
        return out
