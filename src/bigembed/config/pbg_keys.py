"""PBG's key table: which config keys behave differently from PyTorch-BigGraph, which are
accepted and ignored, and which are bigembed's own (``bigembed config keys`` marks them;
docs/pbg_compatibility.md explains them)."""

from __future__ import annotations

#: PBG keys bigembed accepts and ignores (a changed value warns), with the reason.
IGNORED_KEYS: dict[str, str] = {
    "num_groups_for_partition_server": "bigembed sends each partition in one gloo transfer",
    "num_groups_per_sharded_partition_server": "bigembed has no sharded partition-server mode",
    "partition_shard_size": "bigembed has no sharded partition-server mode",
}
#: Every PBG key whose behaviour in bigembed differs from PBG's, with how (see
#: docs/pbg_compatibility.md); ``bigembed config keys`` marks them.
PBG_DIFFERENCES: dict[str, str] = {
    "entities.TYPE.featurized": "every negative mode (PBG: batch negatives only), partitioned "
    "or not, distributed; features from `bigembed import --features`",
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
    "self_negative",
    "distributed_timeout",
    "memory_budget",
    "partition_prefetch",
    "communication",
    "communication.strategy",
    "communication.precision",
    "communication.partition_precision",
    "communication.sync_every",
    "communication.sync_interval",
    "communication.sparse_rows",
    "communication.row_fraction",
    "communication.overlap",
    "communication.hierarchical",
    "communication.edge_split",
    "communication.replica_stealing",
    "communication.random_level",
    "distributed_mode",
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
    "relation_prediction_weight",
    "kernel",
    "growth",
    "growth.init",
    "growth.init_state",
    "growth.freeze",
    "growth.edges",
    "growth.replay_fraction",
    "edge_files",
    *(f"edge_files.{f}" for f in ("header", "delimiter", "lhs_col", "rel_col", "rhs_col")),
)


def pbg_status(key: str) -> str:
    """How ``key`` compares with PBG: ``same``, ``differs`` or ``new`` (bigembed only)."""
    if key in PBG_DIFFERENCES:
        return "differs"
    return "new" if key in BIGEMBED_ONLY_KEYS else "same"
