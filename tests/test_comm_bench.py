"""bench/comm_bench.py runs, and the network namespaces it uses (tests/support/netns.py) work."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from support import netns

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.integration  # bench/comm_bench.py as a subprocess, network namespaces


def _namespaces() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


@pytest.mark.skipif(not netns.available(), reason="needs root, ip and tc")
def test_machines_are_connected_shaped_counted_and_removed() -> None:
    with netns.machines(2, "100mbit", "1ms") as (a, b):
        assert {a.namespace, b.namespace} <= _namespaces()
        assert "100mbit" in a.shaping
        sent = a.counters()[0]
        ping = subprocess.run(
            a.command([sys.executable, "-c", _CONNECT, b.address]),
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert ping.returncode == 0 or "refused" in ping.stdout + ping.stderr, ping
        assert a.counters()[0] > sent  # the counters see the packets
    assert not any(ns.startswith(netns.PREFIX) for ns in _namespaces())


# one TCP connection attempt (a refusal proves the link carries packets both ways)
_CONNECT = """
import socket, sys
try:
    socket.create_connection((sys.argv[1], 9), timeout=5).close()
except ConnectionRefusedError:
    print("refused")
"""


def test_quick_run_prints_the_table(tmp_path: Path) -> None:
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "comm_bench.py"),
            "--quick",
            "--graphs",
            "shared",
            "--strategies",
            "async_ps",
            "--precisions",
            "fp32,int8",
            "--workdir",
            str(tmp_path),
            "--json",
            str(tmp_path / "rows.json"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    table = [line for line in out.stdout.splitlines() if line.startswith("| shared |")]
    assert len(table) == 3, out.stdout  # one machine, fp32, int8
    import json

    rows = json.loads((tmp_path / "rows.json").read_text())
    fp32, int8 = rows[1], rows[2]
    assert fp32["precision"] == "fp32" and int8["precision"] == "int8"
    # an asynchronous strategy runs as many rounds as it can: the codec shows per round
    assert fp32["shared_kb_per_round"] > 3.5 * int8["shared_kb_per_round"] > 0
