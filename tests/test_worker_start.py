"""Starting and stopping Hogwild workers: they are forked from a preloaded forkserver
(bigembed.train.hogwild.guard), which may have started long before a pool, yet see the
trainer's environment of the pool's start; killing them at once prints nothing extra."""

from __future__ import annotations

import os
import sys
import time
from typing import Any

import pytest
import torch

from bigembed.model import NegativeSettings, ScoringModel
from bigembed.model.spec import ModelSpec, RelationSpec
from bigembed.train.hogwild import pool as hogwild
from bigembed.train.hogwild.guard import adopt_environment


def _report_environment(rank: int, tasks: Any, results: Any, *shared: Any) -> None:
    """A worker main in place of the worker loop (started through the same guard and
    forkserver): takes the first message as the loop does and shows the variable
    ``BIGEMBED_TEST_PROBE`` it then sees on the board."""
    _setup, board, environ = tasks.get()
    adopt_environment(environ)
    board[rank, 0] = float(os.environ.get("BIGEMBED_TEST_PROBE", "0"))
    while tasks.get() is not None:
        pass


@pytest.mark.integration
def test_workers_see_the_environment_of_the_pool_start(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hogwild, "MAIN", f"{__name__}:_report_environment")
    model = ScoringModel(ModelSpec(relations=(RelationSpec("e", "e"),), entity_dims={"e": 4}))
    states = [torch.zeros_like(p) for p in model.parameters()]
    setup = hogwild.WorkerSetup(model, states, NegativeSettings(1, 1, 1), 0.1, 0.1, 10, False)
    # The first pool may start the forkserver (with this environment); the second one's
    # workers fork from it, yet must see the environment of their own pool's start.
    for value in (1.0, 2.0):
        monkeypatch.setenv("BIGEMBED_TEST_PROBE", str(value))
        pool = hogwild.HogwildPool(setup, 2)
        try:
            deadline = time.monotonic() + 60
            while pool.board[:, 0].tolist() != [value, value] and time.monotonic() < deadline:
                time.sleep(0.05)
            assert pool.board[:, 0].tolist() == [value, value]
        finally:
            pool.close()


def _raised_in(filename: str, exc: BaseException) -> BaseException:
    code = compile("raise exc", filename, "exec")
    try:
        exec(code, {"exc": exc})
    except BaseException as caught:
        return caught
    raise AssertionError("not raised")


def test_killing_workers_mid_handshake_prints_no_traceback(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An abandoned pool kills its workers at once; one killed while receiving a shared tensor
    breaks multiprocessing's resource-sharer handshake, whose thread prints the traceback
    through sys.excepthook after the run's one-line error. Those, and only those, are dropped."""
    seen: list[type[BaseException]] = []
    monkeypatch.setattr(hogwild, "_previous_excepthook", None)
    monkeypatch.setattr(sys, "excepthook", lambda t, e, tb: seen.append(t))
    monkeypatch.setattr(hogwild, "_last_abandon", -float("inf"))
    broken = _raised_in(
        "/usr/lib/python3/multiprocessing/resource_sharer.py", ConnectionResetError()
    )
    other = _raised_in("/somewhere/else.py", ConnectionResetError())
    hogwild._expect_broken_handshakes()
    sys.excepthook(type(broken), broken, broken.__traceback__)
    assert seen == [], "the broken handshake of a killed worker was printed"
    sys.excepthook(type(other), other, other.__traceback__)
    wrong = _raised_in("/usr/lib/python3/multiprocessing/resource_sharer.py", ValueError())
    sys.excepthook(type(wrong), wrong, wrong.__traceback__)
    assert seen == [ConnectionResetError, ValueError], "other errors must still be printed"
    monkeypatch.setattr(hogwild, "_last_abandon", -float("inf"))  # long after the abandon
    sys.excepthook(type(broken), broken, broken.__traceback__)
    assert seen[-1] is ConnectionResetError
