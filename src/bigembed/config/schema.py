"""The typed training configuration: PyTorch-BigGraph's schema, validated early.

Every key of PBG's ``ConfigSchema`` exists here with PBG's name, type, default and meaning, so
a PBG config loads unchanged (YAML, TOML, JSON, or PBG's own Python format). Differences, all
in the direction of failing early with a clear message instead of crashing mid-run:

* operators are validated at load time (PBG waits for model build);
* checks PBG only makes at runtime (same-side partition counts, ``global_emb`` with dynamic
  relations, even dimensions for ``complex_diagonal``, N3 with ``linear``/``affine``) run here
  (:mod:`bigembed.config.checks`);
* ``num_gpus > 0`` and ``half_precision`` are rejected (CPU only); PBG's partition-server
  tuning keys are accepted and ignored, with a warning when changed.
  :mod:`bigembed.config.pbg_keys` lists every key that behaves differently.

bigembed-only keys: ``seed``, ``compute_dtype``, ``distributed_timeout``, the ``communication``
section and others (see their descriptions). The nested sections are
:mod:`bigembed.config.sections`; value parsing :mod:`bigembed.config.types`; reading files and
``-p`` overrides :mod:`bigembed.config.loading`.
"""

from __future__ import annotations

import os
import re
from typing import Annotated, Literal

from pydantic import BaseModel, Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from bigembed.config.checks import cross_field_problems
from bigembed.config.keys import mixed_case_to_snake
from bigembed.config.sections import (
    MODEL_CONFIG,
    CommunicationSchema,
    EarlyStoppingSchema,
    EdgeFilesSchema,
    EntitySchema,
    GrowthSchema,
    RelationSchema,
    TuneSchema,
)
from bigembed.config.types import (
    TRAIN_TYPES,
    Bool,
    BucketOrder,
    Bytes,
    ComparatorName,
    ComputeDtypeName,
    DistributedMode,
    Float,
    Int,
    LoadBalancing,
    LossName,
    OneOf,
    Regularizer,
)

NUM_GPUS_MESSAGE = (
    "bigembed trains on CPU only (no GPU support); set num_gpus: 0 and use workers for CPU "
    "parallelism"
)
HALF_PRECISION_MESSAGE = (
    "PBG's fp16 GPU matmuls are not supported (bigembed trains on CPU only); set "
    "half_precision: false and use compute_dtype: bfloat16 for reduced-precision compute"
)


