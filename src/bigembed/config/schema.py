"""The typed training configuration: PyTorch-BigGraph's schema, validated early.

Every key of PBG's ``ConfigSchema`` exists here with PBG's name, type, default and meaning, so
a PBG config loads unchanged (YAML, TOML, JSON, or PBG's own Python format). Differences, all
in the direction of failing early with a clear message instead of crashing mid-run:

* operators are validated at load time (PBG waits for model build);
* checks PBG only makes at runtime (same-side partition counts, ``global_emb`` with dynamic
  relations, even dimensions for ``complex_diagonal``, N3 with ``linear``/``affine``) run here;
* ``featurized`` entities, ``num_gpus > 0`` and ``half_precision`` are rejected (CPU only,
  no feature bags); PBG's partition-server tuning keys are accepted and ignored, with a warning
  when changed. :data:`PBG_DIFFERENCES` lists every key that behaves differently.

bigembed-only keys: ``seed``, ``compute_dtype``, ``distributed_timeout``,
the ``communication`` section (see their descriptions). Value parsing lives in
:mod:`bigembed.config.types`; file reading, ``-p`` overrides, error formatting and help text in
:mod:`bigembed.config.loading`.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_core import PydanticCustomError

from bigembed.config.loading import (
    apply_overrides,
    describe_keys,
    format_table,
    format_validation_error,
    normalize_keys,
    read_config_file,
    snake_case_keys,
)
from bigembed.config.types import (
    Bool,
    BucketOrder,
    Bytes,
    ComparatorName,
    ComputeDtypeName,
    EvalProtocolName,
    Float,
    Int,
    LoadBalancing,
    LossName,
    OneOf,
    OperatorName,
    PartitionPrecisionName,
    PrecisionName,
    PrunerName,
    Regularizer,
    SamplerName,
    StrategyName,
    TuneParamType,
    ValidationMetricName,
)
from bigembed.errors import ConfigError
from bigembed.model import ModelSpec, RelationSpec

logger = logging.getLogger(__name__)

#: ``train_type`` values (lower case; matched case-insensitively, ``1vsAll`` as LibKGE writes it).
TRAIN_TYPES: tuple[str, ...] = ("negative_sampling", "1vsall", "kvsall")
#: The ``train_type`` values that score every entity of a type (all_negs on every relation).
ALL_ENTITY_TRAIN_TYPES = ("1vsall", "kvsall")
#: How the docs (and LibKGE) write each ``train_type``.
TRAIN_TYPE_NAMES = {
    "negative_sampling": "negative_sampling",
    "1vsall": "1vsAll",
    "kvsall": "KvsAll",
}

__all__ = [
    "ConfigSchema",
    "EntitySchema",
    "RelationSchema",
    "add_config_arguments",
    "config_from_args",
    "config_keys",
    "config_to_dict",
    "config_warnings",
    "format_config_keys",
    "load_config",
    "model_spec",
    "parse_config_dict",
    "pbg_status",
]

FEATURIZED_MESSAGE = (
    "featurized entities are not supported by bigembed (an embedding-bag model over feature "
    "ids); precompute feature-based embeddings and start from them with init_path, or import "
    "the features as entities of their own linked by a relation"
)
NUM_GPUS_MESSAGE = (
    "bigembed trains on CPU only (no GPU support); set num_gpus: 0 and use workers for CPU "
    "parallelism"
)
HALF_PRECISION_MESSAGE = (
    "PBG's fp16 GPU matmuls are not supported (bigembed trains on CPU only); set "
    "half_precision: false and use compute_dtype: bfloat16 for reduced-precision compute"
)
#: PBG keys bigembed accepts and ignores (a changed value warns), with the reason.
IGNORED_KEYS: dict[str, str] = {
    "num_groups_for_partition_server": "bigembed sends each partition in one gloo transfer",
    "num_groups_per_sharded_partition_server": "bigembed has no sharded partition-server mode",
    "partition_shard_size": "bigembed has no sharded partition-server mode",
}
#: Every PBG key whose behaviour in bigembed differs from PBG's, with how (see
#: docs/pbg_compatibility.md); ``bigembed config keys`` marks them.
PBG_DIFFERENCES: dict[str, str] = {
    "entities.TYPE.featurized": "true is refused (featurized entities are not supported)",
    "init_scale": "independent N(0,1) samples seeded by (seed, type, partition); PBG tiles one "
    "random block",
    "checkpoint_preservation_interval": "snapshots are hard links in epoch_N/ (PBG: symlinks)",
    "batch_size": "any value works (PBG needs a multiple of num_batch_negs)",
    "num_uniform_negs": "by default the whole batch shares one draw (see uniform_negs_group); "
    "PBG draws per chunk of num_batch_negs",
    "hogwild_delay": "applied as documented (PBG applies it by machine rank: never on one machine)",
    "num_groups_for_partition_server": "accepted and ignored (warns if changed)",
    "num_groups_per_sharded_partition_server": "accepted and ignored (warns if changed)",
    "partition_shard_size": "accepted and ignored (warns if changed)",
    "num_gpus": "values > 0 are refused (CPU only)",
    "half_precision": "true is refused (use compute_dtype: bfloat16)",
}
#: Keys PBG does not have.
BIGEMBED_ONLY_KEYS = (
    "seed",
    "compute_dtype",
    "uniform_negs_group",
    "train_type",
    "distributed_timeout",
    "memory_budget",
    "partition_prefetch",
    "communication",
    "communication.strategy",
    "communication.precision",
    "communication.partition_precision",
    "communication.sync_every",
    "communication.sync_interval",
    "early_stopping",
    "early_stopping.valid_path",
    "early_stopping.every",
    "early_stopping.patience",
    "early_stopping.metric",
    "early_stopping.protocol",
    "early_stopping.min_delta",
    "early_stopping.filter_paths",
    "tune",
    "tune.n_trials",
    "tune.params",
    *(f"tune.params.KEY.{f}" for f in ("type", "low", "high", "log", "step", "choices")),
    "tune.sampler",
    "tune.pruner",
    "tune.startup_trials",
    "load_balancing",
    "relation_init_scale",
    "entity_dropout",
    "relation_dropout",
    "kernel",
)

_MODEL_CONFIG = ConfigDict(extra="forbid", frozen=True, coerce_numbers_to_str=True)


def _mixed_case_to_snake(data: Any) -> Any:
    """PBG accepts ``mixedCase`` keys (``numEpochs``) and converts them to ``snake_case``."""
    if isinstance(data, dict):
        return snake_case_keys(data)
    return data


# --------------------------------------------------------------------------- schemas


class EntitySchema(BaseModel):
    """One entity type (a value of ``entities``)."""

    model_config = _MODEL_CONFIG

    num_partitions: Int = Field(
        gt=0,
        description="Number of partitions this entity type is split into; 1 = unpartitioned. "
        "All partitioned types used on the same side of relations must share one count.",
    )
    featurized: Bool = Field(
        default=False,
        description="PBG: each entity is a bag of features (embedding = mean of feature "
        "embeddings). Not supported by bigembed: must be false (see docs/pbg_compatibility.md).",
    )
    dimension: Int | None = Field(
        default=None,
        gt=0,
        description="Embedding dimension of this type; null = the global `dimension`.",
    )

    _norm = model_validator(mode="before")(_mixed_case_to_snake)

    @field_validator("featurized")
    @classmethod
    def _no_featurized(cls, value: bool) -> bool:
        if value:
            raise PydanticCustomError("unsupported", FEATURIZED_MESSAGE)
        return value


class RelationSchema(BaseModel):
    """One relation type (an item of ``relations``; its id is its index in the list)."""

    model_config = _MODEL_CONFIG

    name: str = Field(
        min_length=1,
        description="Name of the relation type; in non-dynamic mode it must equal the relation "
        "string of the edges in the input files.",
    )
    lhs: str = Field(min_length=1, description="Entity type of the left-hand side.")
    rhs: str = Field(min_length=1, description="Entity type of the right-hand side.")
    weight: Float = Field(default=1.0, gt=0, description="Multiplier of this relation's loss.")
    operator: OperatorName = Field(
        default="none",
        description="Transformation applied to the right-hand side embedding before comparing "
        "(dynamic_relations: to either side).",
    )
    all_negs: Bool = Field(
        default=False,
        description="Use every entity of the same type and partition as negatives (both sides) "
        "instead of batch/uniform sampling.",
    )

    _norm = model_validator(mode="before")(_mixed_case_to_snake)


class CommunicationSchema(BaseModel):
    """bigembed only: what crosses the network in the distributed mode."""

    model_config = _MODEL_CONFIG

    strategy: StrategyName = Field(
        default="async_ps",
        description="bigembed only: how trainers keep the shared parameters in step. async_ps "
        "(PBG's parameter servers: centralized, asynchronous), allreduce (centralized, "
        "synchronous: everybody's changes summed every sync_every batches), "
        "async_model_average (centralized, asynchronous: a background thread averages the "
        "values), decentralized (synchronous: each round every trainer averages with one peer, "
        "no server). See docs/distributed.md.",
    )
    precision: PrecisionName = Field(
        default="fp32",
        description="bigembed only: encoding of the shared parameters (relation operators, "
        "global and unpartitioned embeddings, their Adagrad state) exchanged between "
        "trainers: fp32 (exact), fp16, bf16 or int8 (chunk-wise, ~4x fewer bytes; lossy "
        "codecs carry their error into the next message).",
    )
    partition_precision: PartitionPrecisionName = Field(
        default="fp32",
        description="bigembed only: how partitions travel between trainers and partition "
        "servers: fp32 (exact) or compressed (the trainer receives a bf16 copy and sends back "
        "its change as int8 with a per-row scale; the server keeps the exact fp32 master).",
    )
    sync_every: Int = Field(
        default=16,
        ge=1,
        description="bigembed only: synchronous strategies (allreduce, decentralized): a "
        "trainer's workers run at most this many batches (all workers together) before the "
        "next round has merged them; they wait for it.",
    )
    sync_interval: float = Field(
        default=0.01,
        gt=0,
        description="bigembed only: asynchronous strategies (async_ps, async_model_average): "
        "the least seconds between two rounds of a trainer (PBG: 0.01, at most 100 per second).",
    )


class EarlyStoppingSchema(BaseModel):
    """bigembed only: evaluate on validation edges during training, keep the best version."""

    model_config = _MODEL_CONFIG

    valid_path: str = Field(
        description="bigembed only: the validation edges: an imported edge path or a "
        "TSV/CSV/Parquet file of names (never trained on).",
    )
    every: Int = Field(
        default=1, gt=0, description="bigembed only: evaluate after every this many epochs."
    )
    patience: Int = Field(
        default=3,
        gt=0,
        description="bigembed only: stop after this many evaluations in a row without a gain "
        "over the best.",
    )
    metric: ValidationMetricName = Field(
        default="mrr",
        description="bigembed only: what is compared: mrr, hits@1, hits@3, hits@10 or auc "
        "(filtered with protocol full, raw with sampled).",
    )
    protocol: EvalProtocolName = Field(
        default="full",
        description="bigembed only: full (filtered ranking against every entity) or sampled "
        "(against the config's negatives, raw; cheaper on big graphs).",
    )
    min_delta: Float = Field(
        default=0.0, ge=0, description="bigembed only: the least gain that counts as one."
    )
    filter_paths: list[str] | None = Field(
        default=None,
        description="bigembed only: known true edges to filter with (null = edge_paths plus "
        "valid_path).",
    )


class TuneParamSchema(BaseModel):
    """bigembed only: the distribution of one tuned config key."""

    model_config = _MODEL_CONFIG

    type: TuneParamType = Field(
        description="bigembed only: the distribution of config key KEY: float, int or categorical."
    )
    low: float | None = Field(
        default=None, description="bigembed only: float/int: the least value."
    )
    high: float | None = Field(
        default=None, description="bigembed only: float/int: the greatest value."
    )
    log: Bool = Field(default=False, description="bigembed only: float/int: sample on a log scale.")
    step: float | None = Field(
        default=None, description="bigembed only: float/int: grid step (optional)."
    )
    choices: list[Any] | None = Field(
        default=None, description="bigembed only: categorical: the values."
    )

    @model_validator(mode="after")
    def _complete(self) -> TuneParamSchema:
        if self.type == "categorical":
            if not self.choices:
                raise PydanticCustomError("tune", "categorical: give a non-empty choices list")
        elif self.low is None or self.high is None or self.low > self.high:
            raise PydanticCustomError("tune", f"{self.type}: give low <= high")
        elif self.log and self.low <= 0:
            raise PydanticCustomError("tune", "log: true needs low > 0")
        return self


class TuneSchema(BaseModel):
    """bigembed only: the search of ``bigembed tune`` (Optuna)."""

    model_config = _MODEL_CONFIG

    n_trials: Int = Field(default=20, gt=0, description="bigembed only: trials in all.")
    params: dict[str, TuneParamSchema] = Field(
        description="bigembed only: config key (as -p takes it, e.g. lr, dimension, "
        "relations.0.operator) -> distribution {type: float|int|categorical, low, high, log, "
        "step, choices}.",
    )
    sampler: SamplerName = Field(
        default="tpe", description="bigembed only: tpe (Optuna's default) or random."
    )
    pruner: PrunerName = Field(
        default="median",
        description="bigembed only: median (stop a trial whose validation metric is below the "
        "median of earlier trials at the same epoch) or none.",
    )
    startup_trials: Int = Field(
        default=2,
        ge=0,
        description="bigembed only: trials run to the end before pruning starts.",
    )


class ConfigSchema(BaseModel):
    """The whole training configuration (PBG's ``ConfigSchema`` plus a few bigembed keys)."""

    model_config = _MODEL_CONFIG

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
        default="float32",
        description="bigembed only: float32, or bfloat16 compute (master weights and Adagrad "
        "state stay float32).",
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
    train_type: Annotated[str, OneOf(TRAIN_TYPES)] = Field(
        default="negative_sampling",
        description="bigembed only: negative_sampling (PBG's batch and uniform negatives) or "
        "1vsAll (LibKGE's name, case-insensitive): each edge's corrupted sides are scored "
        "against every entity of their type, softmax over all of them (all_negs on every "
        "relation); needs entity types of one partition. KvsAll: the same loss computed "
        "once per distinct query (h, r, ?) / (?, r, t) of a batch, every true answer of its "
        "edges a positive (batches of one side, edges grouped by query: ~3.6x fewer products "
        "on FB15k-237); needs dynamic_relations, loss_fn softmax and comparator dot or cos.",
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

    _norm = model_validator(mode="before")(_mixed_case_to_snake)

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
        problems = _cross_field_problems(self)
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


# --------------------------------------------------------------------------- cross-field checks


def _cross_field_problems(cfg: ConfigSchema) -> list[str]:
    """Every cross-field inconsistency, as ``key.path: message`` lines."""
    problems: list[str] = []
    known = ", ".join(sorted(cfg.entities))
    for i, rel in enumerate(cfg.relations):
        for side in ("lhs", "rhs"):
            etype = getattr(rel, side)
            if etype not in cfg.entities:
                problems.append(
                    f"relations[{i}].{side}: unknown entity type {etype!r} (known: {known})"
                )
    if problems:
        return problems  # the checks below need valid entity references

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
    if cfg.train_type == "kvsall":
        needs = {
            "dynamic_relations": cfg.dynamic_relations,
            "loss_fn": cfg.loss_fn == "softmax",
            "comparator": cfg.comparator in ("dot", "cos"),
        }
        for key, ok in needs.items():
            if not ok:
                problems.append(
                    f"{key}: train_type: KvsAll needs dynamic_relations: true, loss_fn: softmax "
                    f"and comparator: dot or cos (got {key}: {getattr(cfg, key)}); use "
                    f"train_type: 1vsAll otherwise"
                )
                return problems
    if cfg.train_type in ALL_ENTITY_TRAIN_TYPES:
        for i, rel in enumerate(cfg.relations):
            for side in ("lhs", "rhs"):
                etype = getattr(rel, side)
                parts = cfg.entities[etype].num_partitions
                if parts > 1:
                    problems.append(
                        f"train_type: {TRAIN_TYPE_NAMES[cfg.train_type]} scores every entity "
                        f"of a type and needs entity types of one partition, but "
                        f"relations[{i}].{side} type {etype!r} has num_partitions: {parts}; "
                        f"set it to 1 or use train_type: negative_sampling"
                    )
                    return problems
    if cfg.disable_lhs_negs and cfg.disable_rhs_negs:
        problems.append(
            "disable_rhs_negs: cannot be true together with disable_lhs_negs: true "
            "(no negatives would be left)"
        )
    if cfg.early_stopping is not None and cfg.num_machines > 1:
        problems.append(
            "early_stopping: not supported in distributed mode (num_machines > 1) yet; train "
            "on one machine or evaluate the checkpoints with bigembed eval"
        )
    if cfg.num_machines > 1 and not cfg.distributed_init_method:
        problems.append(
            "distributed_init_method: required when num_machines > 1 "
            "(e.g. tcp://HOST:PORT or file:///shared/path)"
        )

    if not cfg.dynamic_relations:
        seen: dict[str, int] = {}
        for i, rel in enumerate(cfg.relations):
            if rel.name in seen:
                problems.append(
                    f"relations[{i}].name: duplicate relation name {rel.name!r} "
                    f"(also relations[{seen[rel.name]}])"
                )
            seen.setdefault(rel.name, i)

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

    for key in ("entity_dropout", "relation_dropout"):
        if getattr(cfg, key) > 0 and not cfg.dynamic_relations:
            problems.append(
                f"{key}: applies to the query side of an edge, which needs "
                f"dynamic_relations: true (one operator per direction); set {key}: 0"
            )
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


def config_warnings(cfg: ConfigSchema) -> list[str]:
    """Settings that are accepted but deserve a warning, as ``key: message`` lines."""
    out: list[str] = []
    for key, reason in IGNORED_KEYS.items():
        default = ConfigSchema.model_fields[key].default
        value = getattr(cfg, key)
        if value != default:
            out.append(
                f"{key}: {value} is accepted for PBG compatibility and ignored ({reason}); "
                f"remove it or set it to the default {default}"
            )
    if (
        cfg.num_machines > 1
        and cfg.bucket_order != ConfigSchema.model_fields["bucket_order"].default
    ):
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


# --------------------------------------------------------------------------- the model's part


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
        regularizer=cfg.regularizer,
    )


# --------------------------------------------------------------------------- parsing / loading


def parse_config_dict(data: dict[str, Any], source: str = "<config>") -> ConfigSchema:
    """Validate a raw config dict (as read from a file); errors name ``source`` and the key."""
    if not isinstance(data, dict):
        raise ConfigError(
            f"{source}: the config must be a mapping of keys to values, got {type(data).__name__}"
        )
    data = normalize_keys(data, source)
    try:
        cfg = ConfigSchema.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, source, ConfigSchema)) from None
    for line in config_warnings(cfg):
        logger.warning("%s: %s", source, line)
    return cfg


