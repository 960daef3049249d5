"""A scheduler starting over a Redis that still shows requests "running" from a process that died
marks them failed, so none stays running forever; its own requests carry its instance id."""

from __future__ import annotations

import asyncio

from services.settings import ServiceSettings
from shared.state.redis_server import start_redis
from shared.state.store import AsyncStateStore, RequestRecord, RequestState, StoreConfig
from tests.support.model_services import serving


def test_startup_fails_what_a_dead_scheduler_left_running(tiny_model_dir, tmp_path):
    from services.scheduler.main import start
    from sdk import AsyncClient

    async def main(url: str) -> None:
        store = AsyncStateStore(StoreConfig(url=url))
        await store.put_request(RequestRecord(request_id="left-over", state=RequestState.RUNNING, owner="gone-1"))
        async with serving(tiny_model_dir, num_blocks=64) as (target, _):
            settings = ServiceSettings(model=str(tiny_model_dir), target_addr=target.address, draft_addr="none",
                                       redis_url=url, port=0, trace_exporter="memory", metrics_port=None,
                                       home=tmp_path, max_batch_size=2)
            running = await asyncio.wait_for(start(settings), timeout=60)
            try:
                record = await store.get_request("left-over")
                assert record.state == RequestState.FAILED and "stopped" in record.error
                async with AsyncClient(running.address, timeout=30) as client:
                    result = await client.generate([1, 2, 3], max_new_tokens=3, request_id="fresh")
                assert len(result.token_ids) == 3
                for _ in range(200):  # the recorder writes behind the loop
                    await running.recorder.flush()
                    fresh = await store.get_request("fresh")
                    if fresh.state == RequestState.FINISHED:
                        break
                    await asyncio.sleep(0.02)
                assert fresh.state == RequestState.FINISHED and fresh.owner and fresh.owner != "gone-1"
            finally:
                await running.stop(0)
        await store.close()

    with start_redis() as redis:
        asyncio.run(main(redis.url))
