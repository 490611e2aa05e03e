"""Hierarchical reduction: within each host first, then one leader per host across hosts.

When several trainers share a host (``bigembed launch -n`` with several ranks per machine),
the flat :class:`~bigembed.communication.primitives.ShardedReduce` sends ``2 (W - 1) / W`` of
the vector per trainer, most of it to trainers on other hosts. Bagua's hierarchical reduction
sends each host's sum across the network once instead:

1. **up** (within the host): every trainer sends its vector to its host's leader (the host's
   lowest rank), encoded with error feedback; the leader adds them to its own in rank order;
2. **across**: the leaders run a ``ShardedReduce`` of their hosts' sums among themselves (each
   leader owns a contiguous run of the flat plan's segments);
3. **down** (within the host): each leader forwards the encoded sums of that reduction, the
   very bytes every leader decoded, to its host's trainers, which decode them the same way.

Every trainer therefore ends with the same bits, whatever the codec, as with the flat
reduction; what crosses hosts is ``2 (H - 1) / H`` of the vector per *host* instead of per
trainer. The hierarchy is used only when it changes something: at least two hosts and a host
with two trainers or more (``make_reduce``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

import torch
import torch.distributed as dist
from torch import Tensor

from bigembed.communication.codecs import Codec
from bigembed.communication.param_server import Segment, ShardPlan
from bigembed.communication.primitives import (
    TAG_HOST_DOWN,
    TAG_HOST_UP,
    ShardedReduce,
    exchange,
)
from bigembed.communication.segment_stream import SegmentStream

logger = logging.getLogger(__name__)


def host_leaders(trainers: Sequence[int], hosts: Sequence[str]) -> dict[int, int]:
    """Each trainer's host leader (the lowest rank on its host)."""
    first: dict[str, int] = {}
    for t, h in zip(trainers, hosts, strict=True):
        first[h] = min(first.get(h, t), t)
    return {t: first[h] for t, h in zip(trainers, hosts, strict=True)}


def is_hierarchical(hosts: Sequence[str]) -> bool:
    """Whether a hierarchy saves anything: two hosts or more, one with several trainers."""
    return 1 < len(set(hosts)) < len(hosts)


def make_reduce(
    rank: int,
    plan: ShardPlan,
    codec: Codec,
    group: dist.ProcessGroup | None,
    trainers: Sequence[int],
    hosts: Sequence[str] | None,
) -> ShardedReduce | HierarchicalReduce:
    """The reduction a strategy's rounds use: host by host where ``hosts`` (each trainer's
    host id, None: flat) make it worth it, else flat."""
    if hosts is not None and is_hierarchical(hosts):
        reduce = HierarchicalReduce(rank, plan, codec, group, trainers, hosts)
        logger.info(
            "shared parameters: hierarchical reduction, %d hosts, this host's leader rank %d",
            len(set(hosts)),
            reduce.leader,
        )
        return reduce
    return ShardedReduce(rank, plan, codec, group, trainers)