def load_config(path: str | os.PathLike[str], overrides: Sequence[str] = ()) -> ConfigSchema:
    """Read a config file (.yaml/.yml/.toml/.json/.py), apply ``-p`` overrides, validate it."""
    source = os.fspath(path)
    data = read_config_file(Path(source))
    data = normalize_keys(data, source)
    data = apply_overrides(data, overrides, ConfigSchema, source)
    return parse_config_dict(data, source)


def config_to_dict(cfg: ConfigSchema) -> dict[str, Any]:
    """The full config (defaults included) as JSON-safe data; parse_config_dict reverses it."""
    return cfg.model_dump(mode="json")


# --------------------------------------------------------------------------- CLI helpers


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the positional ``config`` and the repeatable ``-p/--param KEY=VALUE``."""
    parser.add_argument("config", help="config file (.yaml, .yml, .toml, .json or PBG .py)")
    parser.add_argument(
        "-p",
        "--param",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config key, e.g. -p num_epochs=5 -p relations.0.operator=diagonal "
        "-p entities.all.num_partitions=4 -p edge_paths=a,b (repeatable)",
    )


def config_from_args(args: argparse.Namespace) -> ConfigSchema:
    """Load the config named by :func:`add_config_arguments`' arguments."""
    params = getattr(args, "param", None) or []
    flat: list[str] = []
    for item in params:  # tolerate nargs-style lists too
        flat.extend(item if isinstance(item, list) else [item])
    return load_config(args.config, flat)


