"""WaitDeadline behaves as ``asyncio.timeout`` for one wait at a time, with one timer for a run of waits."""

from __future__ import annotations

import asyncio

import pytest

from services.scheduler.wait_deadline import WaitDeadline


def test_a_wait_past_its_allowance_raises_timeout_error():
    async def main():
        deadline = WaitDeadline()
        with pytest.raises(TimeoutError):
            with deadline.within(0.02):
                await asyncio.sleep(1)
        with deadline.within(0.5):  # the next wait is not touched by the last one's expiry
            await asyncio.sleep(0.01)
        assert asyncio.current_task().cancelling() == 0

    asyncio.run(main())


def test_each_wait_gets_its_whole_allowance_from_its_own_start():
    """The timer set by an early wait moves to the due time of the wait under way when it fires."""

    async def main():
        deadline = WaitDeadline()
        with deadline.within(0.1):
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.06)  # the timer (set for the first wait) fires 0.03 s into the next one
        with deadline.within(0.1):
            await asyncio.sleep(0.06)  # not due: 0.06 s of its 0.1 s
        loop = asyncio.get_running_loop()
        start = loop.time()
        with pytest.raises(TimeoutError):
            with deadline.within(0.05):  # a shorter allowance than the timer's: a timer of its own
                await asyncio.sleep(1)
        assert loop.time() - start < 0.5

    asyncio.run(main())


def test_many_short_waits_share_one_timer():
    async def main():
        loop = asyncio.get_running_loop()
        deadline = WaitDeadline()
        timers = []
        call_at = loop.call_at
        loop.call_at = lambda *a, **k: timers.append(a) or call_at(*a, **k)
        for _ in range(100):
            with deadline.within(30.0):
                await asyncio.sleep(0)
        loop.call_at = call_at
        return timers

    assert len(asyncio.run(main())) == 1


def test_someone_elses_cancel_stays_a_cancel_and_no_limit_never_fires():
    async def waiter(deadline, timeout_s):
        with deadline.within(timeout_s):
            await asyncio.sleep(1)

    async def main():
        deadline = WaitDeadline()
        task = asyncio.create_task(waiter(deadline, 10.0))
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        task = asyncio.create_task(waiter(deadline, None))
        await asyncio.sleep(0.05)
        assert not task.done()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())


def test_an_overlapping_wait_gets_a_deadline_of_its_own():
    async def main():
        deadline = WaitDeadline()

        async def slow():
            with deadline.within(0.03):
                await asyncio.sleep(1)

        async def quick():
            with deadline.within(1.0):
                await asyncio.sleep(0.06)
            return "done"

        first = asyncio.create_task(slow())
        await asyncio.sleep(0)
        second = asyncio.create_task(quick())
        results = await asyncio.gather(first, second, return_exceptions=True)
        assert isinstance(results[0], TimeoutError) and results[1] == "done"

    asyncio.run(main())
