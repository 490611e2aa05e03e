"""A commented starting config for an edge file (``bigembed init``), and whose it is.

The config is written from an :class:`~bigembed.edgelists.EdgeFileShape`: how to read the file
(``edge_files``), one entity type, the relations (listed when the file has few distinct ones,
else ``dynamic_relations``, or a single relation when there is no relation column), stores and
checkpoint beside the config, and a small ComplEx model that trains in seconds to minutes.
Every key written has a one-line comment. The text is parsed back with the schema before it is
returned, so what ``init`` writes always loads.

The first line records a hash of the rest: a config ``init`` wrote and nobody edited since is
provably ours to replace (``--force``); an edited one is not.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from bigembed.config.loading import parse_config_dict
from bigembed.edgelists import EdgeFileShape, delimiter_name

MARK = "# bigembed init"
_MARK_LINE = re.compile(rf"^{MARK} sha256:([0-9a-f]{{16}})\n")
_PLAIN = re.compile(r"^[A-Za-z_][A-Za-z0-9_./-]*$")
_YAML_WORDS = {"true", "false", "yes", "no", "on", "off", "y", "n", "null", "none"}
COMMENT_COLUMN = 34
TEMPLATE_RELATION = "all_edges"
SINGLE_RELATION = "edge"
ENTITY_TYPE = "entity"


@dataclass(frozen=True)
class StarterPaths:
    """Where the config's stores and checkpoint go (as written in the config)."""

    entities: str
    edges: str
    model: str

    @classmethod
    def beside(cls, config: Path, cwd: Path) -> StarterPaths:
        """``DIR/NAME/{entities,edges,model}`` for the config ``DIR/NAME.yaml``, relative to
        ``cwd`` (where bigembed runs; PBG's rule) when below it, else absolute."""
        base = Path(os.path.abspath(config)).with_suffix("")
        try:
            shown = base.relative_to(Path(os.path.abspath(cwd)))
        except ValueError:
            shown = base
        return cls(*(str(shown / part) for part in ("entities", "edges", "model")))


