"""Orders in which the buckets (lhs partition, rhs partition) of an edge set are trained."""

from __future__ import annotations

import bisect
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


def _emit(pairs: list[tuple[int, int]], rng: random.Random) -> list[Bucket]:
    """The buckets of unordered partition pairs, a bucket next to its transpose, in random order."""
    groups: list[list[Bucket]] = []
    for a, b in pairs:
        group: list[Bucket] = [(a, a)] if a == b else [(a, b), (b, a)]
        rng.shuffle(group)
        groups.append(group)
    rng.shuffle(groups)
    return [b for g in groups for b in g]


def _buffer_order(nparts: int, buffer: int, rng: random.Random) -> list[Bucket]:
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
        order.extend(_emit(new, rng))

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


def _staggered_order(nparts: int, slots: int, rng: random.Random) -> list[Bucket]:
    """The ``buffer`` order for ``slots`` >= 3 partitions in memory, planned so that each
    swap's leaving partition is idle for most of the group of buckets before the swap.

    ``slots - 2`` partitions are fixed; every partition with untrained buckets against them
    passes through the two other slots in a chain: partition ``q[k]`` arrives while
    ``q[k - 1]`` is still resident, and its group of buckets trains first the pair
    ``(q[k - 1], q[k])`` (the leaving partition's last buckets), then ``q[k]`` against the fixed
    ones, its own diagonal bucket last. ``q[k - 1]`` leaves at the next swap, so from the
    group's third bucket on it is idle: its write-back and the read of ``q[k + 1]`` into its
    slot overlap the rest of the group, and the order needs no slot beyond ``slots`` for
    reading ahead. Each arrival trains up to ``slots - 1`` new partition pairs (``slots - 2``
    fixed ones and its predecessor in the chain), as many as BETA's with a buffer of ``slots``
    and one more than BETA's with the ``slots - 1`` it could plan for when a slot is kept for
    reading ahead; the chains' pairs leave the last untrained pairs scattered, so a pass
    loads a few more partitions than BETA's with ``slots`` (16 partitions, 4 slots: 47 against
    46; BETA with 3: 58). Then the next ``slots - 2`` partitions with untrained buckets are
    fixed (those resident first) and the chain starts again.

    Every bucket after the first shares a partition with a bucket trained before it (a
    partition's random start is first trained next to an already trained one).
    """
    c = max(3, min(slots, nparts))
    perm = list(range(nparts))
    rng.shuffle(perm)
    todo = {(a, b) for a in range(nparts) for b in range(a, nparts)}
    order: list[Bucket] = []
    resident: list[int] = []  # in order of arrival
    group: list[tuple[int, int]] = []  # the pairs the last arrival brought, not yet emitted

    def pair(a: int, b: int) -> tuple[int, int]:
        return (a, b) if a <= b else (b, a)

    def done(part: int) -> bool:
        return not any(part in p for p in todo)

    def emit(leaving: int | None) -> None:
        """The pending group: the leaving partition's pairs first, then those of the other
        partitions it finishes (the store may evict one of them instead: it breaks ties
        between partitions never needed again by its own rule), the diagonal last."""
        first = [p for p in group if leaving in p]
        then = [p for p in group if p not in first and p[0] != p[1] and done(p[0]) | done(p[1])]
        rest = [p for p in group if p not in first + then and p[0] != p[1]]
        for part in (first, then, rest):
            rng.shuffle(part)
        for a, b in first + then + rest + [p for p in group if p[0] == p[1]]:
            buckets: list[Bucket] = [(a, b)] if a == b else [(a, b), (b, a)]
            rng.shuffle(buckets)
            order.extend(buckets)
        group.clear()

    def load(part: int, keep: set[int]) -> None:
        if part in resident:
            return
        leaving = None
        if len(resident) >= c:
            # a partition with nothing left to train (fixed or not) first, as the store's
            # eviction of the partition needed furthest ahead will; else the oldest not kept
            idle = [r for r in resident if done(r)]
            leaving = (idle or [r for r in resident if r not in keep])[0]
            resident.remove(leaving)
        emit(leaving)
        resident.append(part)
        new = [pair(part, r) for r in resident if pair(part, r) in todo]
        todo.difference_update(new)
        group.extend(new)

    def open_parts() -> list[int]:
        return [p for p in perm if any(p in q for q in todo)]

    while todo:
        left = open_parts()
        if len(left) <= c:
            for p in sorted(left, key=lambda q: q not in resident):
                load(p, set(left))
            continue
        fixed = [p for p in resident if p in left][: c - 2]
        fixed += [p for p in left if p not in fixed][: c - 2 - len(fixed)]
        for p in fixed:
            load(p, set(fixed))
        # the chain: each next partition shares an untrained pair with the previous if it can
        chain = [r for r in resident if r not in fixed and r in left][-1:]
        waiting = [p for p in left if p not in fixed and p not in chain]
        while waiting:
            last = chain[-1] if chain else None
            nxt = next((p for p in waiting if last is not None and pair(p, last) in todo), None)
            if nxt is None:
                nxt = waiting[0]
            waiting.remove(nxt)
            if not any(pair(nxt, f) in todo for f in fixed):
                continue
            load(nxt, set(fixed) | ({last} if last is not None else set()))
            chain.append(nxt)
    emit(None)
    return _with_slack(order, c)


Unit = tuple[Bucket, ...]  # a bucket and its transpose (or a diagonal bucket alone)


