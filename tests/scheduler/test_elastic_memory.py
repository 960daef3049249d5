"""Nightjar §5.1's trigger (offload after T_persist scarce steps without speculation, reload with hysteresis), and
the loop growing the target's KV pool into the offloaded draft's space and shrinking it back before a reload."""

from __future__ import annotations

import asyncio

import pytest

from scheduler.engine_loop import Scheduler, SchedulerConfig
from scheduler.policies.elastic_memory import ElasticDraftMemory, ElasticMemoryConfig, PoolGrowth
from scheduler.policies.speculation import SpecShape, SpeculationPolicy
from scheduler.request import Request
from scheduler.testing import FakeDraft, FakeTarget, ToyDraftLM, ToyLM
from scheduler.workers import FakeClock, NullObserver
from services.scheduler.main import draft_memory_config, pool_growth
from shared.engine.errors import KVBlocksInUseError


def test_offload_needs_persistent_scarcity_without_speculation():
    mem = ElasticDraftMemory(ElasticMemoryConfig(low_free=0.1, high_free=0.3, persist_steps=3))
    scarce = dict(speculated=False, free_share=0.05, num_waiting=5)
    assert [mem.observe(**scarce) for _ in range(2)] == [None, None]
    assert mem.observe(speculated=True, free_share=0.05, num_waiting=5) is None  # speculating: the streak resets
    assert mem.observe(speculated=False, free_share=0.5, num_waiting=5) is None  # memory fine: resets too
    assert [mem.observe(**scarce) for _ in range(3)] == [None, None, "offload"]
    mem.done("offload")
    # hysteresis: free between tau_low and tau_high, or a queue, keeps it offloaded
    assert mem.observe(speculated=False, free_share=0.2, num_waiting=0) is None
    assert mem.observe(speculated=False, free_share=0.9, num_waiting=1) is None
    assert mem.observe(speculated=False, free_share=0.9, num_waiting=0) == "reload"
    mem.done("reload")
    assert not mem.offloaded


def test_failures_back_off_or_disable():
    mem = ElasticDraftMemory(ElasticMemoryConfig(persist_steps=1, retry_steps=2))
    scarce = dict(speculated=False, free_share=0.0, num_waiting=1)
    assert mem.observe(**scarce) == "offload"
    mem.failed("offload")  # transient: try again after retry_steps
    assert [mem.observe(**scarce) for _ in range(3)] == [None, None, "offload"]
    mem.failed("offload", permanent=True)  # a draft that cannot offload: never again
    assert all(mem.observe(**scarce) is None for _ in range(10))


def test_config_spec():
    assert draft_memory_config("off") is None
    assert draft_memory_config("on") == ElasticMemoryConfig()
    assert draft_memory_config("low=0.05,high=0.5,persist=4") == ElasticMemoryConfig(
        low_free=0.05, high_free=0.5, persist_steps=4
    )
    with pytest.raises(ValueError):
        draft_memory_config("low=0.5,high=0.2")
    with pytest.raises(ValueError):
        draft_memory_config("bogus=1")


# --- the loop: the target's pool grows into the offloaded draft's space ----------------------------------------


class PoolTarget(FakeTarget):
    """A FakeTarget whose KV pool can be resized; ``refuse_shrinks`` shrinks fail like a pool with owned blocks."""

    def __init__(self, lm: ToyLM, clock: FakeClock, base_blocks: int) -> None:
        super().__init__(lm, clock)
        self.num_blocks = base_blocks
        self.refuse_shrinks = 0
        self.log: list[str] = []  # resize and draft memory calls, in order (shared with the draft)

    async def resize_kv(self, num_blocks: int) -> int:
        if num_blocks < self.num_blocks and self.refuse_shrinks:
            self.refuse_shrinks -= 1
            raise KVBlocksInUseError("blocks 25..49 are owned")
        self.log.append(f"resize:{num_blocks}")
        self.num_blocks = num_blocks
        return num_blocks


class OffloadingDraft(FakeDraft):
    def __init__(self, lm: ToyDraftLM, clock: FakeClock, log: list[str]) -> None:
        super().__init__(lm, clock)
        self.log = log

    async def offload(self) -> int:
        self.log.append("offload")
        self.seqs.clear()
        return 0

    async def reload(self) -> int:
        self.log.append("reload")
        return 0


class BusyOff(SpeculationPolicy):
    """k = 0 while 3 or more run (as a bandit learns at high load), a chain of 2 otherwise."""

    name = "busy-off"

    def decide(self, batch, ctx):
        return [SpecShape.none() if len(batch) >= 3 else SpecShape.chain(2)] * len(batch)


def _pool_scheduler(extra_blocks: int = 25):
    lm, clock = ToyLM(vocab_size=50, seed=3), FakeClock()
    target = PoolTarget(lm, clock, base_blocks=25)
    draft = OffloadingDraft(ToyDraftLM(lm, 0.8, seed=5), clock, target.log)
    reports: list = []

    class Record(NullObserver):
        def on_step(self, report):
            report.num_running_after = len(sched.running)  # what the memory decision saw, after commit
            report.num_waiting_after = len(sched.waiting)
            reports.append(report)

    config = SchedulerConfig(
        max_batch_size=8,
        max_tokens_in_flight=100,  # 4 requests of 5 + 20
        draft_memory=ElasticMemoryConfig(low_free=0.1, high_free=0.3, persist_steps=2, retry_steps=2),
        pool_growth=PoolGrowth(base_blocks=25, extra_blocks=extra_blocks, block_size=4),
    )
    sched = Scheduler(target, draft, config=config, clock=clock, spec_policy=BusyOff(), observers=[Record()])
    return sched, target, draft, lm, reports


