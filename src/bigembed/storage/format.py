"""On-disk format of the entity and edge stores: file names, the format version, dtypes.

See ``docs/FORMAT.md`` for the full description. Bump :data:`FORMAT_VERSION` on any change
that an older reader would misread; readers refuse other versions with a clear message.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from bigembed.errors import InputError

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
ENTITY_FORMAT = "bigembed-entities"
EDGE_FORMAT = "bigembed-edges"
EDGE_COLUMNS = ("lhs", "rhs", "rel", "weight")
IMPORT_ID = "import_id"  # entity manifest: this import; edge manifest: its entity store's
RELATIONS = "relations"  # edge manifest: the relation names its ids index (null: dynamic)
PUBLISHING_KEY = "publishing"  # in an entity manifest that an import is replacing right now
INT32_MAX = np.iinfo(np.int32).max


def entity_count_file(entity_type: str, part: int) -> str:
    """PBG-compatible name of the file holding the entity count of one partition."""
    return f"entity_count_{entity_type}_{part}.txt"


def entity_names_file(entity_type: str, part: int) -> str:
    """Parquet file with one ``name`` column, row ``k`` = the entity at offset ``k``."""
    return f"entity_names_{entity_type}_{part}.parquet"


DYNAMIC_REL_COUNT = "dynamic_rel_count.txt"
DYNAMIC_REL_NAMES = "dynamic_rel_names.json"


def bucket_dir(lhs_part: int, rhs_part: int) -> str:
    return f"bucket_{lhs_part}_{rhs_part}"


def index_dtype(max_value: int) -> np.dtype:
    """int32 when every value up to ``max_value`` fits, else int64."""
    return np.dtype(np.int32) if max_value <= INT32_MAX else np.dtype(np.int64)


def has_manifest(path: Path) -> bool:
    """Whether ``path`` holds a store manifest (an import wrote it; its content is unchecked)."""
    return (path / MANIFEST).exists()


def read_manifest(path: Path, expected_format: str) -> dict[str, Any]:
    """Read and check ``path/manifest.json``; any problem is an InputError naming the path."""
    what = "entity store" if expected_format == ENTITY_FORMAT else "edge store"
    if not path.is_dir():
        raise InputError(f"{path}: {what} not found (run `bigembed import` first)")
    manifest_path = path / MANIFEST
    try:
        data = json.loads(manifest_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(
            f"{manifest_path}: missing; {path} is not a complete bigembed {what} "
            f"(re-run `bigembed import`)"
        ) from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"{manifest_path}: corrupt manifest ({exc})") from None
    if not isinstance(data, dict) or data.get("format") != expected_format:
        raise InputError(f"{manifest_path}: not a bigembed {what} manifest")
    if PUBLISHING_KEY in data:
        raise InputError(
            f"{manifest_path}: an import was interrupted while publishing this {what}; "
            f"re-run `bigembed import --force`"
        )
    version = data.get("format_version")
    if version != FORMAT_VERSION:
        raise InputError(
            f"{manifest_path}: format_version {version!r} is not supported by this bigembed "
            f"(it reads version {FORMAT_VERSION}); re-run `bigembed import`"
        )
    return data


def manifest_error(path: Path, why: str) -> InputError:
    return InputError(f"{path / MANIFEST}: corrupt manifest ({why})")
