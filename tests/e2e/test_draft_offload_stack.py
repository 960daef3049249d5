"""Nightjar's elastic draft memory over real gRPC with the tiny pair: under KV pressure with speculation off
the scheduler offloads the draft, reloads it once the queue drains, and every output stays the target's
greedy output; with TANDEM_KV_GROW_BLOCKS the target's pool and the scheduler's budget grow meanwhile."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence

from scheduler.policies.speculation import SpecContext, SpecShape, SpeculationPolicy
from scheduler.request import Request
from sdk import Client, FinishReason
from services.scheduler import policies
from shared.rpc.channel import aio_channel
from shared.rpc.gen.tandem.v1 import common_pb2, draft_pb2_grpc, target_pb2_grpc
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

    monkeypatch.setitem(policies.SPECULATION_POLICIES, "busy-off", lambda arg: BusyOff())
    rng = random.Random(5)
    # 4 running requests reserve 4 x (8 + 20) = all of the 112-token budget (64 blocks of 4 minus
    # 4 x (4 + 32) spare): free < 10 %, more waiting -> offload; the last ones run alone -> reload, speculate
    requests = [
        dict(prompt=[rng.randrange(VOCAB) for _ in range(8)], max_new_tokens=20, speculation="auto") for _ in range(9)
    ]

    async def main():
        async with serving(*tiny_pair) as (target, draft):
            running = await start(_busy_off_scheduler(tiny_pair[0], target, draft, max_batch_size=4))
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


def _busy_off_scheduler(target_dir, target, draft, *, max_batch_size: int):
    """Settings of a scheduler over ``target`` and ``draft``: busy-off policy, quick draft offload."""
    from services.settings import ServiceSettings

    return ServiceSettings(
        port=0, trace_exporter="none", shutdown_grace_s=0.5, model=str(target_dir), target_addr=target.address,
        draft_addr=draft.address, max_batch_size=max_batch_size, speculation_policy="busy-off",
        draft_offload="low=0.1,high=0.3,persist=2",
    )  # fmt: skip


def _generate_all(address: str, requests: list[dict]) -> list:
    from concurrent.futures import ThreadPoolExecutor

    with Client(address, timeout=120) as client, ThreadPoolExecutor(len(requests)) as pool:
        return [f.result() for f in [pool.submit(client.generate, **r) for r in requests]]


def _counter(exposition: str, name: str) -> float:
    for line in exposition.splitlines():
        if line.startswith(name):
            return float(line.split()[-1])
    return 0.0


def test_offload_grows_the_target_pool_and_budget_reload_shrinks_them(tiny_pair, reference, monkeypatch):
    """A co-located pair under a small pool: the target's pool takes the offloaded draft's space (kv_grow_blocks),
    the budget follows, more requests run at once, output stays greedy, and the reload gives the space back."""
    from services.scheduler.main import start

    monkeypatch.setitem(policies.SPECULATION_POLICIES, "busy-off", lambda arg: BusyOff())
    rng = random.Random(7)
    # 100 blocks of 4 minus 8 x (4 + 32) spare = 112 tokens: 4 requests of 8 + 20. Grown by 56 blocks (+224
    # tokens): 336, so all 8 of the batch run.
    requests = [
        dict(prompt=[rng.randrange(VOCAB) for _ in range(8)], max_new_tokens=20, speculation="auto") for _ in range(12)
    ]
    num_blocks, grow = 100, 56
    budgets: list[tuple[int, int, bool]] = []  # (budget, batch size, offloaded) per step

    class Budget:
        def on_step(self, report):
            budgets.append((report.kv_token_budget, report.batch_size, report.draft_offloaded))

        def on_finish(self, request):
            pass

    async def main():
        async with serving(*tiny_pair, num_blocks=num_blocks, kv_grow_blocks=grow) as (target, draft):
            running = await start(_busy_off_scheduler(tiny_pair[0], target, draft, max_batch_size=8))
            try:
                base = num_blocks * BLOCK_SIZE - 8 * (BLOCK_SIZE + 32)
                assert running.scheduler.config.max_tokens_in_flight == base == 112
                assert running.scheduler.config.pool_growth.extra_tokens == grow * BLOCK_SIZE
                running.scheduler.add_observer(Budget())
                results = await asyncio.to_thread(_generate_all, running.address, requests)
                results += await asyncio.to_thread(_generate_all, running.address, requests[:1])  # alone: reloaded
                exposition = running.metrics.render()
                assert not running.scheduler.draft_offloaded and running.scheduler.max_tokens_in_flight == base
            finally:
                await running.stop()
            infos = []
            for service, stub_type in ((target, target_pb2_grpc.TargetServiceStub), (draft, draft_pb2_grpc.DraftServiceStub)):
                async with aio_channel(service.address) as channel:
                    infos.append(await stub_type(channel).Info(common_pb2.InfoRequest()))
            target.engine_host.engine.runner.check_accounting()
            return results, exposition, infos

    results, exposition, (target_info, draft_info) = asyncio.run(main())
    for i, (req, r) in enumerate(zip(requests + requests[:1], results)):
        assert r.finish_reason == FinishReason.LENGTH
        assert r.token_ids == reference.greedy(req["prompt"], req["max_new_tokens"]), f"request {i}"
    assert _counter(exposition, 'tandem_kv_pool_events_total{event="grow"}') >= 1
    assert _counter(exposition, 'tandem_kv_pool_events_total{event="shrink"}') >= 1
    assert _counter(exposition, "tandem_kv_budget_tokens") == 112
    # the budget grew with the offload and came back; the grown budget ran more requests than the small pool holds
    assert {b for b, _, _ in budgets} == {112, 112 + grow * BLOCK_SIZE}
    assert all(off for b, _, off in budgets if b > 112)
    assert max(n for b, n, _ in budgets if b > 112) > 4 >= max(n for b, n, _ in budgets if b == 112)
    assert results[-1].stats.num_draft_tokens > 0  # speculating again after the reload
    # the target's pool is back to its start-up size, all free; the draft never grows
    assert (target_info.kv_blocks_total, target_info.kv_blocks_free, target_info.kv_blocks_max) == (100, 100, 156)
    assert (draft_info.kv_blocks_max, draft_info.kv_blocks_free, draft_info.weights_offloaded) == (100, 100, False)
