"""The native step kernel (bigembed.kernels.native.step) against the eager step, its reference:
same losses, violators, updated rows, Adagrad states and relation parameters, on the configs it
supports; the eager path when it cannot be built or the config is outside it."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from bigembed.buckets.batching import Batch
from bigembed.kernels.native import build as native_build
from bigembed.kernels.native.choice import choose_kernel
from bigembed.kernels.native.step import NativeStep, unsupported
from bigembed.kernels.step import BatchTrainer, StepStats, Table
from bigembed.model import NegativeSettings, ScoringModel
from bigembed.model.spec import ModelSpec, RelationSpec

ROWS, DIM = 600, 13

LIB = native_build.native_library()
needs_kernel = pytest.mark.skipif(LIB is None, reason="no C++ compiler: the kernel cannot be built")


def _spec(comparator: str, loss: str, operator: str, glob: bool, **extra) -> ModelSpec:
    return ModelSpec(
        relations=(RelationSpec("e", "e", operator, weight=1.5),),
        entity_dims={"e": DIM},
        comparator=comparator,
        loss=loss,
        global_emb=glob,
        **extra,
    )


def _run(
    spec: ModelSpec,
    negs: NegativeSettings,
    batch: int,
    weighted: bool,
    shared: bool,
    native: bool,
    self_loops: int = 0,
) -> tuple[list[StepStats], Table, Table, list[torch.Tensor]]:
    """Three steps from the same seeded model, tables and batches (the first ``self_loops``
    edges of each batch with the same offset on both sides)."""
    torch.manual_seed(0)
    model = ScoringModel(spec)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    states = [torch.zeros_like(p) for p in model.parameters()]
    gen = torch.Generator().manual_seed(0)
    step = NativeStep.for_model(model, negs, LIB) if native and LIB is not None else None
    trainer = BatchTrainer(model, states, negs, 0.1, 0.05, gen, native=step)
    assert (trainer.native is not None) == native
    g = torch.Generator().manual_seed(1)
    lhs = Table(torch.randn(ROWS, DIM, generator=g), torch.rand(ROWS, generator=g))
    rhs = lhs
    if not shared:
        rhs = Table(torch.randn(ROWS + 7, DIM, generator=g), torch.rand(ROWS + 7, generator=g))
    stats = []
    for _ in range(3):
        heads = torch.randint(ROWS, (batch,), generator=g)
        tails = torch.randint(ROWS, (batch,), generator=g)
        tails[:self_loops] = heads[:self_loops]
        b = Batch(
            heads,
            tails,
            torch.zeros(batch, dtype=torch.long),
            0,
            torch.rand(batch, generator=g) + 0.5 if weighted else None,
        )
        stats.append(trainer.step(b, lhs, rhs))
    return stats, lhs, rhs, [p.detach() for p in model.parameters()]


# (comparator, loss, operator, global_emb, batch, batch negs, uniform negs, uniform group,
#  weighted, one shared table, disabled sides)
CASES = [
    ("cos", "ranking", "none", True, 40, 10, 8, 40, False, False, (False, False)),
    ("cos", "softmax", "none", True, 40, 10, 8, 40, True, True, (False, False)),
    ("dot", "softmax", "translation", False, 23, 6, 4, 7, False, False, (False, False)),
    ("cos", "logistic", "diagonal", True, 17, 0, 5, 5, True, False, (False, False)),
    ("dot", "ranking", "diagonal", True, 30, 50, 7, 30, False, True, (False, False)),
    ("cos", "softmax", "translation", True, 25, 10, 8, 12, False, False, (True, False)),
    ("dot", "logistic", "none", False, 25, 10, 9, 25, True, False, (False, True)),
    ("cos", "ranking", "translation", False, 1000, 50, 50, 1000, False, False, (False, False)),
]


@needs_kernel
@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c[:5])))
def test_native_step_matches_eager(case: tuple) -> None:
    comparator, loss, operator, glob, batch, nb, nu, group, weighted, shared, off = case
    spec = _spec(comparator, loss, operator, glob)
    negs = NegativeSettings(nb, nu, group, *off)
    eager = _run(spec, negs, batch, weighted, shared, native=False)
    native = _run(spec, negs, batch, weighted, shared, native=True)
    for e, n in zip(eager[0], native[0], strict=True):
        assert n.loss == pytest.approx(e.loss, rel=1e-5)
        assert n.count == e.count == batch
        # Ties (a negative that is the positive's own entity) may round either way.
        for ev, nv in ((e.violators_lhs, n.violators_lhs), (e.violators_rhs, n.violators_rhs)):
            assert abs(ev - nv) <= 2 + 0.01 * ev
    for e_tab, n_tab in zip(eager[1:3], native[1:3], strict=True):
        torch.testing.assert_close(n_tab.emb, e_tab.emb, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(n_tab.state, e_tab.state, rtol=1e-4, atol=1e-6)
    for e_p, n_p in zip(eager[3], native[3], strict=True):
        torch.testing.assert_close(n_p, e_p, rtol=1e-5, atol=1e-5)
    # The steps moved the rows (so the comparison above compares updates).
    initial = torch.randn(ROWS, DIM, generator=torch.Generator().manual_seed(1))
    assert (native[1].emb - initial).abs().max() > 1e-3


# (comparator, loss, operator, global_emb, batch, batch negs, uniform negs, uniform group,
#  weighted, one shared table, disabled sides)
SELF_NEGATIVE_CASES = [
    ("cos", "softmax", "translation", True, 40, 10, 8, 40, True, True, (False, False)),
    ("dot", "ranking", "diagonal", True, 23, 6, 4, 7, False, False, (False, False)),
    ("cos", "logistic", "diagonal", False, 30, 0, 5, 10, True, True, (False, False)),
    ("dot", "softmax", "none", False, 25, 10, 9, 25, False, True, (True, False)),
    ("cos", "ranking", "translation", True, 25, 10, 8, 12, True, False, (False, True)),
]


@needs_kernel
@pytest.mark.parametrize("case", SELF_NEGATIVE_CASES, ids=lambda c: "-".join(map(str, c[:5])))
def test_native_step_matches_eager_with_self_negative(case: tuple) -> None:
    """The query-entity column (``self_negative``, on by default within one type) natively:
    the eager step's losses, violators, rows, states and parameters; self-loops masked."""
    comparator, loss, operator, glob, batch, nb, nu, group, weighted, shared, off = case
    spec = _spec(comparator, loss, operator, glob)
    negs = NegativeSettings(nb, nu, group, *off, self_negative="auto")
    eager = _run(spec, negs, batch, weighted, shared, native=False, self_loops=3)
    native = _run(spec, negs, batch, weighted, shared, native=True, self_loops=3)
    without = _run(spec, replace(negs, self_negative=False), batch, weighted, shared, True, 3)
    for e, n, w in zip(eager[0], native[0], without[0], strict=True):
        assert n.loss == pytest.approx(e.loss, rel=1e-5)
        assert abs(n.loss - w.loss) > 1e-3 * abs(w.loss)  # the column counts
        for ev, nv in ((e.violators_lhs, n.violators_lhs), (e.violators_rhs, n.violators_rhs)):
            assert abs(ev - nv) <= 2 + 0.01 * ev
    for e_tab, n_tab in zip(eager[1:3], native[1:3], strict=True):
        torch.testing.assert_close(n_tab.emb, e_tab.emb, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(n_tab.state, e_tab.state, rtol=1e-4, atol=1e-6)
    for e_p, n_p in zip(eager[3], native[3], strict=True):
        torch.testing.assert_close(n_p, e_p, rtol=1e-5, atol=1e-5)


@needs_kernel
@pytest.mark.parametrize(
    "spec, negs",
    [
        (_spec("cos", "ranking", "linear", True), NegativeSettings(5, 5, 10)),
        (_spec("l2", "ranking", "none", True), NegativeSettings(5, 5, 10)),
        (_spec("cos", "ranking", "none", True, bias=True), NegativeSettings(5, 5, 10)),
        (_spec("cos", "ranking", "none", True, max_norm=1.0), NegativeSettings(5, 5, 10)),
        (
            _spec("dot", "softmax", "none", True, regularization_coef=0.1),
            NegativeSettings(5, 5, 10),
        ),
        (_spec("cos", "ranking", "none", True, entity_dropout=0.2), NegativeSettings(5, 5, 10)),
        (_spec("cos", "ranking", "none", True), NegativeSettings(5, 0, 10)),
        (_spec("cos", "ranking", "none", True), NegativeSettings(5, 600, 10)),
        (
            _spec("dot", "ranking", "none", True, dynamic_relations=True, num_dynamic_relations=2),
            NegativeSettings(5, 5, 10),
        ),
    ],
    ids=[
        "linear",
        "l2",
        "bias",
        "max_norm",
        "regularizer",
        "dropout",
        "no-uniform",
        "wide",
        "dynamic",
    ],
)
def test_configs_outside_the_kernel_take_the_eager_path(
    spec: ModelSpec, negs: NegativeSettings
) -> None:
    assert unsupported(ScoringModel(spec), negs) is not None


@needs_kernel
def test_all_negs_relation_takes_the_eager_path() -> None:
    spec = ModelSpec(
        relations=(RelationSpec("e", "e", "none", all_negs=True), RelationSpec("e", "e", "none")),
        entity_dims={"e": DIM},
        comparator="cos",
        loss="softmax",
    )
    assert LIB is not None
    native = NativeStep.for_model(ScoringModel(spec), NegativeSettings(5, 5, 10), LIB)
    assert native is not None  # the model qualifies (its second relation), the first does not
    table = torch.randn(50, DIM)
    idx = torch.arange(10)
    batch = Batch(idx, idx, torch.zeros(10, dtype=torch.long), 0, None)
    state = torch.zeros(50)
    before = table.clone()
    assert native.step(batch, table, state, table, state, torch.Generator(), 0.1) is None
    assert torch.equal(table, before)


def _no_prebuilt_kernel(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing built anywhere the loader looks, and an empty cache."""
    monkeypatch.delenv("BIGEMBED_KERNEL_DIR", raising=False)
    monkeypatch.setattr(native_build, "PACKAGE_DIR", tmp_path / "package")
    monkeypatch.setenv("BIGEMBED_CACHE_DIR", str(tmp_path / "cache"))


def test_missing_compiler_falls_back_to_eager(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    _no_prebuilt_kernel(tmp_path, monkeypatch)
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    spec = _spec("cos", "ranking", "none", True)
    negs = NegativeSettings(10, 8, 40)
    choice = choose_kernel("auto", ScoringModel(spec), negs)
    assert (choice.kernel, choice.library, choice.degraded) == ("eager", None, True)
    assert "no C++ compiler found" in choice.reason
    assert "bigembed build-kernels" in choice.reason  # the remedy
    assert not list((tmp_path / "cache").rglob("*.so"))
    assert choice.step_kernel(ScoringModel(spec), negs) is None
    stats = _run(spec, negs, 40, False, False, native=False)[0]
    assert all(s.loss > 0 for s in stats)


def test_failing_compiler_falls_back_and_native_can_be_turned_off(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _no_prebuilt_kernel(tmp_path, monkeypatch)
    model = ScoringModel(_spec("cos", "ranking", "none", True))
    negs = NegativeSettings(10, 8, 40)
    monkeypatch.setenv("CXX", "false")  # exists, exits 1
    choice = choose_kernel("auto", model, negs)
    assert choice.kernel == "eager" and "false failed to build" in choice.reason
    assert not list((tmp_path / "cache").rglob("*.so"))  # no partial library left
    monkeypatch.delenv("CXX")
    monkeypatch.setenv("BIGEMBED_NATIVE", "0")
    choice = choose_kernel("auto", model, negs)
    assert (choice.kernel, choice.reason) == ("eager", "turned off by BIGEMBED_NATIVE=0")
    assert not choice.degraded


def test_library_name_keeps_the_source_and_flags(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A library built from another source or for other vector units is never loaded."""
    name = native_build.library_name()
    source = tmp_path / "native_step.cpp"
    source.write_text(native_build.SOURCE.read_text() + "// changed\n")
    monkeypatch.setattr(native_build, "SOURCE", source)
    assert native_build.library_name() != name
    monkeypatch.undo()
    flags = native_build.compile_flags()
    monkeypatch.setattr(native_build, "compile_flags", lambda: [*flags, "-mavx512f"])
    assert native_build.library_name() != name
    monkeypatch.undo()
    assert native_build.library_name() == name
