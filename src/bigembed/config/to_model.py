"""The model's part of the config: what the scoring model is built from, and what imported
relation ids index."""

from __future__ import annotations

from bigembed.config.schema import ConfigSchema
from bigembed.config.types import ALL_ENTITY_TRAIN_TYPES
from bigembed.model import ModelSpec, RelationSpec


def relation_list(cfg: ConfigSchema) -> list[str] | None:
    """What imported relation ids index: the names of ``relations`` in order, or None with
    ``dynamic_relations`` (ids then index the entity store's relation names)."""
    return None if cfg.dynamic_relations else [r.name for r in cfg.relations]


def model_spec(cfg: ConfigSchema, num_dynamic_relations: int = 0) -> ModelSpec:
    """What the scoring model is built from, taken from ``cfg``.

    ``num_dynamic_relations``: the number of relation types found in the data when
    ``dynamic_relations`` (ignored otherwise: the relations are the config's).
    """
    return ModelSpec(
        relations=tuple(
            RelationSpec(
                lhs=r.lhs,
                rhs=r.rhs,
                operator=r.operator,
                weight=r.weight,
                all_negs=r.all_negs or cfg.train_type in ALL_ENTITY_TRAIN_TYPES,
            )
            for r in cfg.relations
        ),
        entity_dims={etype: cfg.entity_dimension(etype) for etype in cfg.entities},
        comparator=cfg.comparator,
        bias=cfg.bias,
        loss=cfg.loss_fn,
        margin=cfg.margin,
        global_emb=cfg.global_emb,
        dynamic_relations=cfg.dynamic_relations,
        num_dynamic_relations=num_dynamic_relations if cfg.dynamic_relations else 0,
        max_norm=cfg.max_norm,
        regularization_coef=cfg.regularization_coef,
        compute_dtype=cfg.compute_dtype,
        relation_init_scale=cfg.relation_init_scale,
        seed=cfg.seed,
        entity_dropout=cfg.entity_dropout,
        relation_dropout=cfg.relation_dropout,
        relation_prediction_weight=cfg.relation_prediction_weight,
        regularizer=cfg.regularizer,
    )
