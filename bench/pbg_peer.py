"""PyTorch-BigGraph 1.0 side by side: the same config and the same imported data, in its own venv.

PBG is never a dependency of bigembed: ``/work/shared/tools/setup_pbg.sh .peer/pbg-venv`` (or any
venv with ``torchbiggraph==1.0.0``) provides it, and the benches run it as a subprocess when that
venv exists. This module

* translates a bigembed config into a PBG config file (a Python file defining
  ``get_torchbiggraph_config()``), keeping the keys PBG 1.0's schema has and reporting the ones
  it drops (e.g. ``regularization_coef``: PBG 1.0 has no regularizer);
* writes the edges bigembed imported in PBG's layout with PBG's own storage classes (run in
  PBG's venv), so both train on exactly the same partitions, offsets and buckets (PBG's own
  importer is slow and writes 157 MB per bucket file);
* runs ``torchbiggraph.train``, timestamps its log lines as they arrive and reads each epoch's
  time from "Starting epoch e" to "Finished epoch e" (bucket loading and training; its
  checkpoint write follows "Finished"). PBG sleeps ``hogwild_delay`` per bucket in epoch 1
  only, so steady state is epochs 2+.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_VENV = ROOT / ".peer" / "pbg-venv"

_FIELDS = """
import attr, json
from torchbiggraph.config import ConfigSchema, EntitySchema, RelationSchema
print(json.dumps({n: sorted(attr.fields_dict(s)) for n, s in
    (("config", ConfigSchema), ("entity", EntitySchema), ("relation", RelationSchema))}))
"""

_WRITE = """
import json, sys
import numpy as np, torch
from torchbiggraph.edgelist import EdgeList
from torchbiggraph.entitylist import EntityList
from torchbiggraph.graph_storages import EDGE_STORAGES, ENTITY_STORAGES, RELATION_TYPE_STORAGES
src, ent_dir, edge_dir = sys.argv[1:4]
meta = json.load(open(f"{src}/meta.json"))
ents = ENTITY_STORAGES.make_instance(ent_dir)
ents.prepare()
for etype, counts in meta["counts"].items():
    for part, count in enumerate(counts):
        ents.save_count(etype, part, count)
        ents.save_names(etype, part, meta["names"][etype][part])
rels = RELATION_TYPE_STORAGES.make_instance(ent_dir)
rels.prepare()
rels.save_count(meta["num_relations"])
rels.save_names(meta["relation_names"])
edges = EDGE_STORAGES.make_instance(edge_dir)
edges.prepare()
for l, r in meta["buckets"]:
    z = np.load(f"{src}/bucket_{l}_{r}.npz")
    t = lambda k: torch.from_numpy(z[k].astype(np.int64))
    edges.save_edges(l, r, EdgeList(EntityList.from_tensor(t("lhs")),
                                     EntityList.from_tensor(t("rhs")), t("rel")))
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The benches' PBG options: ``--pbg-venv`` and ``--no-pbg``."""
    parser.add_argument(
        "--pbg-venv",
        type=Path,
        default=DEFAULT_VENV,
        help="PBG 1.0's venv (default .peer/pbg-venv); skipped with a line when absent",
    )
    parser.add_argument("--no-pbg", action="store_true", help="do not run PBG")


def pbg_python(venv: Path) -> Path | None:
    """The venv's interpreter when PBG 1.0 is installed in it, else None."""
    py = venv / "bin" / "python"
    if not (venv / "bin" / "torchbiggraph_train").exists() or not py.exists():
        return None
    return py


def skip_line(venv: Path) -> str:
    return (
        f"PBG: skipped (no PBG 1.0 venv at {venv}; docs/training.md says how to create one, "
        "or pass --pbg-venv DIR)"
    )


