"""``communication.overlap``: a synchronous round communicates while the workers train the next
``sync_every`` batches (one round of staleness).

* the round thread alone (no process): with overlap the workers pass the gate while a data
  round is in flight, and never run more than ``2 x sync_every`` batches past the last merged
  round; without it, never while a round is in flight, and at most ``sync_every``;
* over gloo (2 trainers, ``allreduce`` and ``decentralized``, each round made slow by a hook
  that holds it after its merge): with overlap the workers ran more than ``sync_every`` batches
  past the last completed round (they trained during rounds), at most ``2 x sync_every``; the
  final agreed values equal the non-overlapped run's and the exact expectation (the workers'
  changes are fixed, so only float rounding tells the runs apart).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from bigembed.communication import lockstep
from bigembed.communication.lockstep import GatePace, LockstepRounds
from bigembed.train.hogwild.gate import BatchGate
from support.strategy_runs import drive, expected, init, load, save, spawn

SYNC_EVERY, BUCKETS, BATCHES = 4, 2, 12
STRATEGIES = ("allreduce", "decentralized")


def _round_thread(
    overlap: bool, monkeypatch: pytest.MonkeyPatch | None = None
) -> tuple[int, int, BatchGate]:
    """(batches passed while a data round was in flight, the largest lag behind the last
    completed round, the gate) of one worker next to a round thread whose rounds take 30 ms.
    With ``monkeypatch``, the rounds' header exchange also takes 30 ms (a slower peer) and "in
    flight" is that wait only."""
    gate = BatchGate(1)
    in_flight = threading.Event()
    if monkeypatch is not None:
        exchange = lockstep.flags_exchange

        def slow_peer(*args: Any) -> torch.Tensor:
            in_flight.set()
            time.sleep(0.03)
            in_flight.clear()
            return exchange(*args)

        monkeypatch.setattr(lockstep, "flags_exchange", slow_peer)

    def on_data() -> None:
        rounds.snapshot_taken()
        if monkeypatch is None:
            in_flight.set()
        time.sleep(0.03)
        in_flight.clear()

    rounds = LockstepRounds(
        0,
        [0],
        None,
        gate,
        gated=True,
        sync_every=SYNC_EVERY,
        interval=0.01,
        on_data=on_data,
        on_agree=lambda: None,
        on_error=lambda message: None,
        name="test-overlap",
        overlap=overlap,
    )
    rounds.set_training(True)
    rounds.start()
    during, lag = 0, 0
    for _ in range(6 * SYNC_EVERY):
        gate.wait_turn()
        during += in_flight.is_set()
        lag = max(lag, gate.batches() - rounds._completed_batches)
        time.sleep(0.002)
        gate.passed(0)
    rounds.set_training(False)
    rounds.stop(10)
    return during, lag, gate


def test_overlap_lets_the_workers_train_during_a_round() -> None:
    during, lag, _ = _round_thread(overlap=True)
    assert during >= SYNC_EVERY, during  # trained while the rounds communicated
    assert SYNC_EVERY < lag <= 2 * SYNC_EVERY, lag
    during, lag, _ = _round_thread(overlap=False)
    assert during == 0, during
    assert lag <= SYNC_EVERY, lag


