"""A draft failure near the end of the traffic leaves nothing on the draft: the loop, idle, releases what the
failed draft may still hold once it answers again (DraftLink.release_stale_when_idle)."""

from __future__ import annotations

import asyncio

from scheduler.engine_loop import Scheduler, SchedulerConfig
from scheduler.policies.speculation import FixedChain
from scheduler.request import Request
from scheduler.testing import FakeDraft, FakeTarget, ToyDraftLM, ToyLM


class _DownAt:
    """Takes the draft down after ``step`` steps (every call to it raises from then on)."""

    def __init__(self, draft: FakeDraft, step: int) -> None:
        self.draft, self.step = draft, step

    def on_step(self, report) -> None:
        if report.step == self.step:
            self.draft.down = True

    def on_finish(self, request) -> None:
        return None


def _scheduler(retry_s: float) -> tuple[Scheduler, FakeDraft]:
    """Chains of 3 over toy workers; the draft goes down after step 2 and is retried every ``retry_s``."""
    lm = ToyLM()
    draft = FakeDraft(ToyDraftLM(lm))
    sched = Scheduler(FakeTarget(lm), draft, spec_policy=FixedChain(3),
                      config=SchedulerConfig(draft_retry_initial_s=retry_s, draft_retry_max_s=retry_s))  # fmt: skip
    sched.add_observer(_DownAt(draft, step=2))
    return sched, draft


def test_sequences_a_failed_draft_holds_are_released_while_the_loop_idles():
    async def main():
        sched, draft = _scheduler(retry_s=0.05)
        loop = asyncio.create_task(sched.run())
        streams = [sched.submit(Request(id=f"r{i}", prompt_ids=[1, 2, 3 + i], max_new_tokens=12)) for i in range(3)]
        outs = await asyncio.wait_for(asyncio.gather(*(s.collect() for s in streams)), 10)
        assert all(len(out) == 12 for out in outs)  # finished by plain decoding after the failure
        assert draft.seqs and sched.link.stale  # what the draft held when it went down is still there
        draft.down = False  # it answers again: the idle loop releases the sequences after the backoff
        for _ in range(200):
            if not draft.seqs and not sched.link.stale:
                break
            await asyncio.sleep(0.01)
        assert not draft.seqs and not sched.link.stale
        assert not sched.has_work()
        sched.stop()
        await asyncio.wait_for(loop, 5)

    asyncio.run(main())


def test_new_work_while_waiting_for_the_retry_is_served_at_once():
    async def main():
        sched, draft = _scheduler(retry_s=30.0)
        loop = asyncio.create_task(sched.run())
        first = sched.submit(Request(id="a", prompt_ids=[1, 2, 3], max_new_tokens=8))
        await asyncio.wait_for(first.collect(), 10)
        assert sched.link.stale  # idle, waiting 30 s for the retry
        second = sched.submit(Request(id="b", prompt_ids=[4, 5, 6], max_new_tokens=8))
        assert len(await asyncio.wait_for(second.collect(), 5)) == 8  # the wait ended at the submission
        sched.stop()
        await asyncio.wait_for(loop, 5)

    asyncio.run(main())
