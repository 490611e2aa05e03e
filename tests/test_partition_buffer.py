"""The partition buffer: a memory budget's worth of partitions, read ahead and written back in
the background, in a buffer-aware bucket order.

* Training with a buffer, background write-back and read-ahead (and a slow writer, so reads
  and writes really overlap) is bit-identical to a store that never evicts.
* From the store's event log: a partition is never read while its write-back is queued or in
  progress, and no more tables than the capacity are ever alive.
* The ``buffer`` order trains every bucket once, and the partitions a pass loads fall with the
  buffer as BETA claims (about ``p^2 / (2 (c - 1))``). With read-ahead it is staggered: the
  partition leaving at each swap is trained first in the group before it, and the store
  writes it back and reads the next one while the rest of the group trains; buckets moved
  between its swap segments leave nearly every swap some buckets of slack, at the same loads.
* ``memory_budget`` decides the capacity, names itself when it is too small, and parses units.
"""

from __future__ import annotations

import random
import sys
import threading
import time
import weakref
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

import pytest
import torch

from bigembed.checkpoints.store import CheckpointStore
from bigembed.config import parse_config_dict
from bigembed.errors import BigembedError
from bigembed.kernels.step import Table
from bigembed.partition_keys import PartitionKey
from bigembed.train.memory import partition_io
from bigembed.train.memory.bucket_order import bucket_order
from bigembed.train.memory.budget import plan_memory
from bigembed.train.memory.partitions import PartitionStore, init_embeddings
from bigembed.train.single_machine import Trainer
from support.graphs import budget_for, graph_config, write_graph
from support.partition_stores import SlowWriterStore, run_order, small_store, swapping_store
from support.tree_memory import train_measured

NPARTS = 6


class InMemoryStore(PartitionStore):
    """The reference: a partition, once loaded, never leaves memory."""

    def evict(self, keep: Iterable[PartitionKey] = ()) -> list[PartitionKey]:
        return []

    def _make_room(self, protect: set[PartitionKey]) -> bool:
        return True


def _final(cfg) -> dict[str, torch.Tensor]:
    store = CheckpointStore(cfg.checkpoint_path)
    version = store.committed_version()
    meta = store.read_metadata(version)
    out: dict[str, torch.Tensor] = {}
    for p in range(NPARTS):
        count = meta.entity_counts[("node", p)]
        emb, state = torch.empty(count, cfg.dimension), torch.empty(count)
        store.load_partition("node", p, version, emb, state)
        out[f"emb{p}"], out[f"state{p}"] = emb, state
    payload = store.load_model(version)
    out.update({f"model/{k}": v for k, v in payload["model"].items()})
    return out


def _never_read_while_writing(events: list[tuple[str, PartitionKey]]) -> None:
    writing: set[PartitionKey] = set()
    for i, (kind, key) in enumerate(events):
        if kind == "write_queued":
            writing.add(key)
        elif kind == "write_end":
            writing.discard(key)
        elif kind == "load_start":
            assert key not in writing, f"event {i}: {key} read before its write-back completed"


@pytest.mark.parametrize("capacity", [2, 3])
def test_buffered_background_swapping_is_bit_identical(tmp_path: Path, capacity: int) -> None:
    write_graph(tmp_path, num_entities=600, num_edges=3000, num_partitions=NPARTS, seed=3)
    common = {
        "num_partitions": NPARTS,
        "num_epochs": 2,
        "bucket_order": "buffer",
        "seed": 5,
        "workers": 1,
    }
    cfg = graph_config(tmp_path, checkpoint_path=str(tmp_path / "buf"), **common)
    ref_cfg = graph_config(tmp_path, checkpoint_path=str(tmp_path / "ref"), **common)
    trainer = Trainer(cfg, progress=False, partitions_type=SlowWriterStore, capacity=capacity)
    trainer.train()
    store = SlowWriterStore.last
    Trainer(ref_cfg, progress=False, partitions_type=InMemoryStore, capacity=capacity).train()

    assert store.events is not None
    _never_read_while_writing(store.events)
    assert store.peak_tables <= capacity, "more tables alive than the capacity"
    kinds = [k for k, _ in store.events]
    assert kinds.count("write_queued") > 0 and kinds.count("load_start") > NPARTS, "it swapped"
    if capacity > 2:  # a spare slot: partitions were read while the previous bucket trained
        assert store.reads_ahead > 0
    got, want = _final(cfg), _final(ref_cfg)
    changed = [k for k in want if not torch.equal(got[k], want[k])]
    assert not changed, f"buffered swapping changed {changed}"


