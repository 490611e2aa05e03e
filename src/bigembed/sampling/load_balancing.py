"""Bagua's load-balancing sampler: equal-cost shares of a dataset for synchronous replicas.

This follows Bagua's ``LoadBalancingDistributedSampler``
(``bagua/torch_api/contrib/load_balancing_data_loader.py`` in BaguaSys/bagua) step by step and
reproduces its output exactly, index for index:

1. every item has a *complexity* (a cost: a sequence length, an edge's candidates x operator
   cost, ...);
2. when shuffling, a ``torch.Generator`` seeded with ``seed + epoch`` draws one noise value per
   item with a single ``torch.randint`` call, in ``[0, int((max - min) * random_level + 1))``,
   and adds it to the item's complexity (so equal-cost items change places between epochs; with
   ``random_level = 0`` the noise is all zeros but is still drawn, as in Bagua, which keeps the
   generator's state and hence the group order the same as Bagua's);
3. the items are sorted by (noisy) complexity, stably (ties keep item order);
4. the sorted list is cut into consecutive groups of ``num_replicas`` items, wrapped around to
   ``num_samples`` groups: ``num_samples = ceil(n / num_replicas)`` (the last group takes its
   missing places from the start of the sorted list, i.e. the cheapest items repeat), or
   ``floor(n / num_replicas)`` with ``drop_last`` (the costliest tail of the sorted list is left
   out);
5. when shuffling, the group order is ``torch.randperm`` from the same generator, right after
   the noise; without shuffling the groups keep their sorted order and no noise is drawn;
6. replica ``i`` takes the ``i``-th item of every group, in group order.

So at every synchronous step all replicas work on items of about the same cost, and nobody waits
for a straggler; ``random_level`` trades some of that balance for randomness of order.

Bagua's complexities are integers; floats are accepted too (the noise is still an integer, its
bound computed from the float range by the same formula, so with float costs in a narrow range
``random_level`` moves items only among those within a few units of each other).

:func:`balanced_split` is the vectorized core (no Python loop over items: it serves millions of
edges) that the sampler calls; :func:`even_split` is the baseline it is measured against
(contiguous equal slices, the same padding rule).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch.utils.data import Sampler


class SizedDataset(Protocol):
    """What the sampler needs of a dataset: its length and its items by index."""

    def __len__(self) -> int: ...

    def __getitem__(self, index: int, /) -> Any: ...


def num_samples_per_replica(n: int, num_replicas: int, *, drop_last: bool = False) -> int:
    """How many items each replica gets: ``ceil(n / num_replicas)``, or ``floor`` with
    ``drop_last`` (Bagua's ``ceil((n - num_replicas) / num_replicas)`` when ``n`` does not
    divide evenly, the same number)."""
    _check_replicas(num_replicas)
    if n < 0:
        raise ValueError(f"the number of items must be >= 0, not {n}")
    return n // num_replicas if drop_last else -(-n // num_replicas)


def balanced_split(
    complexity: torch.Tensor,
    num_replicas: int,
    *,
    seed: int = 0,
    epoch: int = 0,
    shuffle: bool = True,
    random_level: float = 0.0,
    drop_last: bool = False,
) -> list[torch.Tensor]:
    """Each replica's item indices (int64), in the order the sampler yields them.

    ``complexity`` is a 1-D tensor of per-item costs (int64 as in Bagua, or float64). The
    result is exactly what :class:`LoadBalancingDistributedSampler` with the same arguments
    yields on each rank (the module docstring has the steps). Every replica gets
    ``num_samples_per_replica(n, num_replicas, drop_last=drop_last)`` indices; without
    ``drop_last`` and with ``n`` not a multiple of ``num_replicas``, the
    ``num_samples * num_replicas - n`` cheapest items (in sorted order) appear twice. An empty
    ``complexity`` gives every replica an empty share (Bagua's sampler fails on an empty
    dataset).
    """
    _check_replicas(num_replicas)
    _check_random_level(random_level)
    costs = _as_costs(complexity)
    n = int(costs.numel())
    num_samples = num_samples_per_replica(n, num_replicas, drop_last=drop_last)
    if n == 0:
        return [torch.empty(0, dtype=torch.int64) for _ in range(num_replicas)]
    num_groups = max(1, num_samples)  # Bagua cuts at least one group
    if shuffle:
        generator = torch.Generator()
        generator.manual_seed(seed + epoch)
        bound = int((costs.max().item() - costs.min().item()) * random_level + 1)
        noise = torch.randint(bound, (n,), generator=generator)
        order = torch.argsort(costs + noise, stable=True)
        group_order = torch.randperm(num_groups, generator=generator)
    else:
        order = torch.argsort(costs, stable=True)
        group_order = torch.arange(num_groups)
    wrapped = torch.arange(num_groups * num_replicas) % n
    groups = order[wrapped].view(num_groups, num_replicas)
    shares = groups[group_order[:num_samples]].t().contiguous()
    return list(shares.unbind(0))


def even_split(
    n: int,
    num_replicas: int,
    *,
    seed: int = 0,
    epoch: int = 0,
    shuffle: bool = False,
    drop_last: bool = False,
) -> list[torch.Tensor]:
    """Each replica's item indices (int64) under an even split: contiguous equal slices.

    The baseline :func:`balanced_split` is compared with: replica ``i`` takes items
    ``[i * s, (i + 1) * s)`` of the (wrapped) item list, ``s`` =
    ``num_samples_per_replica(n, num_replicas, drop_last=drop_last)``; without ``drop_last`` the
    list wraps around to ``s * num_replicas`` items (the first items repeat), with it the tail
    is left out, as in :func:`balanced_split`. With ``shuffle`` the item list is first permuted
    by ``torch.randperm(n)`` from a generator seeded with ``seed + epoch``.
    """
    num_samples = num_samples_per_replica(n, num_replicas, drop_last=drop_last)
    if n == 0:
        return [torch.empty(0, dtype=torch.int64) for _ in range(num_replicas)]
    if shuffle:
        generator = torch.Generator()
        generator.manual_seed(seed + epoch)
        items = torch.randperm(n, generator=generator)
    else:
        items = torch.arange(n)
    wrapped = items[torch.arange(num_samples * num_replicas) % n]
    return list(wrapped.view(num_replicas, num_samples).unbind(0))


class LoadBalancingDistributedSampler(Sampler[int]):
    """Bagua's ``LoadBalancingDistributedSampler``: this replica's equal-cost share of a dataset.

    The interface and the output are Bagua's (BaguaSys/bagua,
    ``bagua/torch_api/contrib/load_balancing_data_loader.py``); the steps are in the module
    docstring. ``complexity_fn`` maps an item (``dataset[i]``) to its cost, an int as in Bagua
    or a float; it is called once per item here, at construction. ``num_replicas`` and
    ``rank`` default to the world size and rank of the initialized ``torch.distributed``
    default group, as torch's ``DistributedSampler`` does. Call :meth:`set_epoch` before each
    epoch for a new order when shuffling.
    """

    def __init__(
        self,
        dataset: SizedDataset,
        complexity_fn: Callable[[Any], float],
        num_replicas: int | None = None,
        rank: int | None = None,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        random_level: float = 0.0,
    ) -> None:
        if num_replicas is None:
            num_replicas = _default_group_value("num_replicas", dist.get_world_size)
        if rank is None:
            rank = _default_group_value("rank", dist.get_rank)
        _check_replicas(num_replicas)
        if not 0 <= rank < num_replicas:
            raise ValueError(
                f"Invalid rank {rank}, rank should be in the interval [0, {num_replicas - 1}]"
            )
        _check_random_level(random_level)
        self.dataset = dataset
        self.num_replicas = num_replicas
        self.rank = rank
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        self.random_level = random_level
        self.epoch = 0
        self.complexity = _complexities([complexity_fn(dataset[i]) for i in range(len(dataset))])
        self.num_samples = num_samples_per_replica(
            len(self.complexity), num_replicas, drop_last=drop_last
        )
        self.total_size = self.num_samples * num_replicas

    def __iter__(self) -> Iterator[int]:
        share = balanced_split(
            self.complexity,
            self.num_replicas,
            seed=self.seed,
            epoch=self.epoch,
            shuffle=self.shuffle,
            random_level=self.random_level,
            drop_last=self.drop_last,
        )[self.rank]
        return iter(share.tolist())

    def __len__(self) -> int:
        return self.num_samples

    def set_epoch(self, epoch: int) -> None:
        """Use ``epoch`` for the next iteration: with ``shuffle``, a new noise and group order
        (the same on every replica for the same seed and epoch)."""
        self.epoch = epoch


def _complexities(values: list[Any]) -> torch.Tensor:
    """``complexity_fn``'s results as one tensor: int64 when all are integers (Python, NumPy
    or 0-d tensors), float64 otherwise."""
    numbers = [v.item() if hasattr(v, "item") else v for v in values]
    if all(isinstance(v, int) for v in numbers):
        return torch.tensor(numbers, dtype=torch.int64)
    return torch.tensor([float(v) for v in numbers], dtype=torch.float64)


def _as_costs(complexity: torch.Tensor) -> torch.Tensor:
    if complexity.dim() != 1:
        raise ValueError(f"complexity must be a 1-D tensor, not of shape {tuple(complexity.shape)}")
    if complexity.dtype == torch.bool or complexity.is_complex():
        raise ValueError(f"complexity must be integer or floating point, not {complexity.dtype}")
    if complexity.is_floating_point():
        costs = complexity.to(torch.float64)
        if not bool(torch.isfinite(costs).all()):
            raise ValueError("complexity must be finite (no NaN or infinity)")
        return costs
    return complexity.to(torch.int64)


def _check_replicas(num_replicas: int) -> None:
    if num_replicas < 1:
        raise ValueError(f"num_replicas must be >= 1, not {num_replicas}")


def _check_random_level(random_level: float) -> None:
    if not 0.0 <= random_level <= 1.0:
        raise ValueError(f"Invalid random level {random_level}, should be in the range [0.0, 1.0]")


def _default_group_value(name: str, read: Callable[[], int]) -> int:
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError(
            f"{name} was not given and torch.distributed is not initialized: "
            "pass it or call torch.distributed.init_process_group first"
        )
    return read()
