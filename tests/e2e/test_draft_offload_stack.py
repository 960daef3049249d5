"""Nightjar's elastic draft memory over real gRPC with the tiny pair: under KV pressure with speculation off
the scheduler offloads the draft, reloads it once the queue drains, and every output stays the target's
greedy output."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence

from scheduler.policies.speculation import SpecContext, SpecShape, SpeculationPolicy
from scheduler.request import Request
from sdk import Client, FinishReason
from services.scheduler import policies
from shared.rpc.channel import aio_channel
from shared.rpc.gen.tandem.v1 import common_pb2, draft_pb2_grpc
from tests.support.model_services import BLOCK_SIZE, NUM_BLOCKS, serving
from tests.support.tiny_stack import VOCAB


class BusyOff(SpeculationPolicy):
    """k = 0 while the batch is full (as a bandit learns at high load), a chain of 2 when it is small."""

    name = "busy-off"

    def decide(self, batch: Sequence[Request], ctx: SpecContext) -> list[SpecShape]:
        shape = SpecShape.none() if len(batch) >= 3 else SpecShape.chain(2)
        return [shape] * len(batch)


def test_draft_offloads_under_kv_pressure_and_output_is_lossless(tiny_pair, reference, monkeypatch):
    from services.scheduler.main import start
    from services.settings import ServiceSettings

    monkeypatch.setitem(policies.SPECULATION_POLICIES, "busy-off", lambda arg: BusyOff())
    rng = random.Random(5)
    # 4 running requests reserve 4 x (8 + 20) = all of the 112-token budget (64 blocks of 4 minus
    # 4 x (4 + 32) spare): free < 10 %, more waiting -> offload; the last ones run alone -> reload, speculate
    requests = [
        dict(prompt=[rng.randrange(VOCAB) for _ in range(8)], max_new_tokens=20, speculation="auto") for _ in range(9)
    ]

    async def main():
        async with serving(*tiny_pair) as (target, draft):
            settings = ServiceSettings(
                port=0, trace_exporter="none", shutdown_grace_s=0.5, model=str(tiny_pair[0]),
                target_addr=target.address, draft_addr=draft.address, max_batch_size=4,
                speculation_policy="busy-off", draft_offload="low=0.1,high=0.3,persist=2",
            )  # fmt: skip
            running = await start(settings)
            try:
                assert running.scheduler.config.max_tokens_in_flight == NUM_BLOCKS * BLOCK_SIZE - 4 * (BLOCK_SIZE + 32)
                results = await asyncio.to_thread(_generate_all, running.address, requests)
                # one more, alone: the draft is back and speculates for it
                results += await asyncio.to_thread(_generate_all, running.address, requests[:1])
                exposition = running.metrics.render()
                assert not running.scheduler.draft_offloaded
            finally:
                await running.stop()
            async with aio_channel(draft.address) as channel:
                info = await draft_pb2_grpc.DraftServiceStub(channel).Info(common_pb2.InfoRequest())
            engine = draft.engine_host.engine
            return results, exposition, info, engine

    results, exposition, info, engine = asyncio.run(main())
    for i, (req, r) in enumerate(zip(requests + requests[:1], results)):
        assert r.finish_reason == FinishReason.LENGTH
        assert r.token_ids == reference.greedy(req["prompt"], req["max_new_tokens"]), f"request {i}"
    assert _counter(exposition, 'tandem_draft_memory_events_total{event="offload"}') >= 1
    assert _counter(exposition, 'tandem_draft_memory_events_total{event="reload"}') >= 1
    assert results[-1].stats.num_draft_tokens > 0  # speculation resumed after the reload (re-prefilled draft)
    # nothing left on the draft: every block free, weights resident
    assert (info.weights_offloaded, info.num_live_seqs, info.kv_blocks_free) == (False, 0, NUM_BLOCKS)
    engine.runner.check_accounting()


def _generate_all(address: str, requests: list[dict]) -> list:
    from concurrent.futures import ThreadPoolExecutor

    with Client(address, timeout=120) as client, ThreadPoolExecutor(len(requests)) as pool:
        return [f.result() for f in [pool.submit(client.generate, **r) for r in requests]]


def _counter(exposition: str, name: str) -> float:
    for line in exposition.splitlines():
        if line.startswith(name):
            return float(line.split()[-1])
    return 0.0
