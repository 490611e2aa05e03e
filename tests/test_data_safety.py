"""Never destroy or corrupt what the user has: outputs vs inputs, --force, staging, import ids."""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bigembed.cli import main as cli_main
from bigembed.importing.publish import Publisher
from bigembed.output_paths import STAGING_MARKER, claim_staging
from bigembed.storage import EdgeStore, EntityStore
from support.imports import random_edges, write_config, write_tsv

ROOT = Path(__file__).resolve().parents[1]


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = cli_main(list(argv))
    captured = capsys.readouterr()
    return code, captured.err


def _one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err  # one line, no traceback
    return lines[0]


def _tree(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A project dir: config.yaml, edges.tsv, out/{entities,edges,model} (imported, trained)."""
    root = tmp_path_factory.mktemp("project")
    write_config(root)
    write_tsv(root / "edges.tsv", random_edges(300, 40, ["r"], seed=1))
    assert (
        cli_main(["import", "--no-progress", str(root / "config.yaml"), str(root / "edges.tsv")])
        == 0
    )
    assert (
        cli_main(
            [
                "train",
                "--no-progress",
                str(root / "config.yaml"),
                "-p",
                "num_epochs=1",
                "-p",
                "workers=1",
            ]
        )
        == 0
    )
    return root


@pytest.fixture()
def project(trained: Path, tmp_path: Path) -> Path:
    """A private copy of the trained project (paths in the config rewritten)."""
    root = tmp_path / "proj"
    shutil.copytree(trained, root)
    text = (root / "config.yaml").read_text().replace(str(trained), str(root))
    (root / "config.yaml").write_text(text)
    return root


# ---------------------------------------------------------------------- export


def test_export_force_into_or_above_the_checkpoint_is_refused(project: Path, capsys) -> None:
    model = project / "out" / "model"
    before = _tree(project)
    for target in (model, project, project / "out", model / "sub"):
        code, err = _run(
            capsys, "export", str(model), "--format", "npy", "-o", str(target), "--force"
        )
        line = _one_line(err)
        assert code == 2 and str(target) in line and str(model) in line, line
        assert "input" in line
    # the entity store is an input too
    ent = project / "out" / "entities"
    code, err = _run(
        capsys,
        "export",
        str(model),
        "--format",
        "npy",
        "-o",
        str(ent / "x"),
        "--entity-path",
        str(ent),
    )
    assert code == 2 and f"{ent}" in _one_line(err)
    assert _tree(project) == before


def test_export_force_replaces_only_an_earlier_export(project: Path, capsys) -> None:
    model = project / "out" / "model"
    edges = project / "out" / "edges"
    before = _tree(edges)
    code, err = _run(capsys, "export", str(model), "--format", "npy", "-o", str(edges), "--force")
    assert code == 2 and "not replaced" in _one_line(err)
    assert _tree(edges) == before
    out = project / "exported"
    assert _run(capsys, "export", str(model), "--format", "tsv", "-o", str(out))[0] == 0
    assert (out / ".bigembed-output.json").exists()
    assert _run(capsys, "export", str(model), "--format", "npy", "-o", str(out), "--force")[0] == 0
    assert (out / "embeddings_node.npy").exists() and not (out / "entities.tsv").exists()


# ---------------------------------------------------------------------- import


def test_import_force_never_deletes_a_directory_that_is_not_an_edge_store(
    tmp_path: Path, capsys
) -> None:
    config = write_config(tmp_path)
    data = write_tsv(tmp_path / "in.tsv", random_edges(50, 10, ["r"]))
    mine = tmp_path / "out" / "edges"
    mine.mkdir(parents=True)
    (mine / "thesis.tex").write_text("years of work")
    code, err = _run(capsys, "import", "--no-progress", str(config), str(data), "--force")
    line = _one_line(err)
    assert code == 2 and f"{mine}: not replaced" in line and "manifest.json" in line
    assert (mine / "thesis.tex").read_text() == "years of work"
    assert not (tmp_path / "out" / "entities" / "manifest.json").exists()


def test_import_force_never_replaces_entity_files_it_did_not_write(tmp_path: Path, capsys) -> None:
    config = write_config(tmp_path)
    data = write_tsv(tmp_path / "in.tsv", random_edges(50, 10, ["r"]))
    ent = tmp_path / "out" / "entities"
    ent.mkdir(parents=True)
    pbg = {"entity_count_node_0.txt": "2\n", "entity_names_node_0.json": '["a", "b"]'}
    for name, text in pbg.items():
        (ent / name).write_text(text)
    code, err = _run(capsys, "import", "--no-progress", str(config), str(data), "--force")
    assert code == 2 and "no bigembed entity store manifest.json" in _one_line(err)
    assert {p.name: p.read_text() for p in ent.iterdir()} == pbg


@pytest.mark.parametrize("where", ["is", "holds"])
def test_import_edge_path_overlapping_the_input_is_refused(
    tmp_path: Path, capsys, where: str
) -> None:
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    data = write_tsv(data_dir / "in.tsv", random_edges(50, 10, ["r"]))
    config = write_config(tmp_path)
    edge_path = data if where == "is" else data_dir
    cfg = config.read_text().replace(str(tmp_path / "out" / "edges"), str(edge_path))
    config.write_text(cfg)
    before = data.read_bytes()
    for extra in ([], ["--force"]):
        code, err = _run(capsys, "import", "--no-progress", str(config), str(data), *extra)
        line = _one_line(err)
        assert code == 2 and str(edge_path) in line and str(data) in line and "input" in line
    assert data.read_bytes() == before
    assert sorted(p.name for p in data_dir.iterdir()) == ["in.tsv"]


def test_entity_path_may_hold_the_inputs(tmp_path: Path, capsys) -> None:
    """PBG's examples keep the raw data in the entity path: that stays allowed."""
    config = write_config(tmp_path)
    ent = tmp_path / "out" / "entities"
    ent.mkdir(parents=True)
    data = write_tsv(ent / "train.tsv", random_edges(50, 10, ["r"]))
    assert _run(capsys, "import", "--no-progress", str(config), str(data))[0] == 0
    assert _run(capsys, "import", "--no-progress", str(config), str(data), "--force")[0] == 0
    assert data.exists() and EntityStore(ent).import_id is not None


def test_nul_bytes_in_names_are_rejected_with_file_and_line(tmp_path: Path, capsys) -> None:
    config = write_config(tmp_path, dynamic=True)
    for text, line in ((b"a\tr\tb\nc\x00d\tr\te\n", 2), (b"a\tr\tb\nc\tr\x00s\te\n", 2)):
        data = tmp_path / "in.tsv"
        data.write_bytes(text)
        code, err = _run(capsys, "import", "--no-progress", str(config), str(data))
        assert code == 2 and f"{data}:{line}: NUL byte" in _one_line(err)
        assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("first", "rest", "args", "warned"),
    [
        ("lhs\trel\trhs", "a\tr\tb", [], True),
        ("head\trelation\ttail", "a\tr\tb", [], True),
        ("src\tr\tdst", "1\tr\t2\n3\tr\t4", [], True),
        ("x\tr\ty", "1\tr\t2\n3\tr\t4", [], True),  # non-numeric above numeric ids
        ("x\tr\ty", "a\tr\tb\nc\tr\td", [], False),
        ("lhs\trel\trhs", "a\tr\tb", ["--header"], False),
    ],
)
def test_a_header_line_without_header_flag_is_warned_about(
    tmp_path: Path, caplog, first: str, rest: str, args: list[str], warned: bool
) -> None:
    config = write_config(tmp_path, dynamic=True)
    data = tmp_path / "in.tsv"
    data.write_text(f"{first}\n{rest}\n")
    if "--header" in args:
        args = [*args, "--lhs-col", "lhs", "--rel-col", "rel", "--rhs-col", "rhs"]
    with caplog.at_level(logging.WARNING, logger="bigembed"):
        assert cli_main(["import", "--no-progress", str(config), str(data), *args]) == 0
    hits = [r for r in caplog.records if "looks like a header" in r.getMessage()]
    assert len(hits) == (1 if warned else 0), caplog.text
    if warned:
        assert str(data) in hits[0].getMessage() and "--header" in hits[0].getMessage()


