"""The narrow interfaces the scheduler core is written against.

Three implementations plug into each: gRPC clients (deployment), in-process
engines (tests), simulated workers on a virtual clock (the simulator)::

    Scheduler ──prefill/verify/release──▶ TargetWorker
              ──prefill/speculate/release─▶ DraftWorker
              ──now/sleep──────────────────▶ Clock
              ──on_step/on_finish──────────▶ IterationObserver(s)  (metrics, Redis, traces)

Contract every worker must keep (the loop relies on it):

- Results come back in the order of the items, one per item.
- A call is atomic per batch: if it raises, the loop assumes nothing of the
  batch was committed (the target) or that the worker's state for the batch
  is unknown (the draft, which is then resynchronised from scratch).
- ``release`` is idempotent: ids the worker does not hold are ignored.
- The scheduler never has two calls in flight on one worker, and releases a
  sequence only between calls, so workers need no locking of their own.

Target semantics: ``prefill`` registers ``prompt_ids`` and samples the next
token, which the target counts as committed. ``verify`` walks the tree that
hangs off the last committed token, accepts a path, samples one bonus token,
and commits path + bonus itself (an empty tree is a plain decode step).

Draft semantics (optionally also ``offload()`` / ``reload()``, Nightjar's
elastic memory: offload drops every sequence the draft holds; a draft
without them, or whose offload fails, just stays resident): ``prefill`` registers a sequence prefix. ``speculate`` first
appends ``SpecItem.new_tokens`` (everything committed since the last call for
that sequence; never empty), discarding whatever it speculated before, then
proposes a chain or a tree after the last token.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from shared.engine.types import AcceptResult, PrefillItem, PrefillResult, SpecItem, TokenTree, VerifyItem

if TYPE_CHECKING:
    from scheduler.report import StepReport
    from scheduler.request import Request


@runtime_checkable
class TargetWorker(Protocol):
    async def prefill(self, items: list[PrefillItem]) -> list[PrefillResult]: ...

    async def verify(self, items: list[VerifyItem]) -> list[AcceptResult]: ...

    async def release(self, seq_ids: list[str]) -> None: ...


@runtime_checkable
class DraftWorker(Protocol):
    async def prefill(self, items: list[PrefillItem]) -> None: ...

    async def speculate(self, items: list[SpecItem]) -> list[TokenTree]: ...

    async def release(self, seq_ids: list[str]) -> None: ...


@runtime_checkable
class Clock(Protocol):
    def now(self) -> float:
        """Seconds, monotonic."""
        ...

    async def sleep(self, seconds: float) -> None: ...


@runtime_checkable
class IterationObserver(Protocol):
    """Attached from outside (metrics, Redis, tracing); may return an awaitable.

    Exceptions raised here are logged and swallowed: an observer never stops the loop.
    """

    def on_step(self, report: StepReport) -> None | Awaitable[None]: ...

    def on_finish(self, request: Request) -> None | Awaitable[None]: ...


class NullObserver:
    """Base class for observers that care about only one of the hooks."""

    def on_step(self, report: StepReport) -> None:
        return None

    def on_finish(self, request: Request) -> None:
        return None


class RealClock:
    def now(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))


class FakeClock:
    """Virtual time for tests and the simulator.

    Manual (``auto_advance=False``): ``sleep`` blocks until ``advance`` moves
    time past its deadline.

    Auto-advancing (default): when nothing else in the event loop is ready to
    run, time jumps to the earliest pending deadline and that sleeper wakes.
    So concurrent sleeps overlap (``gather(sleep(1), sleep(2))`` takes 2
    virtual seconds) and a run costs no wall time. Only meaningful when all
    waiting in the program is on this clock (no real I/O or timers).
    """

    _MAX_SETTLE_HOPS = 10_000  # bound on the idle wait, in event-loop turns

    def __init__(self, start: float = 0.0, auto_advance: bool = True) -> None:
        self._now = float(start)
        self.auto_advance = auto_advance
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []  # heap by deadline
        self._seq = itertools.count()
        self._advancer_pending = False

    def now(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("cannot move a clock backwards")
        self._now += seconds
        self._wake_due()

    def advance_to(self, t: float) -> None:
        self.advance(max(0.0, t - self._now))

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (self._now + seconds, next(self._seq), fut))
        self._schedule_advancer()
        await fut

    # -- internals -------------------------------------------------------------------------
    def _wake_due(self) -> None:
        while self._sleepers and self._sleepers[0][0] <= self._now:
            _, _, fut = heapq.heappop(self._sleepers)
            if not fut.done():
                fut.set_result(None)

    def _schedule_advancer(self) -> None:
        if self.auto_advance and not self._advancer_pending:
            self._advancer_pending = True
            asyncio.get_running_loop().call_soon(self._advance_when_idle, 0)

    def _advance_when_idle(self, hops: int) -> None:
        loop = asyncio.get_running_loop()
        # CPython's loop keeps its ready callbacks in ``_ready``; elsewhere settle for a few turns
        ready = getattr(loop, "_ready", None)
        busy = bool(ready) if ready is not None else hops < 32
        if busy and hops < self._MAX_SETTLE_HOPS:
            loop.call_soon(self._advance_when_idle, hops + 1)
            return
        self._advancer_pending = False
        while self._sleepers and self._sleepers[0][2].done():  # cancelled sleeps
            heapq.heappop(self._sleepers)
        if not self._sleepers:
            return
        self._now = max(self._now, self._sleepers[0][0])
        self._wake_due()
        if self._sleepers:
            self._schedule_advancer()
