"""Keeps a learning policy's state in Redis (scheduler.policies.shared_state, architecture.md §6).

    tandem:v1:blob:policy:<name>     JSON   the policy's SharedState (with its own layout version)

    start    load()      adopt the stored state: a restarted scheduler carries on from it
    on_step  every ``every_steps`` steps, off the loop: merge the events recorded since the last
             sync into the stored state (WATCH/MULTI, so replicas never lose each other's events),
             then adopt the result (this replica now also knows what the others learned)
    close    a last sync

A failed sync (Redis away) keeps its events for the next one; the policy
goes on learning locally meanwhile.
"""

from __future__ import annotations

import asyncio
import logging

from redis.exceptions import RedisError

from scheduler.policies.shared_state import SharedState
from scheduler.report import StepReport
from scheduler.request import Request
from shared.state.store import AsyncStateStore

log = logging.getLogger(__name__)


class PolicyStateSync:
    def __init__(self, store: AsyncStateStore, state: SharedState, *, every_steps: int = 16) -> None:
        self.store = store
        self.state = state
        self.every_steps = every_steps
        self._steps = 0
        self._task: asyncio.Task[None] | None = None
        self._failing = False
        self.num_syncs = 0

    async def load(self) -> bool:
        """Adopt the stored state, if any; True when there was one."""
        try:
            stored = await self.store.get_json(self.state.name)
        except (RedisError, OSError) as exc:
            log.warning("policy state %s: could not read it (%s); learning from scratch", self.state.name, exc)
            return False
        self.state.adopt(stored)
        found = self.state.num_adopted > 0
        log.info("policy state %s: %s", self.state.name, "resumed from Redis" if found else "none stored yet")
        return found

    def on_step(self, report: StepReport) -> None:
        self._steps += 1
        if self._steps % self.every_steps == 0 and (self._task is None or self._task.done()):
            self._task = asyncio.get_running_loop().create_task(self.sync(), name="policy-state-sync")

    def on_finish(self, request: Request) -> None:
        return None

    async def sync(self) -> None:
        """Store the events recorded since the last sync and adopt the merged state."""
        events = self.state.take()
        try:
            if events:
                stored = await self.store.update_json(self.state.name, lambda s: self.state.merge(s, events))
            else:  # nothing new here: still pick up what the other replicas stored
                stored = await self.store.get_json(self.state.name)
        except Exception as exc:  # noqa: BLE001 - Redis away or a lost race: keep the events for next time
            self.state.restore(events)
            if not self._failing:
                log.warning("policy state %s: sync failed (%s); retrying later", self.state.name, exc)
            self._failing = True
            return
        self._failing = False
        self.state.adopt(stored)
        self.num_syncs += 1

    async def close(self) -> None:
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)
        await self.sync()
