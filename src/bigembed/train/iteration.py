"""The order of training steps: epochs -> edge sets -> edge chunks, and stable seeds."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass


def mix_seed(*parts: int) -> int:
    """A stable 63-bit seed from integers (Python's hash() of tuples is not stable across runs)."""
    h = 0xCBF29CE484222325
    for p in parts:
        h = ((h ^ (p & 0xFFFFFFFFFFFF)) * 0x100000001B3) & 0x7FFFFFFFFFFFFFFF
    return h


@dataclass(frozen=True)
class Iteration:
    """One checkpointed step: (epoch, edge set, edge chunk)."""

    index: int  # 0-based; the checkpoint version after it is index + 1
    epoch: int
    edge_path_idx: int
    chunk: int

    @property
    def version(self) -> int:
        """The checkpoint version this step produces."""
        return self.index + 1


def iterations(
    num_epochs: int, num_paths: int, num_chunks: int, start: int = 0
) -> Iterator[Iteration]:
    """The steps from ``start`` on: all chunks of edge set 0, then of set 1, ..., per epoch."""
    total = num_epochs * num_paths * num_chunks
    for index in range(start, total):
        epoch, rest = divmod(index, num_paths * num_chunks)
        path_idx, chunk = divmod(rest, num_chunks)
        yield Iteration(index, epoch, path_idx, chunk)
