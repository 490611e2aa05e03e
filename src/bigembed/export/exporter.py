"""Exporting a checkpoint: its entity embeddings in blocks and its relation parameters, written
atomically in one of :data:`FORMATS` (see the package docstring)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from bigembed.atomic import atomic_directory
from bigembed.checkpoints import EntityTables, TrainedModel, open_for_inference
from bigembed.errors import InputError
from bigembed.export.relations import relation_params
from bigembed.export.writers import (
    EntityBlock,
    write_npy,
    write_parquet,
    write_projector,
    write_tsv,
)
from bigembed.output_paths import check_replaceable, refuse_overlap, write_error
from bigembed.storage import EntityStore

FORMATS = ("tsv", "npy", "parquet", "projector")


def entity_blocks(
    trained: TrainedModel, store: EntityStore, tables: EntityTables
) -> Iterator[EntityBlock]:
    """Every partition of every entity type: names and vectors with the global embedding."""
    for etype in trained.config.entities:
        for part in range(trained.num_partitions(etype)):
            if (etype, part) not in trained.entity_counts:
                continue
            with torch.no_grad():
                vectors = tables.adjusted(etype, tables.table(etype, part)).numpy()
            yield EntityBlock(etype, part, store.names_array(etype, part), vectors)


def export_checkpoint(
    checkpoint_dir: str | os.PathLike[str],
    fmt: str,
    output: str | os.PathLike[str],
    *,
    entity_path: str | os.PathLike[str] | None = None,
    force: bool = False,
) -> dict[str, Any]:
    """Write the last checkpoint in ``checkpoint_dir`` to the directory ``output``.

    Returns the export manifest (also written as ``export.json``).

    >>> export_checkpoint("work/fb15k237/model", "npy", "out")["files"]
    ['embeddings_all.npy', 'names_all.json', 'relation_params.npz', 'relation_params.json']
    """
    if fmt not in FORMATS:
        raise InputError(f"unknown export format {fmt!r} (known: {', '.join(FORMATS)})")
    out = Path(output)
    refuse_overlap([out], [checkpoint_dir])
    check_replaceable(out, "export", force=force)
    opened = open_for_inference(checkpoint_dir, entity_path, cache_bytes=0)  # each read once
    trained, store, tables = opened.trained, opened.entities, opened.tables
    refuse_overlap([out], [trained.path, store.path])
    params = relation_params(trained)
    shapes = {
        t: (tables.total(t), trained.config.entity_dimension(t)) for t in trained.config.entities
    }
    where = str(store.path)
    try:
        with atomic_directory(out, force=force, marker="export") as tmp:
            blocks = entity_blocks(trained, store, tables)
            if fmt == "tsv":
                files = write_tsv(tmp, blocks, params, where)
            elif fmt == "projector":
                files = write_projector(tmp, blocks, params, where)
            elif fmt == "npy":
                files = write_npy(tmp, blocks, params, where, shapes)
            else:
                files = write_parquet(tmp, blocks, params, where, shapes)
            manifest = {
                "format": fmt,
                "checkpoint": str(trained.path),
                "version": trained.version,
                "entity_path": where,
                "global_embedding_added": bool(len(trained.model.global_embs)),
                "max_norm_applied": trained.config.max_norm,
                "entity_types": {t: {"count": n, "dimension": d} for t, (n, d) in shapes.items()},
                "relation_params": len(params),
                "files": files,
            }
            (tmp / "export.json").write_text(json.dumps(manifest, indent=1) + "\n")
    except OSError as exc:
        raise write_error(exc, out, "export") from None
    return manifest
