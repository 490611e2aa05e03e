"""Fresh trainers and tables for the tests that compare one BatchTrainer.step against a
reference update computed by hand (test_all_entities, test_kvsall)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from bigembed.kernels.step import BatchTrainer, Table
from bigembed.model import NegativeSettings, ScoringModel
from bigembed.model.spec import ModelSpec, RelationSpec

#: no sampled negatives: the steps under test score against every entity
NO_NEGATIVES = NegativeSettings(num_batch_negs=0, num_uniform_negs=0, uniform_group=8)


def fresh_trainer(spec: ModelSpec) -> Callable[[], BatchTrainer]:
    """Each call: the same model (seed 5), zero Adagrad states, lr 0.1 for rows and relations."""

    def make() -> BatchTrainer:
        torch.manual_seed(5)
        model = ScoringModel(spec)
        states = [torch.zeros_like(p) for p in model.parameters()]
        return BatchTrainer(model, states, NO_NEGATIVES, 0.1, 0.1, torch.Generator().manual_seed(0))

    return make


def fresh_tables(
    emb_l: torch.Tensor, emb_r: torch.Tensor, shared: bool
) -> Callable[[], tuple[Table, Table]]:
    """Each call: copies of the two tables with zero Adagrad states (``shared``: one table is
    both sides)."""

    def make() -> tuple[Table, Table]:
        lhs = Table(emb_l.clone(), torch.zeros(emb_l.shape[0]))
        rhs = lhs if shared else Table(emb_r.clone(), torch.zeros(emb_r.shape[0]))
        return lhs, rhs

    return make


def perturbed_model(
    operator: str,
    comparator: str = "dot",
    loss: str = "softmax",
    dynamic: bool = True,
    num_dynamic_relations: int = 3,
    **spec_fields: Any,
) -> ScoringModel:
    """A one-type all-entity model (d=8, N3 0.01; ``spec_fields``: other ModelSpec fields)
    whose parameters are moved off their initial values (seed 0), so the operators are not
    the identity in the comparisons."""
    spec = ModelSpec(
        relations=(RelationSpec("e", "e", operator, all_negs=True),),
        entity_dims={"e": 8},
        comparator=comparator,
        loss=loss,
        regularization_coef=0.01,
        global_emb=not dynamic,
        dynamic_relations=dynamic,
        num_dynamic_relations=num_dynamic_relations,
        **spec_fields,
    )
    torch.manual_seed(0)
    model = ScoringModel(spec)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    return model
