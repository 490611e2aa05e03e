"""The rule of tests/conftest.py: a test that starts a process without ``@pytest.mark.integration``
fails (so ``pytest -m "not integration"`` starts none), one with the marker runs as usual.

Checked by running pytest with this suite's conftest over a few probe tests in a temporary folder.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration  # it runs pytest as a subprocess

TESTS = Path(__file__).resolve().parent

PROBES = """
import multiprocessing
import subprocess
import sys

import pytest


def test_unmarked_subprocess():
    subprocess.run([sys.executable, "-c", "pass"], check=True)


def test_unmarked_multiprocessing():
    process = multiprocessing.get_context("spawn").Process(target=print)
    process.start()
    process.join()


def test_unmarked_swallowed():
    try:
        subprocess.run([sys.executable, "-c", "pass"], check=True)
    except BaseException:
        pass


def test_unmarked_without_a_process():
    assert True


@pytest.mark.integration
def test_marked_subprocess():
    subprocess.run([sys.executable, "-c", "pass"], check=True)
"""


def test_unmarked_process_starts_fail_and_marked_ones_run(tmp_path: Path) -> None:
    shutil.copy(TESTS / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "test_probes.py").write_text(PROBES)
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    integration: processes\n")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
    }
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", "-p", "no:xdist"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = out.stdout.splitlines()

    def outcomes(test: str) -> set[str]:
        """What ``-rA``'s summary says of ``test`` (a test can pass and error at teardown)."""
        node = f"test_probes.py::{test}"
        found = {
            line.split()[0]
            for line in lines
            if line.startswith(("PASSED ", "FAILED ", "ERROR ")) and f"{node} " in f"{line} "
        }
        assert found, out.stdout + out.stderr
        return found

    assert outcomes("test_marked_subprocess") == {"PASSED"}
    assert outcomes("test_unmarked_without_a_process") == {"PASSED"}
    assert outcomes("test_unmarked_subprocess") == {"FAILED"}
    assert outcomes("test_unmarked_multiprocessing") == {"FAILED"}
    assert "ERROR" in outcomes("test_unmarked_swallowed")  # at teardown: the call passed
    assert "mark it @pytest.mark.integration" in out.stdout, out.stdout
