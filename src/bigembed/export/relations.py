"""Relation parameters of a trained model, one record per (relation, side, parameter).

The records follow PyTorch-BigGraph's relation export: in standard mode each relation's rhs
operator parameters; with dynamic relations the lhs and rhs operators' rows of each relation,
under PBG's parameter names (``diagonals``, ``translations``, ... for dynamic operators).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from bigembed.checkpoints import TrainedModel
from bigembed.model import pbg_param_name


@dataclass
class RelationParam:
    relation: str
    side: str  # "lhs" or "rhs": which side's operator
    operator: str
    param: str  # PBG's parameter name
    values: np.ndarray  # float32, the parameter's own shape

    @property
    def shape_text(self) -> str:
        """PBG's shape notation: dimensions joined by ``x`` (``400``, ``400x400``)."""
        return "x".join(str(d) for d in self.values.shape)


def relation_params(trained: TrainedModel) -> list[RelationParam]:
    """Every operator parameter of the model, in PBG's export order."""
    cfg = trained.config
    model = trained.model
    out: list[RelationParam] = []
    if cfg.dynamic_relations:
        operator = cfg.relations[0].operator
        names = trained.relation_names
        for side, op in (("lhs", model.lhs_operators[0]), ("rhs", model.rhs_operators[0])):
            for pname, param in op.named_parameters():
                rows = param.detach().numpy()
                for rname, row in zip(names, rows, strict=True):
                    out.append(
                        RelationParam(
                            rname,
                            side,
                            operator,
                            pbg_param_name(pname, True),
                            np.array(row, dtype=np.float32),
                        )
                    )
        return out
    for rcfg, op in zip(cfg.relations, model.rhs_operators, strict=True):
        for pname, param in op.named_parameters():
            out.append(
                RelationParam(
                    rcfg.name,
                    "rhs",
                    rcfg.operator,
                    pname,
                    np.array(param.detach().numpy(), dtype=np.float32),
                )
            )
    return out
