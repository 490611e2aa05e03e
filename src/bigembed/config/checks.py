"""The config's cross-field checks: what no single key can get wrong, found at load time.

PBG makes several of these checks only at runtime (same-side partition counts, ``global_emb``
with dynamic relations, even dimensions for ``complex_diagonal``, N3 with ``linear``/``affine``);
here a config that would fail mid-run fails to load, with one ``key.path: message`` line per
problem. Each check is a function of the config returning its lines; :data:`CROSS_FIELD_CHECKS`
runs them in order. :func:`config_warnings` lists the settings that are accepted but warned
about.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from bigembed.config.pbg_keys import IGNORED_KEYS
from bigembed.config.types import ALL_ENTITY_TRAIN_TYPES, TRAIN_TYPE_NAMES

if TYPE_CHECKING:
    from bigembed.config.schema import ConfigSchema

#: A check: the problems it finds in a config, as ``key.path: message`` lines.
Check = Callable[["ConfigSchema"], list[str]]


def entity_references(cfg: ConfigSchema) -> list[str]:
    """Every relation side names a known entity type."""
    problems: list[str] = []
    known = ", ".join(sorted(cfg.entities))
    for i, rel in enumerate(cfg.relations):
        for side in ("lhs", "rhs"):
            etype = getattr(rel, side)
            if etype not in cfg.entities:
                problems.append(
                    f"relations[{i}].{side}: unknown entity type {etype!r} (known: {known})"
                )
    return problems


def dynamic_relations(cfg: ConfigSchema) -> list[str]:
    """Dynamic relations: one template relation and no global embeddings."""
    problems: list[str] = []
    if cfg.dynamic_relations and len(cfg.relations) != 1:
        problems.append(
            f"relations: dynamic_relations: true needs exactly one relation (the template for "
            f"all relation types), got {len(cfg.relations)}"
        )
    if cfg.dynamic_relations and cfg.global_emb:
        problems.append(
            "global_emb: global embeddings are not supported with dynamic_relations: true; "
            "set global_emb: false"
        )
    return problems


def kvsall_needs(cfg: ConfigSchema) -> list[str]:
    """``train_type: KvsAll`` needs dynamic relations, the softmax loss and a dot-product
    comparator (the first unmet need is reported)."""
    if cfg.train_type != "kvsall":
        return []
    needs = {
        "dynamic_relations": cfg.dynamic_relations,
        "loss_fn": cfg.loss_fn == "softmax",
        "comparator": cfg.comparator in ("dot", "cos"),
    }
    for key, ok in needs.items():
        if not ok:
            return [
                f"{key}: train_type: KvsAll needs dynamic_relations: true, loss_fn: softmax "
                f"and comparator: dot or cos (got {key}: {getattr(cfg, key)}); use "
                f"train_type: 1vsAll otherwise"
            ]
    return []


def all_entity_partitions(cfg: ConfigSchema) -> list[str]:
    """Training types that score every entity of a type need types of one partition (the
    first relation side in the way is reported)."""
    if cfg.train_type not in ALL_ENTITY_TRAIN_TYPES:
        return []
    for i, rel in enumerate(cfg.relations):
        for side in ("lhs", "rhs"):
            etype = getattr(rel, side)
            parts = cfg.entities[etype].num_partitions
            if parts > 1:
                return [
                    f"train_type: {TRAIN_TYPE_NAMES[cfg.train_type]} scores every entity "
                    f"of a type and needs entity types of one partition, but "
                    f"relations[{i}].{side} type {etype!r} has num_partitions: {parts}; "
                    f"set it to 1 or use train_type: negative_sampling"
                ]
    return []


def negatives_left(cfg: ConfigSchema) -> list[str]:
    """At least one side is corrupted."""
    if cfg.disable_lhs_negs and cfg.disable_rhs_negs:
        return [
            "disable_rhs_negs: cannot be true together with disable_lhs_negs: true "
            "(no negatives would be left)"
        ]
    return []


def featurized_types(cfg: ConfigSchema) -> list[str]:
    """Featurized types: unpartitioned and trained on one machine (the bags are local)."""
    problems: list[str] = []
    for name, entity in cfg.entities.items():
        if not entity.featurized:
            continue
        if entity.num_partitions != 1:
            problems.append(
                f"entities.{name}.featurized: a featurized type must be unpartitioned "
                f"(num_partitions: 1, not {entity.num_partitions}); see docs/featurized.md"
            )
        if cfg.num_machines > 1:
            problems.append(
                f"entities.{name}.featurized: featurized types train on one machine "
                "(num_machines: 1) in this version; see docs/featurized.md"
            )
        if "old_entities" in cfg.growth.freeze:
            problems.append(
                f"growth.freeze: old_entities cannot hold with the featurized type '{name}' (its "
                "old and new entities share feature rows); drop old_entities from growth.freeze"
            )
    return problems


def distributed_settings(cfg: ConfigSchema) -> list[str]:
    """Several machines: an init method; data-parallel replicas without partition servers."""
    problems: list[str] = []
    if cfg.num_machines > 1 and not cfg.distributed_init_method:
        problems.append(
            "distributed_init_method: required when num_machines > 1 "
            "(e.g. tcp://HOST:PORT or file:///shared/path)"
        )
    if cfg.distributed_mode == "data_parallel" and cfg.num_partition_servers > 0:
        problems.append(
            "num_partition_servers: data_parallel replicas keep their own copy of the tables "
            "and need no partition servers; set num_partition_servers: -1 (or 0)"
        )
    return problems


def unique_relation_names(cfg: ConfigSchema) -> list[str]:
    """Standard mode: relation names are unique (imported edges name their relation)."""
    if cfg.dynamic_relations:
        return []
    problems: list[str] = []
    seen: dict[str, int] = {}
    for i, rel in enumerate(cfg.relations):
        if rel.name in seen:
            problems.append(
                f"relations[{i}].name: duplicate relation name {rel.name!r} "
                f"(also relations[{seen[rel.name]}])"
            )
        seen.setdefault(rel.name, i)
    return problems


def relation_operands(cfg: ConfigSchema) -> list[str]:
    """Per relation: both sides have one dimension, and its operator fits them
    (``complex_diagonal``: even) and the N3 regularizer (not ``linear``/``affine``)."""
    problems: list[str] = []

    def dim_source(etype: str) -> str:
        own = cfg.entities[etype].dimension
        return f"entities.{etype}.dimension" if own is not None else "dimension"

    for i, rel in enumerate(cfg.relations):
        ldim, rdim = cfg.entity_dimension(rel.lhs), cfg.entity_dimension(rel.rhs)
        if ldim != rdim:
            problems.append(
                f"relations[{i}]: lhs type {rel.lhs!r} has dimension {ldim} ({dim_source(rel.lhs)})"
                f" but rhs type {rel.rhs!r} has dimension {rdim} ({dim_source(rel.rhs)}); "
                f"they must be equal"
            )
        if rel.operator == "complex_diagonal":
            for etype in dict.fromkeys((rel.lhs, rel.rhs)):
                dim = cfg.entity_dimension(etype)
                if dim % 2:
                    problems.append(
                        f"relations[{i}].operator: complex_diagonal needs an even dimension, "
                        f"but entity type {etype!r} has {dim} ({dim_source(etype)})"
                    )
        if cfg.regularization_coef > 0 and rel.operator in ("linear", "affine"):
            problems.append(
                f"regularization_coef: the N3 regularizer does not support operator "
                f"{rel.operator!r} (relations[{i}].operator); set regularization_coef: 0 or use "
                f"none, translation, diagonal or complex_diagonal"
            )
    return problems


def dropout_needs_dynamic(cfg: ConfigSchema) -> list[str]:
    """Entity and relation dropout act on a query's side: dynamic relations only."""
    return [
        f"{key}: applies to the query side of an edge, which needs "
        f"dynamic_relations: true (one operator per direction); set {key}: 0"
        for key in ("entity_dropout", "relation_dropout")
        if getattr(cfg, key) > 0 and not cfg.dynamic_relations
    ]


