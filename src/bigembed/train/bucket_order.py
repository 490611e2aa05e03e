"""Orders in which the buckets (lhs partition, rhs partition) of an edge set are trained."""

from __future__ import annotations

import random

from bigembed.partition_keys import Bucket


def _layers(nparts_lhs: int, nparts_rhs: int, rng: random.Random) -> list[list[Bucket]]:
    """PBG's L-shaped layers: layer k holds the buckets with min(i, j) = k.

    Inside a layer the order is random, but a bucket and its transpose stay adjacent (so the
    partitions loaded for one are reused by the other).
    """
    layers = []
    for k in range(min(nparts_lhs, nparts_rhs)):
        pairs: list[list[Bucket]] = [[(k, k)]]
        for other in range(k + 1, max(nparts_lhs, nparts_rhs)):
            group: list[Bucket] = []
            if other < nparts_rhs:
                group.append((k, other))
            if other < nparts_lhs:
                group.append((other, k))
            if group:
                rng.shuffle(group)
                pairs.append(group)
        rng.shuffle(pairs)
        layers.append([b for group in pairs for b in group])
    return layers


def _affinity(nparts_lhs: int, nparts_rhs: int, rng: random.Random) -> list[Bucket]:
    remaining = {(i, j) for i in range(nparts_lhs) for j in range(nparts_rhs)}
    current = rng.choice(sorted(remaining))
    order = [current]
    remaining.remove(current)
    while remaining:
        i, j = current
        if (j, i) in remaining:
            nxt = (j, i)
        else:
            sharing = sorted(
                b for b in remaining if b[0] == i or b[1] == j or b[0] == j or b[1] == i
            )
            nxt = rng.choice(sharing) if sharing else rng.choice(sorted(remaining))
        order.append(nxt)
        remaining.remove(nxt)
        current = nxt
    return order


def bucket_order(name: str, nparts_lhs: int, nparts_rhs: int, rng: random.Random) -> list[Bucket]:
    """Every bucket exactly once, in the order ``name`` (random/affinity/inside_out/outside_in)."""
    if name == "random":
        order = [(i, j) for i in range(nparts_lhs) for j in range(nparts_rhs)]
        rng.shuffle(order)
        return order
    if name == "affinity":
        return _affinity(nparts_lhs, nparts_rhs, rng)
    if name in ("inside_out", "outside_in"):
        layers = _layers(nparts_lhs, nparts_rhs, rng)
        if name == "inside_out":
            layers.reverse()
        return [b for layer in layers for b in layer]
    raise ValueError(f"unknown bucket order {name!r}")
