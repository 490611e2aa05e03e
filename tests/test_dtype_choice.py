"""``compute_dtype: auto``: the decision from the CPU flags and a cached timing, explicit
values, the line a run prints and records, and bf16 products on every all-entity path."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import torch

from bigembed.checkpoints.reading import load_trained
from bigembed.checkpoints.tables import EntityTables
from bigembed.errors import ConfigError
from bigembed.kernels import KernelChoice
from bigembed.model import DtypeChoice, NegativeSettings, QueryBatch, SideEmbeddings
from bigembed.model import dtype_choice as dc
from bigembed.ranking.filters import KnownEdges
from bigembed.ranking.full import EvalEdges, rank_edges
from bigembed.registry import UnknownName
from bigembed.train import loop
from bigembed.train.records import EdgeStats, Position, StepLog, StepRecord, merge_step_logs
from bigembed.train.single_machine import train
from support.checkpoints import make_config, write_checkpoint
from support.graphs import graph_config, write_graph
from support.steps import perturbed_model

FAST = {"float32": 50.0, "bfloat16": 200.0}  # bf16 4x fp32
SLOW = {"float32": 50.0, "bfloat16": 60.0}  # 1.2x: not worth it


@pytest.fixture(autouse=True)
def fresh_choice(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """Each test decides anew, with its own cache file and no environment override."""
    monkeypatch.delenv(dc.ENV_OVERRIDE, raising=False)
    monkeypatch.setattr(dc, "cache_path", lambda: tmp_path / "cache" / dc.CACHE_NAME)
    dc.choose_compute_dtype.cache_clear()
    yield
    dc.choose_compute_dtype.cache_clear()


def _machine(monkeypatch: pytest.MonkeyPatch, flags: tuple[str, ...] | None, rates=FAST) -> list:
    """Pretend to be a CPU with ``flags``; returns the list of measurements made."""
    calls: list[int] = []

    def measure() -> dict[str, float]:
        calls.append(1)
        return dict(rates)

    monkeypatch.setattr(dc, "cpu_info", lambda: ("Test CPU 9000", flags))
    monkeypatch.setattr(dc, "measure_rates", measure)
    return calls


def test_flags_and_a_faster_timing_choose_bf16(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _machine(monkeypatch, ("avx512_bf16", "amx_bf16"))
    choice = dc.choose_compute_dtype("auto")
    assert (choice.name, choice.dtype, choice.auto, len(calls)) == (
        "bfloat16",
        torch.bfloat16,
        True,
        1,
    )
    assert choice.line() == (
        "compute dtype: bfloat16 (auto: avx512_bf16, amx_bf16 on Test CPU 9000: bf16 200 "
        "against fp32 50 GFLOP/s, measured now)"
    )


def test_no_flags_choose_fp32_without_measuring(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _machine(monkeypatch, ())
    choice = dc.choose_compute_dtype("auto")
    assert choice.line() == "compute dtype: float32 (auto: no bf16 matrix units on Test CPU 9000)"
    assert calls == []


@pytest.mark.parametrize(
    ("flags", "rates", "name"),
    [(("amx_bf16",), SLOW, "float32"), (None, FAST, "bfloat16"), (None, SLOW, "float32")],
)
def test_the_timing_decides_where_flags_allow(
    monkeypatch: pytest.MonkeyPatch, flags: tuple[str, ...] | None, rates: dict, name: str
) -> None:
    """Flags present but bf16 not 1.5x faster: fp32; flags unknown (no /proc/cpuinfo): the
    timing alone."""
    _machine(monkeypatch, flags, rates)
    choice = dc.choose_compute_dtype("auto")
    assert choice.name == name
    if name == "float32":
        assert "not 1.5x faster" in choice.reason


def test_the_cache_is_read_instead_of_measuring_again(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    calls = _machine(monkeypatch, ("amx_bf16",))
    assert dc.choose_compute_dtype("auto").name == "bfloat16"
    dc.choose_compute_dtype.cache_clear()  # a new process
    again = dc.choose_compute_dtype("auto")
    assert len(calls) == 1 and again.name == "bfloat16" and again.reason.endswith("cached")
    entries = json.loads((tmp_path / "cache" / dc.CACHE_NAME).read_text())
    assert list(entries) == [dc.machine_key("Test CPU 9000", ("amx_bf16",))]
    # another machine (other flags) sharing the home directory: measured, both kept
    monkeypatch.setattr(dc, "cpu_info", lambda: ("Test CPU 9000", ("avx512_bf16",)))
    dc.choose_compute_dtype.cache_clear()
    dc.choose_compute_dtype("auto")
    assert len(calls) == 2
    assert len(json.loads((tmp_path / "cache" / dc.CACHE_NAME).read_text())) == 2


@pytest.mark.parametrize("content", ["{not json", "[1, 2]", '{"k": {"float32": "x"}}', ""])
def test_a_corrupt_cache_is_measured_again_and_rewritten(tmp_path: Path, content: str) -> None:
    path = tmp_path / "c" / dc.CACHE_NAME
    path.parent.mkdir()
    path.write_text(content)
    calls: list[int] = []
    key = "k"

    def measure() -> dict[str, float]:
        calls.append(1)
        return dict(FAST)

    assert dc.cached_rates(key, path, measure) == (FAST, False)
    assert dc.cached_rates(key, path, measure) == (FAST, True)
    assert len(calls) == 1
    assert json.loads(path.read_text()) == {key: FAST}


@pytest.mark.parametrize("name", ["float32", "bfloat16"])
def test_explicit_values_override_the_machine(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    def boom() -> None:
        raise AssertionError("an explicit compute_dtype must not look at the machine")

    monkeypatch.setattr(dc, "cpu_info", boom)
    monkeypatch.setattr(dc, "measure_rates", boom)
    monkeypatch.setenv(dc.ENV_OVERRIDE, "float32" if name == "bfloat16" else "bfloat16")
    choice = dc.choose_compute_dtype(name)
    assert (choice.name, choice.reason, choice.auto) == (name, "set by compute_dtype", False)


def test_environment_override_and_unknown_names(monkeypatch: pytest.MonkeyPatch) -> None:
    _machine(monkeypatch, ("amx_bf16",))
    monkeypatch.setenv(dc.ENV_OVERRIDE, "float32")
    assert dc.choose_compute_dtype("auto").line() == (
        "compute dtype: float32 (auto: set by BIGEMBED_COMPUTE_DTYPE=float32)"
    )
    dc.choose_compute_dtype.cache_clear()
    monkeypatch.setenv(dc.ENV_OVERRIDE, "fp16")
    with pytest.raises(ConfigError, match="BIGEMBED_COMPUTE_DTYPE='fp16': expected float32 or"):
        dc.choose_compute_dtype("auto")
    with pytest.raises(UnknownName, match="unknown compute dtype 'fp16'"):
        dc.choose_compute_dtype("fp16")


def test_the_cache_is_written_atomically_into_the_user_cache(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.undo()  # the real cache_path
    monkeypatch.setenv("BIGEMBED_CACHE_DIR", str(tmp_path / "user"))
    path = dc.cache_path()
    assert path == tmp_path / "user" / dc.CACHE_NAME
    dc.cached_rates("k", path, lambda: dict(SLOW))
    assert [p.name for p in path.parent.iterdir()] == [dc.CACHE_NAME]  # no temporary left


def test_measuring_is_bounded_and_restores_threads() -> None:
    threads = torch.get_num_threads()
    rates = dc.measure_rates(size=64, seconds=0.01)
    assert set(rates) == {"float32", "bfloat16"} and min(rates.values()) > 0
    assert torch.get_num_threads() == threads


def test_a_run_prints_and_records_its_choice(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """``compute_dtype: auto`` (the default) on a pretended bf16 machine: the run trains in bf16,
    says so among its first lines and in every step record of training_stats.json."""
    _machine(monkeypatch, ("amx_bf16",))
    write_graph(tmp_path, num_edges=300)
    cfg = graph_config(tmp_path, num_epochs=1)
    assert cfg.compute_dtype == "auto"
    with caplog.at_level("INFO", logger="bigembed.train.loop"):
        train(cfg, progress=False)
    lines = [r.getMessage() for r in caplog.records]
    expected = (
        "compute dtype: bfloat16 (auto: amx_bf16 on Test CPU 9000: bf16 200 against fp32 50 "
        "GFLOP/s, measured now)"
    )
    assert expected in lines[:3]
    stats = Path(cfg.checkpoint_path) / "training_stats.json"
    steps = [json.loads(x) for x in stats.read_text().splitlines()]
    steps = [s for s in steps if s["type"] == "step"]
    assert [(s["compute_dtype"], s["compute_dtype_reason"]) for s in steps] == [
        ("bfloat16", expected[len("compute dtype: bfloat16 (") : -1])
    ]


def test_auto_keeps_fp32_where_the_native_kernel_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """bf16 chosen by auto, but the native kernel (fp32 only) could run: fp32 and native; where
    it cannot, bf16 stays; an explicit bfloat16 is never changed."""
    _machine(monkeypatch, ("amx_bf16",))

    def fake_choice(requested: str, model, negs) -> KernelChoice:  # type: ignore[no-untyped-def]
        if model.compute_dtype == torch.float32 and model.spec.comparator == "dot":
            return KernelChoice("native", "test")
        return KernelChoice("eager", "test")

    monkeypatch.setattr(loop, "choose_kernel", fake_choice)
    negs = NegativeSettings(num_batch_negs=0, num_uniform_negs=5, uniform_group=5)
    for comparator, setting, kernel, name in [
        ("dot", "auto", "native", "float32"),
        ("cos", "auto", "eager", "bfloat16"),
        ("dot", "bfloat16", "eager", "bfloat16"),
    ]:
        model = perturbed_model("diagonal", comparator, compute_dtype=setting)
        choice = loop._choose_kernel("auto", model, negs)
        assert (choice.kernel, model.dtype_choice.name, model.compute_dtype) == (
            kernel,
            name,
            getattr(torch, name),
        )
        if name == "float32":
            assert model.dtype_choice.reason == loop.NATIVE_FP32


# ---------------------------------------------------------------- bf16 on every all-entity path
_PRODUCTS = (("mm", "matmul", "bmm", "baddbmm"), ("mm", "matmul", "bmm", "__matmul__"))


@contextmanager
def product_dtypes() -> Iterator[list[tuple[torch.dtype, ...]]]:
    """Records the dtypes of the tensor operands of every torch matrix product run inside,
    followed by its result's number of columns."""
    seen: list[tuple] = []
    saved = [(torch, n, getattr(torch, n)) for n in _PRODUCTS[0]]
    saved += [(torch.Tensor, n, getattr(torch.Tensor, n)) for n in _PRODUCTS[1]]

    def spy(func):  # type: ignore[no-untyped-def]
        def product(*args, **kwargs):  # type: ignore[no-untyped-def]
            res = func(*args, **kwargs)
            seen.append((*(a.dtype for a in args if isinstance(a, torch.Tensor)), res.shape[-1]))
            return res

        return product

    try:
        for owner, name, func in saved:
            setattr(owner, name, spy(func))
        yield seen
    finally:
        for owner, name, func in saved:
            setattr(owner, name, func)


