"""Learned policy state in a real Redis: survives a restart, shared by two replicas."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from scheduler.policies.faser import Faser
from scheduler.policies.smartspec import SmartSpec
from scheduler.report import StepReport
from services.scheduler.observers.policy_state import PolicyStateSync
from shared.state.redis_server import start_redis
from shared.state.store import AsyncStateStore, StoreConfig
from tests.scheduler.sim_reports import CHEAP_DRAFT, requests, run_steps


@pytest.fixture(scope="module")
def redis_url():
    server = start_redis()
    yield server.url
    server.stop()


def _store(url: str, namespace: str) -> AsyncStateStore:
    return AsyncStateStore(StoreConfig(url=url, namespace=namespace))


@pytest.mark.parametrize("make", [SmartSpec, Faser], ids=["smartspec", "faser"])
def test_state_survives_a_restart_and_replicas_share_it(redis_url, make):
    namespace = f"test-{uuid.uuid4().hex[:8]}"

    async def scenario():
        # replica A learns, syncs through the observer hook, and shuts down
        a = make()
        store_a = _store(redis_url, namespace)
        sync_a = PolicyStateSync(store_a, a.shared_state(), every_steps=4)
        assert not await sync_a.load()
        run_steps(a, requests(2), [0.9, 0.9], CHEAP_DRAFT, steps=12)
        for step in range(4):
            sync_a.on_step(StepReport(step=step, started_at=0.0))
        await sync_a.close()
        assert sync_a.num_syncs >= 1 and not a.state.pending
        learned = a.shared_state().state

        # a restarted scheduler resumes from it
        b = make()
        store_b = _store(redis_url, namespace)
        sync_b = PolicyStateSync(store_b, b.shared_state())
        assert await sync_b.load()
        assert b.shared_state().state == learned

        # two replicas learning side by side: each sees the other's events after its next sync
        run_steps(b, requests(2, prefix="b"), [0.3, 0.3], CHEAP_DRAFT, steps=3, seed=1)
        a2 = make()
        sync_a2 = PolicyStateSync(_store(redis_url, namespace), a2.shared_state())
        await sync_a2.load()
        run_steps(a2, requests(2, prefix="c"), [0.5, 0.5], CHEAP_DRAFT, steps=2, seed=2)
        await asyncio.gather(sync_b.sync(), sync_a2.sync())
        await sync_b.sync()  # b picks up whatever a2 stored after b's first merge
        stored = await store_b.get_json(b.shared_state().name)
        assert b.shared_state().state == stored
        await sync_a2.sync()
        assert a2.shared_state().state == stored
        n_events = 12 + 3 + 2
        if make is Faser:
            assert len(stored["window"]) == n_events  # every replica's observations, none lost
        else:
            assert len(stored["alpha"]) == n_events
        for s in (store_a, store_b, sync_a2.store):
            await s.close()

    asyncio.run(scenario())


def test_length_history_survives_a_restart(redis_url):
    """LAPS-SD / LP-SJF's per-class output-length history lives in Redis like any learned state."""
    from scheduler.policies.laps_sd import LapsSD
    from scheduler.policies.order_baselines import LPSJF
    from scheduler.request import FinishReason, Request, RequestState

    namespace = f"test-{uuid.uuid4().hex[:8]}"

    def finished(i: int, generated: int) -> Request:
        r = Request(f"r{i}", [1] * 10, max_new_tokens=100)
        r.output_ids = [7] * generated
        r.state, r.finish_reason = RequestState.FINISHED, FinishReason.STOP_TOKEN
        return r

    async def scenario():
        a = LapsSD()
        sync_a = PolicyStateSync(_store(redis_url, namespace), a.shared_state(), every_steps=1)
        assert not await sync_a.load()
        for i in range(3):
            a.on_finish(finished(i, 20))
        await sync_a.close()
        fresh = Request("new", [1] * 10, max_new_tokens=100)
        assert a.predictor.predict(fresh) == pytest.approx(20)

        b = LPSJF()  # another policy over the same history, e.g. after a restart with TANDEM_QUEUE_POLICY changed
        sync_b = PolicyStateSync(_store(redis_url, namespace), b.shared_state())
        assert await sync_b.load()
        assert b.predictor.predict(fresh) == pytest.approx(20)
        for s in (sync_a.store, sync_b.store):
            await s.close()

    asyncio.run(scenario())


def test_sync_keeps_events_while_redis_is_away():
    async def scenario():
        policy = SmartSpec()
        sync = PolicyStateSync(_store("redis://127.0.0.1:1/0", "x"), policy.shared_state())
        assert not await sync.load()
        run_steps(policy, requests(1), [0.8], CHEAP_DRAFT, steps=3)
        await sync.sync()
        assert len(policy.state.pending) == 3  # kept for the next sync
        await sync.store.close()

    asyncio.run(scenario())
