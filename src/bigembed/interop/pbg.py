"""Convert checkpoints between PyTorch-BigGraph's layout and bigembed's, both ways.

PBG checkpoint directory (see docs/FORMAT.md and PBG's ``checkpoint_storage.py``):
``checkpoint_version.txt`` (N), ``config.json``, ``embeddings_{type}_{part}.vN.h5`` (dataset
``embeddings``, float32 ``(count, dim)``; an opaque optimizer blob we neither read nor write),
``model.vN.h5`` (group ``model`` with ``relations/{idx}/operator/{side}/{param}`` and
``entities/{type}/global_embedding``). PBG entity path: ``entity_count_{type}_{part}.txt``,
``entity_names_{type}_{part}.json``, ``dynamic_rel_count.txt``, ``dynamic_rel_names.json``.

Both directions keep the version number (both count completed (epoch, edge set, chunk)
steps), embeddings, relation parameters, global embeddings, names and relation names exactly.
Optimizer state is not converted: training resumed on the other side restarts Adagrad's
accumulators. Edge paths are not converted (re-import the edges for the other system); the
config keeps pointing at them. bigembed-only config keys, which PBG's strict schema would
reject, travel in a side file ``bigembed_config.json`` that PBG ignores.

h5py is an optional dependency (``pip install 'bigembed[h5]'``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from bigembed.atomic import atomic_directory, atomic_write_text
from bigembed.checkpoints import (
    VERSION_FILE,
    CheckpointMetadata,
    CheckpointStore,
    IterationPosition,
    open_for_inference,
    state_mismatch,
)
from bigembed.config import BIGEMBED_ONLY_KEYS as CONFIG_ONLY_KEYS
from bigembed.config import ConfigSchema, config_to_dict, model_spec, parse_config_dict
from bigembed.errors import BigembedError, CheckpointError, InputError
from bigembed.model import ScoringModel
from bigembed.model import from_pbg as public_to_key
from bigembed.model import to_pbg as key_to_public
from bigembed.output_paths import check_replaceable, refuse_overlap
from bigembed.partition_keys import PartitionKey
from bigembed.storage import write_entity_store

# The top-level keys PBG's schema lacks: kept in the side file, never in PBG's config.json.
BIGEMBED_ONLY_KEYS = tuple(k for k in CONFIG_ONLY_KEYS if "." not in k)
SIDE_CONFIG = "bigembed_config.json"
PBG_FORMAT_VERSION = 1


def _h5py():
    try:
        import h5py
    except ImportError:
        raise BigembedError(
            "converting PyTorch-BigGraph checkpoints needs h5py: pip install 'bigembed[h5]' "
            "(or pip install h5py)"
        ) from None
    return h5py


def _refuse_existing(outputs: list[tuple[Path, str]], force: bool, inputs: list[Path]) -> None:
    """Outputs apart from the inputs and each other; --force replaces only bigembed's own."""
    (out_ck, _), (out_ent, _) = outputs
    refuse_overlap([out_ck, out_ent], inputs)
    refuse_overlap([out_ck], [out_ent])
    for path, kind in outputs:
        check_replaceable(path, kind, force=force)


# ---------------------------------------------------------------------- PBG -> bigembed


def _read_int(path: Path) -> int:
    try:
        return int(path.read_text().strip())
    except FileNotFoundError:
        raise InputError(f"{path}: missing") from None
    except ValueError:
        raise InputError(f"{path}: not a number") from None


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(f"{path}: missing") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: not valid JSON ({exc})") from None


def _pbg_version(ckpt: Path) -> int:
    if not ckpt.is_dir():
        raise CheckpointError(f"{ckpt}: no such PBG checkpoint directory")
    vfile = ckpt / VERSION_FILE
    if not vfile.exists():
        raise CheckpointError(f"{vfile}: missing; {ckpt} holds no committed PBG checkpoint")
    text = vfile.read_text().strip()
    try:
        version = int(text) if text else 0
    except ValueError:
        raise CheckpointError(f"{vfile}: not a version number: {text[:40]!r}") from None
    if version <= 0:
        raise CheckpointError(f"{vfile}: version {version}; no committed PBG checkpoint")
    return version


def _open_h5(h5py, path: Path):
    try:
        f = h5py.File(path, "r")
    except FileNotFoundError:
        raise CheckpointError(f"{path}: missing (incomplete PBG checkpoint?)") from None
    except OSError as exc:
        raise CheckpointError(f"{path}: not a readable HDF5 file ({exc})") from None
    fmt = f.attrs.get("format_version")
    if fmt is not None and int(fmt) != PBG_FORMAT_VERSION:
        f.close()
        raise CheckpointError(f"{path}: PBG format_version {fmt}, this converter reads 1")
    return f