def test_store_never_reads_a_partition_before_its_write_back(tmp_path: Path) -> None:
    """Straight on the store, a plan that evicts partitions and needs them again soon."""
    order = bucket_order("random", 8, 8, random.Random(2))
    store = swapping_store(tmp_path, 3, background=True)
    run_order(store, order)
    assert store.events is not None
    _never_read_while_writing(store.events)
    assert store.peak_tables <= 3
    # every bucket added 1 to both its partitions' rows (once for a diagonal bucket)
    for p in range(8):
        uses = sum((i == p) + (j == p) - (i == j == p) for i, j in order)
        table = store.read(("node", p))
        fresh = swapping_store(tmp_path / "fresh", 3, background=False).read(("node", p))
        assert torch.allclose(table.emb, fresh.emb + uses), p


def test_a_partition_given_back_is_read_again_only_after_its_write_back(tmp_path: Path) -> None:
    """A managed store with room to spare (no read waits for write-backs to free memory):
    a partition given back and needed again at once is still read only after its own
    write-back completed, and the value read carries the update made before."""
    store = small_store(tmp_path / "ck", 4, 20, capacity=4, managed=True, background=True)
    assert store.events is not None
    a, b, c = ("node", 0), ("node", 1), ("node", 2)
    for table in store.ensure({a, b}).values():
        table.emb.add_(1.0)
    store.write_back([a], lambda keys: None)
    tables = store.ensure({a, c})
    store.drain()
    _never_read_while_writing(store.events)
    assert ("write_end", a) in store.events and store.events.count(("load_start", a)) == 2
    fresh = small_store(tmp_path / "fresh", 4, 20, PartitionStore).read(a)
    assert torch.allclose(tables[a].emb, fresh.emb + 1.0)


def test_the_store_evicts_the_leaving_partition_early_within_its_capacity(
    tmp_path: Path,
) -> None:
    """With the staggered order planned, the store writes the leaving partition back and reads
    the next one while the buckets before the swap still train (read-ahead past the next
    bucket), yet swaps exactly what evicting at the swap would (the same loads as the
    simulation), never holds more than its capacity, never reads a partition before its
    write-back, and every bucket's update reaches the checkpoint."""
    nparts, capacity = 12, 4
    order = bucket_order("buffer", nparts, nparts, random.Random(5), capacity, read_ahead=True)
    store = small_store(tmp_path / "ck", nparts, 30, capacity=capacity, background=True)
    assert store.events is not None
    started: list[int] = []  # where each bucket starts in the event log
    keys = [{("node", i), ("node", j)} for i, j in order]
    store.plan(keys)
    for k in keys:
        started.append(len(store.events))
        for t in store.ensure(k).values():
            t.emb.add_(1.0)
    store.flush()
    _never_read_while_writing(store.events)
    assert store.peak_tables <= capacity
    assert store.loads == _belady_loads(order, capacity), "early evictions changed the swaps"
    swaps = _evictions(order, capacity)
    queued = [i for i, (kind, _) in enumerate(store.events) if kind == "write_queued"]
    assert len(queued) == len(swaps)
    # evicted before the bucket preceding its swap started
    early = sum(q < started[i - 1] for q, (i, _) in zip(queued, swaps, strict=True))
    assert early >= 0.7 * len(swaps), (early, len(swaps))
    for p in range(nparts):
        uses = sum((i == p) + (j == p) - (i == j == p) for i, j in order)
        initial = init_embeddings(30, 4, 0.1, 1, "node", p)
        assert torch.allclose(store.read(("node", p)).emb, initial + uses), p


