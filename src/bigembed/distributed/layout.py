"""Who is who in a distributed run: ranks, roles, and which rank owns which piece of state.

World ranks ``[0, M)`` are the trainers (``num_machines`` = M); with ``num_partition_servers``
N > 0, ranks ``[M, M + N)`` are the partition servers the user starts by hand. Everything
else runs as threads inside the trainers (one process per machine is much cheaper to start and
to watch than PBG's four): every trainer hosts a parameter-server shard and a sharer loop, a
partition server too when N = -1, and trainer 0 hosts the lock server and the rendezvous store.
"""

from __future__ import annotations

from dataclasses import dataclass

from bigembed.config import ConfigSchema
from bigembed.errors import ConfigError
from bigembed.partition_keys import PartitionKey


@dataclass(frozen=True)
class RankLayout:
    num_trainers: int
    num_partition_servers: int  # the config value: -1, 0 or N > 0

    @staticmethod
    def of(cfg: ConfigSchema) -> RankLayout:
        return RankLayout(cfg.num_machines, cfg.num_partition_servers)

    @property
    def world_size(self) -> int:
        return self.num_trainers + max(self.num_partition_servers, 0)

    @property
    def trainers(self) -> list[int]:
        return list(range(self.num_trainers))

    @property
    def server_ranks(self) -> list[int]:
        """Ranks hosting a partition server (empty: partitions go through the checkpoint dir)."""
        if self.num_partition_servers < 0:
            return self.trainers
        return [self.num_trainers + i for i in range(self.num_partition_servers)]

    def is_trainer(self, rank: int) -> bool:
        return 0 <= rank < self.num_trainers

    def partition_server_rank(self, index: int) -> int:
        """World rank of ``bigembed partition-server --rank index``."""
        if not 0 <= index < self.num_partition_servers:
            raise ConfigError(
                f"partition server rank {index} is out of range: num_partition_servers is "
                f"{self.num_partition_servers}, so ranks 0..{self.num_partition_servers - 1} exist"
            )
        return self.num_trainers + index

    def check_trainer_rank(self, rank: int) -> None:
        if not self.is_trainer(rank):
            raise ConfigError(
                f"--rank {rank} is out of range: num_machines is {self.num_trainers}, so trainer "
                f"ranks are 0..{self.num_trainers - 1}"
            )

    def role(self, rank: int) -> str:
        """A human name for a rank, used in every message about a peer."""
        if self.is_trainer(rank):
            extra = ", lock server, store host" if rank == 0 else ""
            return f"rank {rank} (trainer{extra})"
        return f"rank {rank} (partition server {rank - self.num_trainers})"

    def server_for(self, key: PartitionKey) -> int:
        """World rank of the partition server holding ``key``."""
        servers = self.server_ranks
        return servers[key[1] % len(servers)]

    def writer_for(self, key: PartitionKey) -> int:
        """Trainer that writes ``key`` into each checkpoint (PBG: partition p -> p mod M)."""
        return key[1] % self.num_trainers