def _in_file(h5py, group, name: str, path: Path):
    """``group[name]``, or None if absent, refusing anything whose bytes live outside the file.

    A crafted checkpoint could otherwise make the converter copy an arbitrary local file into
    the output: an external link (another HDF5 file), a dataset with external raw storage
    (``dset.external``: any file, read as raw bytes) or a virtual dataset (mapped from other
    files). Soft links are refused too: PBG writes none, and refusing them rules out cycles.
    """
    where = f"{path}: {group.name.rstrip('/')}/{name}"
    link = group.get(name, getlink=True)
    if link is None:
        return None
    if isinstance(link, h5py.ExternalLink):
        raise CheckpointError(
            f"{where} is an external link to {link.filename}:{link.path}; "
            "refusing to read data from outside the checkpoint file"
        )
    if isinstance(link, h5py.SoftLink):
        raise CheckpointError(
            f"{where} is a soft link to {link.path}; a PBG checkpoint holds no links"
        )
    obj = group[name]
    if isinstance(obj, h5py.Dataset):
        if obj.external:
            files = ", ".join(sorted({os.fsdecode(e[0]) for e in obj.external}))
            raise CheckpointError(
                f"{where} stores its data in external file(s) {files}; "
                "refusing to read data from outside the checkpoint file"
            )
        if obj.is_virtual:
            raise CheckpointError(
                f"{where} is a virtual dataset (mapped from other files); "
                "refusing to read data from outside the checkpoint file"
            )
    return obj


def _datasets_in_file(h5py, group, path: Path, prefix: str = ""):
    """(name relative to ``group``, dataset) of every dataset below ``group``, each checked
    with :func:`_in_file`."""
    for name in group:
        obj = _in_file(h5py, group, name, path)
        if isinstance(obj, h5py.Group):
            yield from _datasets_in_file(h5py, obj, path, f"{prefix}{name}/")
        elif isinstance(obj, h5py.Dataset):
            yield f"{prefix}{name}", obj


def _pbg_config(ckpt: Path, version: int, out_entity: Path, out_ckpt: Path, h5py) -> ConfigSchema:
    path = ckpt / "config.json"
    if path.exists():
        data = _read_json(path)
    else:  # PBG also stores the config as an attribute of every h5 file
        with _open_h5(h5py, ckpt / f"model.v{version}.h5") as f:
            if "config/json" not in f.attrs:
                raise CheckpointError(f"{path}: missing, and {f.filename} has no config either")
            data = json.loads(f.attrs["config/json"])
    if not isinstance(data, dict):
        raise InputError(f"{path}: not a config (a JSON object)")
    side = ckpt / SIDE_CONFIG
    if side.exists():
        data.update({k: v for k, v in _read_json(side).items() if k in BIGEMBED_ONLY_KEYS})
    data["entity_path"] = str(out_entity)
    data["checkpoint_path"] = str(out_ckpt)
    return parse_config_dict(data, source=str(path))


def _iteration_attrs(attrs) -> dict[str, Any]:
    out = {}
    for key, value in attrs.items():
        if key.startswith("iteration/"):
            out[key.split("/", 1)[1]] = value.item() if hasattr(value, "item") else value
    for k, v in out.items():
        if isinstance(v, bytes):
            out[k] = v.decode("utf-8")
    return out


