"""A distributed run's summaries and early stopping, with real ranks on 127.0.0.1.

One graph with one partition, two trainers: in the partitioned mode one of them trains each
step's only bucket and the other trains nothing (its own figures are zeros); in the
data-parallel mode each trains its share. Either way every summary line rank 0 prints must be
the step's merged record, as committed to ``training_stats.json``; and early stopping, decided
on rank 0, must stop both trainers after the same version, keep the best one, and stay stopped.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from bigembed.checkpoints import CheckpointStore
from support.graphs import tiny_kg_config_file
from support.ranks import TIMEOUT, run

_LINE = re.compile(
    r"\[rank (\d+)\] epoch (\d+)/6: loss ([\d.]+)  reg ([\d.]+)  ([\d,]+) edges/s  "
    r"[\d.]+s  \(([\d,]+) edges by (\d+) trainers\)"
)


def _check_run(out: str, model: Path) -> None:
    store = CheckpointStore(model)
    steps = {r["version"]: r for r in store.read_stats() if r["type"] == "step"}
    lines = _LINE.findall(out)
    assert [int(m[1]) for m in lines] == [1, 2, 3], out  # patience 2: stopped after epoch 3
    for rank, epoch, loss, reg, eps, edges, trainers in lines:
        step = {**steps[int(epoch)], **steps[int(epoch)]["stats"]}
        assert rank == "0" and trainers == "2"
        assert int(edges.replace(",", "")) == step["count"] > 0, (out, step)
        assert float(loss) == pytest.approx(step["loss"], abs=1e-4), (out, step)
        assert float(reg) == pytest.approx(step["reg"], abs=1e-4)
        assert int(eps.replace(",", "")) == pytest.approx(step["edges_per_sec"], abs=1)
    assert "Stopped early: early stopping: validation mrr did not improve" in out
    assert store.committed_version() == 3  # not 6: both ranks stopped there
    assert json.loads((model / "best" / "best.json").read_text())["version"] == 1
    validation = (model / "validation_stats.json").read_text().splitlines()
    assert [json.loads(line)["version"] for line in validation] == [1, 2, 3]


@pytest.mark.integration
def test_merged_summaries_and_early_stopping_in_both_modes(tmp_path: Path) -> None:
    config, valid = tiny_kg_config_file(
        tmp_path, 60, 900, valid=True, num_epochs=6, lr=0.1, distributed_timeout=TIMEOUT
    )
    data = yaml.safe_load(config.read_text())
    # min_delta 1.0: no evaluation beats the first, so the stop point is certain
    data["early_stopping"] = {"valid_path": str(valid), "patience": 2, "min_delta": 1.0}
    config.write_text(yaml.safe_dump(data))
    for mode in ("data_parallel", "partitioned"):
        model = tmp_path / mode
        argv = ["launch", str(config), "-n", "2", "-p", f"checkpoint_path={model}"]
        out = run([*argv, "-p", f"distributed_mode={mode}"])
        assert out.returncode == 0, out.stdout + out.stderr
        _check_run(out.stdout, model)
    # a stopped run stays stopped on every rank (rank 0's verdict at the start)
    again = run(["launch", str(config), "-n", "2", "-p", f"checkpoint_path={tmp_path / mode}"])
    assert again.returncode == 0, again.stdout + again.stderr
    assert "[rank 0] Nothing to do: early stopping" in again.stdout
    assert CheckpointStore(tmp_path / mode).committed_version() == 3
