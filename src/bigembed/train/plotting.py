"""Training curves (loss per step, eval metrics before/after) drawn with matplotlib."""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bigembed.atomic import atomic_write_bytes
from bigembed.train.records import TrainingLog


def plot_training(
    log: TrainingLog, output: Path, validation: Sequence[dict[str, Any]] = ()
) -> None:
    """Draw ``log``'s curves as a PNG at ``output`` (written atomically); ``validation``: early
    stopping's records (``validation_stats.json``), drawn as a panel of their own."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps, buckets = log.steps, log.buckets
    evaluated = [s for s in steps if s.eval_after is not None]
    has_eval = bool(evaluated)
    panels = 1 + int(has_eval) + int(bool(validation))
    fig, axes = plt.subplots(1, panels, figsize=(5.5 * panels + 1.5, 4.5), squeeze=False)
    ax = axes[0][0]
    if buckets:
        ax.plot(
            range(1, len(buckets) + 1),
            [b.stats.loss for b in buckets],
            lw=0.8,
            alpha=0.5,
            label="per bucket",
        )
    if steps:
        per_step_x = []
        n = 0
        for s in steps:
            n += sum(1 for b in buckets if b.at.version == s.at.version)
            per_step_x.append(n if buckets else s.at.version)
        ax.plot(per_step_x, [s.stats.loss for s in steps], "o-", label="per step")
    ax.set_xlabel("bucket trained" if buckets else "step")
    ax.set_ylabel("training loss per edge")
    ax.set_title("Training loss")
    ax.grid(alpha=0.3)
    ax.legend()
    if has_eval:
        ax = axes[0][1]
        xs = [s.at.version for s in evaluated]
        for key in ("mrr", "hits@1", "hits@10"):
            ax.plot(
                xs,
                [s.eval_after[key] for s in evaluated if s.eval_after is not None],
                "o-",
                label=f"{key} after",
            )
        before = [s for s in steps if s.eval_before is not None]
        ax.plot(
            [s.at.version for s in before],
            [s.eval_before["mrr"] for s in before if s.eval_before is not None],
            "x--",
            label="mrr before",
        )
        ax.set_xlabel("step (checkpoint version)")
        ax.set_title("Withheld-edge eval (sampled negatives)")
        ax.set_ylim(0, 1)
        ax.grid(alpha=0.3)
        ax.legend()
    if validation:
        _plot_validation(axes[0][panels - 1], validation)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    atomic_write_bytes(output, buf.getvalue())


def _plot_validation(ax: Any, records: Sequence[dict[str, Any]]) -> None:
    """Early stopping's validation metric per evaluated version, the best one marked."""
    last = records[-1]
    metric, protocol = last.get("metric", "mrr"), last.get("protocol", "full")
    xs = [r["version"] for r in records]
    ax.plot(xs, [r.get("value", float("nan")) for r in records], "o-", label=f"valid {metric}")
    best = last.get("best_version")
    if best in xs:
        ax.plot([best], [records[xs.index(best)]["value"]], "r*", ms=14, label="best (kept)")
    kind = "filtered, full ranking" if protocol == "full" else "raw, sampled"
    ax.set_title(f"Validation ({kind})")
    ax.set_xlabel("step (checkpoint version)")
    ax.grid(alpha=0.3)
    ax.legend()
