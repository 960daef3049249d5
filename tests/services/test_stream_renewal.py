"""New TLS credentials for the model services reach the step streams without losing a step: a renewal while
requests decode (continuation steps owed) moves each stream to a new call on a new channel once nothing is
owed, and the old channel closes as it is left (services/scheduler/stream_workers.py, plan_stream.py).

The renewal here dials the same plaintext address (credentials None): what is tested is the move, which TLS
does not change; tests/e2e/test_tls_launch.py renews real certificates under mutual TLS."""

from __future__ import annotations

import asyncio

from scheduler.engine_loop import Scheduler
from scheduler.request import RequestState
from scheduler.workers import NullObserver
from services.scheduler.run_ahead import RunAhead
from services.scheduler.stream_workers import StreamDraftWorker, StreamTargetWorker
from shared.engine.types import PrefillItem, SpecItem
from tests.services.test_run_ahead import requests
from tests.support.model_services import NUM_BLOCKS, greedy_reference, serving


class RenewAt(NullObserver):
    """Renews the worker's credentials after each of ``steps``, while the requests still decode."""

    def __init__(self, worker, steps: set[int]) -> None:
        self.worker, self.steps = worker, steps

    async def on_step(self, report) -> None:
        if report.step in self.steps:
            await self.worker.renew_credentials(None)


def test_a_renewal_while_decoding_moves_the_step_stream_and_loses_nothing(tiny_model_dir):
    reqs = requests("n")

    async def main():
        async with serving(tiny_model_dir) as (t, _):
            target = StreamTargetWorker(t.address, timeout_s=10)
            target.run_ahead = RunAhead(repeat=3)  # continuation steps owed on the stream when it renews
            first_channel = target._bare_channel
            sched = Scheduler(target, None, observers=[RenewAt(target, {2, 6})])
            streams = [sched.submit(r) for r in reqs]
            try:
                _, *outs = await asyncio.gather(sched.run_until_idle(), *(s.collect() for s in streams))
                info = await target.info()
                closing = set(target._old_channels)
                await asyncio.wait_for(asyncio.gather(*closing), 5)  # the old channels close once left
                return outs, info, target.stream.num_opened, first_channel, target._bare_channel
            finally:
                await target.close()

    outs, info, opened, first, last = asyncio.run(main())
    for req, out in zip(reqs, outs):
        assert req.state is RequestState.FINISHED, req.error
        assert out == greedy_reference(tiny_model_dir, tuple(req.prompt_ids), req.max_new_tokens)
    assert (info.kv_blocks_free, info.num_live_seqs) == (NUM_BLOCKS, 0)
    assert opened >= 2 and last is not first  # moved to a call on the new channel


def test_the_draft_stream_moves_after_a_renewal_and_keeps_its_sequences(tiny_model_dir):
    async def main():
        async with serving(tiny_model_dir, tiny_model_dir) as (_, draft):
            worker = StreamDraftWorker(draft.address)
            try:
                await worker.prefill([PrefillItem("a", [3, 14, 15])])
                before = await worker.speculate([SpecItem("a", [92], chain_len=2)])
                await worker.renew_credentials(None)
                assert worker.renewing and worker.stream.num_opened == 1
                after = await worker.speculate([SpecItem("a", [92], chain_len=2)])  # same position: same tree
                await asyncio.wait_for(asyncio.gather(*worker._old_channels), 5)
                return before, after, worker.renewing, worker.stream.num_opened
            finally:
                await worker.close()

    before, after, renewing, opened = asyncio.run(main())
    assert not renewing and opened == 2 and after[0].token_ids == before[0].token_ids
