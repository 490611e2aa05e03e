"""The layers of docs/ARCHITECTURE.md hold: no package imports a higher layer.

The contracts live in pyproject.toml (``[tool.importlinter]``) and are checked by import-linter's
``lint-imports``. To show they can fail, the same contracts are run over a stand-in package
``bigembed`` (empty modules, one per layer) built in a temporary directory, once clean and once
with a lower layer importing a higher one. A second check keeps other packages on the public
API of ``bigembed.storage`` and ``bigembed.edgelists`` (names in their ``__all__``).
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "bigembed"
LINT_IMPORTS = shutil.which("lint-imports", path=str(Path(sys.executable).parent)) or shutil.which(
    "lint-imports"
)
needs_linter = pytest.mark.skipif(LINT_IMPORTS is None, reason="import-linter not installed")


def _lint(
    cwd: Path, *, config: Path, pythonpath: Path | None = None
) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    assert LINT_IMPORTS is not None
    return subprocess.run(
        [LINT_IMPORTS, "--config", str(config), "--no-cache", "--no-logo"],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _contracts() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]


def _layer_modules(layers: list[str]) -> list[str]:
    """Module tails of every layer entry ('a | b', 'a : b', '(optional)')."""
    out = []
    for layer in layers:
        for part in re.split(r"[|:]", layer):
            out.append(part.strip().strip("()"))
    return out


def _fake_bigembed(root: Path, violation: tuple[str, str] | None) -> None:
    """The stand-in of :func:`_stand_in`; ``violation`` (importer, imported) adds one import
    between two of its packages."""
    _stand_in(root, [violation] if violation is not None else [])


def _write_import(root: Path, importer: str, imported: str, *, package: bool = False) -> None:
    """Create module ``importer`` (dotted; a package with ``package`` or if it is one already)
    and, with ``imported``, make it import that module from inside a function, as the real
    lazy imports do (the import graph counts them)."""
    parts = importer.split(".")
    for i in range(1, len(parts)):
        root.joinpath(*parts[:i]).mkdir(parents=True, exist_ok=True)
        root.joinpath(*parts[:i], "__init__.py").touch()
    where = root.joinpath(*parts)
    if package or where.is_dir():
        where.mkdir(exist_ok=True)
        path = where / "__init__.py"
    else:
        path = where.with_suffix(".py")
    text = path.read_text() if path.exists() else ""
    if imported:
        text += f"def _use_{text.count('def ')}():\n    import {imported}\n"
    path.write_text(text)


def _stand_in(root: Path, imports: list[tuple[str, str]]) -> None:
    """A stand-in ``bigembed`` under ``root`` that keeps every contract of pyproject.toml: an
    empty package per layer module of each layers contract, each source module of a forbidden
    contract, and each import the contracts ignore. Then each (importer, imported) of
    ``imports`` (names under ``bigembed.``): the importer's ``core`` module imports the
    imported's ``inner`` module."""
    for contract in _contracts()["contracts"]:
        if contract["type"] == "layers":
            for container in contract.get("containers", ["bigembed"]):
                for name in _layer_modules(contract["layers"]):
                    _write_import(root, f"{container}.{name}", "", package=True)
    for contract in _contracts()["contracts"]:
        for source in contract.get("source_modules", []):
            _write_import(root, source, "")
        for ignored in contract.get("ignore_imports", []):
            importer, imported = (part.strip() for part in ignored.split("->"))
            _write_import(root, imported, "")
            _write_import(root, importer, imported)
    for importer, imported in imports:
        _write_import(root, f"bigembed.{imported}.inner", "")
        _write_import(root, f"bigembed.{importer}.core", f"bigembed.{imported}.inner")