class HierarchicalReduce:
    """The allreduce of a flat plan's vector, host by host (one instance per trainer); the same
    interface as ``ShardedReduce`` (``reduce``, ``bytes_sent``, ``bytes_received``,
    ``sent_to``)."""

    def __init__(
        self,
        rank: int,
        plan: ShardPlan,
        codec: Codec,
        group: dist.ProcessGroup | None,
        trainers: Sequence[int],
        hosts: Sequence[str],
    ) -> None:
        self.rank = rank
        self.group = group
        self.owners = plan.active_servers
        self.owner_sizes = [plan.size(s) for s in self.owners]
        # every segment of the flat plan, in owner order: each is encoded on its own
        segments = [seg.size for s in self.owners for seg in plan.segments[s]]
        leader_of = host_leaders(trainers, hosts)
        self.leader = leader_of[rank]
        self.members = sorted(t for t, lead in leader_of.items() if lead == rank and t != rank)
        leaders = sorted(set(leader_of.values()))
        top = _contiguous_plan(segments, leaders)
        self.top_owners = top.active_servers
        self.top_sizes = {s: [seg.size for seg in top.segments[s]] for s in self.top_owners}
        self.sent_to: dict[int, int] = {t: 0 for t in trainers if t != rank}
        if rank == self.leader:
            self.across = ShardedReduce(rank, top, codec, group, leaders)
            self.up_in = SegmentStream(codec, segments, feedback=False)
        else:
            self.up = SegmentStream(codec, segments)  # error feedback at the sender
        self.down_in = {
            s: SegmentStream(codec, self.top_sizes[s], feedback=False) for s in self.top_owners
        }
        self._bytes_sent = 0
        self.bytes_received = 0

    @property
    def bytes_sent(self) -> int:
        across = self.across.bytes_sent if self.rank == self.leader else 0
        return self._bytes_sent + across

    def reduce(self, parts: Mapping[int, Tensor]) -> dict[int, Tensor]:
        """``parts[s]``: this trainer's values for the flat plan's owner s (every owner).
        Returns, per owner, the sum over all trainers, the same bits on every trainer."""
        mine = torch.cat([parts[s] for s in self.owners])
        if self.rank == self.leader:
            wire = self._lead(mine)
        else:
            message = self.up.encode(mine)
            exchange({self.leader: message}, {}, self.group, TAG_HOST_UP)
            self._sent(self.leader, message)
            nbytes = sum(self.down_in[s].nbytes for s in self.top_owners)
            wire = torch.empty(nbytes, dtype=torch.uint8)
            exchange({}, {self.leader: wire}, self.group, TAG_HOST_DOWN)
            self.bytes_received += wire.numel()
        total, offset = [], 0
        for s in self.top_owners:
            stream = self.down_in[s]
            total.append(stream.decode(wire[offset : offset + stream.nbytes]))
            offset += stream.nbytes
        return dict(zip(self.owners, torch.cat(total).split(self.owner_sizes), strict=True))

    def _lead(self, mine: Tensor) -> Tensor:
        """A leader's part: its host's sum, the reduction across hosts, and the bytes of the
        result sent down to its host's trainers (returned: it decodes them the same way)."""
        receives = {m: self.up_in.empty() for m in self.members}
        exchange({}, receives, self.group, TAG_HOST_UP)
        self.bytes_received += sum(buf.numel() for buf in receives.values())
        total = mine.clone()
        for m in self.members:  # a fixed order: the same sum whatever arrived first
            total += self.up_in.decode(receives[m])
        pieces = total.split([sum(self.top_sizes[s]) for s in self.top_owners])
        before = self.across.bytes_received
        self.across.reduce(dict(zip(self.top_owners, pieces, strict=True)))
        self.bytes_received += self.across.bytes_received - before
        for peer, n in self.across.sent_to.items():
            self.sent_to[peer] = n
        wire = torch.cat([self.across.wire[s] for s in self.top_owners])
        exchange(dict.fromkeys(self.members, wire), {}, self.group, TAG_HOST_DOWN)
        for m in self.members:
            self._sent(m, wire)
        return wire

    def _sent(self, peer: int, buf: Tensor) -> None:
        self.sent_to[peer] += buf.numel()
        self._bytes_sent += buf.numel()


def _contiguous_plan(sizes: Sequence[int], servers: Sequence[int]) -> ShardPlan:
    """A plan of the segments ``sizes`` (in order, ``Segment(k, 0, size)``) cut into contiguous
    runs of about equal size, one per server: a segment is never split, so each is still
    encoded on its own."""
    plan = ShardPlan([], [], servers)
    total, done, k = sum(sizes), 0, 0
    for i, server in enumerate(servers):
        goal = total * (i + 1) // len(servers)
        while k < len(sizes) and (done < goal or i == len(servers) - 1):
            plan.segments[server].append(Segment(k, 0, sizes[k]))
            done += sizes[k]
            k += 1
    return plan
