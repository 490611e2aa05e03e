"""The config's nested sections: entity types, relation types, and bigembed's own
``communication``, ``early_stopping`` and ``tune`` sections.

Each is a frozen pydantic model that refuses unknown keys; the whole config,
:class:`~bigembed.config.schema.ConfigSchema`, holds them.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from bigembed.config.keys import mixed_case_to_snake
from bigembed.config.types import (
    Bool,
    EdgeSplit,
    EvalProtocolName,
    Float,
    FreezeName,
    GrowthEdgesName,
    GrowthInitName,
    GrowthStateName,
    Int,
    OperatorName,
    PartitionPrecisionName,
    PrecisionName,
    PrunerName,
    SamplerName,
    StrategyName,
    TuneParamType,
    ValidationMetricName,
)

#: Every schema's settings: unknown keys refused, values frozen, numbers accepted as strings.
MODEL_CONFIG = ConfigDict(extra="forbid", frozen=True, coerce_numbers_to_str=True)


class EntitySchema(BaseModel):
    """One entity type (a value of ``entities``)."""

    model_config = MODEL_CONFIG

    num_partitions: Int = Field(
        gt=0,
        description="Number of partitions this entity type is split into; 1 = unpartitioned. "
        "All partitioned types used on the same side of relations must share one count.",
    )
    featurized: Bool = Field(
        default=False,
        description="PBG: each entity is a bag of features and its embedding is the (weighted) "
        "mean of its features' embeddings; the features come from `bigembed import --features "
        "TYPE=FILE`; its partitions share one feature table (see docs/featurized.md).",
    )
    dimension: Int | None = Field(
        default=None,
        gt=0,
        description="Embedding dimension of this type; null = the global `dimension`.",
    )

    _norm = model_validator(mode="before")(mixed_case_to_snake)


class RelationSchema(BaseModel):
    """One relation type (an item of ``relations``; its id is its index in the list)."""

    model_config = MODEL_CONFIG

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

    _norm = model_validator(mode="before")(mixed_case_to_snake)


class CommunicationSchema(BaseModel):
    """bigembed only: what crosses the network in the distributed mode."""

    model_config = MODEL_CONFIG

    strategy: StrategyName = Field(
        default="async_ps",
        description="bigembed only: how trainers keep the shared parameters in step. async_ps "
        "(PBG's parameter servers: centralized, asynchronous), allreduce (centralized, "
        "synchronous: everybody's changes summed every sync_every batches), "
        "async_model_average (centralized, asynchronous: a background thread averages the "
        "values), decentralized (synchronous: each round every trainer averages with one peer, "
        "no server), async_decentralized (asynchronous: a background thread averages with "
        "whichever peer is ready, nobody waits). See docs/distributed.md.",
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
        description="bigembed only: asynchronous strategies (async_ps, async_model_average, "
        "async_decentralized): "
        "the least seconds between two rounds of a trainer (PBG: 0.01, at most 100 per second).",
    )
    sparse_rows: Bool = Field(
        default=True,
        description="bigembed only: send an embedding table's changes as row-sparse deltas "
        "(the indices of the rows changed since the last round and their values in the "
        "configured precision) instead of the whole table; the rows' Adagrad state goes with "
        "them.",
    )
    row_fraction: float = Field(
        default=1.0,
        gt=0.0,
        le=1.0,
        description="bigembed only: with sparse_rows, the most rows of an embedding table a "
        "round sends, as a fraction of the table's rows: the rows whose change (plus error "
        "feedback) is largest; the others keep their change for a later round, and a "
        "checkpoint's agreement sends them all. 1 sends every changed row.",
    )
    overlap: Bool = Field(
        default=False,
        description="bigembed only: synchronous strategies (allreduce, decentralized): run a "
        "round's communication while the workers train the next sync_every batches (one round "
        "of staleness) instead of holding them until it is merged.",
    )
    hierarchical: Bool = Field(
        default=True,
        description="bigembed only: allreduce and async_model_average with several trainers "
        "on one host: reduce within the host first, then one leader per host across hosts.",
    )
    edge_split: EdgeSplit = Field(
        default="load_balancing",
        description="bigembed only: distributed_mode data_parallel: how a bucket's edges are "
        "split between trainers: load_balancing (Bagua's load-balancing sampler over the "
        "per-edge cost of the cost model, so every trainer gets about the same cost) or even "
        "(equal slices of the shuffled edges).",
    )
    replica_stealing: Bool = Field(
        default=True,
        description="bigembed only: distributed_mode data_parallel with one worker per "
        "trainer: a trainer that has trained its share of a bucket takes the unstarted batches "
        "of the trainer with the most left (a counter per share in the run's store), so a slow "
        "core or machine does not hold the others at the end of every bucket.",
    )
    random_level: float = Field(
        default=0.0,
        ge=0.0,
        le=1.0,
        description="bigembed only: the load-balancing sampler's noise: each edge's cost is "
        "shuffled by up to this fraction of the cost range before sorting (Bagua's "
        "random_level).",
    )


class EarlyStoppingSchema(BaseModel):
    """bigembed only: evaluate on validation edges during training, keep the best version."""

    model_config = MODEL_CONFIG

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


class GrowthSchema(BaseModel):
    """bigembed only: how training continues a model whose entity store was extended
    (``bigembed import --extend``; docs/growing.md)."""

    model_config = MODEL_CONFIG

    init: GrowthInitName = Field(
        default="random",
        description="bigembed only: the first value of a new entity's row: random (as a fresh "
        "model's, init_scale) or neighbors (the mean of its trained neighbours' embeddings over "
        "the training edges; random when it has none).",
    )
    init_state: GrowthStateName = Field(
        default="zero",
        description="bigembed only: the first row-Adagrad state of a new entity's row: zero (a "
        "fresh row's: its first steps are the largest) or old_mean (the mean state of the "
        "partition's old rows: new rows step at the pace the trained ones do and do not jump "
        "past the old entities' answers).",
    )
    freeze: list[FreezeName] = Field(
        default_factory=list,
        description="bigembed only: what training leaves unchanged: old_entities (the rows of "
        "the entities of the store this one extends: only the new rows train) and/or relations "
        "(relation operators and global embeddings).",
    )
    edges: GrowthEdgesName = Field(
        default="all",
        description="bigembed only: the training edges each epoch visits: all, or new (only "
        "those with at least one end among the new entities of the store's last extension, "
        "plus a replay_fraction sample of the others: an update costs a fraction of an epoch).",
    )
    replay_fraction: Float = Field(
        default=0.5,
        ge=0,
        le=1,
        description="bigembed only: with edges: new, the share of the other edges (both ends "
        "old) trained too each epoch, a new sample every epoch: there the old rows keep seeing "
        "their own edges, and the new entities, among the negatives, learn not to outscore the "
        "old entities' answers.",
    )


def _column(value: Any) -> Any:
    """A column index written as text (``-p edge_files.lhs_col=0``) is an index."""
    if isinstance(value, str) and value.strip().isdigit():
        return int(value.strip())
    return value


Column = Annotated[int | str, BeforeValidator(_column)]


class EdgeFilesSchema(BaseModel):
    """bigembed only: how ``bigembed import`` reads the config's edge list files (its flags
    override these); ``bigembed init`` writes them from what it saw in the file."""

    model_config = MODEL_CONFIG

    header: Bool = Field(
        default=False,
        description="bigembed only: text edge files start with a line of column names.",
    )
    delimiter: str | None = Field(
        default=None,
        description="bigembed only: field separator of text edge files (null = tab for "
        ".tsv/.txt, comma for .csv).",
    )
    lhs_col: Column = Field(
        default=0,
        description="bigembed only: head column: index from 0 or (header or Parquet) name.",
    )
    rel_col: Column | None = Field(
        default=1,
        description="bigembed only: relation column: index, name, or null when there is none "
        "(every edge has the config's single relation).",
    )
    rhs_col: Column = Field(
        default=2,
        description="bigembed only: tail column: index from 0 or (header or Parquet) name.",
    )

    @field_validator("lhs_col", "rel_col", "rhs_col")
    @classmethod
    def _index_not_negative(cls, value: int | str | None) -> int | str | None:
        if isinstance(value, int) and value < 0:
            raise PydanticCustomError(
                "negative_column", "a column index counts from 0 (null: no relation column)"
            )
        return value


class TuneParamSchema(BaseModel):
    """bigembed only: the distribution of one tuned config key."""

    model_config = MODEL_CONFIG

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

    model_config = MODEL_CONFIG

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