@pytest.mark.integration
@needs_linter
def test_bigembed_keeps_its_layers() -> None:
    result = _lint(ROOT, config=ROOT / "pyproject.toml")
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.integration
@needs_linter
@pytest.mark.parametrize(
    ("importer", "imported", "contract"),
    [
        ("storage", "train", "bigembed layers"),  # the lowest data layer reaching up
        ("model", "config", "bigembed layers"),  # the model must not read the job config
        ("train", "eval", "train and eval are independent"),
        ("eval", "train", "train and eval are independent"),
        ("serving", "export", "bigembed layers"),  # independent siblings
    ],
)
def test_the_contracts_catch_a_violation(
    tmp_path: Path, importer: str, imported: str, contract: str
) -> None:
    config = tmp_path / "pyproject.toml"
    shutil.copy(ROOT / "pyproject.toml", config)
    clean = tmp_path / "clean"
    clean.mkdir()
    _fake_bigembed(clean, None)
    result = _lint(clean, config=config, pythonpath=clean)
    assert result.returncode == 0, result.stdout + result.stderr

    broken = tmp_path / "broken"
    broken.mkdir()
    _fake_bigembed(broken, (importer, imported))
    result = _lint(broken, config=config, pythonpath=broken)
    assert result.returncode != 0, result.stdout
    broken_part = result.stdout.split("Broken contracts", 1)[-1]
    assert contract in broken_part
    assert f"bigembed.{importer}.core -> bigembed.{imported}.inner" in broken_part


# ----------------------------------------------------------------- inner layers and cycles
@needs_linter
@pytest.mark.parametrize(
    ("imports", "broken"),
    [
        ([("train.memory", "train.hogwild")], "train: the compositions"),
        ([("train.hogwild", "train.loop")], "train: the compositions"),
        ([("distributed.context", "distributed.trainer")], "distributed: the trainer's parts"),
        ([("distributed.auth", "distributed.store")], "distributed: the trainer's parts"),
        # a cycle between two subpackages of one layer, which no layers contract sees
        ([("kernels.a", "kernels.b"), ("kernels.b", "kernels.a")], "no import cycle"),
    ],
)
@pytest.mark.integration
def test_the_inner_contracts_catch_a_violation(
    tmp_path: Path, imports: list[tuple[str, str]], broken: str
) -> None:
    config = tmp_path / "pyproject.toml"
    shutil.copy(ROOT / "pyproject.toml", config)
    clean = tmp_path / "clean"
    _stand_in(clean, [])
    result = _lint(clean, config=config, pythonpath=clean)
    assert result.returncode == 0, result.stdout + result.stderr

    wrong = tmp_path / "wrong"
    _stand_in(wrong, imports)
    result = _lint(wrong, config=config, pythonpath=wrong)
    assert result.returncode != 0, result.stdout
    broken_part = result.stdout.split("Broken contracts", 1)[-1]
    assert broken in broken_part
    assert broken_part.count("\n" + broken) == 1, "only that contract breaks"
    importer, imported = imports[0]
    if len(imports) == 1:
        assert f"bigembed.{importer}.core -> bigembed.{imported}.inner" in broken_part
    else:
        assert "No cycles are allowed in bigembed.kernels" in broken_part


def _cycle_exemptions() -> list[tuple[str, str]]:
    """The imports the acyclic contract ignores (pyproject.toml says why), as pairs."""
    acyclic = next(c for c in _contracts()["contracts"] if c["type"] == "acyclic_siblings")
    pairs = [[p.strip() for p in e.split("->")] for e in acyclic.get("ignore_imports", [])]
    return [(a, b) for a, b in pairs]


