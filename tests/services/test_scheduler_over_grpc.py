"""The scheduler loop over the gRPC workers and real model services: lossless, degrades when the draft dies."""

from __future__ import annotations

import asyncio

import pytest

from scheduler.engine_loop import Scheduler
from services.scheduler.stream_workers import worker_classes
from scheduler.policies.speculation import FixedChain
from scheduler.request import FinishReason, Request, RequestState, SpecMode, SpeculationSetting
from scheduler.workers import NullObserver
from tests.support.model_services import NUM_BLOCKS, greedy_reference, serving


def mixed_requests() -> list[Request]:
    """AUTO (the policy's chain of 3), FIXED k=2 and OFF requests of different lengths, decoded together."""
    fixed2 = SpeculationSetting(SpecMode.FIXED, 2)
    off = SpeculationSetting(SpecMode.OFF)
    return [
        Request(id="auto", prompt_ids=[3, 14, 15, 92, 65], max_new_tokens=14),
        Request(id="fixed2", prompt_ids=[35, 89], max_new_tokens=9, speculation=fixed2),
        Request(id="off", prompt_ids=[79, 32, 38, 46], max_new_tokens=6, speculation=off),
        Request(id="auto2", prompt_ids=[26, 43, 38, 32, 79, 50, 28, 84], max_new_tokens=11),
    ]


async def run_requests(sched: Scheduler, reqs: list[Request]) -> list[list[int]]:
    streams = [sched.submit(r) for r in reqs]
    _, *outs = await asyncio.gather(sched.run_until_idle(), *(s.collect() for s in streams))
    return outs


class StopDraftAt(NullObserver):
    """Stops the draft service after step ``step``, as if its process died mid-run."""

    def __init__(self, draft, step: int) -> None:
        self.draft, self.step = draft, step

    async def on_step(self, report) -> None:
        if report.step == self.step:
            await self.draft.stop(0)


PROTOCOLS = pytest.mark.parametrize("protocol", ["stream", "unary"])


def run(tiny_model_dir, draft_dir, *, stop_draft_at: int | None = None, protocol: str = "stream"):
    reqs = mixed_requests()
    target_cls, draft_cls = worker_classes(protocol)

    async def main():
        async with serving(tiny_model_dir, draft_dir) as (t, d):
            target, draft = target_cls(t.address, timeout_s=10), draft_cls(d.address, timeout_s=10)
            observers = [StopDraftAt(d, stop_draft_at)] if stop_draft_at is not None else []
            sched = Scheduler(target, draft, spec_policy=FixedChain(3), observers=observers)
            try:
                outs = await run_requests(sched, reqs)
                infos = [await target.info()] + ([await draft.info()] if stop_draft_at is None else [])
            finally:
                await asyncio.gather(target.close(), draft.close())
            return outs, infos, sched

    outs, infos, sched = asyncio.run(main())
    for req, out in zip(reqs, outs):
        assert req.state is RequestState.FINISHED and req.finish_reason is FinishReason.LENGTH, req.error
        assert out == req.output_ids == greedy_reference(tiny_model_dir, tuple(req.prompt_ids), req.max_new_tokens)
    for info in infos:  # every sequence released on the services that are still up
        assert (info.kv_blocks_free, info.num_live_seqs) == (NUM_BLOCKS, 0)
    return reqs, sched


@PROTOCOLS
def test_concurrent_requests_with_fixed_k_equal_target_only_greedy(tiny_model_dir, protocol):
    reqs, sched = run(tiny_model_dir, tiny_model_dir, protocol=protocol)  # same weights: every drafted token is accepted
    by_id = {r.id: r for r in reqs}
    assert by_id["auto"].num_accepted_tokens > 0 and by_id["fixed2"].num_accepted_tokens > 0
    assert max(by_id["fixed2"].accepted_lens) == 2 and by_id["off"].num_drafted_tokens == 0
    assert sched.draft_available


@PROTOCOLS
def test_random_draft_stays_lossless(tiny_model_dir, draft_model_dir, protocol):
    run(tiny_model_dir, draft_model_dir, protocol=protocol)


@PROTOCOLS
def test_draft_dying_mid_run_loses_nothing(tiny_model_dir, protocol):
    reqs, sched = run(tiny_model_dir, tiny_model_dir, stop_draft_at=1, protocol=protocol)
    assert not sched.draft_available  # the rest decoded plainly
    assert any(r.num_accepted_tokens for r in reqs)  # speculation happened before the draft went away
