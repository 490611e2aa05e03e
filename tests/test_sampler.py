"""Bagua's load-balancing sampler (``bigembed.sampling``): exact assignments, coverage, balance.

The expected assignments are written out from the algorithm's steps (the worked example of
``shared/reference/peers.md`` section 5, which reproduces Bagua's own output, and a small
example derived by hand below); the other tests check the invariants over many sizes: every
item once per epoch (or the documented repeats/drops), equal counts, balance within one item's
cost, a new order per epoch that is the same for the same seed and epoch.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from bigembed.sampling import (
    LoadBalancingDistributedSampler,
    balanced_split,
    even_split,
    num_samples_per_replica,
)

WORKED = [7, 8, 11, 4, 5, 2, 9, 10, 0, 6, 1, 3]


def _shares(split: list[torch.Tensor]) -> list[list[int]]:
    return [s.tolist() for s in split]


def _sampler(costs: list[int], rank: int, **kwargs: Any) -> list[int]:
    return list(LoadBalancingDistributedSampler(costs, lambda c: c, rank=rank, **kwargs))


def test_the_worked_example_of_bagua() -> None:
    # noise bound int((11 - 0) * 0.5 + 1) = 6; torch.randint(6, (12,)) from seed 0 gives
    # [2, 3, 5, 0, 1, 3, 1, 1, 1, 3, 5, 2]; noisy costs [9, 11, 16, 4, 6, 5, 10, 11, 1, 9, 6, 5]
    # sorted stably: 8, 3, 5, 11, 4, 10, 0, 9, 6, 1, 7, 2; groups [8, 3] [5, 11] [4, 10] [0, 9]
    # [6, 1] [7, 2]; torch.randperm(6) next: [0, 5, 4, 1, 2, 3].
    g = torch.Generator()
    g.manual_seed(0)
    assert torch.randint(6, (12,), generator=g).tolist() == [2, 3, 5, 0, 1, 3, 1, 1, 1, 3, 5, 2]
    assert torch.randperm(6, generator=g).tolist() == [0, 5, 4, 1, 2, 3]
    expected = [[8, 7, 6, 5, 4, 0], [3, 2, 1, 11, 10, 9]]
    split = balanced_split(torch.tensor(WORKED), 2, seed=0, epoch=0, random_level=0.5)
    assert _shares(split) == expected
    sampled = [
        _sampler(WORKED, r, num_replicas=2, shuffle=True, seed=0, random_level=0.5)
        for r in range(2)
    ]
    assert sampled == expected


def test_a_hand_worked_example_without_shuffle_with_padding_and_drop_last() -> None:
    costs = [4, 1, 3, 1, 0]
    # Sorted stably by cost: item 4 (0), item 1 (1), item 3 (1: the tie keeps item order), item
    # 2 (3), item 0 (4) -> [4, 1, 3, 2, 0]. ceil(5 / 2) = 3 groups of 2, the list wrapped around
    # to 6 places: [4, 1] [3, 2] [0, 4] (the cheapest item, 4, fills the missing place). No
    # shuffle: no noise, groups in sorted order. Replica 0 takes the first of every group,
    # replica 1 the second.
    assert _shares(balanced_split(torch.tensor(costs), 2, shuffle=False)) == [[4, 3, 0], [1, 2, 4]]
    assert [_sampler(costs, r, num_replicas=2, shuffle=False) for r in range(2)] == [
        [4, 3, 0],
        [1, 2, 4],
    ]
    # drop_last: floor(5 / 2) = 2 groups [4, 1] [3, 2]; the costliest item (0) is left out.
    assert _shares(balanced_split(torch.tensor(costs), 2, shuffle=False, drop_last=True)) == [
        [4, 3],
        [1, 2],
    ]


def _check_assignment(
    costs: torch.Tensor, num_replicas: int, split: list[torch.Tensor], *, drop_last: bool
) -> None:
    """Every replica the same count; without padding every item exactly once; padding repeats
    the cheapest items of the sorted order, drop_last leaves out the costliest (for unshuffled
    or noise-free splits, where the sorted order is the plain stable sort)."""
    n = len(costs)
    num_samples = num_samples_per_replica(n, num_replicas, drop_last=drop_last)
    assert [len(s) for s in split] == [num_samples] * num_replicas
    total = num_samples * num_replicas
    counts = torch.bincount(torch.cat(split), minlength=n)
    order = torch.argsort(costs, stable=True)
    expected = torch.zeros(n, dtype=torch.int64)
    wrapped = order[torch.arange(total) % n] if n else order
    expected.index_add_(0, wrapped, torch.ones(total, dtype=torch.int64))
    assert counts.tolist() == expected.tolist()
    if total == n:
        assert counts.tolist() == [1] * n


@pytest.mark.parametrize("n,num_replicas", [(12, 3), (12, 5), (7, 2), (3, 4), (1, 3), (40, 1)])
@pytest.mark.parametrize("drop_last", [False, True])
def test_every_item_once_or_as_the_padding_rule_says(
    n: int, num_replicas: int, drop_last: bool
) -> None:
    costs = torch.randint(0, 6, (n,), generator=torch.Generator().manual_seed(n))
    for shuffle in (False, True):
        split = balanced_split(
            costs, num_replicas, shuffle=shuffle, seed=3, epoch=1, drop_last=drop_last
        )
        _check_assignment(costs, num_replicas, split, drop_last=drop_last)


def test_with_random_level_zero_replica_totals_are_within_one_items_cost() -> None:
    rng = random.Random(7)
    for _ in range(200):
        n, num_replicas = rng.randint(1, 60), rng.randint(1, 6)
        costs = torch.tensor([rng.choice([0, 1, 2, 50, 400]) for _ in range(n)])
        for drop_last in (False, True):
            split = balanced_split(costs, num_replicas, seed=rng.randint(0, 9), drop_last=drop_last)
            totals = [int(costs[s].sum()) for s in split]
            assert max(totals) - min(totals) <= int(costs.max() - costs.min())


def test_an_even_split_of_sorted_costs_is_not_balanced() -> None:
    # the contrast that makes the balance test meaningful: the baseline fails it
    costs = torch.arange(20) ** 2
    totals = [int(costs[s].sum()) for s in even_split(20, 2)]
    assert max(totals) - min(totals) > int(costs.max())
    assert _shares(even_split(5, 2)) == [[0, 1, 2], [3, 4, 0]]
    assert _shares(even_split(5, 2, drop_last=True)) == [[0, 1], [2, 3]]
    shuffled = even_split(9, 3, shuffle=True, seed=1)
    assert sorted(torch.cat(shuffled).tolist()) == list(range(9))
    assert _shares(shuffled) == _shares(even_split(9, 3, shuffle=True, seed=1))
    assert _shares(shuffled) != _shares(even_split(9, 3))


def test_each_epoch_a_new_order_the_same_for_the_same_seed_and_epoch() -> None:
    costs = [i % 7 for i in range(40)]
    sampler = LoadBalancingDistributedSampler(
        costs, lambda c: c, num_replicas=2, rank=1, seed=5, random_level=0.3
    )
    orders = []
    for epoch in range(3):
        sampler.set_epoch(epoch)
        orders.append(list(sampler))
        assert list(sampler) == orders[-1]
    assert len({tuple(o) for o in orders}) == 3
    again = LoadBalancingDistributedSampler(
        costs, lambda c: c, num_replicas=2, rank=1, seed=5, random_level=0.3
    )
    again.set_epoch(2)
    assert list(again) == orders[2]
    other_seed = balanced_split(torch.tensor(costs), 2, seed=6, epoch=2, random_level=0.3)
    assert other_seed[1].tolist() != orders[2]
    unshuffled = LoadBalancingDistributedSampler(
        costs, lambda c: c, num_replicas=2, rank=1, shuffle=False
    )
    first = list(unshuffled)
    unshuffled.set_epoch(4)
    assert list(unshuffled) == first


def test_len_and_the_checks_of_the_arguments() -> None:
    for n, num_replicas, drop_last, expected in [
        (10, 3, False, 4),
        (10, 3, True, 3),
        (9, 3, True, 3),
    ]:
        sampler = LoadBalancingDistributedSampler(
            list(range(n)), lambda c: c, num_replicas=num_replicas, rank=0, drop_last=drop_last
        )
        assert len(sampler) == expected == len(list(sampler))
    with pytest.raises(ValueError, match="Invalid rank"):
        LoadBalancingDistributedSampler([1, 2], lambda c: c, num_replicas=2, rank=2)
    with pytest.raises(ValueError, match="random level"):
        LoadBalancingDistributedSampler(
            [1, 2], lambda c: c, num_replicas=2, rank=0, random_level=1.5
        )
    with pytest.raises(RuntimeError, match=r"torch\.distributed is not initialized"):
        LoadBalancingDistributedSampler([1, 2], lambda c: c)
    with pytest.raises(ValueError, match="finite"):
        balanced_split(torch.tensor([1.0, float("nan")]), 2)
    assert _shares(balanced_split(torch.empty(0, dtype=torch.int64), 3)) == [[], [], []]


def test_the_sampler_drives_a_dataloader() -> None:
    n = 23
    features = torch.arange(n, dtype=torch.float32).unsqueeze(1)
    lengths = torch.tensor([(i * 7) % 11 for i in range(n)])
    dataset = TensorDataset(features, lengths)
    seen = []
    for rank in range(3):
        # Bagua's documented use: the complexity is a field of the item (a 0-d tensor here)
        sampler = LoadBalancingDistributedSampler(
            dataset, lambda item: item[1], num_replicas=3, rank=rank, seed=2, random_level=0.5
        )
        sampler.set_epoch(1)
        loader = DataLoader(dataset, batch_size=4, sampler=sampler)
        got = torch.cat([batch[0].squeeze(1) for batch in loader]).long().tolist()
        assert got == list(sampler)
        seen.append(got)
    counts = torch.bincount(torch.cat([torch.tensor(s) for s in seen]), minlength=n)
    assert bool((counts >= 1).all()) and int(counts.sum()) == 24  # ceil(23 / 3) * 3: one repeat


def test_random_sizes_match_the_sampler_and_keep_the_invariants() -> None:
    rng = random.Random(11)
    for _ in range(150):
        n, num_replicas = rng.randint(1, 50), rng.randint(1, 8)
        floats = rng.random() < 0.3
        values = [rng.uniform(0, 9) if floats else rng.randint(0, 12) for _ in range(n)]
        costs = torch.tensor(values, dtype=torch.float64 if floats else torch.int64)
        kwargs: dict[str, Any] = {
            "seed": rng.randint(0, 50),
            "shuffle": rng.random() < 0.7,
            "drop_last": rng.random() < 0.4,
            "random_level": rng.choice([0.0, 0.2, 1.0]),
        }
        epoch = rng.randint(0, 4)
        split = balanced_split(costs, num_replicas, epoch=epoch, **kwargs)
        num_samples = num_samples_per_replica(n, num_replicas, drop_last=bool(kwargs["drop_last"]))
        assert [len(s) for s in split] == [num_samples] * num_replicas
        counts = torch.bincount(torch.cat(split), minlength=n)
        if kwargs["drop_last"]:
            assert int(counts.max()) <= 1
        else:
            assert bool((counts >= 1).all())
        assert int(counts.sum()) == num_samples * num_replicas
        if not kwargs["shuffle"] or kwargs["random_level"] == 0.0:
            _check_assignment(costs, num_replicas, split, drop_last=bool(kwargs["drop_last"]))
        for rank in range(num_replicas):
            sampler = LoadBalancingDistributedSampler(
                values,
                lambda c: c,
                num_replicas=num_replicas,
                rank=rank,
                **kwargs,
            )
            sampler.set_epoch(epoch)
            assert list(sampler) == split[rank].tolist()


def test_a_million_items_split_without_a_python_loop() -> None:
    costs = torch.randint(0, 1000, (1_000_000,), generator=torch.Generator().manual_seed(0))
    split = balanced_split(costs, 4, random_level=0.1)
    assert torch.equal(torch.sort(torch.cat(split)).values, torch.arange(1_000_000))
