"""Opening a trained checkpoint for inference: the model, its entity names, its embedding tables.

Evaluation, export and the query API all read a checkpoint the same way:

* :func:`open_checkpoint` loads the last committed version and turns every way a checkpoint
  can be broken (missing directory, no version file, missing or corrupt files) into one
  :class:`~bigembed.errors.CheckpointError` that names the path;
* :class:`EntityTables` hands out one partition's embeddings at a time, read once from disk
  and cached within a memory budget, with ``max_norm`` applied as the model applies it at
  lookup time (the global embedding is *not* added: :meth:`EntityTables.adjusted` does that);
* :func:`open_entity_store` opens the entity names and checks that they match the checkpoint.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from bigembed.checkpoints.reading import TrainedModel, load_trained
from bigembed.errors import BigembedError, CheckpointError, InputError
from bigembed.storage.entities import EntityStore

DEFAULT_CACHE_BYTES = 2 << 30


def open_checkpoint(path: str | os.PathLike[str]) -> TrainedModel:
    """The last committed version of the checkpoint in ``path``, or a CheckpointError."""
    try:
        return load_trained(path)
    except BigembedError:
        raise
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        # e.g. a truncated metadata file (JSONDecodeError is a ValueError)
        raise CheckpointError(
            f"{path}: unreadable checkpoint ({type(exc).__name__}: {exc})"
        ) from None


def relation_names(trained: TrainedModel) -> list[str]:
    """Name of every relation id the model knows (dynamic: from the data; else the config)."""
    cfg = trained.config
    if not cfg.dynamic_relations:
        return [r.name for r in cfg.relations]
    names = list(trained.relation_names)
    count = trained.model.num_relations
    if len(names) != count:
        names = names[:count] + [f"relation_{i}" for i in range(len(names), count)]
    return names


def open_entity_store(
    trained: TrainedModel, entity_path: str | os.PathLike[str] | None = None
) -> EntityStore:
    """The entity store of ``trained`` (its config's ``entity_path`` unless overridden).

    Checks that every entity type of the model is there with the same partition counts, so
    that names and embedding rows line up.
    """
    path = Path(entity_path) if entity_path is not None else Path(trained.config.entity_path)
    store = EntityStore(path)
    trained.check_import(store)
    for etype in trained.config.entities:
        if etype not in store.entity_types:
            raise InputError(
                f"{path}: has no entity type {etype!r}, which the checkpoint {trained.path} uses "
                f"(pass the entity path the model was trained with)"
            )
        for part in range(trained.num_partitions(etype)):
            want = trained.entity_counts.get((etype, part))
            have = store.count(etype, part) if part < store.num_partitions(etype) else None
            if want is not None and have != want:
                raise InputError(
                    f"{path}: entity type {etype!r} partition {part} has {have} names but the "
                    f"checkpoint {trained.path} has {want} embeddings (was the graph re-imported?)"
                )
    return store


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
        self._cache: OrderedDict[tuple[str, int], Tensor] = OrderedDict()
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

    __call__ = table  # an EmbeddingSource for bigembed.eval.ranking

    def _load(self, etype: str, part: int) -> Tensor:
        store = self.trained.store
        path = store.embeddings_path(etype, part, self.trained.version)
        try:
            mapped = np.load(path, mmap_mode="r", allow_pickle=False)
        except FileNotFoundError:
            raise CheckpointError(f"{path}: missing (incomplete checkpoint?)") from None
        except (OSError, ValueError) as exc:
            raise CheckpointError(f"{path}: unreadable embeddings ({exc})") from None
        count = self.trained.entity_counts.get((etype, part))
        dim = self.dimension(etype)
        bad_count = count is not None and mapped.shape[0] != count
        if mapped.ndim != 2 or mapped.shape[1] != dim or bad_count:
            raise CheckpointError(
                f"{path}: shape {tuple(mapped.shape)} does not match the checkpoint's "
                f"({count}, {dim})"
            )
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
