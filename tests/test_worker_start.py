"""Starting and stopping Hogwild workers: they are forked from a preloaded forkserver
(bigembed.train.hogwild.guard), which may have started long before a pool, yet see the
trainer's environment of the pool's start; killing them at once prints nothing extra."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from bigembed.kernels.native import build as native_build
from bigembed.train.hogwild import pool as hogwild
from bigembed.train.loop import train
from support.graphs import graph_config, write_graph


@pytest.mark.integration
@pytest.mark.skipif(native_build.native_library() is None, reason="no C++ compiler")
def test_workers_see_the_environment_of_the_pool_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_graph(tmp_path, num_entities=300, num_edges=3000, num_relations=1)

    def run(name: str) -> None:
        cfg = graph_config(
            tmp_path,
            num_epochs=1,
            dimension=16,
            workers=2,
            dynamic_relations=False,  # a model the kernel covers
            checkpoint_path=str(tmp_path / name),
        )
        train(cfg, progress=False)

    run("first")  # the forkserver now runs, with this environment
    # Each worker loads the native kernel from BIGEMBED_CACHE_DIR when it starts (this process
    # already has it loaded and will not look again): with the trainer's new setting the
    # workers build it there; with the forkserver's old one they load the cached library.
    cache = tmp_path / "cache"
    monkeypatch.setenv("BIGEMBED_CACHE_DIR", str(cache))
    run("second")
    assert list(cache.rglob("*.so")), "the workers did not see BIGEMBED_CACHE_DIR"


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
