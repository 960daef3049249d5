"""One processor the simulated target and draft share: concurrent work slows both (processor sharing).

On a GPU the draft and the target run on their own devices (or SM partitions), and a simulated
worker's call just sleeps its cost on the virtual clock: calls that overlap in time overlap for free.
On a CPU the two models share the same cores. The scheduler overlaps a draft prefill with the
target's prefill (engine_loop._prefill gathers both), and FASER overlaps drafting with verification;
measured on this machine (2 cores, the demo pair, an open loop at 2x capacity), a draft prefill that
overlaps the target's took 1.65-2.1x its time alone and the target's prefill grew by about the
draft's own time: total work conserved, the cores split between the two.

``SharedProcessor`` is that model, egalitarian processor sharing::

    n jobs running  ->  each advances at rate 1 / n  (seconds of its own work per virtual second)

so a job alone takes its cost, two that overlap finish together no earlier than their summed cost.
Each change of n (a job arriving or finishing) re-plans the next completion. Virtual time only:
``run`` sleeps on the clock it is given (a FakeClock in the simulator).
"""

from __future__ import annotations

import asyncio
import itertools

from scheduler.workers import Clock


class SharedProcessor:
    """``await run(seconds)`` takes ``seconds`` alone, longer while other jobs share the processor."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self._remaining: dict[int, float] = {}  # job -> seconds of its own work left
        self._done: dict[int, asyncio.Future[None]] = {}
        self._ids = itertools.count()
        self._last = clock.now()
        self._timer: asyncio.Task[None] | None = None
        self.busy_s = 0.0  # virtual seconds with at least one job running

    @property
    def running(self) -> int:
        return len(self._remaining)

    async def run(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        self._advance()
        job = next(self._ids)
        self._remaining[job] = seconds
        self._done[job] = asyncio.get_running_loop().create_future()
        self._replan()
        try:
            await self._done[job]
        finally:
            if job in self._remaining:  # cancelled mid-way: it stops taking a share
                self._advance()
                del self._remaining[job]
                self._done.pop(job, None)
                self._replan()

    # -- internals ---------------------------------------------------------------------------
    def _advance(self) -> None:
        """Charge the time since the last change to every running job at rate 1 / n."""
        now = self.clock.now()
        elapsed, self._last = now - self._last, now
        if elapsed <= 0 or not self._remaining:
            return
        self.busy_s += elapsed
        share = elapsed / len(self._remaining)
        for job in self._remaining:
            self._remaining[job] -= share

    def _replan(self) -> None:
        if self._timer is not None and not self._timer.done():
            self._timer.cancel()
        self._timer = None
        if self._remaining:
            left = min(self._remaining.values()) * len(self._remaining)  # first completion at the current rate
            self._timer = asyncio.get_running_loop().create_task(self._complete_after(max(0.0, left)))

    async def _complete_after(self, seconds: float) -> None:
        await self.clock.sleep(seconds)
        self._advance()
        for job in [j for j, left in self._remaining.items() if left <= 1e-9]:  # a nanosecond: float slack
            del self._remaining[job]
            fut = self._done.pop(job)
            if not fut.done():
                fut.set_result(None)
        self._timer = None
        self._replan()
