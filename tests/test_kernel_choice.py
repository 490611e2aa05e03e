"""The native kernels as a visible choice: one ctypes mirror checked against the C layout, the
run's kernel decided once (``kernel: auto|native|eager``), printed in its first lines and
recorded in ``training_stats.json``; ``bigembed build-kernels`` builds ahead."""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from bigembed.errors import ConfigError
from bigembed.kernels.native import abi
from bigembed.kernels.native import build as native_build
from bigembed.kernels.native.choice import choose_kernel
from bigembed.model.scoring import NegativeSettings, ScoringModel
from bigembed.model.spec import ModelSpec, RelationSpec
from bigembed.train.records import StepLog, StepRecord, merge_step_logs, parse_records
from support.graphs import write_graph

ROOT = Path(__file__).resolve().parents[1]


def _built() -> Path | None:
    try:
        return native_build.find_or_build()
    except native_build.NativeUnavailable:
        return None


#: The built library (loaded or not: a mirror that differs must fail the tests, not skip them)
BUILT = _built()
needs_build = pytest.mark.skipif(
    BUILT is None, reason="no C++ compiler: the kernel cannot be built"
)
LIB = native_build.native_library()
needs_kernel = pytest.mark.skipif(LIB is None, reason="no C++ compiler: the kernel cannot be built")
PREBUILT = (native_build.PACKAGE_DIR / native_build.library_name()).is_file()

MODEL = ScoringModel(ModelSpec(relations=(RelationSpec("e", "e"),), entity_dims={"e": 8}))
NEGS = NegativeSettings(5, 5, 10)


# ----------------------------------------------------------------- the ABI mirror
@needs_build
def test_the_ctypes_mirror_matches_the_library_layout() -> None:
    lib = ctypes.CDLL(str(BUILT))
    native = abi.library_layout(lib)
    assert {r.type for r in native} == set(abi.STRUCTS)
    assert abi.compare_layouts(native, abi.mirror_layout()) is None
    assert abi.check_layout(lib) is None
    assert native_build.load_library(str(BUILT)) is not None


class _Reordered(ctypes.Structure):
    """StepArgs with two of its fields swapped (same size, same kinds)."""

    _fields_ = [(n, t) for n, t in abi.StepArgs._fields_ if n not in ("lhs_rows", "rhs_rows")]
    at = [n for n, _ in _fields_].index("dim")
    _fields_ = [*_fields_[:at], ("rhs_rows", abi.Int), ("lhs_rows", abi.Int), *_fields_[at:]]


