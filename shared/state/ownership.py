"""Which scheduler owns a live request record, and failing the records whose owner is gone.

Every scheduler process has an instance id and keeps a heartbeat key alive
(``<ns>:v1:scheduler:<id>``, TTL ``ttl_s``, refreshed every ``ttl_s / 3``);
it writes its id into the records it creates (``RequestRecord.owner``). A
process that dies stops refreshing, so its key expires. At startup a
scheduler fails every live (queued or running) record whose owner has no
heartbeat, or has no owner at all (written before owners existed): no request
stays "running" forever, and replicas sharing one Redis never fail each
other's live requests.

    start:  Heartbeat(store, id).start()  →  fail_orphaned(store, id)
    stop:   Heartbeat.stop()  (deletes the key: a clean exit is not a crash)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import uuid

from redis.exceptions import RedisError

from shared.state.store import AsyncStateStore, RequestState

log = logging.getLogger(__name__)

ORPHAN_ERROR = "the scheduler serving this request stopped (found at the startup of scheduler {me})"


def new_instance_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


def heartbeat_key(store: AsyncStateStore, owner: str) -> str:
    return store.keys.key("scheduler", owner)


class Heartbeat:
    def __init__(self, store: AsyncStateStore, owner: str, ttl_s: float = 15.0) -> None:
        if ttl_s <= 0:
            raise ValueError(f"ttl_s must be > 0, got {ttl_s}")
        self.store, self.owner, self.ttl_s = store, owner, ttl_s
        self._task: asyncio.Task[None] | None = None

    async def beat(self) -> None:
        await self.store.client.set(heartbeat_key(self.store, self.owner), "1", px=int(self.ttl_s * 1000))

    async def start(self) -> None:
        """First beat now, then in the background (a Redis outage only delays the beats)."""
        try:
            await self.beat()
        except (RedisError, OSError) as exc:
            log.warning("heartbeat to Redis failed: %s", exc)
        self._task = asyncio.get_running_loop().create_task(self._run(), name="scheduler-heartbeat")

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.ttl_s / 3)
            try:
                await self.beat()
            except (RedisError, OSError) as exc:  # Redis away: the next beat retries; requests carry on
                log.warning("heartbeat to Redis failed: %s", exc)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        with contextlib.suppress(RedisError, OSError):
            await self.store.client.delete(heartbeat_key(self.store, self.owner))


async def fail_orphaned(store: AsyncStateStore, me: str) -> list[str]:
    """Mark FAILED every live record not owned by a living scheduler other than ``me``; returns their ids."""
    failed = []
    for request_id in await store.live_request_ids():
        record = await store.get_request(request_id)
        if record is None or record.state not in (RequestState.QUEUED, RequestState.RUNNING):
            continue
        if record.owner == me:
            continue
        if record.owner and await store.client.exists(heartbeat_key(store, record.owner)):
            continue  # a living replica's request
        await store.finish_request(request_id, RequestState.FAILED, finish_reason="error",
                                   error=ORPHAN_ERROR.format(me=me))
        failed.append(request_id)
    if failed:
        log.warning("marked %d requests of a stopped scheduler as failed: %s", len(failed), failed[:10])
    return failed