def _units(order: list[Bucket]) -> list[Unit]:
    units: list[Unit] = []
    k = 0
    while k < len(order):
        (a, b), k2 = order[k], k + 1
        if a != b and k2 < len(order) and order[k2] == (b, a):
            units.append((order[k], order[k2]))
            k += 2
        else:
            units.append((order[k],))
            k += 1
    return units


def _parts(unit: Unit) -> set[int]:
    return {p for b in unit for p in b}


def _segments(
    order: list[Bucket], slots: int
) -> tuple[list[list[Unit]], list[set[int]], list[set[int]]]:
    """The order cut at each partition load, as the partition store swaps it (the partition
    needed furthest ahead leaves, ties to the lowest index): the units of each segment, the
    partitions resident during it, and those evicted at its end (to load the next one's)."""
    uses: dict[int, list[int]] = {}
    for i, bucket in enumerate(order):
        for p in set(bucket):
            uses.setdefault(p, []).append(i)

    def next_use(p: int, i: int) -> int:
        k = bisect.bisect_left(uses[p], i)
        return uses[p][k] if k < len(uses[p]) else len(order)

    resident: set[int] = set()
    segs: list[list[Unit]] = []
    held: list[set[int]] = []
    leaving: list[set[int]] = []
    i = 0
    for unit in _units(order):
        need = _parts(unit)
        new = sorted(need - resident)
        out: set[int] = set()
        for p in new:
            if len(resident) >= slots:
                victim = max(sorted(resident - need), key=lambda q: next_use(q, i))
                resident.remove(victim)
                out.add(victim)
            resident.add(p)
        if new or not segs:
            if segs:
                leaving.append(out)
            segs.append([])
            held.append(set())
        segs[-1].append(unit)
        held[-1] = set(resident)
        i += len(unit)
    leaving.append(set())
    return segs, held, leaving


def _with_slack(order: list[Bucket], slots: int) -> list[Bucket]:
    """The same swaps, with buckets moved between the segments (the runs of buckets between
    two loads) so that before each swap several buckets use none of the leaving partitions:
    the window in which the store writes the leaving partition back and reads the next one.

    A segment's first unit (the one its load is for) stays; any other unit may move to a
    segment during which both its partitions are resident and that does not end by evicting
    one of them (there, it is slack). It is taken first from where it is no slack itself (it
    used the partition leaving there), else from a segment with slack to spare. Segments are
    raised to 1, 2, 3, then 4 buckets of slack, so the swaps with none gain first. Inside a
    segment, the units using its leaving partitions come right after the first, then those
    using a partition no later bucket needs (the store may evict one of those instead: a tie
    it breaks by its own rule), then the rest. Every unit moves to where its partitions are
    already resident, so the loads per pass do not change (tested)."""
    segs, held, leaving = _segments(order, slots)
    last = len(segs) - 1
    where: dict[Unit, int] = {}
    by_parts: dict[frozenset[int], list[Unit]] = {}
    for s, seg in enumerate(segs):
        for unit in seg[1:]:
            where[unit] = s
            by_parts.setdefault(frozenset(_parts(unit)), []).append(unit)

    def slack(s: int) -> int:
        return sum(len(u) for u in segs[s] if not _parts(u) & leaving[s])

    for want in (1, 2, 3, 4):
        for t in range(last):
            need = want - slack(t)
            if need <= 0:
                continue
            idle = sorted(held[t] - leaving[t])
            sets = [frozenset((a, b)) for k, a in enumerate(idle) for b in idle[k:]]
            free: dict[int, int] = {}
            donors = []
            for unit in (u for ps in sets for u in by_parts.get(ps, ()) if where[u] != t):
                s = where[unit]
                free.setdefault(s, slack(s))
                costly = 0 if s == last or _parts(unit) & leaving[s] else 1
                donors.append((costly, -free[s], abs(s - t), s, unit))
            for costly, _, _, s, unit in sorted(donors):
                if need <= 0:
                    break
                if costly and free[s] - len(unit) < want:
                    continue
                free[s] -= len(unit) * costly
                segs[s].remove(unit)
                segs[t].append(unit)
                where[unit] = t
                need -= len(unit)
    last_seg = {p: s for s, seg in enumerate(segs) for u in seg for p in _parts(u)}
    out: list[Bucket] = []
    for t, seg in enumerate(segs):

        def rank(u: Unit, t: int = t) -> tuple[bool, bool]:
            parts = _parts(u)
            return not parts & leaving[t], any(last_seg[p] > t for p in parts)

        out.extend(b for u in [seg[0], *sorted(seg[1:], key=rank)] for b in u)
    return out


def bucket_order(
    name: str,
    nparts_lhs: int,
    nparts_rhs: int,
    rng: random.Random,
    buffer: int = 2,
    read_ahead: bool = False,
) -> list[Bucket]:
    """Every bucket exactly once, in the order ``name`` (random/affinity/inside_out/outside_in,
    or ``buffer``: few swaps for ``buffer`` partitions held per side). With ``read_ahead`` (the
    store reads partitions ahead and writes them back in the background) ``buffer`` is the
    staggered order, whose swaps leave room for that I/O within the buffer; without, BETA, with
    slightly fewer swaps but each leaving partition in use up to its swap."""
    if name == "buffer":
        if nparts_lhs == nparts_rhs:
            if read_ahead and buffer >= 3:
                return _staggered_order(nparts_lhs, buffer, rng)
            return _buffer_order(nparts_lhs, buffer, rng)
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
