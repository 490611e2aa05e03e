"""A trained model read back from a checkpoint directory: config, parameters, embeddings.

:func:`load_trained` is the one way to open a checkpoint for inference (evaluation, export,
query, conversion): it reads the last committed version's metadata record, checks it against the
files it describes, builds the model and turns every way a checkpoint can be broken into one
:class:`~bigembed.errors.CheckpointError` naming the path. Embeddings are memory-mapped from the
checkpoint, so opening a model over billions of entities costs nothing until rows are used.
:func:`open_entity_store` opens the entity names that go with a model and checks that they line
up with its embedding rows; :mod:`bigembed.checkpoints.tables` caches the embedding tables.

A reader never takes a lock, and a training may commit (and delete the files of the version a
reader opened) at any moment. So :func:`load_trained` opens every embedding file of the version
it read at once and maps the open files later, never the names; a commit between reading the
version number and opening the files shows as a missing file while the version has moved on,
and the load starts again from the new version. A model once loaded keeps reading its version.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import BinaryIO

import numpy as np
import torch

from bigembed.checkpoints.compatibility import state_mismatch
from bigembed.checkpoints.layout import BEST_DIR, BEST_FILE, map_npy, npy_header
from bigembed.checkpoints.metadata import CheckpointMetadata, PartitionCounts, check_same_import
from bigembed.checkpoints.store import CheckpointStore
from bigembed.config import ConfigSchema, model_spec, parse_config_dict
from bigembed.errors import BigembedError, CheckpointError, InputError
from bigembed.model import FeatureBags, ScoringModel
from bigembed.storage import EntityStore

VERSIONS = ("latest", "best")
LOAD_ATTEMPTS = 20  # loads started again because a training committed meanwhile


def checkpoint_dir(path: str | os.PathLike[str], version: str = "latest") -> Path:
    """The directory to read ``version`` of the checkpoint at ``path`` from: ``latest`` (the
    committed version) is ``path``; ``best`` (early stopping's) is the snapshot ``path/best``."""
    if version == "latest":
        return Path(path)
    if version != "best":
        raise CheckpointError(f"unknown checkpoint version {version!r} (known: latest, best)")
    store = CheckpointStore(path)
    if store.read_best() is None:
        raise CheckpointError(
            f"{store.path}: no best version ({store.path / BEST_DIR}/{BEST_FILE} missing); it "
            "is kept by training with an early_stopping section"
        )
    return store.path / BEST_DIR


@dataclass
class TrainedModel:
    """One committed version of a checkpoint: its parsed config, the model (in eval mode) and
    the metadata record; embeddings stay on disk until asked for."""

    path: Path
    version: int
    config: ConfigSchema
    model: ScoringModel
    metadata: CheckpointMetadata
    # the embedding files of this version, open since the load (see the module docstring)
    files: dict[tuple[str, int], BinaryIO] = field(default_factory=dict, repr=False)
    _bags: dict[tuple[str, int], FeatureBags] = field(default_factory=dict, repr=False)

    @cached_property
    def entity_counts(self) -> PartitionCounts:
        """Entities per (entity type, partition): the metadata's rows, except for a featurized
        type, whose one stored table (partition 0) holds its features: the entities of each of
        its partitions are that partition's bags."""
        counts = dict(self.metadata.entity_counts)
        for etype in {t for t, _ in counts if self.is_featurized(t)}:
            for part in range(self.num_partitions(etype)):
                counts[(etype, part)] = len(self.feature_bags(etype, part))
        return counts

    def is_featurized(self, entity_type: str) -> bool:
        entity = self.config.entities.get(entity_type)
        return entity is not None and bool(entity.featurized)

    def feature_bags(self, entity_type: str, part: int) -> FeatureBags:
        """The bags of a featurized partition, from the config's entity path (cached)."""
        key = (entity_type, part)
        if key not in self._bags:
            store = EntityStore(self.config.entity_path)
            rows = self.metadata.entity_counts.get((entity_type, 0))
            if rows is not None and store.num_features(entity_type) != rows:
                raise CheckpointError(
                    f"{store.path}: '{entity_type}' has {store.num_features(entity_type)} "
                    f"features but the checkpoint {self.path} was trained with {rows} (were "
                    "the features re-imported?); train again on this import"
                )
            csr = store.features(entity_type, part)
            self._bags[key] = FeatureBags.from_arrays(csr.offsets, csr.features, csr.weights)
        return self._bags[key]

    def feature_rows(self, entity_type: str) -> np.ndarray:
        """A featurized type's stored feature embeddings (memory-mapped, read-only): one table,
        stored as partition 0, shared by all the type's partitions."""
        return self._mapped(entity_type, 0, self.metadata.entity_counts.get((entity_type, 0)))

    @property
    def relation_names(self) -> list[str]:
        """Name of every relation id the model knows (dynamic: from the data; else the config).

        Relation ids beyond the recorded names (a checkpoint written without them) are named
        ``relation_{id}``.
        """
        if not self.config.dynamic_relations:
            return [r.name for r in self.config.relations]
        names = list(self.metadata.relation_names)
        count = self.model.num_relations
        if len(names) != count:
            names = names[:count] + [f"relation_{i}" for i in range(len(names), count)]
        return names

    @property
    def import_id(self) -> str | None:
        """Which import of the entity path it was trained on (None: unknown)."""
        return self.metadata.import_id

    def check_import(self, entities: EntityStore) -> None:
        """Refuse an entity store from another import than the one this model was trained on."""
        extended = [e.import_id for e in entities.extends]
        check_same_import(self.path, self.import_id, entities.import_id, entities.path, extended)

    @property
    def store(self) -> CheckpointStore:
        return CheckpointStore(self.path)

    def num_partitions(self, entity_type: str) -> int:
        return self.config.entities[entity_type].num_partitions

    def embeddings(self, entity_type: str, part: int) -> torch.Tensor:
        """Stored embeddings of one partition (memory-mapped; without the global embedding).

        The map is copy-on-write: nothing is read until used, and writes never reach the file.
        """
        return torch.from_numpy(self.mapped_embeddings(entity_type, part, writable=True))

    def mapped_embeddings(
        self, entity_type: str, part: int, *, writable: bool = False
    ) -> np.ndarray:
        """One partition's stored embeddings as a memory map (read-only unless ``writable``,
        which maps copy-on-write), checked against the metadata's (count, dimension).

        A featurized type's entity embeddings are computed here (the weighted mean of their
        features' rows, :class:`bigembed.model.FeatureBags`), in memory."""
        if self.is_featurized(entity_type):
            features = torch.from_numpy(np.array(self.feature_rows(entity_type)))
            return self.feature_bags(entity_type, part).mean(features).numpy()
        return self._mapped(
            entity_type, part, self.entity_counts.get((entity_type, part)), writable
        )

    def _mapped(
        self, entity_type: str, part: int, count: int | None, writable: bool = False
    ) -> np.ndarray:
        path = self.store.embeddings_path(entity_type, part, self.version)
        opened = self.files.get((entity_type, part))
        if opened is not None:
            array = map_npy(opened, path, writable=writable)
        else:
            try:
                array = np.load(path, mmap_mode="c" if writable else "r", allow_pickle=False)
            except FileNotFoundError:
                raise CheckpointError(f"{path}: missing (incomplete checkpoint?)") from None
            except (OSError, ValueError) as exc:
                raise CheckpointError(f"{path}: unreadable embeddings ({exc})") from None
        dim = self.config.entity_dimension(entity_type)
        if array.ndim != 2 or array.shape[1] != dim or (count is not None and len(array) != count):
            raise CheckpointError(
                f"{path}: shape {tuple(array.shape)} does not match the checkpoint's "
                f"({count}, {dim})"
            )
        return array

    @cached_property
    def partition_bases(self) -> dict[str, np.ndarray]:
        """Per entity type, the global index of each partition's first entity."""
        out = {}
        for etype in self.config.entities:
            counts = [
                self.entity_counts.get((etype, p), 0) for p in range(self.num_partitions(etype))
            ]
            out[etype] = np.concatenate(([0], np.cumsum(counts)))
        return out


def load_trained(path: str | os.PathLike[str]) -> TrainedModel:
    """Open the last committed version of a checkpoint directory.

    The metadata is checked against the files it describes before anything is allocated: each
    partition's ``.npy`` header must give ``(entity count, dimension)``, and every model
    parameter's shape (computed on the meta device, which allocates nothing) must match the
    model file's. A metadata file claiming a huge dimension or count is refused with one line
    naming it instead of trying to allocate terabytes. Any other failure to read is a
    CheckpointError naming ``path``.
    """
    store = CheckpointStore(path)
    try:
        for _ in range(LOAD_ATTEMPTS - 1):
            version = store.open_for_reading()
            try:
                return _load_trained(store, version)
            except CheckpointError:
                if store.committed_version() == version:
                    raise
                # a training committed meanwhile and removed this version's files: again
        return _load_trained(store, store.open_for_reading())
    except BigembedError:
        raise
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CheckpointError(
            f"{path}: unreadable checkpoint ({type(exc).__name__}: {exc})"
        ) from None


def _load_trained(store: CheckpointStore, version: int) -> TrainedModel:
    meta = store.read_metadata(version)
    meta_path = store.metadata_path(version)
    config = parse_config_dict(meta.config, source=str(meta_path))
    files = _open_embeddings(
        store, version, [k for k in meta.entity_counts if k[0] in config.entities]
    )
    for (etype, part), count in meta.entity_counts.items():
        if etype in config.entities:
            epath = store.embeddings_path(etype, part, version)
            shape, _dtype = npy_header(epath)
            want = (count, config.entity_dimension(etype))
            if shape != want:
                raise CheckpointError(
                    f"{meta_path}: says partition {part} of '{etype}' is {want} (entities, "
                    f"dimension) but {epath.name} holds {shape}"
                )
    payload = store.load_model(version, mmap=True)
    spec = model_spec(config, meta.num_relations)
    with torch.device("meta"):
        skeleton = ScoringModel(spec)
    _check_shapes(skeleton, payload["model"], meta_path, store.model_path(version))
    model = ScoringModel(spec)
    mismatch = state_mismatch(model, payload["model"])
    if mismatch is not None:
        raise CheckpointError(f"{store.model_path(version)}: does not fit its config: {mismatch}")
    model.load_state_dict(payload["model"])
    model.eval()
    return TrainedModel(store.path, version, config, model, meta, files)


def _open_embeddings(
    store: CheckpointStore, version: int, keys: list[tuple[str, int]]
) -> dict[tuple[str, int], BinaryIO]:
    """Open every embedding file of ``version`` now (a missing one: a CheckpointError)."""
    files: dict[tuple[str, int], BinaryIO] = {}
    try:
        for etype, part in keys:
            path = store.embeddings_path(etype, part, version)
            try:
                files[(etype, part)] = open(path, "rb")  # noqa: SIM115 (kept open: the model's)
            except FileNotFoundError:
                raise CheckpointError(f"{path}: missing (incomplete checkpoint?)") from None
    except BaseException:
        for f in files.values():
            with contextlib.suppress(OSError):
                f.close()
        raise
    return files


def open_entity_store(
    trained: TrainedModel, entity_path: str | os.PathLike[str] | None = None
) -> EntityStore:
    """The entity store of ``trained`` (its config's ``entity_path`` unless overridden).

    Checks that it is the import the model was trained on and that every entity type of the
    model is there with the same partition counts, so that names and embedding rows line up.
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


def _check_shapes(
    skeleton: torch.nn.Module, saved: dict[str, object], meta_path: Path, model_path: Path
) -> None:
    """The config's parameter shapes (``skeleton`` lives on the meta device) against the file."""
    want = {k: tuple(v.shape) for k, v in skeleton.state_dict().items()}
    for key, shape in want.items():
        tensor = saved.get(key)
        have = tuple(tensor.shape) if isinstance(tensor, torch.Tensor) else None
        if have != shape:
            raise CheckpointError(
                f"{meta_path}: its config gives parameter {key!r} the shape {shape} but "
                f"{model_path.name} holds {have}"
            )
