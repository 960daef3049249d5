"""Step streams survive their peers: a target or draft stopped mid-stream and started again loses nothing.

Real services on loopback (tiny models); the scheduler drives them over StepStream / SpeculateStream. A
broken stream is a worker failure with the unary protocol's recovery: the target's requests wait and
are re-prefilled once it answers (target_link.py), the draft's are resynchronised (draft_link.py).
"""

from __future__ import annotations

import asyncio

import pytest

from scheduler.engine_loop import Scheduler
from scheduler.policies.speculation import FixedChain
from scheduler.request import FinishReason, Request, RequestState
from scheduler.workers import NullObserver
from services.model_main import start as start_model
from services.scheduler.stream_workers import worker_classes
from tests.services.test_scheduler_over_grpc import mixed_requests, run_requests
from tests.support.model_services import NUM_BLOCKS, greedy_reference, model_settings, serving


class RestartAt(NullObserver):
    """After step ``step``: stop the service (as if its process died) and start a fresh one on its port."""

    def __init__(self, role: str, model_dir, step: int, holder: dict) -> None:
        self.role, self.model_dir, self.step, self.holder = role, model_dir, step, holder
        self.restarted = asyncio.Event()

    async def on_step(self, report) -> None:
        if report.step == self.step:
            old = self.holder[self.role]
            await old.stop(0)
            asyncio.get_running_loop().create_task(self._start_again(old.port))

    async def _start_again(self, port: int) -> None:
        await asyncio.sleep(0.3)  # a few steps run against a dead peer first
        self.holder[self.role] = await start_model(model_settings(self.model_dir, port=port), self.role)
        self.restarted.set()


@pytest.mark.parametrize("role", ["target", "draft"])
def test_a_restarted_peer_loses_nothing_over_step_streams(tiny_model_dir, role):
    reqs = mixed_requests()
    target_cls, draft_cls = worker_classes("stream")

    async def main():
        async with serving(tiny_model_dir, tiny_model_dir) as (t, d):
            holder = {"target": t, "draft": d}
            restart = RestartAt(role, tiny_model_dir, 2, holder)
            target, draft = target_cls(t.address, timeout_s=10), draft_cls(d.address, timeout_s=10)
            sched = Scheduler(target, draft, spec_policy=FixedChain(3), observers=[restart])
            sched.link.retry_initial_s = sched.link.retry_max_s = 0.05
            try:
                outs = await run_requests(sched, reqs)
                await asyncio.wait_for(restart.restarted.wait(), 30)
                infos = [await target.info(), await draft.info()]
                opened = (target.stream.num_opened, draft.stream.num_opened)
            finally:
                await asyncio.gather(target.close(), draft.close())
                if holder[role] is not (t if role == "target" else d):
                    await holder[role].stop(0)
            return outs, infos, opened, sched

    outs, infos, opened, sched = asyncio.run(main())
    for req, out in zip(reqs, outs):
        assert req.state is RequestState.FINISHED and req.finish_reason is FinishReason.LENGTH, req.error
        assert out == greedy_reference(tiny_model_dir, tuple(req.prompt_ids), req.max_new_tokens)
    for info in infos:  # both services hold nothing at the end: releases reached the fresh one too
        assert (info.kv_blocks_free, info.num_live_seqs) == (NUM_BLOCKS, 0)
    if role == "target":  # the broken stream was opened again on the fresh target
        assert sched.target_link.num_recoveries >= 1 and opened[0] >= 2
    assert any(r.num_accepted_tokens for r in reqs)
