"""A target that dies or restarts mid-request: its requests wait, are re-prefilled with what they
committed, and end exactly as without the outage; past the bound they end UNAVAILABLE with their tokens."""

from __future__ import annotations

import asyncio

import pytest

from scheduler.engine_loop import RequestStream, Scheduler, SchedulerConfig
from scheduler.policies.speculation import FixedChain
from scheduler.request import FinishReason, Request, RequestState
from scheduler.target_link import TargetRecoveryConfig
from scheduler.testing import FakeDraft, FakeTarget, ToyDraftLM, ToyLM
from scheduler.workers import FakeClock, NullObserver


async def consume(stream: RequestStream):
    events = [ev async for ev in stream]
    return [t for ev in events for t in ev.token_ids], events


class Outage(NullObserver):
    """Crashes the target (all sequences lost) after step ``at`` and brings it back ``down_s`` later."""

    def __init__(self, target: FakeTarget, clock: FakeClock, at: int, down_s: float | None) -> None:
        self.target, self.clock, self.at, self.down_s = target, clock, at, down_s
        self.back_at: float | None = None

    def on_step(self, report) -> None:
        if report.step == self.at:
            self.target.crash()
            if self.down_s is not None:
                self.back_at = self.clock.now() + self.down_s
                asyncio.get_running_loop().create_task(self._back())

    async def _back(self) -> None:
        await self.clock.sleep(self.down_s)
        self.target.down = False


def _stack(recovery_s: float, k: int = 3):
    clock = FakeClock()
    lm = ToyLM(vocab_size=50, seed=3)
    target = FakeTarget(lm, clock, prefill_s=0.01, verify_s=0.02)
    draft = FakeDraft(ToyDraftLM(lm, agree_prob=0.7), clock, speculate_s=0.005, reference=target)
    config = SchedulerConfig(target_recovery=TargetRecoveryConfig(recovery_s=recovery_s, backoff_s=0.05))
    return clock, lm, target, draft, Scheduler(target, draft, clock=clock, spec_policy=FixedChain(k), config=config)


@pytest.mark.parametrize("down_s", [0.0, 0.5, 3.0])
def test_a_target_restart_mid_request_changes_no_greedy_token(down_s):
    clock, lm, target, draft, sched = _stack(recovery_s=10)
    outage = Outage(target, clock, at=4, down_s=down_s)
    sched.add_observer(outage)
    reqs = [Request(f"r{i}", [i, i + 1, i + 2], max_new_tokens=12 + 7 * i) for i in range(4)]

    async def main():
        outs = asyncio.gather(*(consume(sched.submit(r)) for r in reqs))
        await sched.run_until_idle()
        return await outs

    outs = asyncio.run(main())
    for req, (tokens, events) in zip(reqs, outs):
        assert req.state is RequestState.FINISHED and req.finish_reason is FinishReason.LENGTH
        assert tokens == lm.generate(req.prompt_ids, req.max_new_tokens), req.id
        assert sum(1 for ev in events if ev.finished) == 1
    assert sched.target_link.num_outages == 1 and sched.target_link.num_recoveries == 1
    assert sum(r.num_recomputes for r in reqs) >= 1  # re-prefilled with prompt + output
    assert target.seqs == {} and draft.seqs == {}  # nothing leaked on either side


def test_past_the_bound_requests_end_unavailable_with_their_tokens_and_later_ones_wait_again():
    clock, lm, target, draft, sched = _stack(recovery_s=2.0)
    sched.add_observer(Outage(target, clock, at=3, down_s=None))  # never comes back by itself
    reqs = [Request(f"r{i}", [i, 5], max_new_tokens=40) for i in range(2)]
    late = Request("late", [7, 7], max_new_tokens=5)

    async def main():
        outs = asyncio.gather(*(consume(sched.submit(r)) for r in reqs))
        await sched.run_until_idle()
        first = await outs
        target.down = False  # the operator restarts it
        late_out = asyncio.ensure_future(consume(sched.submit(late)))
        await sched.run_until_idle()
        return first, await late_out

    outs, (late_tokens, _) = asyncio.run(main())
    for req, (tokens, events) in zip(reqs, outs):
        assert req.state is RequestState.FAILED
        final = events[-1]
        assert final.error_code == "UNAVAILABLE" and "unavailable for more than 2 s" in final.error
        assert 0 < len(tokens) < 40 and tokens == lm.generate(req.prompt_ids, 40)[: len(tokens)]  # partial output
    assert late.state is RequestState.FINISHED and late_tokens == lm.generate(late.prompt_ids, 5)
    assert target.seqs == {} and draft.seqs == {}


def test_a_target_hang_that_comes_back_frees_the_old_sequences_first():
    """A timeout, not a crash: the target still holds the sequences; they are released before re-prefill."""
    clock, lm, target, draft, sched = _stack(recovery_s=10)

    class Timeout(Exception):
        grpc_code = "DEADLINE_EXCEEDED"

    calls = {"n": 0}
    verify = target.verify

    async def flaky(items):
        calls["n"] += 1
        if calls["n"] == 3:
            raise Timeout("deadline")
        return await verify(items)

    target.verify = flaky
    req = Request("r", [1, 2, 3], max_new_tokens=15)

    async def main():
        out = asyncio.ensure_future(consume(sched.submit(req)))
        await sched.run_until_idle()
        return await out

    tokens, _ = asyncio.run(main())
    assert req.state is RequestState.FINISHED and tokens == lm.generate([1, 2, 3], 15)
    assert target.seqs == {}