def module_cycles(package: str, exempt: list[tuple[str, str]] = ()) -> list[list[str]]:
    """Every import cycle between the modules of ``package``, as its strongly connected
    components of more than one module (each sorted), from grimp's import graph less the
    ``exempt`` (importer, imported) imports.

    The graph counts imports inside functions but not those under ``TYPE_CHECKING`` (type
    hints only), as lint-imports does with ``exclude_type_checking_imports``. This sees what
    the acyclic contract cannot: a cycle through a package's own ``__init__`` (a package is not
    one of its children)."""
    import grimp

    graph = grimp.build_graph(package, cache_dir=None, exclude_type_checking_imports=True)
    for importer, imported in exempt:
        if graph.direct_import_exists(importer=importer, imported=imported):
            graph.remove_import(importer=importer, imported=imported)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(module: str) -> None:  # Tarjan's algorithm
        index[module] = low[module] = len(index)
        stack.append(module)
        for other in sorted(graph.find_modules_directly_imported_by(module)):
            if other not in index:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in stack:
                low[module] = min(low[module], index[other])
        if low[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for module in sorted(graph.modules):
        if module not in index:
            visit(module)
    return sorted(cycles)


def test_no_module_imports_itself_through_others() -> None:
    cycles = module_cycles("bigembed", _cycle_exemptions())
    assert not cycles, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_the_cycle_check_catches_a_cycle(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A stand-in package (another name: ``bigembed`` is imported already) whose ``__init__``
    imports a module that imports the package back, lazily, and a two-module cycle; the
    exemption list removes one of them."""
    pkg = tmp_path / "standin_cycles"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("def load():\n    from standin_cycles import leaf\n")
    (pkg / "leaf.py").write_text("import standin_cycles\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "a.py").write_text("from standin_cycles.sub import b\n")
    (pkg / "sub" / "b.py").write_text("def f():\n    from standin_cycles.sub import a\n")
    (pkg / "ok.py").write_text("import standin_cycles.sub.a\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    both = [
        ["standin_cycles", "standin_cycles.leaf"],
        ["standin_cycles.sub.a", "standin_cycles.sub.b"],
    ]
    assert module_cycles("standin_cycles") == both
    exempt = [("standin_cycles.sub.b", "standin_cycles.sub.a")]
    assert module_cycles("standin_cycles", exempt) == both[:1]


@pytest.mark.integration
@needs_linter
@pytest.mark.parametrize("imported", ["torch", "numpy", "bigembed.errors"])
def test_the_guard_contract_catches_a_heavy_import(tmp_path: Path, imported: str) -> None:
    """The worker guard runs before anything heavy is imported: standard library only."""
    config = tmp_path / "pyproject.toml"
    shutil.copy(ROOT / "pyproject.toml", config)
    _stand_in(tmp_path, [])
    _write_import(tmp_path, "bigembed.errors", "")
    (tmp_path / "bigembed" / "train" / "hogwild" / "guard.py").write_text(f"import {imported}\n")
    result = _lint(tmp_path, config=config, pythonpath=tmp_path)
    assert result.returncode != 0, result.stdout
    broken_part = result.stdout.split("Broken contracts", 1)[-1]
    assert "guard imports the standard library only" in broken_part
    assert f"bigembed.train.hogwild.guard -> {imported}" in broken_part


# ----------------------------------------------------------------- public APIs of packages
#: Every top-level package: other packages use the names its ``__init__`` exports.
PUBLIC_API_PACKAGES = tuple(sorted(p.parent.name for p in SRC.glob("*/__init__.py")))


def _exported(package: str) -> set[str]:
    """The names in a package's ``__all__`` (its ``__init__.pyi`` when it exports lazily)."""
    init = SRC / package / "__init__.pyi"
    if not init.exists():
        init = SRC / package / "__init__.py"
    tree = ast.parse(init.read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            return set(ast.literal_eval(node.value))
    return set()


def _private_uses(source: str, own: str, name: str) -> list[str]:
    """``name:line: what`` for each import of another package's internals in ``source``
    (a module of package ``own``)."""
    problems = []
    for node in ast.walk(ast.parse(source, name)):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            modules = [(node.module, [a.name for a in node.names])]
        elif isinstance(node, ast.Import):
            modules = [(a.name, []) for a in node.names]
        else:
            continue
        for module, names in modules:
            parts = module.split(".")
            if parts[0] != "bigembed" or len(parts) < 2:
                continue
            package = parts[1]
            if package not in PUBLIC_API_PACKAGES or package == own:
                continue
            where = f"{name}:{node.lineno}"
            if len(parts) > 2:
                problems.append(f"{where}: imports {module} (use bigembed.{package})")
                continue
            for imported in names:
                if imported not in _exported(package):
                    problems.append(f"{where}: {imported} is not in bigembed.{package}.__all__")
    return problems


def test_other_packages_use_only_the_public_api_of_a_package() -> None:
    assert all(_exported(package) for package in PUBLIC_API_PACKAGES if package != "commands")
    problems = []
    for path in sorted(SRC.rglob("*.py")):
        own = path.relative_to(SRC).parts[0]
        problems += _private_uses(path.read_text(), own, str(path.relative_to(ROOT)))
    assert not problems, "\n".join(problems)


def test_the_public_api_check_catches_internal_imports() -> None:
    """The scan flags a submodule import and a name missing from ``__all__``, not the rest."""
    source = (
        "from bigembed.storage.format import MANIFEST\n"
        "from bigembed.edgelists import InputFile, _EXTENSIONS\n"
        "from bigembed.storage import EntityStore\n"
        "from bigembed.storage.edges import EdgeStore\n"
    )
    problems = _private_uses(source, "eval", "probe.py")
    assert problems == [
        "probe.py:1: imports bigembed.storage.format (use bigembed.storage)",
        "probe.py:2: _EXTENSIONS is not in bigembed.edgelists.__all__",
        "probe.py:4: imports bigembed.storage.edges (use bigembed.storage)",
    ]
    assert _private_uses(source, "storage", "probe.py") == [
        "probe.py:2: _EXTENSIONS is not in bigembed.edgelists.__all__"
    ]


@pytest.mark.integration
def test_every_exported_name_resolves() -> None:
    """A lazy export (``__init__.pyi``, lazy_loader) names a module and an attribute; both must
    exist, which only importing them shows (``EAGER_IMPORT`` makes lazy_loader load them all)."""
    code = (
        "import importlib\n"
        f"for package in {PUBLIC_API_PACKAGES!r}:\n"
        "    module = importlib.import_module('bigembed.' + package)\n"
        "    for name in getattr(module, '__all__', ()):\n"
        "        getattr(module, name)\n"
    )
    env = {**os.environ, "EAGER_IMPORT": "1"}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=120)


@pytest.mark.integration
def test_hogwild_workers_do_not_load_the_stores() -> None:
    """A spawned Hogwild worker imports only what a training step needs: pulling in the stores
    (pyarrow) or the plotting stack costs ~40 MB of memory in every worker process."""
    code = (
        "import sys, bigembed.train.hogwild.worker, bigembed.train.hogwild.guard\n"
        "heavy = [m for m in ('pyarrow', 'matplotlib', 'h5py') if m in sys.modules]\n"
        "print(','.join(heavy))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert out == "", f"worker processes import {out}"


# ----------------------------------------------------------------- bench/ and tests/support/
BENCH = ROOT / "bench"
TESTS = ROOT / "tests"
BENCH_SCRIPTS = {p.stem for p in BENCH.glob("*.py")}
# a test of a bench script loads the script it tests (and nothing else of bench/)
BENCH_SCRIPT_TESTS = {
    "test_dp_bench.py": {"dp_bench", "dp_graphs", "dp_table"},
    "test_planted_graphs.py": {"planted_graphs", "popularity_baseline"},
    "test_wordnet_graph.py": {"wordnet_graph"},
}


def _imports(source: str, name: str) -> list[tuple[int, str, list[str]]]:
    """``(line, module, names)`` of each absolute import in ``source``."""
    found = []
    for node in ast.walk(ast.parse(source, name)):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module, [a.name for a in node.names]))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name, []) for a in node.names]
    return found