def relation_prediction_needs(cfg: ConfigSchema) -> list[str]:
    """``relation_prediction_weight`` acts in the all-entity softmax training of dynamic
    relations (train_type 1vsAll/KvsAll, loss_fn: softmax, comparator: dot or cos)."""
    if cfg.relation_prediction_weight == 0:
        return []
    ok = (
        cfg.train_type in ALL_ENTITY_TRAIN_TYPES
        and cfg.dynamic_relations
        and cfg.loss_fn == "softmax"
        and cfg.comparator in ("dot", "cos")
    )
    if ok:
        return []
    return [
        "relation_prediction_weight: needs train_type: 1vsAll or KvsAll, dynamic_relations: "
        "true, loss_fn: softmax and comparator: dot or cos; set relation_prediction_weight: 0"
    ]


def same_side_partitions(cfg: ConfigSchema) -> list[str]:
    """The partitioned entity types on one side of the relations share one partition count
    (the first mismatch per side is reported)."""
    problems: list[str] = []
    for side in ("lhs", "rhs"):
        first: tuple[str, int, int] | None = None  # (type, partitions, relation index)
        for i, rel in enumerate(cfg.relations):
            etype = getattr(rel, side)
            parts = cfg.entities[etype].num_partitions
            if parts == 1:
                continue
            if first is None:
                first = (etype, parts, i)
            elif parts != first[1]:
                problems.append(
                    f"relations[{i}].{side}: entity type {etype!r} has {parts} partitions but "
                    f"{first[0]!r} (relations[{first[2]}].{side}) has {first[1]}; all partitioned "
                    f"entity types on the same side must share one num_partitions"
                )
                break
    return problems


