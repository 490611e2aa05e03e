"""The row sharer loop of ``async_ps``: row-sparse pushes to every row shard, and its replies.

See :mod:`~bigembed.communication.sparse_ps` for the protocol. The loop is the dense sharer's
(:class:`~bigembed.communication.sharer.Sharer`): paced by the same
:class:`~bigembed.communication.sharer.Pacer`, :meth:`RowSharer.flush` waits for a round that
starts after the call (one that pushes every changed row, whatever ``row_fraction``), and
:meth:`RowSharer.stop` says goodbye to every remote shard, so that its server threads end and a
later instance on the same group starts from quiet channels.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence

import torch
import torch.distributed as dist
from torch import Tensor

from bigembed.communication.codecs import Codec
from bigembed.communication.sharer import Pacer
from bigembed.communication.sparse_ps import (
    OP_BYE,
    OP_PUSH,
    TAG_PUSH,
    TAG_PUSH_HEAD,
    TAG_REPLY,
    TAG_REPLY_HEAD,
    Rows,
    RowShard,
    shard_bounds,
)
from bigembed.communication.sparse_rows import (
    RowCodec,
    RowFeedback,
    changed_rows,
    joined,
    message_bytes,
    row_limit,
    row_tables,
    split_message,
)


class RowSharer:
    """One trainer's row tables in ``async_ps``: its shard and its loop (start, flush, stop)."""

    def __init__(
        self,
        rank: int,
        trainers: Sequence[int],
        group: dist.ProcessGroup | None,
        codec: Codec,
        tensors: Sequence[Tensor],
        tables: Mapping[int, int],
        on_error: Callable[[str], None],
        max_rounds_per_s: float,
        fraction: float = 1.0,
    ) -> None:
        self.rank = rank
        self.group = group
        self.on_error = on_error
        self.tables = row_tables(tensors, tables)
        self.codecs = [RowCodec(codec, t.dim) for t in self.tables]
        self.lossy = not codec.lossless
        self.live = [(tensors[t.table].data, tensors[t.state].data) for t in self.tables]
        self.last = [(a.clone(), s.clone()) for a, s in self.live]  # the servers' rows
        self.feedback = [
            RowFeedback(c, t.rows) for c, t in zip(self.codecs, self.tables, strict=True)
        ]
        servers = list(trainers)
        bounds = [shard_bounds(t.rows, servers) for t in self.tables]
        # per server, per table: its row range; only servers with rows take part
        self.ranges = {
            s: [(b[k], b[k + 1]) for b in bounds]
            for k, s in enumerate(servers)
            if any(b[k + 1] > b[k] for b in bounds)
        }
        # this trainer's own range per table: its rows reach its shard without the network,
        # so only the others count against the limit (row_fraction)
        k = servers.index(rank)
        self.own = [(b[k], b[k + 1]) for b in bounds]
        self.limits = [
            row_limit(fraction, t.rows - (hi - lo))
            for t, (lo, hi) in zip(self.tables, self.own, strict=True)
        ]
        self.shard = RowShard(rank, servers, self.tables, tensors, self.codecs, group, on_error)
        self.pacer = Pacer(max_rounds_per_s)
        self.bytes_sent = 0
        self.bytes_received = 0
        self.rounds = 0
        self._started = 0
        self._completed = 0
        self._full = False  # a flush asked for a round that sends every changed row
        self._cond = threading.Condition()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bigembed-row-sharer", daemon=True)

    # ------------------------------------------------------------------ rounds
    def _round(self, full: bool = False) -> int:
        """One push/pull with every row shard; returns the bytes it moved. ``full``: push
        every changed row (otherwise at most the limit of remote rows per table)."""
        before = self.bytes_sent + self.bytes_received
        snaps = []
        for k, ((live, state), (last, last_state)) in enumerate(
            zip(self.live, self.last, strict=True)
        ):
            idx = changed_rows(live, last, state, last_state, self.feedback[k].pending)
            changed = (idx, live[idx], state[idx])
            snaps.append(changed if full else self._choose(k, changed))
        pending = []
        local = None
        for server, ranges in self.ranges.items():
            pushed = []
            for k, (lo, hi) in enumerate(ranges):
                idx, snap, snap_state = snaps[k]
                sel = (idx >= lo) & (idx < hi)
                rows, values, now = idx[sel], snap[sel], snap_state[sel]
                last, last_state = self.last[k]
                pushed.append((rows, values - last[rows], now - last_state[rows], values))
            if server == self.rank:
                local = self.shard.push_pull(self.rank, [p[:3] for p in pushed], wire=False)
                continue
            messages = [fb.encode(*p)[0] for fb, p in zip(self.feedback, pushed, strict=True)]
            counts = [p[0].numel() for p in pushed]
            head = torch.tensor([OP_PUSH, *counts], dtype=torch.int64)
            payload = joined(messages)
            dist.send(head, dst=server, group=self.group, tag=TAG_PUSH_HEAD)
            if payload.numel():
                dist.send(payload, dst=server, group=self.group, tag=TAG_PUSH)
            self.bytes_sent += 8 * head.numel() + payload.numel()
            pending.append(server)
        # the local shard replies with values; a lossy remote one with changes
        replies: list[tuple[list[Rows], bool]] = []
        if local is not None:
            replies.append(([rows for rows, _ in local], False))
        for server in pending:
            replies.append((self._receive(server), self.lossy))
        for reply, relative in replies:
            for k, part in enumerate(reply):
                self._apply(k, part, snaps[k], relative)
        self.rounds += 1
        return self.bytes_sent + self.bytes_received - before

    def _choose(self, k: int, snap: Rows) -> Rows:
        """The rows of ``snap`` a round pushes: every row of this trainer's own range, and the
        remote rows with the largest changes plus residuals, at most the table's limit; the
        others keep their change in ``live - last`` for a later round."""
        idx, values, now = snap
        lo, hi = self.own[k]
        remote = ((idx < lo) | (idx >= hi)).nonzero().view(-1)
        if remote.numel() <= self.limits[k]:
            return snap
        delta = values[remote] - self.last[k][0][idx[remote]]
        chosen = remote[self.feedback[k].choose(idx[remote], delta, self.limits[k])]
        local = ((idx >= lo) & (idx < hi)).nonzero().view(-1)
        keep = torch.cat([local, chosen]).sort().values
        return idx[keep], values[keep], now[keep]

    def _receive(self, server: int) -> list[Rows]:
        counts = torch.empty(len(self.codecs), dtype=torch.int64)
        dist.recv(counts, src=server, group=self.group, tag=TAG_REPLY_HEAD)
        sizes = counts.tolist()
        buf = torch.empty(message_bytes(sizes, self.codecs), dtype=torch.uint8)
        if buf.numel():
            dist.recv(buf, src=server, group=self.group, tag=TAG_REPLY)
        self.bytes_received += 8 * counts.numel() + buf.numel()
        parts = split_message(buf, sizes, self.codecs)
        return [c.decode(part) for c, part in zip(self.codecs, parts, strict=True)]

    def _apply(self, k: int, reply: Rows, snap: Rows, relative: bool) -> None:
        """Take a shard's rows as the new ``last``; add ``last - snapshot`` to the live rows."""
        rows, values, now = reply
        if rows.numel() == 0:
            return
        live, state = self.live[k]
        last, last_state = self.last[k]
        merged = last[rows] + values if relative else values
        # rows this trainer pushed: their snapshot; the others were equal to last
        base, base_state = last[rows], last_state[rows]
        idx, values_pushed, state_pushed = snap
        if idx.numel():
            at = torch.searchsorted(idx, rows).clamp_(max=idx.numel() - 1)
            mine = idx[at] == rows
            base[mine] = values_pushed[at[mine]]
            base_state[mine] = state_pushed[at[mine]]
        live.index_add_(0, rows, merged - base)
        state.index_add_(0, rows, now - base_state)
        state[rows] = state[rows].clamp_min(0)
        last.index_copy_(0, rows, merged)
        last_state.index_copy_(0, rows, now)

    # ------------------------------------------------------------------ the loop
    def start(self) -> None:
        self.shard.start()
        if self.ranges:
            self._thread.start()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                with self._cond:
                    self._started += 1
                    full, self._full = self._full, False
                began, cpu = self.pacer.clock(), time.thread_time()
                moved = self._round(full)
                with self._cond:
                    self._completed = self._started
                    self._cond.notify_all()
                rest = self.pacer.pause(began, moved, time.thread_time() - cpu)
                if rest > 0:
                    self._wake.wait(rest)
                    self._wake.clear()
            bye = torch.tensor([OP_BYE] + [0] * len(self.codecs), dtype=torch.int64)
            for server in self.ranges:
                if server != self.rank:
                    dist.send(bye, dst=server, group=self.group, tag=TAG_PUSH_HEAD)
                    self.bytes_sent += 8 * bye.numel()
        except Exception as exc:  # reported to the watchdog, which stops the run
            self.on_error(f"row sharer on rank {self.rank} failed: {exc}")

    def flush(self, timeout: float) -> None:
        """Wait for a complete round that started after this call and pushed every changed
        row (whatever ``row_fraction``)."""
        if not self.ranges:
            return
        with self._cond:
            goal = self._started + 1
            self._full = True
            self._wake.set()
            deadline = time.monotonic() + timeout
            while self._completed < goal:
                left = deadline - time.monotonic()
                if left <= 0 or not self._thread.is_alive():
                    raise TimeoutError(f"the row sharer made no round within {timeout:g}s")
                self._cond.wait(min(left, 0.5))

    def stop(self, timeout: float = 30) -> None:
        """End the loop (goodbye to every remote shard), then the shard's server threads."""
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout=timeout)
        self.shard.join(timeout=timeout)
