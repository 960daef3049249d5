"""Calling the observers of a step, and running the deferrable ones while the next step's workers compute.

    step N:   ... verify ─▶ commit ─▶ notify: the policies' own hooks and the synchronous observers now;
                                      the deferrable ones (``deferrable = True``: Redis, metrics) held
    step N+1: start ─▶ admit ─▶ prefill / speculate / verify (the first await of a worker) ── meanwhile:
              step N's deferred observers run, in step order (each batch after the previous one)

Held, not scheduled at once: a task made at notify would run at the loop's first yield, before step
N+1 has sent its plan, in the gap the workers wait through. ``start`` makes the task, so it runs
when the step first waits for a worker; the loop also starts what is held when it goes idle.

What the policies learn (``observe``, ``on_finish``) still lands before the next plan, and every token
already went out on its stream at commit, so nothing observable changes but when the observers run.
A deferred observer sees the same report and requests; gauges it samples from the scheduler read
its state a moment later. ``drain`` waits for the deferred calls (end of run, tests).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

log = logging.getLogger(__name__)

Call = tuple[Callable[[Any], Any], Any]


async def call_all(calls: Iterable[Call]) -> None:
    for fn, arg in calls:
        try:
            out = fn(arg)
            if out is not None and inspect.isawaitable(out):  # most hooks return None: no ABC check for it
                await out
        except Exception:  # noqa: BLE001 - an observer never stops the loop
            log.exception("observer %r failed", fn)


def is_deferrable(observer: object) -> bool:
    return bool(getattr(observer, "deferrable", False))


class ObserverSplit:
    """The observers as (synchronous, deferrable), in their order; worked out again only when the list changes.

    The loop asks every step; the observers (and whether each is ``deferrable``, a class attribute) rarely
    change, so one tuple comparison replaces a bound method and an attribute lookup per observer and hook."""

    def __init__(self) -> None:
        self._of: tuple = ()
        self._split: tuple[tuple, tuple] = ((), ())

    def __call__(self, observers: Iterable[object]) -> tuple[tuple, tuple]:
        current = tuple(observers)
        if len(current) != len(self._of) or any(a is not b for a, b in zip(current, self._of)):  # by identity
            self._of = current
            self._split = (tuple(o for o in current if not is_deferrable(o)),
                           tuple(o for o in current if is_deferrable(o)))  # fmt: skip
        return self._split


class DeferredCalls:
    """Observer calls run in a task of their own, one batch after the other."""

    def __init__(self) -> None:
        self._task: asyncio.Task | None = None
        self._held: list[list[Call]] = []  # batches submitted and not started yet, in step order
        self.busy_s = 0.0  # time spent in deferred calls, all time (what ran beside the workers)

    def submit(self, calls: list[Call]) -> None:
        if calls:
            self._held.append(calls)

    def start(self) -> None:
        """Run what is held once the caller next yields (it is about to wait for its workers)."""
        if self._held:
            batches, self._held = self._held, []
            self._task = asyncio.get_running_loop().create_task(self._after(self._task, batches))

    async def _after(self, previous: asyncio.Task | None, batches: list[list[Call]]) -> None:
        if previous is not None and not previous.done():  # the last batch still runs (it awaited): after it
            await asyncio.gather(previous, return_exceptions=True)
        started = time.perf_counter()
        for calls in batches:
            await call_all(calls)
        self.busy_s += time.perf_counter() - started

    async def drain(self) -> None:
        self.start()
        while self._task is not None and not self._task.done():
            await asyncio.gather(self._task, return_exceptions=True)