def _bench_problems(source: str, name: str) -> list[str]:
    """``name:line: what`` for each import in a bench script of something other than bigembed's
    public API (``bigembed`` and ``bigembed.<package>``'s ``__all__``), or of a test module."""
    problems = []
    for line, module, names in _imports(source, name):
        where = f"{name}:{line}"
        parts = module.split(".")
        if parts[0] == "bigembed" and len(parts) > 2:
            problems.append(f"{where}: imports {module} (use bigembed.{parts[1]})")
        elif parts[0] == "bigembed" and len(parts) == 2:
            if not (SRC / parts[1] / "__init__.py").exists():
                problems.append(f"{where}: imports the module {module} (not a package's API)")
                continue
            exported = _exported(parts[1])
            missing = [n for n in names if n not in exported]
            problems += [f"{where}: {n} is not in {module}.__all__" for n in missing]
        elif parts[0] == "bigembed":
            problems += [f"{where}: bigembed.{n} is not bigembed's API" for n in names]
        elif parts[0] == "conftest" or parts[0].startswith("test_"):
            problems.append(f"{where}: imports the test module {module} (use tests/support)")
    return problems


def _test_problems(source: str, name: str, allowed: set[str]) -> list[str]:
    """``name:line: what`` for each import in a test file of another test module or of a bench
    script not in ``allowed``."""
    problems = []
    for line, module, _ in _imports(source, name):
        top = module.split(".")[0]
        if top == "conftest" or top.startswith("test_"):
            problems.append(f"{name}:{line}: imports the test module {module} (use support)")
        elif top in BENCH_SCRIPTS and top not in allowed:
            problems.append(f"{name}:{line}: imports bench/{top}.py (use support)")
    return problems


