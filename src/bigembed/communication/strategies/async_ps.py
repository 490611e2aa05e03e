"""``async_ps`` (the default): PBG's parameter servers; centralized, asynchronous.

Every trainer hosts one shard of the shared parameters
(:class:`~bigembed.communication.param_server.ParameterServer`), and its sharer loop
(:class:`~bigembed.communication.sharer.Sharer`) pushes its changes to every shard and pulls the
merged values, at most once per ``sync_interval`` (PBG: 100 rounds per second) and 1 GB/s,
while the workers go on training. Changes are summed on the servers: every edge's update is
applied once. With a lossy precision both directions carry changes with error feedback.

With ``communication.sparse_rows`` the row tables (``SharedTensors.row_tables``) and their row
state leave the dense shards: every trainer serves a range of their rows, and a second loop
pushes only the changed rows and pulls the rows changed on the servers since its last pull
(:mod:`~bigembed.communication.sparse_ps`, :mod:`~bigembed.communication.sparse_sharer`).
"""

from __future__ import annotations

from bigembed.communication.param_server import ParameterServer, ShardPlan, gather
from bigembed.communication.sharer import Sharer
from bigembed.communication.sparse_rows import row_tensors
from bigembed.communication.sparse_sharer import RowSharer
from bigembed.communication.strategies.base import SharedTensors, Strategy, StrategyEnv


class AsyncParameterServer(Strategy):
    centralized = True
    synchronous = False
    averages = False  # the servers add every push

    def __init__(self, env: StrategyEnv, shared: SharedTensors) -> None:
        super().__init__(env, shared)
        sparse = env.sparse_rows and bool(shared.row_tables)
        skip = row_tensors(shared.row_tables) if sparse else frozenset()
        numels = [0 if i in skip else n for i, n in enumerate(shared.numels)]
        plan = ShardPlan(shared.names, numels, env.trainers, shared.nonnegative)
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
        self.rows = (
            RowSharer(
                env.rank,
                env.trainers,
                env.group,
                env.codec,
                shared.tensors,
                shared.row_tables,
                env.on_error,
                max_rounds_per_s=1.0 / env.sync_interval,
                fraction=env.row_fraction,
            )
            if sparse
            else None
        )

    def start(self) -> None:
        self.server.start()
        self.sharer.start()
        if self.rows is not None:
            self.rows.start()

    def flush(self, timeout: float) -> None:
        self.sharer.flush(timeout)
        if self.rows is not None:
            self.rows.flush(timeout)

    def agree(self, timeout: float) -> None:
        self.flush(timeout)  # pull what everybody pushed before the barrier

    def stop(self) -> None:
        self.sharer.stop()
        if self.rows is not None:
            self.rows.stop()
        self.server.join(timeout=30)

    @property
    def rounds(self) -> int:
        return max(self.sharer.rounds, self.rows.rounds if self.rows else 0)

    @property
    def bytes_sent(self) -> int:
        return self.sharer.bytes_sent + (self.rows.bytes_sent if self.rows else 0)

    @property
    def bytes_received(self) -> int:
        return self.sharer.bytes_received + (self.rows.bytes_received if self.rows else 0)

    def wire_bytes(self) -> int:
        """The sharers' pushes and the replies to them (servers do not count their side)."""
        return self.bytes_sent + self.bytes_received
