"""The features of featurized entity types on disk: one CSR per partition, one dictionary per type.

An entity of a featurized type (``featurized: true``) is a bag of features. The import writes,
next to the entity names (see docs/FORMAT.md):

* ``entity_features_{type}_{part}.npz``: ``offsets`` (int64, count + 1), ``features`` (int64,
  feature ids) and ``weights`` (float32): the features of the entity at offset ``k`` are
  ``features[offsets[k]:offsets[k + 1]]``, their weights sum to 1 (an empty bag: no features);
* ``feature_names_{type}.parquet``: one ``name`` column, row ``f`` = the feature with id ``f``;
* the manifest's ``features`` object: ``{type: {"num_features": F}}``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from bigembed.errors import InputError

FEATURES_KEY = "features"  # entity manifest: {type: {"num_features": F}}


def features_file(entity_type: str, part: int) -> str:
    """The CSR of one partition of a featurized type."""
    return f"entity_features_{entity_type}_{part}.npz"


def feature_names_file(entity_type: str) -> str:
    """The feature dictionary of a featurized type (row = feature id)."""
    return f"feature_names_{entity_type}.parquet"


@dataclass(frozen=True)
class FeatureCSR:
    """The bags of one partition: entity ``k`` has ``features[offsets[k]:offsets[k+1]]``."""

    offsets: np.ndarray  # int64 (count + 1,)
    features: np.ndarray  # int64 (nnz,)
    weights: np.ndarray  # float32 (nnz,), each non-empty bag sums to 1

    @property
    def count(self) -> int:
        return len(self.offsets) - 1


def write_features(directory: Path, entity_type: str, part: int, csr: FeatureCSR) -> None:
    """Write one partition's CSR (uncompressed ``.npz``)."""
    with open(directory / features_file(entity_type, part), "wb") as f:
        np.savez(f, offsets=csr.offsets, features=csr.features, weights=csr.weights)


def write_feature_names(directory: Path, entity_type: str, names: pa.Array) -> None:
    pq.write_table(pa.table({"name": names}), directory / feature_names_file(entity_type))


def read_features(
    directory: Path, entity_type: str, part: int, count: int, num_features: int
) -> FeatureCSR:
    """Read and check one partition's CSR against its entity and feature counts."""
    path = directory / features_file(entity_type, part)
    try:
        with np.load(path, allow_pickle=False) as data:
            csr = FeatureCSR(
                data["offsets"].astype(np.int64, copy=False),
                data["features"].astype(np.int64, copy=False),
                data["weights"].astype(np.float32, copy=False),
            )
    except FileNotFoundError:
        raise InputError(f"{path}: missing (the entity store is incomplete)") from None
    except (OSError, ValueError, KeyError) as exc:
        raise InputError(f"{path}: unreadable entity features ({exc})") from None
    offsets, features = csr.offsets, csr.features
    ok = (
        csr.count == count
        and offsets[0] == 0
        and offsets[-1] == len(features) == len(csr.weights)
        and bool(np.all(np.diff(offsets) >= 0))
        and (len(features) == 0 or (features.min() >= 0 and features.max() < num_features))
    )
    if not ok:
        raise InputError(
            f"{path}: entity features do not fit the store ({count} entities, "
            f"{num_features} features)"
        )
    return csr


def read_feature_names(directory: Path, entity_type: str, num_features: int) -> list[str]:
    path = directory / feature_names_file(entity_type)
    try:
        names = pq.read_table(path, columns=["name"]).column("name").to_pylist()
    except FileNotFoundError:
        raise InputError(f"{path}: missing (the entity store is incomplete)") from None
    except (OSError, pa.ArrowException, KeyError) as exc:
        raise InputError(f"{path}: unreadable feature names ({exc})") from None
    if len(names) != num_features:
        raise InputError(f"{path}: holds {len(names)} names but the manifest says {num_features}")
    return [str(n) for n in names]