def test_a_bucket_off_the_plan_takes_the_room_of_partitions_read_ahead(tmp_path: Path) -> None:
    """Partitions read ahead for later planned buckets hold slots of the capacity; a bucket
    that needs them all (off the plan) makes them resident and evicts them rather than
    failing for want of room."""
    store = swapping_store(tmp_path, 2, background=True)
    store.plan([{("node", 0)}, {("node", 1)}, {("node", 2)}])
    store.ensure({("node", 0)})
    store.drain()
    assert set(store._reading) == {("node", 1)}, "partition 1 is read ahead"
    tables = store.ensure({("node", 3), ("node", 4)})
    assert set(tables) == {("node", 3), ("node", 4)}
    assert store.peak_tables <= 2
    store.flush()


def test_a_written_back_table_is_freed_before_its_write_back_completes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With read-ahead, a read waiting for a write-back allocates its table the moment that
    write-back is declared done; the evicted table must already be freed then, or both are
    alive at once, one table over the capacity (a 2.5 GB cgroup run was OOM-killed so). Each
    job's completion checks that the tables its callable held are gone, and every allocation
    that fewer than ``capacity`` tables are alive."""
    tables: list[weakref.ref[torch.Tensor]] = []
    late: list[str] = []

    class ProbeEvent(threading.Event):
        def __init__(self, held: list[weakref.ref[torch.Tensor]]) -> None:
            super().__init__()
            self.held = held

        def set(self) -> None:
            if any(r() is not None for r in self.held):
                late.append("a job was declared done while its table was still alive")
            super().set()

    class ProbeJob(partition_io.Job):
        def __init__(self, fn, after=()) -> None:  # type: ignore[no-untyped-def]
            super().__init__(fn, after)
            cells = [c.cell_contents for c in getattr(fn, "__closure__", None) or ()]
            held = [weakref.ref(c.emb) for c in cells if isinstance(c, Table)]
            self._done = ProbeEvent(held)

    monkeypatch.setattr(partition_io, "Job", ProbeJob)
    capacity = 3
    store = swapping_store(tmp_path, capacity, background=True)
    allocate = store._allocate

    def counted(key: PartitionKey) -> Table:
        alive = sum(r() is not None for r in tables)
        if alive + 1 > capacity:
            late.append(f"{alive} tables alive when {key} was allocated")
        table = allocate(key)
        tables.append(weakref.ref(table.emb))
        return table

    store._allocate = counted  # type: ignore[method-assign]
    order = bucket_order("buffer", 8, 8, random.Random(3), capacity, read_ahead=True)
    keys = [{("node", i), ("node", j)} for i, j in order]
    store.plan(keys)
    for k in keys:
        resident = store.ensure(k)
        for t in resident.values():
            t.emb.add_(1.0)
        del resident, t
    store.flush()
    assert store.writes > 8, "the order swapped partitions (write-backs happened)"
    assert len(tables) > 8 and store.reads_ahead > 0
    assert not late, late[:3]


@pytest.mark.parametrize("nparts", [8, 16])
def test_buffer_order_trains_every_bucket_once_and_swaps_less(nparts: int) -> None:
    loads = {}
    for c in (2, 3, 4, 8):
        order = bucket_order("buffer", nparts, nparts, random.Random(c), c)
        assert sorted(order) == [(i, j) for i in range(nparts) for j in range(nparts)]
        loads[c] = _belady_loads(order, c)
    two = _belady_loads(bucket_order("inside_out", nparts, nparts, random.Random(0)), 2)
    pairs = nparts * (nparts - 1) // 2
    for c in (3, 4, 8):
        lower = -(-(pairs - c * (c - 1) // 2) // (c - 1)) + c
        assert loads[c] <= 1.25 * lower, (c, loads[c], lower)
    # the claim: a buffer of c cuts the swaps of the two-partition schedule by ~c/2
    assert loads[4] * 2 <= two, (loads, two)
    assert loads[8] < loads[4] < loads[3] < loads[2] <= two, (loads, two)


def _evictions(order: list[tuple[int, int]], capacity: int) -> list[tuple[int, int]]:
    """(bucket position, partition) of each eviction the partition store makes (the partition
    needed furthest ahead goes when a bucket needs room)."""
    resident: set[int] = set()
    out = []
    for i, bucket in enumerate(order):
        for p in sorted(set(bucket) - resident):
            if len(resident) >= capacity:

                def next_use(q: int, i: int = i) -> int:
                    return next((k for k in range(i, len(order)) if q in order[k]), 1 << 30)

                victim = max(sorted(resident - set(bucket)), key=next_use)
                resident.remove(victim)
                out.append((i, victim))
            resident.add(p)
    return out


def _early_evictions(order: list[tuple[int, int]], capacity: int) -> tuple[int, int]:
    """(evictions, those the store can make before the bucket preceding their swap starts:
    the partition leaving is not used by the two buckets before the swap, so its write-back
    and the next read overlap at least one bucket's training)."""
    evictions = _evictions(order, capacity)
    early = sum(p not in order[i - 1] and p not in order[i - 2] for i, p in evictions)
    return len(evictions), early


def _assert_leaving_first(
    group: list[tuple[int, int]], leaving: int, after: list[tuple[int, int]]
) -> None:
    """In the group of buckets before a swap, the leaving partition's buckets come first,
    after the group's opening bucket (and its transpose: the load that opens the group is for
    it). If the group finishes several partitions (none used ``after``), the store may evict
    any of them (a tie it breaks by its own rule): then the buckets using one of those come
    first, the leaving partition's among them."""
    opening = 2 if len(group) > 1 and group[1] == group[0][::-1] != group[0] else 1
    group = group[opening:]
    uses = [k for k, b in enumerate(group) if leaving in b]
    finished = {q for b in group for q in b if not any(q in x for x in after)}
    if leaving in finished:
        lead = [k for k, b in enumerate(group) if finished & set(b)]
        assert lead == list(range(len(lead))) and set(uses) <= set(lead), (leaving, group)
    else:
        assert uses == list(range(len(uses))), (leaving, group)


@pytest.mark.parametrize(("nparts", "c"), [(16, 3), (16, 4), (32, 4), (16, 6), (12, 5)])
def test_staggered_buffer_order_frees_the_leaving_partition_early(nparts: int, c: int) -> None:
    """The ``buffer`` order with read-ahead: every bucket once; in the group of buckets before
    each swap, the leaving partition's come first, so for most swaps it is idle for the bucket
    before the swap and longer (its write-back and the next read overlap training; BETA keeps
    it busy up to the swap); no more loads than BETA planned one slot short (what read-ahead
    needed before) and at most 10% more than BETA with all ``c`` slots; every bucket after the
    first shares a partition with an earlier one."""
    every = [(i, j) for i in range(nparts) for j in range(nparts)]
    for seed in range(3):
        order = bucket_order("buffer", nparts, nparts, random.Random(seed), c, read_ahead=True)
        beta = bucket_order("buffer", nparts, nparts, random.Random(seed), c)
        assert sorted(order) == every
        seen = set(order[0])
        for k, (i, j) in enumerate(order[1:], 1):
            assert i in seen or j in seen, f"bucket {k} {(i, j)} touches no trained partition"
            seen |= {i, j}
        loads = _belady_loads(order, c)
        short = _belady_loads(bucket_order("buffer", nparts, nparts, random.Random(seed), c - 1), c)
        assert loads <= short and loads <= 1.1 * _belady_loads(beta, c), (loads, short)
        swaps = _belady_load_positions(order, c)
        for i, p in _evictions(order, c):
            _assert_leaving_first(order[max(k for k in swaps if k < i) : i], p, order[i:])
        evictions, early = _early_evictions(order, c)
        assert early >= 0.7 * evictions, (early, evictions)
        assert _early_evictions(beta, c)[1] < early, "BETA keeps more partitions busy to the end"


def _slack(order: list[tuple[int, int]], capacity: int) -> list[int]:
    """For each swap, the buckets trained between the leaving partition's last use and the
    swap: the window in which its write-back and the next read overlap training."""
    return [
        i - 1 - max(k for k in range(i) if p in order[k]) for i, p in _evictions(order, capacity)
    ]


@pytest.mark.parametrize(("nparts", "c"), [(16, 4), (32, 4), (16, 5), (32, 5)])
def test_every_swap_of_the_staggered_order_has_slack(
    nparts: int, c: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The staggered order moves buckets between its swap segments so that before nearly
    every swap some buckets use none of the leaving partitions (chain ends and the end of
    the pass included), with the same loads per pass as the order it starts from: swaps with
    no slack are at most 2.5% of all, and the shortfall below 3 buckets of slack (summed over
    the swaps) is at most 3/4 of the unmoved order's."""
    from bigembed.train.memory import bucket_order as orders

    for seed in range(3):
        order = bucket_order("buffer", nparts, nparts, random.Random(seed), c, read_ahead=True)
        with monkeypatch.context() as m:
            m.setattr(orders, "_with_slack", lambda order, slots: order)
            unmoved = bucket_order("buffer", nparts, nparts, random.Random(seed), c, True)
        assert sorted(order) == sorted(unmoved)
        assert _belady_loads(order, c) == _belady_loads(unmoved, c)
        slack, before = _slack(order, c), _slack(unmoved, c)
        assert sum(s == 0 for s in slack) <= 0.025 * len(slack), sorted(slack)[:20]
        short = sum(max(0, 3 - s) for s in slack)
        assert short <= 0.75 * sum(max(0, 3 - s) for s in before), (short, sorted(slack)[:20])


def _belady_loads(order: list[tuple[int, int]], capacity: int) -> int:
    return len(_belady_load_positions(order, capacity, each=True))


def _belady_load_positions(
    order: list[tuple[int, int]], capacity: int, each: bool = False
) -> list[int]:
    """Where the buckets needing a partition load are (``each``: once per partition loaded)."""
    resident: set[int] = set()
    at = []
    for i, bucket in enumerate(order):
        for p in sorted(set(bucket) - resident):
            if len(resident) >= capacity:

                def next_use(q: int, i: int = i) -> int:
                    return next((k for k in range(i, len(order)) if q in order[k]), 1 << 30)

                resident.remove(max(resident - set(bucket), key=next_use))
            resident.add(p)
            if each or not at or at[-1] != i:
                at.append(i)
    return at


def test_the_store_loads_fall_with_the_capacity(tmp_path: Path) -> None:
    """The real store, planned with the buffer order of its capacity: loads per pass fall."""
    loads = {}
    for c in (2, 4, 6):
        order = bucket_order("buffer", 8, 8, random.Random(1), c, read_ahead=True)
        store = swapping_store(tmp_path, c, background=True)
        run_order(store, order)
        loads[c] = store.loads
        assert store.peak_tables <= c
    assert loads[6] < loads[4] < loads[2], loads
    assert loads[4] * 2 <= loads[2], loads


@pytest.mark.parametrize(
    ("capacity", "types", "prefetch", "want"),
    [(7, 2, True, 3), (8, 2, True, 4), (8, 2, False, 4), (5, 1, True, 5), (3, 2, True, 2)],
)
def test_the_order_plans_whole_partition_indices_of_the_capacity(
    capacity: int, types: int, prefetch: bool, want: int
) -> None:
    """With two partitioned entity types a swap moves a partition index (two tables): the
    order plans ``capacity // 2`` indices, with or without read-ahead (the staggered order
    reads into the slot the leaving index frees), so an even capacity is used whole."""
    from types import SimpleNamespace

    names = ["a", "b"][:types]
    cfg = parse_config_dict(
        {
            "entities": {t: {"num_partitions": 4} for t in names},
            "relations": [{"name": "r", "lhs": names[0], "rhs": names[-1]}],
            "entity_path": "e",
            "edge_paths": ["x"],
            "checkpoint_path": "c",
            "dimension": 8,
            "partition_prefetch": prefetch,
        }
    )
    fake = SimpleNamespace(cfg=cfg, memory=SimpleNamespace(capacity=capacity))
    assert Trainer._order_buffer(fake) == want  # type: ignore[arg-type]


def test_memory_budget_sets_the_capacity(tmp_path: Path) -> None:
    table = 100 * 2**20
    plan = plan_memory(2 * 2**30, [table] * 16, 0, 1000, 2, 2)
    assert plan.capacity == (2 * 2**30 - plan.fixed) // table
    assert plan_memory(10**13, [table] * 16, 0, 1000, 2, 2).capacity == 16
    with pytest.raises(BigembedError, match=r"^memory_budget: "):
        plan_memory(800 * 2**20, [table] * 16, 0, 1000, 2, 2)
    write_graph(tmp_path, num_entities=600, num_edges=3000, num_partitions=NPARTS)
    cfg = graph_config(tmp_path, num_partitions=NPARTS, memory_budget="1.5 GiB")
    assert cfg.memory_budget == 1.5 * 2**30
    assert Trainer(cfg, progress=False).memory.capacity == NPARTS


def test_the_memory_plan_line_says_what_is_resident() -> None:
    """The log line of the plan: the partitions held, or (nothing partitioned) that every table
    stays in memory, never "0 partitions of 0 MiB"."""
    table = 100 * 2**20
    assert (
        "16 partitions of 100 MiB resident"
        in plan_memory(10**13, [table] * 16, 0, 1000, 2, 2).describe()
    )
    unpartitioned = plan_memory(None, [], 50 * 2**20, 1000, 2, 0).describe()
    assert "no partitioned tables (every table stays in memory)" in unpartitioned
    assert "0 partitions" not in unpartitioned


@pytest.mark.parametrize("value", ["lots", "2.5XB", True, -1])
def test_bad_memory_budget_names_the_key(value: object) -> None:
    base = {
        "entities": {"node": {"num_partitions": 1}},
        "relations": [{"name": "r", "lhs": "node", "rhs": "node"}],
        "entity_path": "e",
        "edge_paths": ["x"],
        "checkpoint_path": "c",
    }
    with pytest.raises(BigembedError, match="memory_budget"):
        parse_config_dict({**base, "memory_budget": value})


@pytest.mark.integration
def test_memory_stays_within_the_budget_with_read_ahead(tmp_path: Path) -> None:
    """6 partitions of 24 MB, 2 Hogwild workers, a budget that holds 4 of them: the tree's
    shared tables peak at 3-4 partitions (the buffer is used, read-ahead included, and never
    exceeded), and the whole tree's proportional set size stays within memory_budget."""
    entities, dim = 360_000, 99  # 60k rows of (99 + 1) floats: 24 MB per partition
    write_graph(tmp_path, num_entities=entities, num_edges=6000, num_partitions=NPARTS)
    part = entities // NPARTS * (dim + 1) * 4
    budget = budget_for(4, part, workers=2, edges=6000)
    cfg = graph_config(
        tmp_path,
        num_partitions=NPARTS,
        dimension=dim,
        num_epochs=1,
        workers=2,
        batch_size=200,
        bucket_order="buffer",
        memory_budget=budget,
    )
    err, mem = train_measured(cfg, tmp_path)
    assert "4 partitions" in err, err
    mib = mem.summary(part)
    assert mem.peak_shmem >= 2.9 * part, f"the buffer holds more than one bucket: {mib}"
    assert mem.peak_shmem <= 4.3 * part, f"more partitions alive than the budget holds: {mib}"
    assert mem.peak_pss <= budget, f"the process tree used more than memory_budget: {mib}"


class _HangingRemote:
    """A partition server that never finishes a write-back (until ``gate`` is set)."""

    def __init__(self) -> None:
        import threading

        self.gate = threading.Event()

    def fetch(self, key: PartitionKey, out_emb: torch.Tensor, out_state: torch.Tensor) -> bool:
        return False

    def store(self, key: PartitionKey, emb: torch.Tensor, state: torch.Tensor) -> None:
        self.gate.wait(30)


def test_a_hanging_background_write_back_stops_within_the_deadline(tmp_path: Path) -> None:
    """Distributed store (managed, background): the training thread waits for a background
    transfer at most ``deadline`` seconds, then a PeerError names it; the release never runs."""
    from bigembed.errors import PeerError

    remote = _HangingRemote()
    store = small_store(
        tmp_path / "ck",
        4,
        20,
        PartitionStore,
        remote=remote,
        managed=True,
        background=True,
        deadline=0.5,
    )
    released: list[list[PartitionKey]] = []
    store.ensure({("node", 0), ("node", 1)})
    store.write_back([("node", 0)], released.append)
    store.check()  # nothing failed yet: the write-back is only slow
    started = time.monotonic()
    with pytest.raises(PeerError, match=r"did not finish within 0\.5s"):
        store.drain()
    assert time.monotonic() - started < 5
    assert released == [], "released before its write-back completed"
    remote.gate.set()
    store.close()  # the queued jobs run first: the write-back, then the release
    assert released == [[("node", 0)]]


# ---------------------------------------------------------------------- distributed overlap
#: Each rank of the overlap test: every write-back takes SLOW_WRITE s longer (so a release
#: sent before its write-back completes is logged before it), then the ordinary CLI.
SLOW_WRITE = 0.08
_SLOW_RANK = (
    "import sys, time\n"
    "from bigembed.train.memory.partitions import PartitionStore, init_embeddings\n"
    "_save = PartitionStore._save\n"
    "def slow(self, key, table):\n"
    f"    time.sleep({SLOW_WRITE})\n"
    "    _save(self, key, table)\n"
    "PartitionStore._save = slow\n"
    "from bigembed.cli import main\n"
    "sys.exit(main(sys.argv[1:]))\n"
)


def _holding(lock_events: list[dict]) -> dict[tuple[int, tuple[str, int]], list[list[float]]]:
    """(trainer, partition) -> [granted at, released at] intervals, from the lock server's log
    (the last run only). A grant of a partition the trainer already holds extends nothing."""
    last = max(i for i, e in enumerate(lock_events) if e["event"] == "run_start")
    spans: dict[tuple[int, tuple[str, int]], list[list[float]]] = {}
    for e in lock_events[last:]:
        for t, p in e.get("partitions", []):
            span = spans.setdefault((e["trainer"], (t, p)), [])
            if e["event"] == "acquire" and (not span or span[-1][1] >= 0):
                span.append([e["time"], -1.0])  # open
            elif e["event"] == "release":
                assert span and span[-1][1] < 0, f"release of a partition not held: {e}"
                span[-1][1] = e["time"]
    return spans


def check_transfers(ckpt: Path, ranks: int) -> list[dict]:
    """Every partition transfer of every trainer happened while the lock server counted the
    partition as that trainer's: reads after the grant, write-backs complete before the
    release. With the no-two-holders rule (``check_events``) this is the invariant: nobody
    reads a partition before its previous holder's write-back is complete."""
    from support.ranks import read_events

    spans = _holding(read_events(ckpt / "lock_events.jsonl"))
    locked = {key for _, key in spans}
    transfers = []
    for rank in range(ranks):
        for e in read_events(ckpt / f"partition_transfers_rank{rank}.jsonl"):
            key = (e["partition"][0], e["partition"][1])
            if key not in locked:
                continue  # an unpartitioned (pinned) table: never locked, never swapped
            inside = any(
                start <= e["time"] and (end < 0 or e["time"] <= end)
                for start, end in spans.get((e["trainer"], key), [])
            )
            what = "read" if e["event"].startswith("load") else "written back"
            assert inside, f"rank {rank} {what} {key} while not holding it: {e}"
            transfers.append(e)
    return transfers


@pytest.mark.integration
@pytest.mark.parametrize("prefetch", [True, False])
def test_distributed_overlap_never_reads_before_write_back(tmp_path: Path, prefetch: bool) -> None:
    """Two real trainers on 127.0.0.1, swapping through the shared checkpoint directory with
    slow write-backs. With ``partition_prefetch`` the next bucket is granted early and read
    while the current one trains, the previous one's partitions written back in the
    background; without, all of it happens between buckets. Either way, from the logs of what
    actually happened, no partition is read before its write-back is complete. (Without, it
    runs two epochs: the lock server's costs are analytic in the first pass, then seconds
    calibrated from the first step's buckets.)"""
    from support.ranks import check_events, free_port, make_graph, read_events, start_rank

    epochs = 1 if prefetch else 2
    cfg_path, cfg = make_graph(
        tmp_path, num_epochs=epochs, num_partition_servers=0, partition_prefetch=prefetch
    )
    port = free_port()
    slow = [sys.executable, "-c", _SLOW_RANK]
    procs = [start_rank(cfg_path, rank, port, cli=slow) for rank in range(2)]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    ckpt = Path(cfg.checkpoint_path)
    lock = read_events(ckpt / "lock_events.jsonl")
    granted = check_events(lock)
    assert all(sum(granted[it].values()) == 16 for it in range(epochs)), "each bucket once"
    transfers = check_transfers(ckpt, 2)
    kinds = Counter(e["event"] for e in transfers)
    assert kinds["write_end"] > 0 and kinds["load_start"] > 0, kinds
    # Overlap really happened: a bucket granted ahead had a partition read before the bucket
    # its trainer was training then was reported done.
    done_at = {
        (e["trainer"], e["iteration"], tuple(e["bucket"])): e["time"]
        for e in lock
        if e["event"] == "bucket_done"
    }
    ahead = [e for e in lock if e["event"] == "acquire" and e.get("ahead")]
    if not prefetch:
        assert not ahead, "look-ahead without partition_prefetch"
        grants = [e for e in lock if e["event"] == "acquire" and e["edges"] > 0]
        # analytic: thousands of multiply-adds per edge; calibrated: microseconds per edge
        assert all(e["cost"] > e["edges"] for e in grants if e["iteration"] == 0)
        assert all(e["cost"] < 0.01 * e["edges"] for e in grants if e["iteration"] == 1)
        assert any("cost model calibrated" in out for out in outs)
        return
    assert ahead, "no bucket was granted ahead"
    early = 0
    for g in ahead:
        training = [  # the trainer's grants before this one, not yet done at this grant
            a
            for a in lock
            if a["event"] == "acquire"
            and a["trainer"] == g["trainer"]
            and a["time"] < g["time"]
            and done_at.get((a["trainer"], a["iteration"], tuple(a["bucket"])), 0) > g["time"]
        ]
        if not training:
            continue
        ends = done_at[(g["trainer"], g["iteration"], tuple(training[-1]["bucket"]))]
        new = {tuple(k) for k in g["partitions"]} - {
            tuple(k) for a in training for k in a["partitions"]
        }
        early += any(
            e["event"] == "load_start"
            and e["trainer"] == g["trainer"]
            and tuple(e["partition"]) in new
            and g["time"] <= e["time"] < ends
            for e in transfers
        )
    assert early > 0, "no partition was read while the previous bucket trained"
