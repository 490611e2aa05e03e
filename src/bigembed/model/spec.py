"""What the scoring model is built from: a small, frozen description, independent of any config.

:class:`ModelSpec` holds exactly what :class:`bigembed.model.scoring.ScoringModel` and the code
driving it need to know about the model (relations, dimensions, comparator, loss, ...), nothing
about paths, epochs or workers. The job config builds one (``bigembed.config.model_spec``); tests
and tools may build one directly. Names are those of :mod:`bigembed.model.names`; an unknown
name fails when the model is built (``unknown operator 'x' (known: ...)``).

Torch-free, so the config layer can build specs without loading torch. Specs pickle (they travel
with the model to Hogwild workers).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class RelationSpec:
    """One relation type of the model (in dynamic mode: the template of all of them)."""

    lhs: str  # entity type of the left-hand side
    rhs: str  # entity type of the right-hand side
    operator: str = "none"  # a name of OPERATOR_NAMES; transforms the rhs (dynamic: both sides)
    weight: float = 1.0  # multiplier of this relation's loss
    all_negs: bool = False  # every entity of the partition is a negative (no sampling)


@dataclass(frozen=True)
class ModelSpec:
    """Everything the scoring model is built from.

    ``entity_dims`` maps every entity type to its embedding dimension (in the order global
    embeddings are created). ``num_dynamic_relations`` is the number of relation types sharing
    the single template relation when ``dynamic_relations``; it is ignored otherwise.
    """

    relations: tuple[RelationSpec, ...]
    entity_dims: dict[str, int] = field(hash=False)
    comparator: str = "cos"  # a name of COMPARATOR_NAMES
    bias: bool = False  # coordinate 0 is an additive bias, not compared
    loss: str = "ranking"  # a name of LOSS_NAMES
    margin: float = 0.1  # of the ranking loss
    global_emb: bool = True  # one learned vector per entity type added to its embeddings
    dynamic_relations: bool = False
    num_dynamic_relations: int = 0
    max_norm: float | None = None  # embedding rows are renormalised to this norm when gathered
    regularization_coef: float = 0.0  # weight of the N3 regulariser (0 = off)
    # a name of COMPUTE_DTYPES, or "auto" (bigembed.model.dtype_choice): dtype of the score
    # products (the config's default is "auto"; a spec built directly gets float32)
    compute_dtype: str = "float32"
    # None: operators start as the identity (PBG); a number: their parameters start N(0, s^2)
    relation_init_scale: float | None = None
    seed: int = 0  # seeds the random operator initialization (relation_init_scale)
    # Training only: each coordinate of a query's given entity (the anchor side, before its
    # operator) is zeroed with this probability, the others scaled by 1 / (1 - p).
    entity_dropout: float = 0.0
    # Training only: the same on the relation operator's parameters picked for each query.
    relation_dropout: float = 0.0
    # Training with all-entity softmax (1vsAll/KvsAll), dynamic relations: weight of the
    # relation-prediction cross-entropy of each edge (h, ?, t) over all relation types (0 = off).
    relation_prediction_weight: float = 0.0
    # "N3": PBG's terms (the anchor side after its operator); "N3_factors": Lacroix et al.'s
    # (entity, relation and entity each on its own).
    regularizer: str = "N3"

    @property
    def num_relations(self) -> int:
        """Relation types the model scores: the dynamic count, else one per relation."""
        return self.num_dynamic_relations if self.dynamic_relations else len(self.relations)

    def relation(self, relation_idx: int) -> RelationSpec:
        """The relation ``relation_idx`` (dynamic mode: the template every id shares)."""
        return self.relations[0 if self.dynamic_relations else relation_idx]

    def dimension(self, entity_type: str) -> int:
        """Embedding dimension of ``entity_type``."""
        return self.entity_dims[entity_type]
