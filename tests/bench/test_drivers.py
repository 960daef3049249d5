"""Driver timing on a virtual clock: open-loop sends at arrival times, closed-loop keeps N in flight."""

from __future__ import annotations

import asyncio
import heapq
import itertools

import pytest

from bench import drivers
from bench.drivers import Job, Outcome, closed_loop, open_loop
from bench.prompts import Prompt
from bench.slo import MODERATE, STRINGENT
from bench.tokens import EncodedItem
from bench.workload import WorkItem


class VirtualTimer:
    """Time stands still while any task can run; when all wait, it jumps to the earliest wake-up."""

    def __init__(self) -> None:
        self.t = 0.0
        self._waiters: list = []
        self._seq = itertools.count()

    def now(self) -> float:
        return self.t

    async def sleep_until(self, t: float) -> None:
        if t <= self.t:
            await asyncio.sleep(0)
            return
        fut = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiters, (t, next(self._seq), fut))
        await fut

    async def sleep(self, dt: float) -> None:
        await self.sleep_until(self.t + dt)

    async def drive(self, coro):
        task = asyncio.ensure_future(coro)
        while not task.done():
            for _ in range(20):  # let every runnable task reach its next wait
                await asyncio.sleep(0)
            if task.done():
                break
            if not self._waiters:
                raise RuntimeError("deadlock: nothing runnable and nobody waiting on the clock")
            t, _, fut = heapq.heappop(self._waiters)
            self.t = max(self.t, t)
            fut.set_result(None)
        return task.result()


def job(i: int, arrival: float | None = None, max_new_tokens: int = 5, slo=STRINGENT) -> Job:
    item = WorkItem(i, arrival, Prompt("chat", f"q{i}"), slo, max_new_tokens)
    return Job(EncodedItem(item, (10 + i, 11, 12)), 50.0, f"cfg/{i}")


def fake_sender(timer: VirtualTimer, ttft: float = 0.2, step: float = 0.1, per_step: int = 2, accepted: int = 1):
    """First token after ``ttft``, then chunks of ``per_step`` tokens every ``step`` s until max_new_tokens."""
    in_flight = {"now": 0, "max": 0}

    async def send(j: Job, on_chunk) -> Outcome:
        in_flight["now"] += 1
        in_flight["max"] = max(in_flight["max"], in_flight["now"])
        await timer.sleep(ttft)
        on_chunk([1], 0, False)
        emitted = 1
        while emitted < j.max_new_tokens:
            await timer.sleep(step)
            n = min(per_step, j.max_new_tokens - emitted)
            on_chunk([2] * n, min(accepted, n - 1), True)
            emitted += n
        in_flight["now"] -= 1
        return Outcome(finish_reason="length", num_draft_tokens=4)

    return send, in_flight


def _run(coro_factory):
    async def main():
        timer = VirtualTimer()
        return timer, await timer.drive(coro_factory(timer))

    return asyncio.run(main())


def test_open_loop_timing():
    def scenario(timer):
        send, stats = fake_sender(timer)
        scenario.stats = stats
        return open_loop("cfg", [job(0, 0.0), job(1, 0.05), job(2, 0.7)], send, timer)

    timer, run = _run(scenario)
    sent = [r.trace.sent_s for r in run.records]
    assert sent == pytest.approx([0.0, 0.05, 0.7])
    assert scenario.stats["max"] == 2  # job 1 went out while job 0 was still running
    for r in run.records:
        assert r.trace.ttft_s == pytest.approx(0.2)
        # 5 tokens: t=0.2 (1), 0.3 (2), 0.4 (2) -> TPOT = (0.4 - 0.2) / 4
        assert r.trace.tpot_s == pytest.approx(0.05)
        assert r.trace.latency_s == pytest.approx(0.4)
        assert r.trace.num_tokens == 5
    assert run.wall_s == pytest.approx(0.7 + 0.4)


def test_closed_loop_keeps_concurrency_in_flight():
    def scenario(timer):
        send, stats = fake_sender(timer, ttft=0.5, step=0.25, per_step=1)
        scenario.stats = stats
        return closed_loop("cfg", [job(i, max_new_tokens=3) for i in range(5)], send, timer, concurrency=2)

    timer, run = _run(scenario)
    # each request: 0.5 + 2 x 0.25 = 1.0 s; two at a time -> starts at 0, 0, 1, 1, 2
    assert [r.trace.sent_s for r in run.records] == pytest.approx([0.0, 0.0, 1.0, 1.0, 2.0])
    assert scenario.stats["max"] == 2
    assert run.wall_s == pytest.approx(3.0)
    assert [r.job.encoded.index for r in run.records] == [0, 1, 2, 3, 4]


def test_steps_and_acceptance_come_from_the_chunks():
    def scenario(timer):
        send, _ = fake_sender(timer, per_step=3, accepted=2)
        return closed_loop("cfg", [job(0, max_new_tokens=6)], send, timer, concurrency=1)

    _, run = _run(scenario)
    (r,) = run.records
    assert r.step_tokens == [3, 2]  # prefill token is not a step; the last step is cut at max_new_tokens
    assert r.step_accepts == [2, 1]
    assert r.trace.num_steps == 2 and r.trace.num_accepted_tokens == 3
    assert r.trace.num_draft_tokens == 4  # the sender's server-side count wins where it gives one
    assert r.token_ids == [1, 2, 2, 2, 2, 2]


def test_a_failing_request_is_recorded_and_the_run_goes_on():
    def scenario(timer):
        good, _ = fake_sender(timer)

        async def send(j, on_chunk):
            if j.encoded.index == 1:
                on_chunk([1], 0, False)
                raise RuntimeError("server fell over")
            return await good(j, on_chunk)

        return closed_loop("cfg", [job(0), job(1, slo=MODERATE), job(2)], send, timer, concurrency=1)

    _, run = _run(scenario)
    assert [r.error is None for r in run.records] == [True, False, True]
    bad = run.records[1]
    assert bad.trace.finish_reason == "error" and not bad.trace.attained and "fell over" in bad.error
    assert bad.trace.slo_class == "moderate"


def test_open_loop_needs_arrival_times():
    with pytest.raises(ValueError):
        asyncio.run(open_loop("cfg", [job(0, None)], fake_sender(VirtualTimer())[0], VirtualTimer()))


def test_real_timer_sleeps_until_a_deadline():
    timer = drivers.RealTimer()

    async def main():
        t0 = timer.now()
        await timer.sleep_until(t0 + 0.02)
        return timer.now() - t0

    assert asyncio.run(main()) >= 0.02