def from_pbg(
    pbg_checkpoint: str | os.PathLike[str],
    pbg_entity_path: str | os.PathLike[str],
    out_checkpoint: str | os.PathLike[str],
    out_entity_path: str | os.PathLike[str],
    *,
    force: bool = False,
) -> dict[str, Any]:
    """Read a PBG checkpoint + entity path and write them as a bigembed checkpoint + store.

    The new config's ``entity_path`` and ``checkpoint_path`` point at the outputs.
    Returns a summary (version, entity counts, relations).
    """
    h5py = _h5py()
    src, src_ent = Path(pbg_checkpoint), Path(pbg_entity_path)
    out_ck, out_ent = Path(out_checkpoint).absolute(), Path(out_entity_path).absolute()
    _refuse_existing([(out_ck, "checkpoint"), (out_ent, "entities")], force, [src, src_ent])
    version = _pbg_version(src)
    if not src_ent.is_dir():
        raise InputError(f"{src_ent}: no such PBG entity path")
    cfg = _pbg_config(src, version, out_ent, out_ck, h5py)

    names: dict[str, list[pa.Array]] = {}
    counts: dict[PartitionKey, int] = {}
    for etype, ent in cfg.entities.items():
        names[etype] = []
        for part in range(ent.num_partitions):
            count = _read_int(src_ent / f"entity_count_{etype}_{part}.txt")
            names_file = src_ent / f"entity_names_{etype}_{part}.json"
            part_names = _read_json(names_file)
            if not isinstance(part_names, list) or len(part_names) != count:
                got = len(part_names) if isinstance(part_names, list) else "no list of"
                raise InputError(
                    f"{names_file}: holds {got} names but "
                    f"entity_count_{etype}_{part}.txt says {count}"
                )
            names[etype].append(pa.array([str(n) for n in part_names], pa.string()))
            counts[(etype, part)] = count
    if cfg.dynamic_relations:
        rel_file = src_ent / "dynamic_rel_names.json"
        rel_names = [str(n) for n in _read_json(rel_file)]
        count_file = src_ent / "dynamic_rel_count.txt"
        if count_file.exists() and _read_int(count_file) != len(rel_names):
            raise InputError(
                f"{count_file}: says {_read_int(count_file)} relation types but "
                f"{rel_file} lists {len(rel_names)}"
            )
    else:
        rel_names = [r.name for r in cfg.relations]

    model = ScoringModel(model_spec(cfg, len(rel_names)))
    model_path = src / f"model.v{version}.h5"
    state: dict[str, torch.Tensor] = {}
    with _open_h5(h5py, model_path) as f:
        iteration = IterationPosition.from_json(_iteration_attrs(f.attrs), model_path)
        group = _in_file(h5py, f, "model", model_path)
        if isinstance(group, h5py.Group):
            for name, obj in _datasets_in_file(h5py, group, model_path):
                try:
                    key = public_to_key(name)
                except ValueError as exc:
                    raise CheckpointError(f"{model_path}: {exc}") from None
                state[key] = torch.from_numpy(np.array(obj[...], dtype=np.float32))
    mismatch = state_mismatch(model, state)
    if mismatch is not None:
        raise CheckpointError(f"{model_path}: parameters do not fit the config: {mismatch}")
    model.load_state_dict(state, strict=True)

    embeddings: dict[PartitionKey, np.ndarray] = {}
    for (etype, part), count in counts.items():
        path = src / f"embeddings_{etype}_{part}.v{version}.h5"
        with _open_h5(h5py, path) as f:
            dset = _in_file(h5py, f, "embeddings", path)
            if not isinstance(dset, h5py.Dataset):
                raise CheckpointError(f"{path}: no 'embeddings' dataset")
            emb = np.array(dset[...], dtype=np.float32)
        dim = cfg.entity_dimension(etype)
        if emb.shape != (count, dim):
            raise CheckpointError(
                f"{path}: shape {emb.shape}, expected ({count}, {dim}) from "
                f"the entity count and the config's dimension"
            )
        embeddings[(etype, part)] = emb

    with (
        atomic_directory(out_ent, force=force, marker="entities") as tmp_ent,
        atomic_directory(out_ck, force=force, marker="checkpoint") as tmp_ck,
    ):
        write_entity_store(
            tmp_ent,
            names=names,
            relation_names=rel_names,
            dynamic_relations=cfg.dynamic_relations,
            seed=cfg.seed,
            extra={"converted_from": str(src_ent.absolute())},
        )
        store = CheckpointStore(tmp_ck)
        for (etype, part), emb in embeddings.items():
            store.save_partition(
                etype, part, version, torch.from_numpy(emb), torch.zeros(emb.shape[0])
            )
        store.save_model(version, {"model": model.state_dict(), "optimizer": None})
        store.write_metadata(
            CheckpointMetadata(
                version=version,
                config=config_to_dict(cfg),
                iteration=iteration,
                entity_counts=counts,
                num_relations=len(rel_names),
                relation_names=rel_names,
                converted_from={"system": "PyTorch-BigGraph", "checkpoint": str(src.absolute())},
            )
        )
        atomic_write_text(tmp_ck / "config.json", json.dumps(config_to_dict(cfg), indent=1))
        atomic_write_text(tmp_ck / VERSION_FILE, f"{version}\n")
    return {
        "version": version,
        "entity_counts": {f"{t}_{p}": n for (t, p), n in counts.items()},
        "relations": len(rel_names),
        "checkpoint": str(out_ck),
        "entity_path": str(out_ent),
    }


