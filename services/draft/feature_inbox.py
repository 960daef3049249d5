"""Feature rows the target pushed to this draft (PushFeatures), held until a plan names them.

    target ──FeaturePush──▶ put(seq, block)        rows by sequence and position
    DraftPlan item: rows [a, b) pushed ──▶ await take(seq, a, b)   joined, or None after ``wait_s``

A plan can overtake the push it depends on (two connections), so ``take`` waits up to ``wait_s`` (one
deadline for the whole plan) for rows still in flight, but only while a push stream from a target is open
(``feed``): with none open (this draft restarted and the target's rows went into the old connection, or
the target's stream broke) rows cannot come, so it waits only ``grace_s`` for a target to dial in. Rows are
dropped once taken past, when the sequence is released, and oldest sequence first beyond ``max_bytes`` (a
sequence whose rows were dropped is reported missing and rebuilt by the scheduler, losing nothing but time).

A sequence's rows are held as the blocks that came, consecutive, not joined: a step's plan asks for exactly
the rows its last push carried, and gets that block itself, without a copy (at a hidden size of 4,096,
32 sequences' rows are about 4 MB a step). Bytes are copied only where a take or a newer push cuts a block.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from contextlib import contextmanager

from shared.engine.features import FeatureBlock

DEFAULT_WAIT_S = 2.0
DEFAULT_GRACE_S = 0.25  # no push stream open: how long rows may still come (a target opening its stream)
DEFAULT_MAX_BYTES = 512 << 20


class FeatureInbox:
    def __init__(self, wait_s: float = DEFAULT_WAIT_S, max_bytes: int = DEFAULT_MAX_BYTES,
                 grace_s: float = DEFAULT_GRACE_S) -> None:  # fmt: skip
        self.wait_s = wait_s
        self.grace_s = grace_s
        self.feeds = 0  # push streams open now
        self.max_bytes = max_bytes
        self._rows: OrderedDict[str, list[FeatureBlock]] = OrderedDict()  # seq id -> its blocks, consecutive
        self._bytes = 0
        self._waiters: set[asyncio.Future] = set()
        self.bytes_received = 0  # all time

    def put(self, seq_id: str, block: FeatureBlock) -> None:
        held = self._rows.pop(seq_id, None) or []
        kept: list[FeatureBlock] = []
        if held and held[-1].end >= block.start:  # else a gap (rows lost in flight): keep the newest only
            for b in held:  # a newer block overrides the rows it shares (the target re-ran from there)
                if b.end <= block.start:
                    kept.append(b)
                elif b.start < block.start:
                    kept.append(b.rows(b.start, block.start))
        self._bytes += len(block.data) + sum(len(b.data) for b in kept) - sum(len(b.data) for b in held)
        kept.append(block)
        self._rows[seq_id] = kept
        self.bytes_received += len(block.data)
        while self._bytes > self.max_bytes and len(self._rows) > 1:
            _, dropped = self._rows.popitem(last=False)
            self._bytes -= sum(len(b.data) for b in dropped)
        self._wake()

    @contextmanager
    def feed(self):
        """Held while a target's push stream is open (the servicer's PushFeatures)."""
        self.feeds += 1
        self._wake()
        try:
            yield self
        finally:
            self.feeds -= 1
            self._wake()  # a take waiting on this stream's rows now waits only the grace

    def deadline(self) -> float:
        """One plan's deadline for all its takes."""
        return asyncio.get_running_loop().time() + self.wait_s

    async def take(self, seq_id: str, start: int, end: int, deadline: float | None = None) -> FeatureBlock | None:
        """Rows [start, end) of ``seq_id``, waiting for them until ``deadline`` (default: ``wait_s`` from now)
        while a push stream is open, ``grace_s`` while none is; None when they never came."""
        loop = asyncio.get_running_loop()
        deadline = self.deadline() if deadline is None else deadline
        no_feed_until = None  # the grace's end, from when this take first saw no push stream open
        while True:
            held = self._rows.get(seq_id)
            if held and held[0].start <= start and end <= held[-1].end:
                return self._take(seq_id, held, start, end)
            now = loop.time()
            if self.feeds:
                no_feed_until = None
            elif no_feed_until is None:
                no_feed_until = now + self.grace_s
            left = (deadline if no_feed_until is None else min(deadline, no_feed_until)) - now
            if left <= 0:
                return None
            waiter = loop.create_future()
            self._waiters.add(waiter)
            try:
                await asyncio.wait_for(waiter, left)
            except asyncio.TimeoutError:
                pass
            finally:
                self._waiters.discard(waiter)

    def _take(self, seq_id: str, held: list[FeatureBlock], start: int, end: int) -> FeatureBlock:
        """The rows [start, end) of the held blocks (one whole block as it is); rows before ``start`` are dropped:
        they are not asked for again."""
        parts = [b if (b.start, b.end) == (start, end) else b.rows(max(b.start, start), min(b.end, end))
                 for b in held if b.start < end and start < b.end]  # fmt: skip
        block = parts[0] if len(parts) == 1 else FeatureBlock.join(parts)
        rest = [b if b.start >= start else b.rows(start, b.end) for b in held if b.end > start]
        self._bytes -= sum(len(b.data) for b in held) - sum(len(b.data) for b in rest)
        self._rows[seq_id] = rest
        return block

    def _wake(self) -> None:
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(None)

    def forget(self, seq_ids: list[str]) -> None:
        for seq_id in seq_ids:
            held = self._rows.pop(seq_id, None)
            if held is not None:
                self._bytes -= sum(len(b.data) for b in held)
