"""Entity embedding tables of a trained model, one partition at a time, cached within a budget.

Evaluation, export and the query API read embeddings through :class:`EntityTables`: each
partition is read once from the checkpoint (:meth:`TrainedModel.mapped_embeddings
<bigembed.checkpoints.reading.TrainedModel.mapped_embeddings>` checks its shape), ``max_norm`` is
applied as the model applies it at lookup time, and the global embedding is *not* added
(:meth:`EntityTables.adjusted` does that).
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import torch
from torch import Tensor

from bigembed.checkpoints.reading import TrainedModel
from bigembed.partition_keys import PartitionKey

DEFAULT_CACHE_BYTES = 2 << 30


class EntityTables:
    """Entity embeddings of a trained model, one partition at a time, cached within a budget.

    ``table(type, part)`` is a float32 ``(count, dim)`` tensor of the stored embeddings with
    ``max_norm`` applied (rows renormalised as the model's lookup does); it is read from disk
    once and kept while the cache stays under ``max_bytes`` (least recently used go first).
    """

    def __init__(self, trained: TrainedModel, max_bytes: int = DEFAULT_CACHE_BYTES) -> None:
        self.trained = trained
        self.max_bytes = max_bytes
        self.max_norm = trained.config.max_norm
        self._cache: OrderedDict[PartitionKey, Tensor] = OrderedDict()
        self._bytes = 0
        self.bytes_read = 0

    # ---- shape
    def bases(self, etype: str) -> np.ndarray:
        """Global id of each partition's first entity, plus the total at the end."""
        return self.trained.partition_bases[etype]

    def total(self, etype: str) -> int:
        return int(self.bases(etype)[-1])

    def dimension(self, etype: str) -> int:
        return self.trained.config.entity_dimension(etype)

    def num_partitions(self, etype: str) -> int:
        return self.trained.num_partitions(etype)

    # ---- data
    def table(self, etype: str, part: int) -> Tensor:
        key = (etype, part)
        cached = self._cache.get(key)
        if cached is not None:
            self._cache.move_to_end(key)
            return cached
        tensor = self._load(etype, part)
        size = tensor.numel() * tensor.element_size()
        while self._cache and self._bytes + size > self.max_bytes:
            _, old = self._cache.popitem(last=False)
            self._bytes -= old.numel() * old.element_size()
        self._cache[key] = tensor
        self._bytes += size
        return tensor

    __call__ = table  # an EmbeddingSource for bigembed.ranking.full

    def _load(self, etype: str, part: int) -> Tensor:
        mapped = self.trained.mapped_embeddings(etype, part)
        array = np.array(mapped, dtype=np.float32, order="C")  # one read, then private memory
        del mapped
        self.bytes_read += array.nbytes
        tensor = torch.from_numpy(array)
        if self.max_norm is not None:
            norms = tensor.norm(dim=1, keepdim=True)
            tensor.mul_((self.max_norm / norms.clamp_min(1e-7)).clamp_max(1.0))
        return tensor

    def gather(self, etype: str, ids: np.ndarray) -> Tensor:
        """Rows of the given global ids (any partitions), as a new ``(len(ids), dim)`` tensor."""
        ids = np.asarray(ids, dtype=np.int64)
        bases = self.bases(etype)
        out = torch.empty((len(ids), self.dimension(etype)), dtype=torch.float32)
        if len(ids) == 0:
            return out
        if ids.min() < 0 or ids.max() >= bases[-1]:
            raise IndexError(f"entity id out of range for type {etype!r} ({bases[-1]} entities)")
        parts = np.searchsorted(bases, ids, side="right") - 1
        for part in np.unique(parts):
            sel = np.flatnonzero(parts == part)
            rows = torch.from_numpy(ids[sel] - bases[part])
            out[torch.from_numpy(sel)] = self.table(etype, int(part)).index_select(0, rows)
        return out

    def adjusted(self, etype: str, x: Tensor) -> Tensor:
        """``x`` plus the type's global embedding, when the model has one."""
        globals_ = self.trained.model.global_embs
        if etype in globals_:
            return x + globals_[etype].detach()
        return x
