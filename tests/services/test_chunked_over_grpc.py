"""Chunked prefill (Step RPC) and prefix caching over real gRPC model services: greedy-exact, the cache
reused across requests and reported in Info, and a draft that dies mid chunked prefill loses nothing."""

from __future__ import annotations

import asyncio

import pytest

from scheduler.engine_loop import Scheduler, SchedulerConfig
from scheduler.policies.prefill_split import pair_cost
from scheduler.policies.speculation import FixedChain
from scheduler.request import FinishReason, Request
from services.scheduler.grpc_workers import GrpcDraftWorker, GrpcTargetWorker
from shared.engine.factory import build_target_engine
from shared.engine.model_shape import model_shape
from tests.services.test_scheduler_over_grpc import StopDraftAt, run_requests
from tests.support.model_services import NUM_BLOCKS, greedy_reference, serving

SYSTEM = [5, 17, 29, 41, 53, 65, 77, 89, 101, 113, 125, 137, 149, 161, 173, 185, 197]  # shared by every prompt


def requests(tag: str) -> list[Request]:
    tails = ([3, 1, 4, 1, 5], [9, 2, 6], [8, 8, 8, 8, 8, 8, 8, 8, 8])
    return [Request(f"{tag}{i}", SYSTEM + list(t), max_new_tokens=7 + i) for i, t in enumerate(tails)]


@pytest.mark.parametrize("stop_draft_at", [None, 0])
def test_chunked_prefill_and_prefix_cache_over_grpc(tiny_model_dir, stop_draft_at):
    async def main():
        async with serving(tiny_model_dir, tiny_model_dir) as (t, d):
            target, draft = GrpcTargetWorker(t.address, timeout_s=10), GrpcDraftWorker(d.address, timeout_s=10)
            observers = [StopDraftAt(d, stop_draft_at)] if stop_draft_at is not None else []
            sched = Scheduler(target, draft, spec_policy=FixedChain(2), observers=observers,
                              config=SchedulerConfig(prefill_chunk=6, draft_retry_initial_s=0.05))  # fmt: skip
            try:
                rounds = [(reqs := requests(tag), await run_requests(sched, reqs)) for tag in ("a", "b")]
                info = await target.info()
            finally:
                await asyncio.gather(target.close(), draft.close())
            return rounds, info, sched

    rounds, info, sched = asyncio.run(main())
    for reqs, outs in rounds:
        for req, out in zip(reqs, outs):
            assert req.finish_reason is FinishReason.LENGTH, req.error
            assert out == greedy_reference(tiny_model_dir, tuple(req.prompt_ids), req.max_new_tokens)
    assert sched.chunks.num_chunks >= 6
    assert info.prefix_cache_hit_tokens > 0 and info.prefix_cache_query_tokens >= info.prefix_cache_hit_tokens
    assert info.prefix_cache_blocks > 0 and sched.chunks.num_cached_tokens > 0
    assert (info.kv_blocks_free, info.num_live_seqs) == (NUM_BLOCKS, 0)  # cached blocks count as free
    shape = model_shape(build_target_engine(tiny_model_dir, device="cpu", with_tokenizer=False)[0].runner)
    assert (info.num_layers, info.attention_width, info.layer_params) == (
        shape.num_layers, shape.attention_width, shape.layer_params)  # what the scheduler sizes chunks by
    assert pair_cost(info.attention_width, info.num_layers, info.layer_params) > 0