class ConfigSchema(BaseModel):
    """The whole training configuration (PBG's ``ConfigSchema`` plus a few bigembed keys)."""

    model_config = MODEL_CONFIG

    # ---- model
    entities: dict[str, EntitySchema] = Field(
        min_length=1, description="Entity types, by name (at least one)."
    )
    relations: list[RelationSchema] = Field(
        min_length=1, description="Relation types (at least one); a relation's id is its index."
    )
    dimension: Int = Field(
        gt=0, description="Embedding dimension (per-type override: entities.TYPE.dimension)."
    )
    init_scale: Float = Field(
        default=1e-3, gt=0, description="Std-dev of the normal random initialization of embeddings."
    )
    max_norm: Float | None = Field(
        default=None, gt=0, description="Renormalize embedding rows whose norm exceeds this."
    )
    global_emb: Bool = Field(
        default=True,
        description="Add a learned per-entity-type vector to every embedding "
        "(must be false with dynamic_relations).",
    )
    comparator: ComparatorName = Field(
        default="cos",
        description="How lhs and transformed rhs are scored.",
    )
    bias: Bool = Field(
        default=False,
        description="Use the first embedding coordinate as an additive bias instead of "
        "comparing it.",
    )
    loss_fn: LossName = Field(
        default="ranking",
        description="Loss over each positive and its negatives (ranking uses margin).",
    )
    margin: Float = Field(default=0.1, description="Margin of the ranking loss.")
    regularization_coef: Float = Field(
        default=0.0, ge=0, description="Weight of the N3 regularizer (0 = off)."
    )
    regularizer: Regularizer = Field(
        default="N3",
        description="Regularizer: N3 (PBG's: the cubed magnitudes of each edge's entities, one "
        "of them after its relation operator, and of the operator's parameters) or N3_factors "
        "(bigembed only: Lacroix et al. 2018's form, entity, relation and entity each on its "
        "own, as ComplEx-N3 and LibKGE penalise them).",
    )
    entity_dropout: Float = Field(
        default=0.0,
        ge=0,
        lt=1,
        description="bigembed only: in training, each coordinate of a query's given entity (the "
        "side that is not ranked, before its relation operator) is zeroed with this probability "
        "and the others scaled by 1/(1-p) (LibKGE's entity dropout on the query side; the "
        "ranked candidates are left alone); never in evaluation. Needs dynamic_relations.",
    )
    relation_prediction_weight: Float = Field(
        default=0.0,
        ge=0,
        description="bigembed only: weight of the relation-prediction auxiliary objective (Chen "
        "et al. 2021) in train_type 1vsAll/KvsAll: each training edge (h, r, t) also adds this "
        "weight times the softmax cross-entropy of r among all relation types scored for "
        "(h, ?, t) (the tail-query operator of every relation applied to h, compared with t). "
        "0 = off. Needs dynamic_relations, loss_fn: softmax and comparator dot or cos; costs "
        "one (edges x relations x dimension) product per batch.",
    )
    relation_dropout: Float = Field(
        default=0.0,
        ge=0,
        lt=1,
        description="bigembed only: in training, each parameter of the relation operator picked "
        "for a query (complex_diagonal: real and imaginary parts) is zeroed with this "
        "probability and the others scaled by 1/(1-p) (LibKGE's relation dropout); never in "
        "evaluation. Needs dynamic_relations.",
    )

    # ---- data / IO
    entity_path: str = Field(
        min_length=1,
        description="Directory with the entity counts and names written by the importer.",
    )
    edge_paths: list[Annotated[str, Field(min_length=1)]] = Field(
        min_length=1,
        description="Directories with bucketed edges; each epoch trains them in order.",
    )
    checkpoint_path: str = Field(
        min_length=1,
        description="Directory for checkpoints; an existing checkpoint there is resumed.",
    )
    init_path: str | None = Field(
        default=None,
        description="Checkpoint-format directory with initial embeddings/model, used when "
        "checkpoint_path has none.",
    )
    checkpoint_preservation_interval: Int | None = Field(
        default=None,
        gt=0,
        description="Every this many epochs keep a snapshot of the checkpoint (epoch_N/).",
    )

    # ---- training
    num_epochs: Int = Field(default=1, ge=0, description="Passes over all edge paths.")
    num_edge_chunks: Int | None = Field(
        default=None,
        gt=0,
        description="Split each bucket into this many chunks; null = computed from "
        "max_edges_per_chunk.",
    )
    max_edges_per_chunk: Int = Field(
        default=1_000_000_000,
        gt=0,
        description="Upper bound on edges per chunk, used to compute num_edge_chunks.",
    )
    bucket_order: BucketOrder = Field(
        default="inside_out",
        description="Order of buckets within a pass: random, affinity, inside_out, outside_in, "
        "or buffer (bigembed only: few swaps for the partitions memory_budget holds; with "
        "partition_prefetch staggered so the partition leaving at each swap is written back "
        "and its successor read while training goes on, else BETA) (single machine).",
    )
    load_balancing: LoadBalancing = Field(
        default="cost",
        description="How work is balanced: cost = by a per-bucket cost model (edges x per-edge "
        "cost of their relations): the lock server grants the costliest work on the busiest "
        "partitions first and Hogwild workers take batches from a shared queue; pbg = PBG's "
        "schedule (grants by partition affinity then edge count, even slices per worker).",
    )
    workers: Int | None = Field(
        default=None,
        gt=0,
        description="Hogwild worker processes; null = number of CPUs.",
    )
    batch_size: Int = Field(default=1000, gt=0, description="Edges per training batch.")
    num_batch_negs: Int = Field(
        default=50,
        ge=0,
        description="Negatives taken from the other edges of the batch (chunk size).",
    )
    num_uniform_negs: Int = Field(
        default=50, ge=0, description="Negatives sampled uniformly from the partition per chunk."
    )
    disable_lhs_negs: Bool = Field(default=False, description="Do not corrupt the lhs side.")
    disable_rhs_negs: Bool = Field(default=False, description="Do not corrupt the rhs side.")
    lr: Float = Field(
        default=0.01,
        ge=0,
        description="Adagrad learning rate of embeddings (and relations if relation_lr is null).",
    )
    relation_lr: Float | None = Field(
        default=None,
        ge=0,
        description="Adagrad learning rate of relation parameters; null = lr.",
    )
    relation_init_scale: Float | None = Field(
        default=None,
        gt=0,
        description="bigembed only: null = PBG's initialization of relation operators (the "
        "identity: diagonal 1, complex_diagonal 1 + 0i, linear I, translation 0); a number = "
        "every operator parameter drawn from N(0, scale^2), reproducible from seed (as "
        "ComplEx-N3 and LibKGE start; with softmax over all entities the identity makes each "
        "query entity its own best answer at the start: docs/choosing_a_model.md).",
    )

    # ---- eval during training
    eval_fraction: Float = Field(
        default=0.05,
        ge=0,
        lt=1,
        description="Fraction of each bucket chunk held out to evaluate before/after training it.",
    )
    eval_num_batch_negs: Int | None = Field(
        default=1000, ge=0, description="num_batch_negs used by that evaluation (null = same)."
    )
    eval_num_uniform_negs: Int | None = Field(
        default=1000, ge=0, description="num_uniform_negs used by that evaluation (null = same)."
    )

    # ---- misc / expert
    background_io: Bool = Field(default=False, description="Deprecated, has no effect.")
    verbose: Int = Field(default=0, ge=0, le=1, description="0 = INFO logging, 1 = DEBUG.")
    hogwild_delay: Float = Field(
        default=2.0,
        ge=0,
        description="Seconds by which all but the first Hogwild worker are delayed in the "
        "first epoch.",
    )
    dynamic_relations: Bool = Field(
        default=False,
        description="One template relation; the number of relation types comes from the data "
        "and batches mix them.",
    )

    # ---- distributed
    num_machines: Int = Field(default=1, gt=0, description="Number of trainer machines.")
    distributed_mode: DistributedMode = Field(
        default="partitioned",
        description="bigembed only: partitioned (PBG: trainers train disjoint buckets under "
        "partition locks; needs about 2 partitions per trainer to keep them busy) or "
        "data_parallel (Bagua, DGL-KE: every trainer trains its share of the same bucket's "
        "edges, split by communication.edge_split, and communication.strategy keeps every "
        "parameter in step, entity embeddings included; for graphs with few partitions). "
        "See docs/distributed.md.",
    )
    num_partition_servers: Int = Field(
        default=-1,
        ge=-1,
        description="-1: each trainer runs one; 0: swap partitions via the checkpoint "
        "directory; N > 0: N external partition servers.",
    )
    distributed_init_method: str | None = Field(
        default=None,
        description="torch.distributed init URI (tcp://HOST:PORT, file://PATH, env://); "
        "required when num_machines > 1.",
    )
    distributed_tree_init_order: Bool = Field(
        default=True,
        description="First pass: only hand out buckets touching partitions already initialized.",
    )
    num_groups_for_partition_server: Int = Field(
        default=16,
        ge=1,
        description="PBG: gloo groups striping partition transfers. Accepted for PBG "
        "compatibility and ignored (bigembed's transfers need no striping); warns if changed.",
    )
    num_groups_per_sharded_partition_server: Int = Field(
        default=1,
        ge=1,
        description="PBG: data groups per partition server in sharded mode. Accepted for PBG "
        "compatibility and ignored (no sharded mode); warns if changed.",
    )
    partition_shard_size: Int = Field(
        default=250,
        gt=0,
        description="PBG: shard size in MiB in sharded partition-server mode. Accepted for PBG "
        "compatibility and ignored (partitions move whole); warns if changed.",
    )

    # ---- GPU
    num_gpus: Int = Field(
        default=0,
        ge=0,
        description="PBG: GPUs to train on. bigembed trains on CPU only: must be 0.",
    )
    half_precision: Bool = Field(
        default=False,
        description="PBG: fp16 comparator matmuls on GPU. Not supported: must be false; use "
        "compute_dtype: bfloat16 for reduced-precision compute on CPU.",
    )

    # ---- bigembed-only
    seed: Int = Field(
        default=0,
        ge=0,
        description="bigembed only: seed of partition assignment, bucket orders and shuffles.",
    )
    compute_dtype: ComputeDtypeName = Field(
        default="auto",
        description="bigembed only: dtype of the score products: auto = bfloat16 where the CPU "
        "has bf16 matrix units and they measure faster (AVX-512 BF16, AMX), else float32 "
        "(decided once per machine, cached); or float32 / bfloat16 (master weights and "
        "Adagrad state stay float32).",
    )
    kernel: Annotated[str, OneOf(("auto", "native", "eager"))] = Field(
        default="auto",
        description="bigembed only: the training step's kernel: auto = the native C++ kernel "
        "where the model allows it and it can be built (else eager, saying why), native = fail "
        "if it cannot run, eager = torch operations only (README, Native kernels).",
    )
    uniform_negs_group: Int | None = Field(
        default=None,
        gt=0,
        description="bigembed only: positives that share one draw of uniform negatives. None = "
        "the whole batch (one large matrix product per side, near the matmul peak); set it to "
        "num_batch_negs for PBG's per-chunk draws.",
    )
    self_negative: bool | Literal["auto"] = Field(
        default="auto",
        description="bigembed only: in sampled training, score each edge's query entity as one "
        "more negative of the other side (the head when corrupting the tail, the tail when "
        "corrupting the head; masked where it is the true answer, h == t). auto = on for "
        "relations whose lhs and rhs entity types are the same.",
    )
    train_type: Annotated[str, OneOf(TRAIN_TYPES)] = Field(
        default="negative_sampling",
        description="bigembed only: negative_sampling (PBG's batch and uniform negatives) or "
        "1vsAll (LibKGE's name, case-insensitive): each edge's corrupted sides are scored "
        "against every entity of their type, softmax over all of them (all_negs on every "
        "relation); needs entity types of one partition. KvsAll: the same loss computed "
        "once per distinct query (h, r, ?) / (?, r, t) of a batch, every true answer of its "
        "edges a positive (batches of one side, edges grouped by query: one product per "
        "query, not per edge); needs dynamic_relations, loss_fn softmax and comparator dot or "
        "cos.",
    )
    distributed_timeout: Float = Field(
        default=60.0,
        gt=0,
        description="bigembed only: seconds before a silent distributed peer is declared dead.",
    )
    memory_budget: Bytes | None = Field(
        default=None,
        gt=0,
        description="bigembed only: memory a single-machine run may use, in bytes or with a "
        "unit (2.5GB, 800MiB); it holds as many partitions as fit (docs/training.md, memory "
        "model). null = half the memory available when training starts (MemAvailable, or the "
        "cgroup limit if lower).",
    )
    partition_prefetch: Bool = Field(
        default=True,
        description="bigembed only: read the next bucket's partitions and write evicted ones "
        "back in background threads while a bucket trains. One machine: when the memory "
        "budget holds more than one bucket's partitions; the next bucket's edges are also "
        "read, shuffled and planned in the background (same edges, same order). "
        "Distributed: the lock server grants one bucket ahead and a partition is released "
        "only once written back "
        "(docs/distributed.md).",
    )
    communication: CommunicationSchema = Field(
        default_factory=CommunicationSchema,
        description="bigembed only: how the distributed mode communicates (strategy, "
        "precisions: see the communication.* keys and docs/distributed.md).",
    )
    early_stopping: EarlyStoppingSchema | None = Field(
        default=None,
        description="bigembed only: evaluate on validation edges every few epochs, keep the "
        "best version in checkpoint_path/best/, stop when it stops improving (see the "
        "early_stopping.* keys and docs/training.md).",
    )
    tune: TuneSchema | None = Field(
        default=None,
        description="bigembed only: the search space of `bigembed tune` (see the tune.* keys "
        "and docs/tuning.md); ignored by train.",
    )

    growth: GrowthSchema = Field(
        default_factory=GrowthSchema,
        description="bigembed only: how training continues a model whose entity store was "
        "extended with import --extend (new rows' init, what is frozen: see the growth.* keys "
        "and docs/growing.md).",
    )
    edge_files: EdgeFilesSchema = Field(
        default_factory=EdgeFilesSchema,
        description="bigembed only: how `bigembed import` reads the edge list files (header, "
        "delimiter, columns: see the edge_files.* keys); its flags override these.",
    )
    _norm = model_validator(mode="before")(mixed_case_to_snake)

    @field_validator("num_gpus")
    @classmethod
    def _no_gpus(cls, value: int) -> int:
        if value > 0:
            raise PydanticCustomError("unsupported", NUM_GPUS_MESSAGE)
        return value

    @field_validator("half_precision")
    @classmethod
    def _no_half_precision(cls, value: bool) -> bool:
        if value:
            raise PydanticCustomError("unsupported", HALF_PRECISION_MESSAGE)
        return value

    @field_validator("entities")
    @classmethod
    def _entity_names(cls, value: dict[str, EntitySchema]) -> dict[str, EntitySchema]:
        for name in value:
            if not name or name != name.strip() or re.search(r"[/\\\x00]", name):
                raise PydanticCustomError(
                    "entity_name",
                    "{msg}",
                    {
                        "msg": f"entity type name {name!r} must be non-empty, without surrounding "
                        "spaces, '/' or '\\'"
                    },
                )
        return value

    @model_validator(mode="after")
    def _cross_checks(self) -> ConfigSchema:
        problems = cross_field_problems(self)
        if problems:
            # One error carrying every problem, each line already "path: message".
            raise PydanticCustomError("cross_field", "{lines}", {"lines": "\n".join(problems)})
        return self

    # ---- convenience
    def entity_dimension(self, entity_type: str) -> int:
        """Embedding dimension of ``entity_type``: its own override, else the global one."""
        own = self.entities[entity_type].dimension
        return own if own is not None else self.dimension

    def resolved_workers(self) -> int:
        """Number of Hogwild workers: ``workers``, or the CPU count when it is null."""
        return self.workers if self.workers is not None else (os.cpu_count() or 1)

    def resolved_relation_lr(self) -> float:
        """Learning rate of relation parameters: ``relation_lr``, or ``lr`` when it is null."""
        return self.relation_lr if self.relation_lr is not None else self.lr
