"""``async_ps`` (the default): PBG's parameter servers; centralized, asynchronous.

Every trainer hosts one shard of the shared parameters
(:class:`~bigembed.communication.param_server.ParameterServer`), and its sharer loop
(:class:`~bigembed.communication.sharer.Sharer`) pushes its changes to every shard and pulls the
merged values, at most once per ``sync_interval`` (PBG: 100 rounds per second) and 1 GB/s,
while the workers go on training. Changes are summed on the servers: every edge's update is
applied once. With a lossy precision both directions carry changes with error feedback.
"""

from __future__ import annotations

from bigembed.communication.param_server import ParameterServer, ShardPlan, gather
from bigembed.communication.sharer import Sharer
from bigembed.communication.strategies.base import SharedTensors, Strategy, StrategyEnv


class AsyncParameterServer(Strategy):
    centralized = True
    synchronous = False

    def __init__(self, env: StrategyEnv, shared: SharedTensors) -> None:
        super().__init__(env, shared)
        plan = ShardPlan(shared.names, shared.numels, env.trainers, shared.nonnegative)
        flat = shared.flat
        self.server = ParameterServer(
            env.rank,
            gather(flat, plan.segments[env.rank]),
            env.trainers,
            env.group,
            env.on_error,
            codec=env.codec,
            sizes=[seg.size for seg in plan.segments[env.rank]],
        )
        self.sharer = Sharer(
            env.rank,
            plan,
            shared.tensors,
            self.server,
            env.group,
            env.on_error,
            max_rounds_per_s=1.0 / env.sync_interval,
            codec=env.codec,
        )

    def start(self) -> None:
        self.server.start()
        self.sharer.start()

    def flush(self, timeout: float) -> None:
        self.sharer.flush(timeout)

    def agree(self, timeout: float) -> None:
        self.sharer.flush(timeout)  # pull what everybody pushed before the barrier

    def stop(self) -> None:
        self.sharer.stop()
        self.server.join(timeout=30)

    @property
    def rounds(self) -> int:
        return self.sharer.rounds

    @property
    def bytes_sent(self) -> int:
        return self.sharer.bytes_sent

    @property
    def bytes_received(self) -> int:
        return self.sharer.bytes_received

    def wire_bytes(self) -> int:
        """The sharer's pushes and the replies to them (servers do not count their side)."""
        return self.sharer.bytes_sent + self.sharer.bytes_received
