"""Orders in which the buckets (lhs partition, rhs partition) of an edge set are trained."""

from __future__ import annotations

import random
from collections.abc import Mapping

from bigembed.partition_keys import Bucket

Costs = Mapping[Bucket, float]


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


def _emit(
    pairs: list[tuple[int, int]], rng: random.Random, costs: Costs | None = None
) -> list[Bucket]:
    """The buckets of unordered partition pairs, a bucket next to its transpose, in random order.

    With ``costs``, the costliest bucket comes last (its transpose just before it): the bucket
    trained last before the next swap is the one during which the store reads the next
    partition ahead, so the longest one hides most of that read."""
    groups: list[list[Bucket]] = []
    for a, b in pairs:
        group: list[Bucket] = [(a, a)] if a == b else [(a, b), (b, a)]
        rng.shuffle(group)
        groups.append(group)
    rng.shuffle(groups)
    if costs is not None and groups:
        top = max(groups, key=lambda g: max(costs.get(b, 0.0) for b in g))
        top.sort(key=lambda b: costs.get(b, 0.0))
        groups.remove(top)
        groups.append(top)
    return [b for g in groups for b in g]


def _buffer_order(
    nparts: int, buffer: int, rng: random.Random, costs: Costs | None = None
) -> list[Bucket]:
    """BETA (Marius, OSDI'21): with ``buffer`` partitions in memory, fix ``buffer - 1`` of them
    and cycle every partition that still has untrained buckets with them through the last
    slot; then fix the next ``buffer - 1`` (starting with those already resident) and repeat.

    Each swap trains every new bucket its partition forms with the resident ones, so a pass
    needs about ``p^2 / (2 (buffer - 1))`` swaps, against about ``p^2 / 2`` when only one
    bucket's two partitions are held.
    """
    c = max(2, min(buffer, nparts))
    perm = list(range(nparts))
    rng.shuffle(perm)
    todo = {(a, b) for a in range(nparts) for b in range(a, nparts)}
    order: list[Bucket] = []
    resident: list[int] = []

    def load(part: int, keep: set[int]) -> None:
        if part in resident:
            return
        if len(resident) >= c:
            resident.remove(next(r for r in resident if r not in keep))
        resident.append(part)
        new = sorted(
            (min(part, r), max(part, r)) for r in resident if (min(part, r), max(part, r)) in todo
        )
        todo.difference_update(new)
        order.extend(_emit(new, rng, costs))

    def open_parts() -> list[int]:
        return [p for p in perm if any(p in pair for pair in todo)]

    while todo:
        left = open_parts()
        if len(left) <= c:
            for p in left:
                load(p, set(left))
            continue
        fixed = [p for p in resident if p in left][: c - 1]
        fixed += [p for p in left if p not in fixed][: c - 1 - len(fixed)]
        for p in fixed:
            load(p, set(fixed))
        for p in sorted(left, key=lambda q: q not in resident):
            if p not in fixed and any((min(p, f), max(p, f)) in todo for f in fixed):
                load(p, set(fixed))
    return order


def bucket_order(
    name: str,
    nparts_lhs: int,
    nparts_rhs: int,
    rng: random.Random,
    buffer: int = 2,
    costs: Costs | None = None,
) -> list[Bucket]:
    """Every bucket exactly once, in the order ``name`` (random/affinity/inside_out/outside_in,
    or ``buffer``: the fewest swaps for ``buffer`` partitions held per side). ``costs`` (the
    cost model's, ``load_balancing: cost``): with ``buffer``, among the buckets a swap brings,
    the costliest is trained last, while the next swap's partition is read ahead."""
    if name == "buffer":
        if nparts_lhs == nparts_rhs:
            return _buffer_order(nparts_lhs, buffer, rng, costs)
        name = "inside_out"  # lhs and rhs of different sizes: no shared buffer to plan for
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