def _assert_all_bf16(seen: list[tuple], min_columns: int = 0) -> None:
    """Products ran, and every one with at least ``min_columns`` result columns in bf16."""
    wide = [ops[:-1] for ops in seen if ops[-1] >= min_columns]
    assert wide, "no torch matrix product ran"
    assert all(d == torch.bfloat16 for ops in wide for d in ops), seen


def _sides(rows: int = 12, n: int = 9) -> tuple[SideEmbeddings, SideEmbeddings, torch.Tensor]:
    torch.manual_seed(3)
    table = torch.randn(rows, 8)
    lidx, ridx = torch.randint(rows, (n,)), torch.randint(rows, (n,))
    leaves = [x.clone().requires_grad_() for x in (table[lidx], table, table[ridx], table)]
    lhs = SideEmbeddings(leaves[0], lidx, None, leaves[1])
    rhs = SideEmbeddings(leaves[2], ridx, None, leaves[3])
    return lhs, rhs, torch.randint(3, (n,))


@pytest.mark.parametrize(
    ("loss", "need_scores"), [("softmax", False), ("ranking", False), ("softmax", True)]
)
def test_1vsall_and_all_negs_products_run_in_bf16(loss: str, need_scores: bool) -> None:
    """The tiled all-entity softmax (1vsAll) and the all-entity score blocks (``all_negs``
    with another loss, or scores kept), forward and backward."""
    model = perturbed_model("complex_diagonal", "dot", loss, compute_dtype="bfloat16")
    lhs, rhs, rel = _sides()
    negs = NegativeSettings(num_batch_negs=0, num_uniform_negs=0, uniform_group=9)
    with product_dtypes() as seen:
        out = model(lhs, rhs, rel, 0, None, negs, need_scores=need_scores)
        (out.loss + out.reg).backward()
    _assert_all_bf16(seen)
    assert out.loss.dtype == torch.float32 and lhs.all is not None and lhs.all.grad is not None
    assert lhs.all.grad.dtype == torch.float32