@needs_kernel
def test_a_mirror_that_differs_is_refused_and_training_goes_eager(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert ctypes.sizeof(_Reordered) == ctypes.sizeof(abi.StepArgs)
    path = native_build.find_or_build()
    monkeypatch.setitem(abi.STRUCTS, "StepArgs", _Reordered)
    native_build.load_library.cache_clear()
    try:
        with pytest.raises(native_build.NativeUnavailable, match=r"ABI mismatch: .*StepArgs"):
            native_build.load_library(str(path))
        choice = choose_kernel("auto", MODEL, NEGS)
        assert choice.kernel == "eager" and "ABI mismatch" in choice.reason and choice.degraded
        with pytest.raises(ConfigError, match=r"kernel: native, but .*ABI mismatch"):
            choose_kernel("native", MODEL, NEGS)
    finally:
        native_build.load_library.cache_clear()


def test_layout_comparison_names_the_first_difference() -> None:
    rows = abi.mirror_layout()
    moved = [*rows]
    moved[3] = abi.Row(rows[3].type, rows[3].field, rows[3].offset + 8, 8, rows[3].kind)
    assert rows[3].field in (abi.compare_layouts(rows, moved) or "")
    assert "only the C side has" in (abi.compare_layouts(rows, rows[:-1]) or "")
    assert abi.compare_layouts(rows, rows) is None


# ----------------------------------------------------------------- the choice
def test_the_choice_says_why() -> None:
    eager = choose_kernel("eager", MODEL, NEGS)
    assert (eager.kernel, eager.library) == ("eager", None)
    assert eager.line() == "kernel: eager (forced by kernel: eager)"
    if LIB is None:
        return
    native = choose_kernel("auto", MODEL, NEGS)
    assert native.kernel == "native" and native.line().startswith("kernel: native (built at ")
    # The query entity as a negative (on by default within one type) is native too.
    for self_negative in ("auto", True):
        negs = NegativeSettings(5, 5, 10, self_negative=self_negative)
        assert MODEL.self_negative(negs, 0)
        assert choose_kernel("auto", MODEL, negs).kernel == "native"
    reg = ScoringModel(
        ModelSpec(relations=(RelationSpec("e", "e"),), entity_dims={"e": 8}, max_norm=1.0)
    )
    choice = choose_kernel("auto", reg, NEGS)
    assert (choice.kernel, choice.reason) == ("eager", "max_norm is not supported natively")
    assert choice.library is not None  # the eval still scores natively
    wide = ScoringModel(ModelSpec(relations=(RelationSpec("e", "e"),), entity_dims={"e": 2048}))
    assert choose_kernel("auto", wide, NEGS).reason == "dimension 2048 > native max 512"
    with pytest.raises(ConfigError, match="kernel: native, but max_norm"):
        choose_kernel("native", reg, NEGS)


def test_old_stats_without_the_kernel_still_read() -> None:
    old = {"type": "step", "version": 1, "stats": {"count": 5, "loss": 1.0}}
    (step,) = parse_records([old]).steps
    assert step.kernel is None and step.kernel_reason is None
    assert "kernel" not in step.to_json()
    native = StepRecord.from_json({**old, "kernel": "native", "kernel_reason": "built at x"})
    assert native.to_json()["kernel"] == "native"
    eager = StepRecord.from_json({**old, "kernel": "eager", "kernel_reason": "no compiler"})
    merged = merge_step_logs([StepLog([], native), StepLog([], eager)]).step
    assert (merged.kernel, merged.kernel_reason) == ("eager", "trainer 1: no compiler")


def test_a_distributed_steps_gate_waits_add_up_over_trainers() -> None:
    """The merged step sums the trainers' gate and peer waits and keeps each one's; a trainer
    that recorded none counts 0, and none recorded stays absent."""
    base = {"type": "step", "version": 1, "stats": {"count": 5, "loss": 1.0}}
    waited = StepRecord.from_json({**base, "gate_wait_seconds": 0.5, "peer_wait_seconds": 0.2})
    plain = StepRecord.from_json(base)
    merged = merge_step_logs([StepLog([], waited), StepLog([], plain)]).step
    assert merged.gate_wait_by_trainer == [0.5, 0.0]
    assert merged.peer_wait_by_trainer == [0.2, 0.0]
    assert merged.to_json()["peer_wait_seconds"] == 0.2
    both = merge_step_logs([StepLog([], waited), StepLog([], waited)]).step
    assert both.peer_wait_seconds == pytest.approx(0.4)
    none = merge_step_logs([StepLog([], plain), StepLog([], plain)]).step
    assert "peer_wait_seconds" not in none.to_json()


# ----------------------------------------------------------------- through bigembed train
def _config(root: Path, **keys: object) -> Path:
    write_graph(root, num_entities=200, num_edges=2000, num_relations=1)
    data = {
        "entities": {"node": {"num_partitions": 1}},
        "relations": [{"name": "all", "lhs": "node", "rhs": "node", "operator": "diagonal"}],
        "entity_path": str(root / "entities"),
        "edge_paths": [str(root / "edges")],
        "checkpoint_path": str(root / "model"),
        "dimension": 16,
        "comparator": "dot",
        "loss_fn": "softmax",
        "num_epochs": 1,
        "batch_size": 100,
        "num_batch_negs": 20,
        "num_uniform_negs": 20,
        "workers": 2,
        **keys,
    }
    path = root / "config.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _cli(*argv: str, **env: str | None) -> subprocess.CompletedProcess[str]:
    environ = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    environ.pop("BIGEMBED_KERNEL_DIR", None)
    for key, value in env.items():
        if value is None:
            environ.pop(key, None)
        else:
            environ[key] = value
    return subprocess.run(
        [sys.executable, "-m", "bigembed.cli", *argv],
        capture_output=True,
        text=True,
        env=environ,
        timeout=300,
    )


def _kernels_recorded(root: Path) -> set[tuple[str, str]]:
    lines = (root / "model" / "training_stats.json").read_text().splitlines()
    steps = [json.loads(line) for line in lines if '"step"' in line]
    return {(s["kernel"], s["kernel_reason"]) for s in steps if s.get("type") == "step"}


@pytest.mark.integration
def test_train_forced_eager(tmp_path: Path) -> None:
    done = _cli("train", str(_config(tmp_path, kernel="eager")), "--no-progress")
    assert done.returncode == 0, done.stderr
    assert "kernel: eager (forced by kernel: eager)" in done.stderr
    assert _kernels_recorded(tmp_path) == {("eager", "forced by kernel: eager")}


@pytest.mark.integration
@needs_kernel
def test_train_forced_native(tmp_path: Path) -> None:
    done = _cli("train", str(_config(tmp_path, kernel="native")), "--no-progress")
    assert done.returncode == 0, done.stderr
    assert "kernel: native (built at " in done.stderr
    ((kernel, reason),) = _kernels_recorded(tmp_path)
    assert kernel == "native" and reason.startswith("built at ")


@pytest.mark.integration
@pytest.mark.skipif(PREBUILT, reason="a kernel is built beside the code")
def test_train_without_a_compiler_warns_once(tmp_path: Path) -> None:
    """Two workers, one warning line with the remedy; ``kernel: native`` then fails in one
    line."""
    config = _config(tmp_path)
    no_compiler = {"CXX": str(tmp_path / "no-such-c++"), "BIGEMBED_CACHE_DIR": str(tmp_path / "c")}
    done = _cli("train", str(config), "--no-progress", **no_compiler)
    assert done.returncode == 0, done.stderr
    warnings = [line for line in done.stderr.splitlines() if "no C++ compiler found" in line]
    assert len(warnings) == 1, done.stderr
    assert "WARNING" in warnings[0] and "bigembed build-kernels" in warnings[0]
    assert "kernel: eager (no C++ compiler found" in warnings[0]
    ((kernel, reason),) = _kernels_recorded(tmp_path)
    assert kernel == "eager" and "install g++" in reason

    again = ("-p", "kernel=native", "-p", f"checkpoint_path={tmp_path / 'again'}")
    done = _cli("train", str(config), "--no-progress", *again, **no_compiler)
    assert done.returncode != 0
    assert "Traceback" not in done.stderr
    assert (
        done.stderr.strip()
        .splitlines()[-1]
        .startswith(
            "bigembed train: error: kernel: native, but the native kernel is unavailable: "
            "no C++ compiler found"
        )
    )


@pytest.mark.integration
@needs_kernel
def test_build_kernels_ahead_for_a_machine_without_a_compiler(tmp_path: Path) -> None:
    into = tmp_path / "kernels"
    done = _cli("build-kernels", "--into", str(into))
    assert done.returncode == 0, done.stderr
    (built,) = into.glob("*.so")
    assert f"Built the native kernel: {built}" in done.stdout
    assert f"BIGEMBED_KERNEL_DIR={into}" in done.stdout
    config = _config(tmp_path)
    done = _cli(
        "train",
        str(config),
        "--no-progress",
        CXX=str(tmp_path / "no-such-c++"),
        BIGEMBED_CACHE_DIR=str(tmp_path / "empty-cache"),
        BIGEMBED_KERNEL_DIR=str(into),
    )
    assert done.returncode == 0, done.stderr
    assert f"kernel: native (built at {built})" in done.stderr
    assert not (tmp_path / "empty-cache").exists() or not list(
        (tmp_path / "empty-cache").rglob("*")
    )


@pytest.mark.integration
def test_build_kernels_into_a_file_refuses_and_leaves_it(tmp_path: Path) -> None:
    """``--into`` names a folder: a file there is refused in one line and left as it was."""
    target = tmp_path / "notes.txt"
    target.write_text("mine\n")
    done = _cli("build-kernels", "--into", str(target))
    assert done.returncode != 0
    assert done.stderr.strip() == (
        f"bigembed build-kernels: error: --into {target}: not a directory (nothing was written)"
    )
    assert target.read_text() == "mine\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


@pytest.mark.integration
def test_build_kernels_without_a_compiler_fails_in_one_line(tmp_path: Path) -> None:
    done = _cli("build-kernels", "--into", str(tmp_path / "k"), CXX=str(tmp_path / "no-c++"))
    assert done.returncode != 0
    assert done.stderr.strip().startswith("bigembed build-kernels: error: no C++ compiler found")
    assert len(done.stderr.strip().splitlines()) == 1


@pytest.mark.integration
def test_the_workers_load_the_library_the_trainer_chose(tmp_path: Path) -> None:
    """A worker's trainer takes the kernel from its setup (it does not look for one itself):
    handed a library that is not there, it fails rather than finding its own."""
    from bigembed.kernels import KernelChoice
    from bigembed.train.hogwild.messages import WorkerSetup
    from bigembed.train.hogwild.worker import make_trainer

    states = [p.detach().clone() for p in MODEL.parameters()]
    setup = WorkerSetup(MODEL, states, NEGS, 0.1, 0.1, 10, False)
    assert make_trainer(setup).native is None  # the default choice: eager
    missing = KernelChoice("native", "chosen by the test", str(tmp_path / "missing.so"))
    setup.kernel = missing
    with pytest.raises(native_build.NativeUnavailable, match=r"missing\.so"):
        make_trainer(setup)
    if LIB is not None:
        setup.kernel = choose_kernel("auto", MODEL, NEGS)
        assert make_trainer(setup).native is not None
        setup.kernel = choose_kernel("eager", MODEL, NEGS)
        assert make_trainer(setup).native is None


def test_an_unwritable_cache_gives_the_remedy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cache that cannot be written (here a file where the directory belongs, which even
    root cannot write into; a read-only home alike) names the build-ahead remedy."""
    cache = tmp_path / "cache"
    cache.write_text("")
    monkeypatch.delenv("BIGEMBED_KERNEL_DIR", raising=False)
    monkeypatch.setattr(native_build, "PACKAGE_DIR", tmp_path / "package")
    monkeypatch.setenv("BIGEMBED_CACHE_DIR", str(cache))
    choice = choose_kernel("auto", MODEL, NEGS)
    assert choice.kernel == "eager" and choice.degraded
    assert f"cannot build the kernel into {cache / 'native'}" in choice.reason
    assert "bigembed build-kernels --into DIR" in choice.reason