# ---------------------------------------------------------------------- import ids


class Killed(BaseException):
    """Stands for SIGKILL: nothing after it runs (no rollback, no cleanup)."""


def _kill_after_edges(monkeypatch: pytest.MonkeyPatch) -> None:
    """Kill the import once the edge stores are published, before the entity files."""
    real_move = Publisher._move

    def move(self: Publisher, src: Path, dst: Path) -> None:
        if self.work is not None and src.parent == self.work / "entities":
            raise Killed
        real_move(self, src, dst)

    monkeypatch.setattr(Publisher, "_move", move)
    monkeypatch.setattr(Publisher, "_rollback", lambda self: None)
    monkeypatch.setattr(Publisher, "abort", lambda self: self._release())


def test_kill_between_edge_and_entity_publication_is_detected(
    project: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    config = str(project / "config.yaml")
    old_entities = EntityStore(project / "out" / "entities").import_id
    assert old_entities is not None
    assert EdgeStore(project / "out" / "edges").import_id == old_entities
    write_tsv(project / "edges.tsv", random_edges(300, 60, ["r"], seed=2))
    _kill_after_edges(monkeypatch)
    with pytest.raises(Killed):
        cli_main(["import", "--no-progress", config, str(project / "edges.tsv"), "--force"])
    monkeypatch.undo()
    assert EdgeStore(project / "out" / "edges").import_id != old_entities  # new edges, old names
    code, err = _run(capsys, "train", "--no-progress", config, "-p", "num_epochs=1")
    line = _one_line(err)
    assert code == 2 and "entities" in line and "re-run `bigembed import --force`" in line, line
    # the next forced import repairs it (a new checkpoint: the old one is of the old import)
    assert (
        _run(capsys, "import", "--no-progress", config, str(project / "edges.tsv"), "--force")[0]
        == 0
    )
    assert (
        _run(
            capsys,
            "train",
            "--no-progress",
            config,
            "-p",
            "num_epochs=1",
            "-p",
            f"checkpoint_path={project / 'model2'}",
        )[0]
        == 0
    )


def test_edge_store_of_another_import_is_refused(project: Path, tmp_path: Path, capsys) -> None:
    """Stores that each look complete but come from different imports: a one-line error."""
    other = tmp_path / "other"
    other.mkdir()
    config_b = write_config(other)
    # other names: the same 40 would be the same import (ids are derived from the entities)
    write_tsv(other / "in.tsv", random_edges(300, 50, ["r"], seed=5))
    assert _run(capsys, "import", "--no-progress", str(config_b), str(other / "in.tsv"))[0] == 0
    edges = project / "out" / "edges"
    shutil.rmtree(edges)
    shutil.copytree(other / "out" / "edges", edges)
    config = str(project / "config.yaml")
    want = (
        f"{edges} was imported with a different entity store than "
        f"{project / 'out' / 'entities'} (import ids differ); re-run bigembed import"
    )
    code, err = _run(capsys, "train", "--no-progress", config, "-p", "num_epochs=1")
    assert code == 2 and _one_line(err) == f"bigembed train: error: {want}"
    code, err = _run(capsys, "eval", "--no-progress", config, "--edges", str(edges))
    assert code == 2 and want in _one_line(err)


@pytest.mark.integration
def test_edges_of_another_relation_list_are_refused(tmp_path: Path, capsys) -> None:
    """Relation ids index the config's relations at import time: a config whose list changed
    since (a relation dropped, the order changed) is refused with one line, by train (with
    Hogwild workers) and eval; stores written before manifests recorded the list are caught
    when a bucket holds an id past the config's list."""
    rels = [(name, "node", "node") for name in ("a", "b", "c")]
    write_config(tmp_path, relations=rels)
    write_tsv(tmp_path / "in.tsv", random_edges(600, 40, ["a", "b", "c"], seed=3))
    config = str(tmp_path / "config.yaml")
    assert _run(capsys, "import", "--no-progress", config, str(tmp_path / "in.tsv"))[0] == 0
    edges = tmp_path / "out" / "edges"
    for changed in (rels[:1], [rels[1], rels[0], rels[2]]):
        other = write_config(tmp_path, relations=changed, name="changed.yaml")
        names = ", ".join(r[0] for r in changed)
        want = (
            f"bigembed train: error: relations: the config has relations [{names}] but {edges} "
            "was imported with relations [a, b, c]; re-run bigembed import (or restore the "
            "config's relations)"
        )
        code, err = _run(capsys, "train", "--no-progress", str(other), "-p", "workers=2")
        assert code == 2 and _one_line(err) == want
        assert not (tmp_path / "out" / "model").exists()
    assert _run(capsys, "train", "--no-progress", config, "-p", "num_epochs=1")[0] == 0
    manifest = edges / "manifest.json"
    data = json.loads(manifest.read_text())
    manifest.write_text(json.dumps({**data, "relations": ["a", "c", "b"]}))
    code, err = _run(capsys, "eval", "--no-progress", config, "--edges", str(edges))
    assert code == 2 and "was imported with relations [a, c, b]" in _one_line(err)
    data.pop("relations")
    manifest.write_text(json.dumps(data))
    one = write_config(tmp_path, relations=rels[:1], name="one.yaml")
    fresh = f"checkpoint_path={tmp_path / 'fresh'}"
    code, err = _run(capsys, "train", "--no-progress", str(one), "-p", "workers=2", "-p", fresh)
    assert code == 2
    assert "has relation id 2 but the config has 1 relation(s)" in _one_line(err)


def test_stores_without_import_ids_are_tolerated(project: Path) -> None:
    for store in ("entities", "edges"):
        path = project / "out" / store / "manifest.json"
        data = json.loads(path.read_text())
        data.pop("import_id")
        path.write_text(json.dumps(data))
    entities = EntityStore(project / "out" / "entities")
    edges = EdgeStore(project / "out" / "edges", entities=entities)
    assert entities.import_id is None and edges.import_id is None


# ---------------------------------------------------------------------- staging directories


def _dead_pid() -> int:
    proc = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    return int(proc.stdout)


def _fake_dead_staging(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / STAGING_MARKER).write_text(
        json.dumps(
            {"written_by": "bigembed", "pid": _dead_pid(), "start_time": "1", "boot_id": None}
        )
    )
    (path / "spill").mkdir()
    (path / "spill" / "run0.bin").write_bytes(b"x" * 100)
    return path


@pytest.mark.integration
def test_next_import_removes_only_dead_marked_staging_dirs(tmp_path: Path, capsys) -> None:
    config = write_config(tmp_path)
    data = write_tsv(tmp_path / "in.tsv", random_edges(50, 10, ["r"]))
    out = tmp_path / "out"
    dead = [
        _fake_dead_staging(out / "entities" / ".bigembed-import-dead1"),
        _fake_dead_staging(out / ".edges.import-dead2"),
        _fake_dead_staging(out / ".edges.old-dead3"),
    ]
    unmarked = out / ".edges.import-mine"
    unmarked.mkdir()
    (unmarked / "notes.txt").write_text("not bigembed's")
    live = out / ".edges.import-live"
    live.mkdir()
    claim = claim_staging(live)  # held by a running import (this process)
    try:
        assert _run(capsys, "import", "--no-progress", str(config), str(data))[0] == 0
        assert not any(p.exists() for p in dead)
        assert (unmarked / "notes.txt").read_text() == "not bigembed's"
        assert (live / STAGING_MARKER).exists()
    finally:
        claim.release()


@pytest.mark.integration
def test_killed_import_is_cleaned_up_by_the_next(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    data = write_tsv(tmp_path / "in.tsv", random_edges(200_000, 50_000, ["r"], seed=3))
    out = tmp_path / "out"
    code = "import sys; from bigembed.cli import main; sys.exit(main(sys.argv[1:]))"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            code,
            "import",
            "--no-progress",
            str(config),
            str(data),
            "--buffer-edges",
            "1000",
            "--run-edges",
            "1000",
        ],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    staging: list[Path] = []
    while time.monotonic() < deadline and proc.poll() is None:
        staging = list(out.glob(".edges.import-*")) if out.exists() else []
        if staging and list(staging[0].glob("store/*")):
            break
        time.sleep(0.01)
    assert proc.poll() is None, "the import finished before it could be killed"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    left = list(out.glob(".edges.import-*")) + list((out / "entities").glob(".bigembed-import-*"))
    assert left and not (out / "edges").exists()
    small = write_tsv(tmp_path / "small.tsv", random_edges(50, 10, ["r"]))
    assert cli_main(["import", "--no-progress", str(config), str(small)]) == 0
    assert not any(p.exists() for p in left)
    hidden = [p.name for p in out.rglob(".*") if p.name != ".bigembed-output.json"]
    assert hidden == []


# ---------------------------------------------------------------------- eval --output, plot


def test_eval_output_never_overwrites_inputs(project: Path, capsys) -> None:
    config = str(project / "config.yaml")
    version_file = project / "out" / "model" / "checkpoint_version.txt"
    before = _tree(project)
    for target in (
        version_file,
        project / "out" / "model" / "report.json",
        project / "config.yaml",
        project / "out" / "edges",
    ):
        code, err = _run(
            capsys, "eval", "--no-progress", config, "--output", str(target), "--force"
        )
        assert code == 2 and str(target) in _one_line(err), err
    assert _tree(project) == before
    report = project / "report.json"
    assert _run(capsys, "eval", "--no-progress", config, "--output", str(report))[0] == 0
    code, err = _run(capsys, "eval", "--no-progress", config, "--output", str(report))
    assert code == 2 and "--force" in _one_line(err)
    assert _run(capsys, "eval", "--no-progress", config, "--output", str(report), "--force")[0] == 0
    notes = project / "notes.json"
    notes.write_text('{"mine": true}')
    code, err = _run(capsys, "eval", "--no-progress", config, "--output", str(notes), "--force")
    assert code == 2 and "not a bigembed eval report" in _one_line(err)
    assert notes.read_text() == '{"mine": true}'
    code, err = _run(capsys, "eval", "--no-progress", config, "--output", str(project))
    assert code == 2


def test_plot_never_overwrites_a_checkpoint_file(project: Path, capsys) -> None:
    model = project / "out" / "model"
    version = (model / "checkpoint_version.txt").read_bytes()
    for target in (model / "checkpoint_version.txt", model / "config.json", project / "notes"):
        if target.name == "notes":
            target.write_text("mine")
        before = target.read_bytes()
        code, err = _run(capsys, "plot", str(model), "-o", str(target))
        assert code == 2 and str(target) in _one_line(err)
        assert target.read_bytes() == before
    assert (model / "checkpoint_version.txt").read_bytes() == version
    assert _run(capsys, "plot", str(model))[0] == 0
    assert _run(capsys, "plot", str(model))[0] == 0  # its own PNG is redrawn


# ---------------------------------------------------------------------- convert


def test_convert_outputs_overlapping_inputs_are_refused(project: Path, capsys) -> None:
    pytest.importorskip("h5py")
    model, ent = project / "out" / "model", project / "out" / "entities"
    before = _tree(project)
    for out_ck, out_ent in (
        (model, project / "pbg_ent"),
        (project / "pbg_ck", ent),
        (project / "out", project / "pbg_ent"),
        (project / "same", project / "same"),
    ):
        code, err = _run(
            capsys, "convert", "to-pbg", str(model), str(ent), str(out_ck), str(out_ent), "--force"
        )
        assert code == 2 and "output" in _one_line(err), err
    assert _tree(project) == before
    pbg_ck, pbg_ent = project / "pbg_ck", project / "pbg_ent"
    assert (
        _run(capsys, "convert", "to-pbg", str(model), str(ent), str(pbg_ck), str(pbg_ent))[0] == 0
    )
    code, err = _run(
        capsys,
        "convert",
        "from-pbg",
        str(pbg_ck),
        str(pbg_ent),
        str(pbg_ck),
        str(project / "b_ent"),
        "--force",
    )
    assert code == 2 and str(pbg_ck) in _one_line(err)
    # --force over an earlier conversion is fine, over the user's directory it is not
    assert (
        _run(
            capsys, "convert", "to-pbg", str(model), str(ent), str(pbg_ck), str(pbg_ent), "--force"
        )[0]
        == 0
    )
    mine = project / "mine"
    mine.mkdir()
    (mine / "a.txt").write_text("x")
    code, err = _run(
        capsys,
        "convert",
        "from-pbg",
        str(pbg_ck),
        str(pbg_ent),
        str(mine),
        str(project / "b_ent"),
        "--force",
    )
    assert code == 2 and "not replaced" in _one_line(err) and (mine / "a.txt").exists()


# ---------------------------------------------------------------------- write errors


def test_write_errors_are_one_line_naming_the_path(project: Path, tmp_path: Path, capsys) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("a file where a directory is expected")
    model = project / "out" / "model"
    code, err = _run(capsys, "export", str(model), "--format", "npy", "-o", str(blocker / "x"))
    line = _one_line(err)
    assert code != 0 and str(blocker) in line and "cannot write" in line, line
    config = write_config(tmp_path)
    text = config.read_text().replace(str(tmp_path / "out" / "entities"), str(blocker / "ent"))
    config.write_text(text)
    data = write_tsv(tmp_path / "in.tsv", random_edges(50, 10, ["r"]))
    code, err = _run(capsys, "import", "--no-progress", str(config), str(data))
    line = _one_line(err)
    assert code != 0 and str(blocker) in line and "cannot write the import's outputs" in line
    code, err = _run(
        capsys,
        "eval",
        "--no-progress",
        str(project / "config.yaml"),
        "--output",
        str(blocker / "r.json"),
    )
    line = _one_line(err)
    assert code != 0 and str(blocker) in line and "cannot write the eval report" in line, line


def _read_only_dir(path: Path) -> Path:
    """A directory writes to which fail (read-only tmpfs when root, chmod otherwise)."""
    path.mkdir()
    if os.geteuid() != 0:
        path.chmod(0o555)
        return path
    try:
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(path)],
            check=True,
            capture_output=True,
        )
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("root without mount permission: cannot make a read-only directory")
    return path


@pytest.mark.integration
def test_read_only_outputs_give_one_line_errors(project: Path, tmp_path: Path, capsys) -> None:
    ro = _read_only_dir(tmp_path / "ro")
    try:
        code, err = _run(
            capsys, "export", str(project / "out" / "model"), "--format", "npy", "-o", str(ro / "x")
        )
        line = _one_line(err)
        assert code != 0 and str(ro) in line and "cannot write" in line, line
        config = write_config(tmp_path)
        config.write_text(config.read_text().replace(str(tmp_path / "out"), str(ro / "out")))
        data = write_tsv(tmp_path / "in.tsv", random_edges(50, 10, ["r"]))
        code, err = _run(capsys, "import", "--no-progress", str(config), str(data))
        line = _one_line(err)
        assert code != 0 and str(ro) in line and "cannot write the import's outputs" in line
        assert "read-only file system" in line, line
    finally:
        if os.geteuid() == 0:
            subprocess.run(["umount", str(ro)], check=False)
        else:
            ro.chmod(0o755)