# ---------------------------------------------------------------------- bigembed -> PBG


def refuse_featurized(path: Path, types: list[str]) -> None:
    """Featurized types have no per-entity parameters to convert (see docs/featurized.md)."""
    if types:
        raise CheckpointError(
            f"{path}: featurized entity types ({', '.join(types)}) cannot be converted or "
            "remapped; export their embeddings with `bigembed export`"
        )


def to_pbg(
    checkpoint_dir: str | os.PathLike[str],
    entity_path: str | os.PathLike[str] | None,
    out_checkpoint: str | os.PathLike[str],
    out_entity_path: str | os.PathLike[str],
    *,
    force: bool = False,
) -> dict[str, Any]:
    """Write bigembed's last checkpoint (and its entity names) in PBG's layout.

    ``entity_path`` None means the checkpoint config's. Returns a summary like
    :func:`from_pbg`'s.
    """
    h5py = _h5py()
    out_ck, out_ent = Path(out_checkpoint).absolute(), Path(out_entity_path).absolute()
    opened = open_for_inference(checkpoint_dir, entity_path, cache_bytes=0)
    trained, store = opened.trained, opened.entities
    featurized = [t for t in trained.config.entities if trained.is_featurized(t)]
    refuse_featurized(trained.path, featurized)
    _refuse_existing(
        [(out_ck, "pbg-checkpoint"), (out_ent, "pbg-entities")],
        force,
        [Path(checkpoint_dir), trained.path, store.path],
    )
    cfg = trained.config
    version = trained.version
    rel_names = trained.relation_names
    full = config_to_dict(cfg)
    pbg_cfg = {k: v for k, v in full.items() if k not in BIGEMBED_ONLY_KEYS}
    pbg_cfg["entity_path"] = str(out_ent)
    pbg_cfg["checkpoint_path"] = str(out_ck)
    config_json = json.dumps(pbg_cfg, indent=4)
    attrs: dict[str, Any] = {"format_version": PBG_FORMAT_VERSION, "config/json": config_json}
    for key, value in trained.metadata.iteration.to_json().items():
        attrs[f"iteration/{key}"] = value

    def write_attrs(f) -> None:
        for k, v in attrs.items():
            f.attrs[k] = v

    counts = {}
    with (
        atomic_directory(out_ent, force=force, marker="pbg-entities") as tmp_ent,
        atomic_directory(out_ck, force=force, marker="pbg-checkpoint") as tmp_ck,
    ):
        for etype in cfg.entities:
            for part in range(trained.num_partitions(etype)):
                if (etype, part) not in trained.entity_counts:
                    continue
                names = store.names(etype, part)
                counts[f"{etype}_{part}"] = len(names)
                (tmp_ent / f"entity_count_{etype}_{part}.txt").write_text(f"{len(names)}\n")
                (tmp_ent / f"entity_names_{etype}_{part}.json").write_text(
                    json.dumps(names, ensure_ascii=False)
                )
                emb = trained.mapped_embeddings(etype, part)
                with h5py.File(tmp_ck / f"embeddings_{etype}_{part}.v{version}.h5", "w") as f:
                    write_attrs(f)
                    f.create_dataset("embeddings", data=np.asarray(emb, dtype=np.float32))
        (tmp_ent / "dynamic_rel_count.txt").write_text(f"{len(rel_names)}\n")
        (tmp_ent / "dynamic_rel_names.json").write_text(json.dumps(rel_names, ensure_ascii=False))
        with h5py.File(tmp_ck / f"model.v{version}.h5", "w") as f:
            write_attrs(f)
            group = f.create_group("model", track_order=True)
            for key, tensor in trained.model.state_dict().items():
                public, private = key_to_public(key, cfg.dynamic_relations)
                ds = group.create_dataset(public, data=tensor.detach().numpy())
                ds.attrs["state_dict_key"] = private
        (tmp_ck / "config.json").write_text(config_json)
        extra = {k: full[k] for k in BIGEMBED_ONLY_KEYS if k in full}
        (tmp_ck / SIDE_CONFIG).write_text(json.dumps(extra, indent=1) + "\n")
        (tmp_ck / VERSION_FILE).write_text(f"{version}\n")
    return {
        "version": version,
        "entity_counts": counts,
        "relations": len(rel_names),
        "checkpoint": str(out_ck),
        "entity_path": str(out_ent),
    }
