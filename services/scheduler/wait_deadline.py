"""A deadline for a long run of short waits, one at a time: ``asyncio.timeout``'s behaviour, one timer for all.

    deadline = WaitDeadline()
    with deadline.within(60.0):       # as ``async with asyncio.timeout(60.0)``: TimeoutError past 60 s
        await call.write(plan)
        reply = await call.read()

A step stream waits for every outcome under the same allowance (plan_stream.py), a thousand times a
second. ``asyncio.timeout`` makes a Timeout and schedules, then cancels, a timer handle for each wait
(its context manager is a coroutine pair too). Here a wait only notes its task and when it is due; the
one timer, when it fires, moves itself to the due time of the wait under way if that is later (a wait
that began after the timer was set), ends the wait if it is due, or lapses if nothing waits. So the
timer fires about once per allowance, whatever the number of waits.

A wait past its due time is ended as ``asyncio.timeout`` ends it: its task is cancelled, and the
CancelledError leaves ``within`` as TimeoutError unless someone else cancelled the task meanwhile. A
``within`` entered while another wait is under way gets a deadline of its own.
"""

from __future__ import annotations

import asyncio
import contextlib

_NO_LIMIT = contextlib.nullcontext()  # reusable: it keeps no state


class WaitDeadline:
    """One wait at a time under a deadline; reused from wait to wait (see the module's docstring)."""

    def __init__(self) -> None:
        self._task: asyncio.Task | None = None  # the task of the wait under way; None between waits
        self._due = 0.0  # loop time the wait under way times out
        self._cancelling = 0  # its task's pending cancellations when it began (as asyncio.timeout counts them)
        self._expired = False  # the timer cancelled the wait under way
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0  # loop time the timer fires

    def within(self, timeout_s: float | None) -> contextlib.AbstractContextManager:
        """The context manager of one wait of at most ``timeout_s`` (None: no limit)."""
        if timeout_s is None:
            return _NO_LIMIT
        if self._task is not None:  # a wait under way already: this one gets its own deadline
            return WaitDeadline().within(timeout_s)
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("WaitDeadline.within() must be used inside a task")
        loop = task.get_loop()
        self._task, self._cancelling, self._expired = task, task.cancelling(), False
        self._due = loop.time() + timeout_s
        if self._timer is not None and self._due < self._timer_at:  # a shorter allowance than the timer's
            self._timer.cancel()
            self._timer = None
        if self._timer is None:
            self._timer_at = self._due
            self._timer = loop.call_at(self._due, self._fire)
        return self

    def __enter__(self) -> WaitDeadline:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        task, self._task = self._task, None
        if task is not None and self._expired:
            self._expired = False
            if task.uncancel() <= self._cancelling and exc_type is asyncio.CancelledError:
                raise TimeoutError from exc  # the cancellation was ours: no one else asked for one

    def _fire(self) -> None:
        self._timer = None
        task = self._task
        if task is None:  # nothing waits: the next wait sets the timer again
            return
        if self._due > self._timer_at:  # the wait under way began after the timer was set: not due yet
            self._timer_at = self._due
            self._timer = task.get_loop().call_at(self._due, self._fire)
            return
        self._expired = True
        task.cancel()