def test_kvsall_query_products_run_in_bf16() -> None:
    model = perturbed_model("complex_diagonal", "dot", compute_dtype="bfloat16")
    torch.manual_seed(4)
    table = torch.randn(12, 8)
    lidx, ridx, rel = torch.randint(12, (9,)), torch.randint(12, (9,)), torch.randint(3, (9,))
    keys, inverse = torch.unique(lidx * 3 + rel, return_inverse=True)
    leaves = [x.clone().requires_grad_() for x in (table[keys // 3], table, table[ridx])]
    q = QueryBatch("rhs", leaves[0], keys % 3, leaves[1], leaves[2], ridx, inverse, rel, None)
    with product_dtypes() as seen:
        out = model.query_loss(q)
        (out.loss + out.reg).backward()
    _assert_all_bf16(seen)
    assert leaves[1].grad is not None and leaves[1].grad.dtype == torch.float32


def test_full_ranking_runs_bf16_products_and_keeps_exact_ties(tmp_path: Path) -> None:
    """Full-ranking eval in bf16: the products are bf16, the scores compared in fp32; scores
    that bf16 represents exactly give the fp32 ranks, ties included (the hand-built ranks of
    tests/test_eval_ranking.py)."""
    cfg = make_config(tmp_path)
    emb = np.array([[1, 0], [5, 0], [4, 0], [3, 0], [3, 0], [1, 0]], np.float32)
    write_checkpoint(cfg, {("node", 0): emb}, ["all"])
    trained = load_trained(cfg.checkpoint_path)
    test = EvalEdges([0, 2], [0, 0], [3, 5])
    known = KnownEdges(np.array([0, 0, 2]), np.array([0, 0, 0]), np.array([3, 1, 3]), 1)

    def rank():  # type: ignore[no-untyped-def]
        res = rank_edges(trained.model, EntityTables(trained), trained.partition_bases, test, known)
        return [getattr(s, k).tolist() for s in (res.lhs, res.rhs) for k in ("raw", "filtered")]

    fp32 = rank()
    trained.model.use_dtype(DtypeChoice("bfloat16", "test"))
    with product_dtypes() as seen:
        bf16 = rank()
    _assert_all_bf16(seen, min_columns=2)  # the positives' own scores stay fp32 (1 column)
    assert bf16 == fp32
    # tails of (e0, r, ?) and (e2, r, ?), raw then filtered: e0 ties the true e5 (score 4)
    assert fp32[2:] == [[4, 6], [3, 5]]


def test_a_distributed_step_records_the_trainers_dtypes() -> None:
    """Merged step records: one dtype where every trainer agrees, ``mixed`` naming the first
    trainer that differs."""

    def log(name: str) -> StepLog:
        step = StepRecord(Position(1), EdgeStats(count=10))
        step.compute_dtype, step.compute_dtype_reason = name, f"reason {name}"
        return StepLog([], step)

    same = merge_step_logs([log("float32"), log("float32")]).step
    assert (same.compute_dtype, same.compute_dtype_reason) == ("float32", "reason float32")
    mixed = merge_step_logs([log("float32"), log("bfloat16")]).step
    assert (mixed.compute_dtype, mixed.compute_dtype_reason) == (
        "mixed",
        "trainer 0: float32; trainer 1: reason bfloat16",
    )


def test_eval_computes_in_the_given_configs_dtype(tmp_path: Path) -> None:
    """``compute_dtype`` is how to compute, not part of what was learnt: ``bigembed eval -p
    compute_dtype=...`` ranks in that dtype whatever the checkpoint trained in."""
    from bigembed.eval.evaluation import prepare_evaluation

    write_graph(tmp_path, num_edges=300)
    cfg = graph_config(tmp_path, num_epochs=1, compute_dtype="float32")
    train(cfg, progress=False)
    same = prepare_evaluation(cfg)
    assert same.trained.model.compute_dtype == torch.float32
    other = prepare_evaluation(cfg.model_copy(update={"compute_dtype": "bfloat16"}))
    assert other.trained.model.compute_dtype == torch.bfloat16
    assert prepare_evaluation(cfg.checkpoint_path).trained.model.compute_dtype == torch.float32
