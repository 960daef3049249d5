"""Feature rows the target pushed to this draft (PushFeatures), held until a plan names them.

    target ──FeaturePush──▶ put(seq, block)        rows by sequence and position
    DraftPlan item: rows [a, b) pushed ──▶ await take(seq, a, b)   joined, or None after ``wait_s``

A plan can overtake the push it depends on (two connections), so ``take`` waits up to ``wait_s`` (one
deadline for the whole plan) for rows still in flight, but only while a push stream from a target is open
(``feed``): with none open (this draft restarted and the target's rows went into the old connection, or
the target's stream broke) rows cannot come, so it waits only ``grace_s`` for a target to dial in. Rows are
dropped once taken past, when the sequence is released, and oldest sequence first beyond ``max_bytes`` (a
sequence whose rows were dropped is reported missing and rebuilt by the scheduler, losing nothing but time).
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
        self._rows: OrderedDict[str, FeatureBlock] = OrderedDict()  # seq id -> its rows, consecutive
        self._bytes = 0
        self._waiters: set[asyncio.Future] = set()
        self.bytes_received = 0  # all time

    def put(self, seq_id: str, block: FeatureBlock) -> None:
        held = self._rows.pop(seq_id, None)
        if held is not None:
            self._bytes -= len(held.data)
            try:
                block = FeatureBlock.join([held, block])  # a newer block overrides the rows it shares
            except ValueError:  # a gap (rows lost in flight): keep the newest; a take across the gap misses
                pass
        self._rows[seq_id] = block
        self._bytes += len(block.data)
        self.bytes_received += len(block.data)
        while self._bytes > self.max_bytes and len(self._rows) > 1:
            _, dropped = self._rows.popitem(last=False)
            self._bytes -= len(dropped.data)
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
            if held is not None and held.start <= start and end <= held.end:
                block = held.rows(start, end)
                self._trim(seq_id, held, start)  # rows before the ones taken are not asked for again
                return block
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

    def _wake(self) -> None:
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(None)

    def _trim(self, seq_id: str, held: FeatureBlock, keep_from: int) -> None:
        keep_from = max(held.start, min(keep_from, held.end))
        if keep_from > held.start:
            rest = held.rows(keep_from, held.end)
            self._rows[seq_id] = rest
            self._bytes -= len(held.data) - len(rest.data)

    def forget(self, seq_ids: list[str]) -> None:
        for seq_id in seq_ids:
            held = self._rows.pop(seq_id, None)
            if held is not None:
                self._bytes -= len(held.data)