async def _serve(sched, requests):
    streams = [sched.submit(r) for r in requests]
    await sched.run_until_idle(max_steps=500)
    return [await s.collect() for s in streams]


def _requests(n: int) -> list[Request]:
    return [Request(id=f"r{i}", prompt_ids=[i % 50, (3 * i) % 50, 7, 1, 2], max_new_tokens=20) for i in range(n)]


def test_offload_grows_the_pool_and_budget_reload_shrinks_them_first():
    sched, target, draft, lm, reports = _pool_scheduler()
    requests = _requests(8)
    outputs = asyncio.run(_serve(sched, requests))
    for req, out in zip(requests, outputs):
        assert out == lm.generate(req.prompt_ids, req.max_new_tokens), req.id
    # offload, then the pool grows; before the reload it shrinks back
    assert target.log == ["offload", "resize:50", "resize:25", "reload"]
    budgets = [r.kv_token_budget for r in reports]
    grow = next(i for i, r in enumerate(reports) if r.kv_pool_event == "grow")
    shrink = next(i for i, r in enumerate(reports) if r.kv_pool_event == "shrink")
    assert reports[grow].draft_memory_event == "offload" and reports[shrink].draft_memory_event == "reload"
    assert set(budgets[:grow]) == {100} and set(budgets[grow:shrink]) == {200} and set(budgets[shrink:]) == {100}
    # the grown budget is used: more than the 4 requests the start-up pool holds run at once
    assert max(r.batch_size for r in reports[grow + 1 : shrink]) > 4
    assert sched.max_tokens_in_flight == 100 and not sched.draft_offloaded


def test_refused_shrink_keeps_the_draft_offloaded_and_the_budget_grown():
    sched, target, draft, lm, reports = _pool_scheduler()
    target.refuse_shrinks = 1
    requests = _requests(9)

    async def main():  # the last request comes later, alone: the retried reload happens while it runs
        return await _serve(sched, requests[:8]) + await _serve(sched, requests[8:])

    outputs = asyncio.run(main())
    assert all(out == lm.generate(r.prompt_ids, r.max_new_tokens) for r, out in zip(requests, outputs))
    events = [(r.kv_pool_event, r.draft_memory_event, r.kv_token_budget) for r in reports if r.kv_pool_event]
    assert events == [("grow", "offload", 200), ("shrink-refused", None, 200), ("shrink", "reload", 100)]
    refused = next(i for i, r in enumerate(reports) if r.kv_pool_event == "shrink-refused")
    assert reports[refused].draft_offloaded  # the draft stayed away with its space in use
    assert target.log == ["offload", "resize:50", "resize:25", "reload"]


def test_reload_waits_until_the_start_up_budget_has_room():
    """Free space is measured against the budget with the draft resident: N_free > S_draft + tau (Nightjar §5.1)."""
    sched, target, draft, lm, reports = _pool_scheduler()
    asyncio.run(_serve(sched, _requests(8)))
    shrink = next(i for i, r in enumerate(reports) if r.kv_pool_event == "shrink")
    # reserved at the reload: under 70 % of the 100-token start-up budget (tau_high = 0.3), so at most 2 requests
    # of 25, although the grown budget (200) had room to spare long before
    assert reports[shrink].num_running_after * 25 < 70
    assert any(r.num_running_after * 25 < 0.7 * 200 for r in reports[:shrink] if r.draft_offloaded)


def test_without_pool_growth_the_budget_stays():
    sched, target, draft, lm, reports = _pool_scheduler()
    sched.config.pool_growth = None
    asyncio.run(_serve(sched, _requests(8)))
    assert target.log == ["offload", "reload"]
    assert {r.kv_token_budget for r in reports} == {100} and not any(r.kv_pool_event for r in reports)


def test_pool_growth_and_budget_from_the_target_info():
    from services.scheduler.main import kv_token_budget
    from shared.rpc.gen.tandem.v1 import common_pb2

    info = common_pb2.ServiceInfo(kv_blocks_total=80, kv_blocks_base=32, kv_blocks_max=80, block_size=4)
    assert pool_growth(info) == PoolGrowth(base_blocks=32, extra_blocks=48, block_size=4)
    # the budget counts the start-up pool, even when the target is still grown from an earlier offload
    assert kv_token_budget(info, SchedulerConfig(max_batch_size=2)) == 32 * 4 - 2 * (4 + 32)
    assert pool_growth(common_pb2.ServiceInfo(kv_blocks_total=32, kv_blocks_base=32, kv_blocks_max=32, block_size=4)) is None
    assert pool_growth(common_pb2.ServiceInfo(kv_blocks_total=32, block_size=4)) is None  # an older target