# --------------------------------------------------------------------------- help text


def config_keys() -> list[tuple[str, str, str, str]]:
    """(key, type, default, description) of every config key, in schema order."""
    return describe_keys(
        [
            ("", ConfigSchema),
            ("entities.TYPE.", EntitySchema),
            ("relations[i].", RelationSchema),
            ("communication.", CommunicationSchema),
            ("early_stopping.", EarlyStoppingSchema),
            ("tune.", TuneSchema),
            ("tune.params.KEY.", TuneParamSchema),
        ]
    )


def pbg_status(key: str) -> str:
    """How ``key`` compares with PBG: ``same``, ``differs`` or ``new`` (bigembed only)."""
    if key in PBG_DIFFERENCES:
        return "differs"
    return "new" if key in BIGEMBED_ONLY_KEYS else "same"


def format_config_keys() -> str:
    """A plain-text table of every key (the help text PBG users expect), with a ``pbg`` column
    and, after the table, how each ``differs`` key differs from PBG."""
    rows = [(k, t, d, pbg_status(k), text) for k, t, d, text in config_keys()]
    table = format_table(rows, ("key", "type", "default", "pbg", "description"))
    notes = [f"  {key}: {how}" for key, how in PBG_DIFFERENCES.items()]
    return "\n".join(
        [
            table,
            "",
            "pbg: same = as in PyTorch-BigGraph, differs = see below, new = bigembed only.",
            "Keys that behave differently from PBG (docs/pbg_compatibility.md):",
            *notes,
        ]
    )
