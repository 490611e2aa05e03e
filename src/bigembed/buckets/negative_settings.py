"""The negative counts a config asks for, in training or in evaluation."""

from __future__ import annotations

from bigembed.config import ConfigSchema
from bigembed.model import NegativeSettings


def negative_settings(cfg: ConfigSchema, for_eval: bool = False) -> NegativeSettings:
    """Training's negatives, or with ``for_eval`` the ``eval_num_*`` overrides where set."""
    batch_negs = cfg.num_batch_negs
    uniform = cfg.num_uniform_negs
    if for_eval:
        batch_negs = cfg.eval_num_batch_negs if cfg.eval_num_batch_negs is not None else batch_negs
        uniform = cfg.eval_num_uniform_negs if cfg.eval_num_uniform_negs is not None else uniform
    group = cfg.uniform_negs_group or cfg.batch_size
    return NegativeSettings(
        num_batch_negs=batch_negs,
        num_uniform_negs=uniform,
        uniform_group=max(1, group),
        disable_lhs=cfg.disable_lhs_negs,
        disable_rhs=cfg.disable_rhs_negs,
        self_negative=False if for_eval else cfg.self_negative,
    )
