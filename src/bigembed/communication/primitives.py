"""Logical primitives the strategies are built from, over torch.distributed point-to-point.

* :func:`exchange`: send one buffer to each of some peers and receive one from each, all in
  flight at once;
* :class:`ShardedReduce`: a (compressed) allreduce of one flat vector: reduce-scatter, each
  trainer summing the segments a :class:`~bigembed.communication.param_server.ShardPlan` gives
  it, then all-gather of the sums. Every message goes through a
  :class:`~bigembed.communication.segment_stream.SegmentStream` with error feedback, so a lossy
  codec loses nothing over rounds; every trainer decodes the *same* bytes of each sum, so all
  trainers end a round with bit-identical results, whatever the codec;
* :func:`peer_of`: the peer of a trainer in a round of pairwise exchanges (the circle method:
  every round a perfect matching, every pair met once in ``W - 1`` rounds; with an odd number
  of trainers one sits out each round).

Only point-to-point operations with the tags below are used, never a collective, so the
primitives can share the trainers' gloo group with anything else that uses other tags.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
import torch.distributed as dist
from torch import Tensor

from bigembed.communication.codecs import Codec
from bigembed.communication.param_server import ShardPlan
from bigembed.communication.segment_stream import SegmentStream

TAG_FLAGS, TAG_SCATTER, TAG_GATHER, TAG_PAIR = 31, 32, 33, 34
#: a hierarchical reduction's levels within a host, and the asynchronous gossip's exchanges
TAG_HOST_UP, TAG_HOST_DOWN, TAG_GOSSIP = 41, 42, 43


def exchange(
    sends: Mapping[int, Tensor],
    receives: Mapping[int, Tensor],
    group: dist.ProcessGroup | None,
    tag: int,
) -> None:
    """Send ``sends[p]`` to each p and receive into ``receives[p]`` from each p, concurrently."""
    works = []
    for peer, buf in receives.items():
        works.append(dist.irecv(buf, src=peer, group=group, tag=tag))
    for peer, buf in sends.items():
        works.append(dist.isend(buf, dst=peer, group=group, tag=tag))
    for work in works:
        assert work is not None  # None only for a rank outside the group
        work.wait()


def peer_of(rank: int, trainers: Sequence[int], round_index: int) -> int | None:
    """This round's partner of ``rank`` among ``trainers`` (None: it sits this round out).

    The circle method: with an even count W, the first trainer stays put and the others
    rotate; round r pairs position i with position W - 1 - i. An odd count adds a phantom,
    whose partner sits out."""
    ranks = list(trainers)
    if len(ranks) % 2:
        ranks.append(-1)
    n = len(ranks)
    r = round_index % (n - 1)
    rotated = [ranks[0], *(ranks[1 + (k - r) % (n - 1)] for k in range(n - 1))]
    pos = rotated.index(rank)
    peer = rotated[n - 1 - pos]
    return None if peer == -1 else peer


class ShardedReduce:
    """The allreduce of one flat vector cut by a shard plan (one instance per trainer).

    Bytes a trainer sends per call: its contribution to every other trainer's shard, plus its
    own shard's sum to every other trainer: ``2 (W - 1) / W`` of the vector for an even plan,
    as a ring allreduce, times the codec's bytes per value.
    """

    def __init__(
        self,
        rank: int,
        plan: ShardPlan,
        codec: Codec,
        group: dist.ProcessGroup | None,
        trainers: Sequence[int],
    ) -> None:
        self.rank = rank
        self.plan = plan
        self.group = group
        self.owners = [s for s in plan.active_servers]
        self.peers = [t for t in trainers if t != rank]
        sizes = {s: [seg.size for seg in plan.segments[s]] for s in self.owners}
        mine = sizes.get(rank, [])
        # phase 1: my contribution to owner s (with error feedback), others' to mine (decode)
        self.up = {s: SegmentStream(codec, sizes[s]) for s in self.owners if s != rank}
        self.up_in = SegmentStream(codec, mine, feedback=False)
        # phase 2: my shard's sum to everybody (error feedback at the reducer), others' sums
        self.down = SegmentStream(codec, mine)
        self.down_in = {s: SegmentStream(codec, sizes[s], feedback=False) for s in self.owners}
        self.bytes_sent = 0
        self.bytes_received = 0
        #: bytes sent to each peer (a hierarchy's levels are told apart by the peers' hosts)
        self.sent_to: dict[int, int] = dict.fromkeys(self.peers, 0)
        #: the last call's encoded sums, per owner: what every trainer decoded (a hierarchical
        #: reduction forwards these bytes to the trainers of a leader's host)
        self.wire: dict[int, Tensor] = {}

    def reduce(self, parts: Mapping[int, Tensor]) -> dict[int, Tensor]:
        """``parts[s]``: this trainer's values for owner s's segments (every owner). Returns,
        per owner, the sum over all trainers, as every trainer decodes it."""
        owns = self.rank in self.owners
        # phase 1: reduce-scatter
        sends = {s: self.up[s].encode(parts[s]) for s in self.up}
        receives = {p: self.up_in.empty() for p in self.peers} if owns else {}
        exchange(sends, receives, self.group, TAG_SCATTER)
        self._count(sends, receives)
        sums: dict[int, Tensor] = {}
        wire: dict[int, Tensor] = {}
        if owns:
            total = parts[self.rank].clone()
            for peer in sorted(receives):  # a fixed order: the same sum whatever arrived first
                total += self.up_in.decode(receives[peer])
            wire[self.rank] = self.down.encode(total)
        # phase 2: all-gather of the sums
        sends = {p: wire[self.rank] for p in self.peers} if owns else {}
        receives = {s: self.down_in[s].empty() for s in self.owners if s != self.rank}
        exchange(sends, receives, self.group, TAG_GATHER)
        self._count(sends, receives)
        wire.update(receives)
        self.wire = wire
        for s in self.owners:
            sums[s] = self.down_in[s].decode(wire[s])
        return sums

    def _count(self, sends: Mapping[int, Tensor], receives: Mapping[int, Tensor]) -> None:
        for peer, t in sends.items():
            self.sent_to[peer] += t.numel() * t.element_size()
        self.bytes_sent += sum(t.numel() * t.element_size() for t in sends.values())
        self.bytes_received += sum(t.numel() * t.element_size() for t in receives.values())


def flags_exchange(mine: Tensor, peers: Sequence[int], group: dist.ProcessGroup | None) -> Tensor:
    """Every trainer's small int64 flag vector, summed (the trainers' round header)."""
    receives = {p: torch.empty_like(mine) for p in peers}
    exchange(dict.fromkeys(peers, mine), receives, group, TAG_FLAGS)
    total = mine.clone()
    for p in sorted(receives):
        total += receives[p]
    return total
