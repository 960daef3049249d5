"""Per-request facts the scheduler's Request does not keep, taken from the target worker's calls.

The public API reports, per streamed chunk, how many of its tokens were
accepted draft tokens, and per request the number of verify steps and the
time spent queued. The scheduler core has no reason to keep those (its
``TokenEvent`` carries tokens only), so rather than widen it, ``StepLedger``
wraps the target worker and writes down, per sequence and in call order::

    prefill(items)   admitted_at (first prefill), chunk: 0 accepted
    verify(items)    steps += 1, chunk: the result's num_accepted (0 for an empty tree)

The loop emits at most one token event per request per target call, in call
order, and only after the call returned; so the servicer pops one chunk entry
per event with tokens (``take_accepted``) and the two stay aligned. Calls that
emit nothing (the request was aborted meanwhile) only leave entries that
``forget`` drops when the request ends. Only requests the servicer ``track``s
are recorded.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from scheduler.prefill_chunks import target_step
from scheduler.workers import Clock, TargetWorker
from shared.engine.types import AcceptResult, PrefillItem, PrefillResult, VerifyItem


@dataclass
class LedgerEntry:
    admitted_at: float | None = None  # scheduler clock, when its first target prefill started
    num_steps: int = 0  # verify steps it took part in
    chunks: deque[int] = field(default_factory=deque)  # accepted draft tokens per future token event


class StepLedger:
    """A ``TargetWorker`` that forwards to ``target`` and keeps a ``LedgerEntry`` per live sequence."""

    def __init__(self, target: TargetWorker, clock: Clock) -> None:
        self.target = target
        self.clock = clock
        self._entries: dict[str, LedgerEntry] = {}

    def __getattr__(self, name: str) -> Any:  # info(), close() ... of the wrapped worker
        return getattr(self.target, name)

    def track(self, seq_id: str) -> LedgerEntry:
        """Start keeping an entry for a request (at submission); untracked sequences are ignored."""
        return self._entries.setdefault(seq_id, LedgerEntry())

    def forget(self, seq_id: str) -> LedgerEntry:
        """Stop tracking a request that ended; returns its entry."""
        return self._entries.pop(seq_id, None) or LedgerEntry()

    def take_accepted(self, seq_id: str, num_tokens: int) -> int:
        """Accepted draft tokens among the ``num_tokens`` of the request's next token event."""
        entry = self._entries.get(seq_id)
        return min(entry.chunks.popleft(), num_tokens) if entry and entry.chunks else 0

    async def prefill(self, items: list[PrefillItem]) -> list[PrefillResult]:
        now = self.clock.now()
        for it in items:
            if (entry := self._entries.get(it.seq_id)) is not None and entry.admitted_at is None:
                entry.admitted_at = now
        results = await self.target.prefill(items)
        for it in items:
            if (entry := self._entries.get(it.seq_id)) is not None:
                entry.chunks.append(0)
        return results

    async def verify(self, items: list[VerifyItem]) -> list[AcceptResult]:
        results = await self.target.verify(items)
        self._verified(items, results)
        return results

    async def step(self, prefills: list[PrefillItem], verifies: list[VerifyItem]):
        """Prefill chunks + verifies in one call: a chunk that ends its prompt counts as a prefill here."""
        now = self.clock.now()
        for it in prefills:
            if (entry := self._entries.get(it.seq_id)) is not None and entry.admitted_at is None:
                entry.admitted_at = now
        prefilled, results = await target_step(self.target, prefills, verifies)
        for res in prefilled:
            if not res.pending and (entry := self._entries.get(res.seq_id)) is not None:
                entry.chunks.append(0)
        self._verified(verifies, results)
        return prefilled, results

    def _verified(self, items: list[VerifyItem], results: list[AcceptResult]) -> None:
        for it, res in zip(items, results):
            if (entry := self._entries.get(it.seq_id)) is not None:
                entry.num_steps += 1
                entry.chunks.append(res.num_accepted if len(it.tree) else 0)

    async def release(self, seq_ids: list[str]) -> None:
        await self.target.release(seq_ids)