#: The checks in the order their lines are reported, each with whether a problem it finds
#: ends the checking: the checks after :func:`entity_references` look entity types up, and a
#: training type's unmet need is reported alone.
CROSS_FIELD_CHECKS: tuple[tuple[Check, bool], ...] = (
    (entity_references, True),
    (dynamic_relations, False),
    (kvsall_needs, True),
    (all_entity_partitions, True),
    (negatives_left, False),
    (distributed_settings, False),
    (unique_relation_names, False),
    (relation_operands, False),
    (dropout_needs_dynamic, False),
    (relation_prediction_needs, False),
    (same_side_partitions, False),
    (featurized_types, False),
)


def cross_field_problems(cfg: ConfigSchema) -> list[str]:
    """Every cross-field inconsistency, as ``key.path: message`` lines."""
    problems: list[str] = []
    for check, final in CROSS_FIELD_CHECKS:
        found = check(cfg)
        problems.extend(found)
        if final and found:
            break
    return problems


def config_warnings(cfg: ConfigSchema) -> list[str]:
    """Settings that are accepted but deserve a warning, as ``key: message`` lines."""
    fields = type(cfg).model_fields
    out: list[str] = []
    for key, reason in IGNORED_KEYS.items():
        default = fields[key].default
        value = getattr(cfg, key)
        if value != default:
            out.append(
                f"{key}: {value} is accepted for PBG compatibility and ignored ({reason}); "
                f"remove it or set it to the default {default}"
            )
    if cfg.num_machines == 1 and cfg.distributed_mode != fields["distributed_mode"].default:
        out.append(
            f"distributed_mode: {cfg.distributed_mode} is ignored with num_machines: 1 (one "
            "machine trains every bucket itself)"
        )
    partitioned = cfg.distributed_mode == "partitioned"
    if cfg.num_machines > 1 and partitioned and cfg.bucket_order != fields["bucket_order"].default:
        out.append(
            f"bucket_order: {cfg.bucket_order} is ignored with num_machines > 1 (the lock server "
            "chooses the buckets, as in PBG)"
        )
    if cfg.num_machines == 1 and cfg.num_partition_servers > 0:
        out.append(
            "num_partition_servers: ignored with num_machines: 1 (partition servers only serve "
            "distributed runs)"
        )
    if cfg.background_io:
        out.append("background_io: deprecated and has no effect")
    if cfg.loss_fn == "logistic" and cfg.comparator == "cos":
        out.append(
            "loss_fn: the logistic loss with the cos comparator learns poorly (scores are "
            "bounded to [-1, 1]); consider comparator: dot"
        )
    return out
