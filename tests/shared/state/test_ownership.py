"""Live request records left by a dead scheduler end as failed at the next startup; a living
replica's records are left alone (real redis-server)."""

from __future__ import annotations

import asyncio

from shared.state.ownership import Heartbeat, fail_orphaned, heartbeat_key
from shared.state.store import AsyncStateStore, RequestRecord, RequestState, StoreConfig


def test_orphans_fail_and_living_replicas_keep_theirs(store_config: StoreConfig) -> None:
    async def scenario() -> None:
        store = AsyncStateStore(store_config)
        try:
            alive = Heartbeat(store, "replica-b", ttl_s=5)
            await alive.start()
            dead = Heartbeat(store, "crashed-a", ttl_s=0.2)
            await dead.beat()  # never refreshed: expires like a killed process's
            records = {
                "r-dead": RequestRecord(request_id="r-dead", state=RequestState.RUNNING, owner="crashed-a"),
                "r-old": RequestRecord(request_id="r-old", state=RequestState.QUEUED),  # before owners existed
                "r-live": RequestRecord(request_id="r-live", state=RequestState.RUNNING, owner="replica-b"),
                "r-mine": RequestRecord(request_id="r-mine", state=RequestState.QUEUED, owner="me"),
                "r-done": RequestRecord(request_id="r-done", state=RequestState.FINISHED, owner="crashed-a"),
            }
            for record in records.values():
                await store.put_request(record)
            await asyncio.sleep(0.35)
            assert not await store.client.exists(heartbeat_key(store, "crashed-a"))

            failed = await fail_orphaned(store, "me")
            assert sorted(failed) == ["r-dead", "r-old"]
            for rid in failed:
                rec = await store.get_request(rid)
                assert rec.state == RequestState.FAILED and "stopped" in rec.error and rec.finish_unix_ns
            assert (await store.get_request("r-live")).state == RequestState.RUNNING
            assert (await store.get_request("r-mine")).state == RequestState.QUEUED
            assert sorted(await store.live_request_ids()) == ["r-live", "r-mine"]
            assert await fail_orphaned(store, "me") == []  # idempotent

            await alive.stop()  # a clean exit removes the key: its leftovers are orphans now
            assert await fail_orphaned(store, "me") == ["r-live"]
        finally:
            await store.close()

    asyncio.run(scenario())

