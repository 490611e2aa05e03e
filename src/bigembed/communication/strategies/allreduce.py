"""``allreduce``: centralized, synchronous. Every ``sync_every`` batches, everybody's changes are
summed (averaged between data-parallel replicas) and every trainer continues from the result.

The workers of a trainer wait at the gate after ``sync_every`` batches until the round has
merged them with every other trainer's (the slowest trainer sets the pace, as in any
synchronous data-parallel training). In partitioned training the changes are *summed*, not
averaged as Bagua's gradient allreduce does: the trainers train disjoint buckets, and summing
applies every edge's update once, as one machine would (and as ``async_ps`` does); averaging
would divide the shared parameters' learning rate by the number of trainers. Data-parallel
replicas (``StrategyEnv.replicas``) train shares of the *same* bucket, so between two rounds
each replica moves the same rows, each with its own Adagrad state, without seeing the others'
moves: summed, a round moves a row W times as far as one machine would, on stale values
(FB15k-237, 2 replicas: filtered MRR -0.025 against one machine). There they are averaged, as
Bagua's gradient allreduce does and as ``decentralized`` and ``async_model_average`` do (MRR
within 0.002 of one machine). Each round moves
``2 (W - 1) / W`` of the shared parameters per trainer, in the codec's bytes (reduce-scatter,
then all-gather), and leaves every trainer with bit-identical shared parameters.

With ``communication.overlap`` the gate opens once a round has read its values, so the round
communicates while the workers train the next ``sync_every`` batches (one round of staleness,
see :mod:`bigembed.communication.lockstep`). With ``communication.hierarchical`` and several
trainers per host, the sums are reduced within each host first and across hosts by one leader
per host (:mod:`bigembed.communication.hierarchical`).

With ``communication.sparse_rows`` the embedding tables (``SharedTensors.row_tables``) move as
row-sparse deltas instead: a sparse all-gather of every trainer's changed rows (indices, values
in the codec's precision with per-row error feedback, row state), which each trainer sums in
rank order, so the result stays bit-identical everywhere
(:mod:`~bigembed.communication.sparse_reduce`). A round then moves ``W - 1`` times this
trainer's changed rows instead of ``2 (W - 1) / W`` of the tables.
"""

from __future__ import annotations

from bigembed.communication.delta_reduce import DeltaReduce
from bigembed.communication.lockstep import LockstepRounds
from bigembed.communication.strategies.base import SharedTensors, Strategy, StrategyEnv
from bigembed.train import BatchGate


class Allreduce(Strategy):
    centralized = True
    synchronous = True
    agreement_merges_everything = True  # the agreement round sends every change since `last`
    averages = False  # between trainers of disjoint buckets (see the module docstring)

    def __init__(self, env: StrategyEnv, shared: SharedTensors) -> None:
        super().__init__(env, shared)
        self.gate = gate = env.gate or BatchGate(env.workers)
        self.averages = type(self).averages or env.replicas
        self.data = DeltaReduce(env, shared, mean=self.averages)
        self.rounds_thread = LockstepRounds(
            env.rank,
            env.trainers,
            env.group,
            gate,
            gated=self.synchronous,
            sync_every=env.sync_every,
            interval=env.sync_interval,
            on_data=self._data_round,
            on_agree=self.data.agree,
            on_error=env.on_error,
            name=self.name,
            overlap=env.overlap,
        )

    def _data_round(self) -> None:
        self.data.round(snapped=self.rounds_thread.snapshot_taken)

    def start(self) -> None:
        self.rounds_thread.start()

    def bucket_started(self) -> None:
        self.rounds_thread.set_training(True)

    def bucket_finished(self) -> None:
        self.rounds_thread.set_training(False)

    def flush(self, timeout: float) -> None:
        self.rounds_thread.flush(timeout)

    def agree(self, timeout: float) -> None:
        self.rounds_thread.agree(timeout)

    def stop(self) -> None:
        self.rounds_thread.stop(timeout=30)

    @property
    def rounds(self) -> int:
        return self.rounds_thread.data_rounds

    @property
    def bytes_sent(self) -> int:
        return self.data.bytes_sent

    @property
    def bytes_received(self) -> int:
        return self.data.bytes_received
