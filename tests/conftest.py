"""Settings of every test process (pytest's own and its xdist workers), the shared fixtures, and
the rule of the ``integration`` marker.

One torch (OpenMP) thread per process, inherited by the processes the tests start (``bigembed``
commands, ranks, Hogwild workers) through ``OMP_NUM_THREADS``. The suite runs two test files at
once on a 2-core machine and most tests start processes of their own: with torch's default of one
thread per core, the OpenMP threads of several processes wait on each other at every parallel
region of the tiny test batches. Tests that need the default thread choice (a rank's share of the
cores) remove ``OMP_NUM_THREADS`` from the environment of the process they start. Likewise
``BIGEMBED_COMPUTE_DTYPE=float32``: ``compute_dtype: auto`` gives the same products on every
machine.

Fixtures: ``tiny_graph`` (a 200-entity planted graph written under the test's ``tmp_path``),
``tiny_config`` (its config), ``trained_checkpoint`` (a tiny model trained once per test module on
a memorisable ring graph; read it, do not write into it). The helpers behind them, and more, are
in ``tests/support/``.

A test that starts a process (a subprocess, or a multiprocessing process: the CLI, ranks,
servers, Hogwild workers with ``workers`` > 1, a forkserver) must be marked
``@pytest.mark.integration`` (or its module ``pytestmark = pytest.mark.integration``), so that
``pytest -m "not integration"`` stays a fast inner loop: an unmarked test that starts one fails,
naming the marker. Compiling the native kernel (a cached side effect of the first native step)
does not count.
"""

from __future__ import annotations

import multiprocessing.process
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")
# compute_dtype: auto is float32 in every test process, whatever the machine's bf16 units
# (tests/test_dtype_choice.py covers the decision itself).
os.environ.setdefault("BIGEMBED_COMPUTE_DTYPE", "float32")

import pytest
import torch

from bigembed.config import ConfigSchema
from support.checkpoints import TrainedRing, trained_ring
from support.graphs import graph_config, write_graph

torch.set_num_threads(1)

# modules that may start a process in any test: the native kernel's compiler (run once, cached)
# and the C library lookup (ldconfig)
PROCESSES_ALLOWED_FROM = ("bigembed.kernels.native.build", "ctypes.util")


@pytest.fixture(autouse=True)
def _processes_only_in_integration_tests(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Iterator[None]:
    """Fail a test not marked ``integration`` that starts a process (see the module's doc)."""
    if request.node.get_closest_marker("integration") is not None:
        yield
        return
    started: list[str] = []

    def refuse(what: str) -> None:
        frame = sys._getframe(2)
        while frame is not None:
            if str(frame.f_globals.get("__name__", "")).startswith(PROCESSES_ALLOWED_FROM):
                return
            frame = frame.f_back  # type: ignore[assignment]
        started.append(what)
        pytest.fail(
            f"{request.node.nodeid} starts a process ({what}): mark it @pytest.mark.integration",
            pytrace=False,
        )

    popen_init = subprocess.Popen.__init__
    process_start = multiprocessing.process.BaseProcess.start

    def guarded_popen(self: subprocess.Popen[Any], args: Any, *rest: Any, **kw: Any) -> None:
        refuse(f"subprocess {str(args)[:80]}")
        popen_init(self, args, *rest, **kw)

    def guarded_start(self: multiprocessing.process.BaseProcess) -> None:
        refuse(f"multiprocessing {self.name}")
        process_start(self)

    monkeypatch.setattr(subprocess.Popen, "__init__", guarded_popen)
    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", guarded_start)
    yield
    call = getattr(request.node, "call_report", None)
    if started and not (call is not None and call.failed):  # the code under test caught it
        pytest.fail(f"started a process without the integration marker: {started}", pytrace=False)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The test files with the most ``integration`` tests (the slow ones: processes) first, the
    unit-only files last; a file's tests stay together, in their order.

    Under the Makefile's ``--dist loadfile --no-loadscope-reorder`` the two workers take the
    files in this order, so the quick unit files fill whichever worker ends its share of slow
    files first (xdist's own order, the files with the fewest tests last, ended the run on
    one-test distributed files while the other worker sat idle)."""
    slow: Counter[str] = Counter()
    size: Counter[str] = Counter()
    first: dict[str, int] = {}
    for index, item in enumerate(items):
        path = item.nodeid.split("::")[0]
        size[path] += 1
        slow[path] += item.get_closest_marker("integration") is not None
        first.setdefault(path, index)

    def order(item: pytest.Item) -> tuple[int, int, int]:
        path = item.nodeid.split("::")[0]
        return -slow[path], -size[path], first[path]

    items.sort(key=order)  # stable: a file's tests keep their order


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """Keeps the report of a test's call on the item, for the fixtures' teardown to read."""
    report = yield
    if report.when == "call":
        item.call_report = report  # type: ignore[attr-defined]
    return report


@pytest.fixture
def tiny_graph(tmp_path: Path) -> Path:
    """A planted graph of 200 entities, 3 relations and 3000 edges in one partition, written in
    the storage format under ``tmp_path`` (returned): ``entities/``, ``edges/``."""
    write_graph(tmp_path)
    return tmp_path


@pytest.fixture
def tiny_config(tiny_graph: Path) -> ConfigSchema:
    """:func:`support.graphs.graph_config` of ``tiny_graph`` (d=16, 2 epochs, one worker, the
    checkpoint in ``tmp_path/model``); ``graph_config(tiny_graph, key=value)`` for another."""
    return graph_config(tiny_graph)


@pytest.fixture(scope="module")
def trained_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> TrainedRing:
    """A tiny model trained (about a second) on the ring graph of
    :func:`support.checkpoints.ring_graph`, whose edges it has memorised; once per test module,
    so a test must not write into its folder."""
    return trained_ring(tmp_path_factory.mktemp("trained"))