def _scalar(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    text = str(value)
    if _PLAIN.match(text) and text.lower() not in _YAML_WORDS:
        return text
    return json.dumps(text, ensure_ascii=False)  # a JSON string is a YAML double-quoted one


class _Writer:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def comment(self, text: str = "", indent: str = "") -> None:
        wrapped = textwrap.wrap(text, 96, initial_indent=indent, subsequent_indent=indent + "  ")
        self.lines += [f"# {line}".rstrip() for line in wrapped or [""]]

    def blank(self) -> None:
        self.lines.append("")

    def key(self, indent: int, key: str, value: Any, comment: str) -> None:
        head = " " * indent + (f"{key}:" if value is ... else f"{key}: {_scalar(value)}")
        self.lines.append(f"{head.ljust(COMMENT_COLUMN - 1)} # {comment}")

    def raw(self, text: str, comment: str) -> None:
        self.lines.append(f"{text.ljust(COMMENT_COLUMN - 1)} # {comment}")


def _relations(w: _Writer, shape: EdgeFileShape) -> None:
    if shape.columns.rel is None:
        w.key(0, "relations", ..., "one relation: the file has no relation column")
        w.raw(f"  - name: {SINGLE_RELATION}", "its name (any): every edge has it")
        _relation_keys(w, "none", "score = dot(head, tail); complex_diagonal if direction matters")
        return
    if shape.more_relations:
        w.key(
            0,
            "relations",
            ...,
            "one template for every relation type of the data (see dynamic_relations)",
        )
        w.raw(f"  - name: {TEMPLATE_RELATION}", "the template's name (any)")
        _relation_keys(w, "complex_diagonal", "ComplEx: one parameter vector per relation type")
        w.key(
            0,
            "dynamic_relations",
            True,
            f"over {shape.relation_limit} distinct relations: import numbers them all",
        )
        w.key(0, "global_emb", False, "no shared bias vector (dynamic_relations needs false)")
        return
    counts = shape.relation_counts
    w.key(0, "relations", ..., f"the {len(counts)} distinct value(s) of the relation column")
    for i, (name, count) in enumerate(counts.items()):
        edges = f"{count:,} edge(s)"
        if i == 0:
            w.raw(f"  - name: {_scalar(name)}", f"as written in the file ({edges})")
            _relation_keys(w, "complex_diagonal", "ComplEx: symmetric, antisymmetric, inverse")
        else:
            item = (
                f"  - {{name: {_scalar(name)}, lhs: {ENTITY_TYPE}, rhs: {ENTITY_TYPE}, "
                f"operator: complex_diagonal}}"
            )
            w.raw(item, f"{edges}; keys as above")


def _relation_keys(w: _Writer, operator: str, why: str) -> None:
    w.key(4, "lhs", ENTITY_TYPE, "entity type of the heads")
    w.key(4, "rhs", ENTITY_TYPE, "entity type of the tails")
    w.key(4, "operator", operator, why)


def starter_config(shape: EdgeFileShape, paths: StarterPaths, *, config: str, command: str) -> str:
    """The commented YAML config for ``shape``, to be written at ``config`` (``command`` is
    the init command line, shown in the header)."""
    w = _Writer()
    w.comment(f"Written by `{command}`; edit freely (`bigembed config keys`: every key).")
    w.comment("Next, from this directory (paths are relative to where bigembed runs, as in PBG):")
    w.comment(f"  bigembed import {config} {shape.path}")
    w.comment(f"  bigembed train {config}")
    w.comment("For held-out edges to evaluate on, split first: docs/tutorial_csv.md.")
    w.comment()
    fmt = shape.fmt + (f" ({shape.compression})" if shape.compression else "")
    seen = [f"{shape.edges:,} edges", fmt]
    w.comment(f"What init saw in {shape.path}: {', '.join(seen)}.")
    for topic in ("delimiter", "header", "columns"):
        if topic in shape.why:
            w.comment(f"{topic}: {shape.why[topic]}", indent="  ")
    w.blank()
    w.key(0, "edge_files", ..., "how `bigembed import` reads the file (its flags override)")
    if shape.fmt != "parquet":
        header_why = "the first line names the columns" if shape.header else "no header line"
        w.key(2, "header", shape.header, header_why)
        assert shape.delimiter is not None
        w.key(2, "delimiter", shape.delimiter, f"{delimiter_name(shape.delimiter)}-separated")
    w.key(2, "lhs_col", shape.columns.lhs, "the head (source) of each edge")
    w.key(2, "rel_col", shape.columns.rel, "the relation (null: no relation column)")
    w.key(2, "rhs_col", shape.columns.rhs, "the tail (target) of each edge")
    w.blank()
    w.key(0, "entities", ..., "the kinds of node; one kind here, every head and tail name")
    w.key(2, ENTITY_TYPE, ..., "its name (any)")
    w.key(4, "num_partitions", 1, "1: all in memory; more (e.g. 8) for graphs that do not fit")
    _relations(w, shape)
    w.blank()
    w.key(0, "entity_path", paths.entities, "written by import: the entity names and counts")
    w.key(0, "edge_paths", ..., "written by import: one edge store per input file")
    w.raw(f"  - {_scalar(paths.edges)}", "training reads these")
    w.key(0, "checkpoint_path", paths.model, "written by train: the model's versions")
    w.blank()
    w.key(0, "dimension", 64, "embedding size: 64 trains fast; 200-400 for quality")
    w.key(0, "comparator", "dot", "score = dot product of the transformed embeddings")
    w.key(0, "loss_fn", "softmax", "softmax over the true tail and the negatives")
    w.key(0, "num_uniform_negs", 100, "negatives drawn uniformly per batch")
    w.key(0, "lr", 0.1, "Adagrad learning rate")
    w.key(0, "num_epochs", 10, "passes over the edges (train resumes where it stopped)")
    body = "\n".join(w.lines) + "\n"
    _check_loads(body, shape)
    digest = hashlib.sha256(body.encode("utf-8")).hexdigest()[:16]
    return f"{MARK} sha256:{digest}\n{body}"


def _check_loads(body: str, shape: EdgeFileShape) -> None:
    """The text parses with the schema, and says what was seen (a bug otherwise)."""
    cfg = parse_config_dict(yaml.safe_load(body), "<bigembed init>")
    if shape.columns.rel is not None and not shape.more_relations:
        assert [r.name for r in cfg.relations] == list(shape.relation_counts), "relation names"
    assert cfg.edge_files.delimiter == shape.delimiter or shape.fmt == "parquet"


def written_by_init(text: str) -> bool:
    """True when ``text`` is a config ``init`` wrote, unedited since (its hash matches)."""
    found = _MARK_LINE.match(text)
    if found is None:
        return False
    body = text[found.end() :]
    return hashlib.sha256(body.encode("utf-8")).hexdigest()[:16] == found.group(1)