def test_bench_uses_the_public_api_and_support_only() -> None:
    problems = []
    for path in sorted(BENCH.glob("*.py")):
        problems += _bench_problems(path.read_text(), str(path.relative_to(ROOT)))
    assert not problems, "\n".join(problems)


def test_tests_import_no_other_test_nor_bench() -> None:
    problems = []
    for path in sorted(TESTS.rglob("*.py")):
        allowed = BENCH_SCRIPT_TESTS.get(path.name, set()) if path.parent == TESTS else set()
        problems += _test_problems(path.read_text(), str(path.relative_to(ROOT)), allowed)
    assert not problems, "\n".join(problems)


def test_the_bench_and_test_import_checks_catch_violations() -> None:
    """The scans flag an internal module, a private name, a test module and a bench script,
    and not the public names, support, or a bench script's own test."""
    bench_source = (
        "from bigembed.train.loop import Trainer\n"
        "import bigembed.config.types\n"
        "from bigembed.config import Bytes, _private\n"
        "from bigembed.atomic import atomic_write_text\n"
        "from test_dist import free_port\n"
        "import bigembed\n"
        "from bigembed.checkpoints import CheckpointStore\n"
        "from support.graphs import graph_config\n"
        "import side_by_side\n"
    )
    assert _bench_problems(bench_source, "probe.py") == [
        "probe.py:1: imports bigembed.train.loop (use bigembed.train)",
        "probe.py:2: imports bigembed.config.types (use bigembed.config)",
        "probe.py:3: _private is not in bigembed.config.__all__",
        "probe.py:4: imports the module bigembed.atomic (not a package's API)",
        "probe.py:5: imports the test module test_dist (use tests/support)",
    ]
    test_source = (
        "from test_dist import free_port\n"
        "import side_by_side\n"
        "import planted_graphs\n"
        "from support.ranks import free_port\n"
    )
    assert _test_problems(test_source, "probe.py", {"planted_graphs"}) == [
        "probe.py:1: imports the test module test_dist (use support)",
        "probe.py:2: imports bench/side_by_side.py (use support)",
    ]
