"""N machines on one host: network namespaces on a bridge, each link shaped by ``tc netem``.

:func:`machines` creates namespaces ``bebench0 ..``, each with one interface
``beN`` (address ``10.77.0.N+1/24``) whose other end is plugged into a bridge in namespace
``bebenchbr``. ``tc`` shapes both directions of every machine's link (its interface's egress:
what it sends; the bridge port's egress: what it receives) to ``rate`` with ``delay`` each
way, as a machine on a switch with that link would see it: with ``netem``, or, on kernels
built without it, with a token bucket (``tbf``: the rate only, no delay; the bench says so).
The interface counters (``/sys/class/net/IF/statistics``) count every byte on the wire:
payload, TCP/IP headers, the rendezvous store, heartbeats. Everything is deleted on exit,
also after an error.

Needs root and ``ip``/``tc`` (iproute2); :func:`available` says whether they are there.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

PREFIX = "bebench"
BRIDGE_NS = f"{PREFIX}br"


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=20)


def _qdisc(ns: str, dev: str, spec: list[str]) -> subprocess.CompletedProcess[str]:
    argv = ["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev, "root", *spec]
    return subprocess.run(argv, capture_output=True, text=True, timeout=20)


def _shape(ns: str, dev: str, rate: str | None, delay: str | None) -> str:
    """Shape ``dev``'s egress; returns how ("netem ...", "tbf ...", or "none")."""
    if not rate and not delay:
        return "none"
    netem = (["delay", delay] if delay else []) + (["rate", rate] if rate else [])
    res = _qdisc(ns, dev, ["netem", *netem, "limit", "100000"])
    if res.returncode == 0:
        return "netem " + " ".join(netem)
    if not rate:
        raise RuntimeError(f"tc netem failed ({res.stderr.strip()}) and there is no rate to shape")
    # Kernels built without sch_netem ("Specified qdisc kind is unknown"): a token bucket
    # limits the rate; no delay can be added then.
    # a queue of up to 1 s: a saturated link delays packets instead of dropping them (drops
    # send the small TCP flows of the control plane into minutes of retransmission backoff)
    res = _qdisc(ns, dev, ["tbf", "rate", rate, "burst", "256kb", "latency", "1s"])
    if res.returncode != 0:
        raise RuntimeError(f"tc could not shape {dev}: {res.stderr.strip()}")
    return f"tbf rate {rate} (netem unavailable: no added delay)"


def available() -> bool:
    if os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("tc") is None:
        return False
    probe = f"{PREFIX}probe{os.getpid()}"
    ok = subprocess.run(["ip", "netns", "add", probe], capture_output=True).returncode == 0
    if ok:
        subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return ok


@dataclass(frozen=True)
class Machine:
    namespace: str
    interface: str
    address: str
    shaping: str  # how its link is shaped (the tc qdisc used)

    def command(self, argv: list[str]) -> list[str]:
        """``argv`` run inside this machine's namespace."""
        return ["ip", "netns", "exec", self.namespace, *argv]

    def counters(self) -> tuple[int, int]:
        """(bytes sent, bytes received) by this machine's interface so far."""
        out = []
        for what in ("tx_bytes", "rx_bytes"):
            path = f"/sys/class/net/{self.interface}/statistics/{what}"
            res = subprocess.run(
                self.command(["cat", path]), check=True, capture_output=True, text=True
            )
            out.append(int(res.stdout))
        return out[0], out[1]


def _cleanup(n: int) -> None:
    for ns in [BRIDGE_NS, *(f"{PREFIX}{k}" for k in range(n))]:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


@contextmanager
def machines(n: int, rate: str | None = None, delay: str | None = None) -> Iterator[list[Machine]]:
    """``n`` namespaces on a bridge, links shaped to ``rate`` (e.g. "100mbit") and ``delay``
    (e.g. "2ms") each way; None: unshaped."""
    _cleanup(16)
    out = []
    try:
        _ip("netns", "add", BRIDGE_NS)
        _ip("-n", BRIDGE_NS, "link", "add", "br0", "type", "bridge")
        _ip("-n", BRIDGE_NS, "link", "set", "br0", "up")
        for k in range(n):
            ns, dev, port = f"{PREFIX}{k}", f"be{k}", f"bp{k}"
            address = f"10.77.0.{k + 1}"
            _ip("netns", "add", ns)
            _ip("link", "add", dev, "netns", ns, "type", "veth", "peer", port, "netns", BRIDGE_NS)
            _ip("-n", BRIDGE_NS, "link", "set", port, "master", "br0")
            _ip("-n", BRIDGE_NS, "link", "set", port, "up")
            _ip("-n", ns, "addr", "add", f"{address}/24", "dev", dev)
            _ip("-n", ns, "link", "set", dev, "up")
            _ip("-n", ns, "link", "set", "lo", "up")
            shaping = _shape(ns, dev, rate, delay)  # what the machine sends
            _shape(BRIDGE_NS, port, rate, delay)  # what it receives
            out.append(Machine(ns, dev, address, shaping))
        yield out
    finally:
        _cleanup(n)