def test_overlap_lets_the_workers_train_while_a_round_waits_for_a_slower_peer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A trainer that reached its budget first does not wait at the gate for the others to
    reach theirs (the round's header exchange): its workers go on, one round of staleness."""
    during, lag, _ = _round_thread(overlap=True, monkeypatch=monkeypatch)
    assert during >= SYNC_EVERY, during
    assert SYNC_EVERY < lag <= 2 * SYNC_EVERY, lag
    during, lag, _ = _round_thread(overlap=False, monkeypatch=monkeypatch)
    assert during == 0, during
    assert lag <= SYNC_EVERY, lag


def test_the_gate_wait_names_the_part_spent_waiting_for_slower_trainers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``peer_waited``: the seconds the gate stayed closed while the round's header waited for
    the other trainers, apart from the round's own 30 ms; none with overlap (the gate is open
    during that wait) and none when every trainer is there at once."""
    _, _, alone = _round_thread(overlap=False)
    rounds = 5  # 6 x SYNC_EVERY batches: the worker waits for the rounds after 1 to 5 budgets
    assert alone.wait_seconds() >= rounds * 0.03, alone.wait_seconds()
    assert alone.peer_waited() < rounds * 0.005, alone.peer_waited()
    _, _, slow_peer = _round_thread(overlap=False, monkeypatch=monkeypatch)
    assert slow_peer.peer_waited() >= (rounds - 1) * 0.03, slow_peer.peer_waited()
    assert slow_peer.peer_waited() <= slow_peer.wait_seconds()
    _, _, overlapped = _round_thread(overlap=True, monkeypatch=monkeypatch)
    assert overlapped.peer_waited() == 0.0


def test_the_round_thread_sleeps_by_the_workers_pace(monkeypatch: pytest.MonkeyPatch) -> None:
    """Half the time the budget's batches left take at the measured pace, between 1 and 50 ms."""
    clock = [0.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    pace = GatePace()
    assert pace.pause(0, 16) == 0.001  # no pace yet: the finest look
    pace.restart(0)
    clock[0] = 0.04
    assert pace.pause(4, 16) == pytest.approx(0.05)  # 10 ms a batch, 12 left: capped at 50 ms
    clock[0] = 0.14
    assert pace.pause(14, 16) == pytest.approx(0.01)  # 2 left: 10 ms
    assert pace.pause(16, 16) == 0.001  # full: the round is due
    pace.restart(16)  # the next round: the last pace until a batch is done
    assert pace.pause(16, 32) == pytest.approx(0.05)


def test_the_round_thread_looks_at_the_gate_a_few_times_a_round() -> None:
    """A worker at 5 ms a batch, rounds every 8 batches (40 ms): the thread reads the batch
    count a few times per round, not every millisecond (which is ~40 looks a round)."""
    looks = [0]

    class CountingGate(BatchGate):
        def batches(self) -> int:
            looks[0] += 1
            return super().batches()

    gate = CountingGate(1)
    rounds = LockstepRounds(
        0,
        [0],
        None,
        gate,
        gated=True,
        sync_every=8,
        interval=0.01,
        on_data=lambda: None,
        on_agree=lambda: None,
        on_error=lambda message: None,
        name="test-pace",
    )
    rounds.set_training(True)
    rounds.start()
    for _ in range(80):
        gate.wait_turn()
        time.sleep(0.005)
        gate.passed(0)
    rounds.set_training(False)
    rounds.stop(10)
    assert rounds.data_rounds >= 9, rounds.data_rounds
    assert looks[0] / rounds.data_rounds < 15, (looks[0], rounds.data_rounds)


def _slow_rounds(strategy: Any) -> None:
    """Hold every data round 30 ms after its merge (a slow network)."""
    merge = strategy.rounds_thread.on_data

    def slow() -> None:
        merge()
        time.sleep(0.03)

    strategy.rounds_thread.on_data = slow


def _rank(rank: int, world: int, store: str, out: str) -> None:
    import faulthandler

    import torch.distributed as dist

    side = init(rank, world, store)
    faulthandler.dump_traceback_later(120, exit=True)
    for strategy in STRATEGIES:
        for overlap in (False, True):
            result = drive(
                rank,
                world,
                side,
                strategy,
                "fp32",
                buckets=BUCKETS,
                batches=BATCHES,
                sync_every=SYNC_EVERY,
                batch_sleep=lambda rank: 0.002,
                env={"overlap": overlap},
                hook=_slow_rounds,
            )
            save(out, f"{strategy}-{overlap}", rank, result)
            dist.barrier(group=side)
    faulthandler.cancel_dump_traceback_later()
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    where = tmp_path_factory.mktemp("overlap")
    spawn(_rank, 2, where)
    return where


@pytest.mark.integration
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_overlapped_rounds_match_the_synchronous_ones(runs: Path, strategy: str) -> None:
    plain, overlapped = (load(runs, f"{strategy}-{o}", 2) for o in (False, True))
    want = expected(2, BUCKETS * BATCHES, mean=strategy == "decentralized")
    for rank in range(2):
        for res in (plain[rank], overlapped[rank]):
            assert not res["errors"], res["errors"]
            assert res["rounds"] > 0
            for got, w in zip(res["tensors"], want, strict=True):
                assert float((got.double() - w).abs().max()) <= 2e-5
        for a, b in zip(plain[rank]["tensors"], overlapped[rank]["tensors"], strict=True):
            assert float((a - b).abs().max()) <= 2e-5  # the same values, up to float rounding
        # without overlap the workers wait for every merge; with it they train during a round
        # (more than sync_every batches past the last merged one), one round at most
        assert max(plain[rank]["lag"]) <= SYNC_EVERY, plain[rank]["lag"]
        assert SYNC_EVERY < max(overlapped[rank]["lag"]) <= 2 * SYNC_EVERY, overlapped[rank]["lag"]
    for res in overlapped[1:]:  # agreed: the same bits on every trainer
        for a, b in zip(overlapped[0]["tensors"], res["tensors"], strict=True):
            assert torch.equal(a, b)