def export_edges(py: Path, entity_path: Path, edge_path: Path, out: Path) -> tuple[Path, Path]:
    """Write bigembed's imported ``entity_path`` counts and ``edge_path`` buckets in PBG's
    layout under ``out``; returns PBG's (entity dir, edge dir). Skipped when already written."""
    from bigembed.storage import EdgeStore, EntityStore

    ent_dir, edge_dir = out / "entities", out / "edges"
    done = out / "done"
    if done.exists():
        return ent_dir, edge_dir
    entities = EntityStore(entity_path)
    store = EdgeStore(edge_path)
    with tempfile.TemporaryDirectory(dir=out.parent if out.parent.exists() else None) as tmp:
        meta = {
            "counts": {t: entities.counts(t) for t in entities.entity_types},
            "names": {
                t: [entities.names(t, p) for p in range(entities.num_partitions(t))]
                for t in entities.entity_types
            },
            "num_relations": entities.num_relations,
            "relation_names": entities.relation_names(),
            "buckets": [list(b) for b in store.buckets()],
        }
        Path(tmp, "meta.json").write_text(json.dumps(meta))
        for lp, rp in store.buckets():
            c = store.load_bucket(lp, rp)
            np.savez(Path(tmp, f"bucket_{lp}_{rp}.npz"), lhs=c.lhs, rhs=c.rhs, rel=c.rel)
        subprocess.run(
            [str(py), "-c", _WRITE, tmp, str(ent_dir), str(edge_dir)],
            check=True,
            stdout=subprocess.DEVNULL,
        )
    done.write_text("")
    return ent_dir, edge_dir


def pbg_config(
    py: Path, cfg: Any, entity_dir: Path, edge_dir: Path, checkpoint: Path
) -> tuple[dict[str, Any], list[str]]:
    """PBG's config for bigembed's ``cfg`` (a ConfigSchema): (config dict, dropped keys with a
    value other than their default, as ``key=value``)."""
    from bigembed.config import config_to_dict, parse_config_dict

    fields = json.loads(subprocess.run([str(py), "-c", _FIELDS], **_TEXT).stdout)
    full = config_to_dict(cfg)
    required = ("entities", "relations", "dimension", "entity_path", "edge_paths")
    base = config_to_dict(parse_config_dict({k: full[k] for k in (*required, "checkpoint_path")}))
    dropped = [
        f"{k}={v}" for k, v in full.items() if k not in fields["config"] and v != base.get(k)
    ]
    out = {k: v for k, v in full.items() if k in fields["config"]}
    out["entities"] = {
        name: {k: v for k, v in e.items() if k in fields["entity"]}
        for name, e in full["entities"].items()
    }
    out["relations"] = [
        {k: v for k, v in r.items() if k in fields["relation"]} for r in full["relations"]
    ]
    out.update(
        entity_path=str(entity_dir), edge_paths=[str(edge_dir)], checkpoint_path=str(checkpoint)
    )
    return out, dropped


_TEXT: dict[str, Any] = {"check": True, "capture_output": True, "text": True}


@dataclass
class PbgRun:
    wall: float  # the whole torchbiggraph_train process
    epoch_seconds: list[float] = field(default_factory=list)
    epoch_edges: list[int] = field(default_factory=list)
    epoch_end: list[float] = field(default_factory=list)  # seconds from start to "Finished"

    def steady_eps(self) -> float:
        """edges/s over epochs 2+ (epoch 1 if it is the only one)."""
        first = 1 if len(self.epoch_seconds) > 1 else 0
        return sum(self.epoch_edges[first:]) / sum(self.epoch_seconds[first:])


_START = re.compile(r"Starting epoch (\d+) /")
_FINISH = re.compile(r"Finished epoch (\d+) /")
_BUCKET = re.compile(r"Processed (\d+) edges in")


def train(py: Path, config: dict[str, Any], workdir: Path, log: Path) -> PbgRun:
    """Run PBG's trainer on ``config`` (written to ``workdir/pbg_config.py``)."""
    workdir.mkdir(parents=True, exist_ok=True)
    cfg_file = workdir / "pbg_config.py"
    cfg_file.write_text(
        "# Written by bench/pbg_peer.py from a bigembed config.\n"
        f"def get_torchbiggraph_config():\n    return {config!r}\n"
    )
    subprocess.run(["rm", "-rf", config["checkpoint_path"]], check=True)
    started: dict[int, float] = {}
    run = PbgRun(0.0)
    edges = 0
    t0 = time.perf_counter()
    with (
        log.open("w") as out,
        subprocess.Popen(
            [str(py), "-u", "-m", "torchbiggraph.train", str(cfg_file)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        ) as proc,
    ):
        assert proc.stdout is not None
        for line in proc.stdout:
            now = time.perf_counter()
            out.write(f"{now - t0:9.3f} {line}")
            if m := _START.search(line):
                started[int(m[1])] = now
                edges = 0
            elif m := _BUCKET.search(line):
                edges += int(m[1])
            elif m := _FINISH.search(line):
                run.epoch_seconds.append(now - started[int(m[1])])
                run.epoch_edges.append(edges)
                run.epoch_end.append(now - t0)
    run.wall = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.exit(f"PBG failed (exit {proc.returncode}); its log: {log}")
    return run
