"""Request records and acceptance statistics in Redis (shared.state.store, architecture.md §6).

    on_submit   put_request   state queued, prompt length, max_new_tokens, SLO, arrival
    on_step     update_request state running (newly prefilled)
                commit_step   per request: the tokens committed since the last write, drafted and
                              accepted counts -> token list + acceptance EMAs (request, policy, global)
    on_finish   commit_step   tokens not yet written (a request that ended at prefill)
                update_request final state, finish reason, error, exact first/last token and finish times

Writes never hold up the iteration loop: the hooks only queue them, and one
writer task sends them in order, so a record is always created before its
first commit. While Redis is unreachable writes fail (logged once per
outage) and the requests carry on; past ``max_pending`` queued writes new
ones are dropped. ``flush()`` waits until everything queued is written.

Priority is recorded as the client sent it (higher runs earlier). The
per-policy scope is the scheduler's policy for AUTO requests, ``client_fixed``
for requests that fixed k themselves, and none for requests with speculation off.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from redis.exceptions import RedisError

from scheduler.report import StepReport
from scheduler.request import Request, RequestState, SpecMode
from services.scheduler.timebase import Timebase
from shared.state.store import AsyncStateStore, RequestRecord, StepOutcome
from shared.state.store import RequestState as RecordState

log = logging.getLogger(__name__)

_RECORD_STATE = {
    RequestState.WAITING: RecordState.QUEUED,
    RequestState.RUNNING: RecordState.RUNNING,
    RequestState.FINISHED: RecordState.FINISHED,
    RequestState.ABORTED: RecordState.ABORTED,
    RequestState.FAILED: RecordState.FAILED,
}

Write = Callable[[], Awaitable[object]]


class RedisRecorder:
    deferrable = True  # runs while the next step's workers compute (scheduler/observer_calls.py)

    def __init__(
        self, store: AsyncStateStore, timebase: Timebase, *, policy_name: str, max_pending: int = 100_000,
        owner: str | None = None,
    ) -> None:
        self.store = store
        self.owner = owner  # this scheduler's instance id (shared.state.ownership)
        self.timebase = timebase
        self.policy_name = policy_name
        self.max_pending = max_pending
        self._requests: dict[str, Request] = {}
        self._written: dict[str, int] = {}  # request id -> output tokens already committed to Redis
        self._queue: asyncio.Queue[Write] = asyncio.Queue()
        self._writer: asyncio.Task[None] | None = None
        self._failing = False
        self.num_dropped = 0

    # ------------------------------------------------------------------ hooks
    def on_submit(self, request: Request) -> None:
        self._requests[request.id] = request
        self._written[request.id] = 0
        record = RequestRecord(
            request_id=request.id,
            state=RecordState.QUEUED,
            prompt_len=len(request.prompt_ids),
            max_new_tokens=request.max_new_tokens,
            priority=-request.priority,
            slo_tpot_ms=request.slo.tpot_ms,
            slo_ttft_ms=request.slo.ttft_ms,
            policy=self._policy(request),
            arrival_unix_ns=self.timebase.unix_ns(request.arrival_time),
            owner=self.owner,
        )
        self._enqueue(lambda: self.store.put_request(record))

    def on_step(self, report: StepReport) -> None:
        for request_id in report.prefilled_ids:
            if request_id in self._requests:
                self._enqueue(lambda rid=request_id: self.store.update_request(rid, state=RecordState.RUNNING))
        outcomes = []
        for o in report.outcomes:
            req = self._requests.get(o.request_id)
            if req is None:
                continue
            outcomes.append(
                StepOutcome(
                    request_id=o.request_id,
                    token_ids=self._unwritten(req),
                    num_proposed=o.num_drafted,
                    num_accepted=o.num_accepted,
                    depth=o.num_drafted if o.shape.kind == "chain" else o.shape.max_depth,
                    policy=self._policy(req),
                )
            )
        if outcomes:
            self._enqueue(lambda: self.store.commit_step(outcomes))

    def on_finish(self, request: Request) -> None:
        if self._requests.pop(request.id, None) is None:
            return
        tokens = self._unwritten(request)
        self._written.pop(request.id, None)
        if tokens:
            rest = StepOutcome(request_id=request.id, token_ids=tokens, policy=self._policy(request))
            self._enqueue(lambda: self.store.commit_step([rest]))
        times = request.token_times
        fields = {
            "state": _RECORD_STATE[request.state],
            "finish_reason": request.finish_reason.value if request.finish_reason else None,
            "error": request.error,
            "finish_unix_ns": self.timebase.unix_ns(request.finish_time),
            "first_token_unix_ns": self.timebase.unix_ns(times[0]) if times else None,
            "last_token_unix_ns": self.timebase.unix_ns(times[-1]) if times else None,
        }
        self._enqueue(lambda: self.store.update_request(request.id, **fields))

    # ------------------------------------------------------------------ writing
    async def flush(self) -> None:
        """Wait until every queued write has been sent (or has failed)."""
        if self._writer is not None:
            await self._queue.join()

    async def close(self, timeout_s: float = 5.0) -> None:
        """Flush (up to ``timeout_s``), stop the writer and close the store."""
        try:
            await asyncio.wait_for(self.flush(), timeout_s)
        except TimeoutError:
            log.warning("redis: %d write(s) still pending at shutdown; dropped", self._queue.qsize())
        if self._writer is not None:
            self._writer.cancel()
            await asyncio.gather(self._writer, return_exceptions=True)
        await self.store.close()

    def _unwritten(self, req: Request) -> list[int]:
        done = self._written.get(req.id, 0)
        self._written[req.id] = len(req.output_ids)
        return req.output_ids[done:]

    def _policy(self, req: Request) -> str | None:
        mode = req.speculation.mode
        return None if mode is SpecMode.OFF else "client_fixed" if mode is SpecMode.FIXED else self.policy_name

    def _enqueue(self, write: Write) -> None:
        if self._queue.qsize() >= self.max_pending:
            self.num_dropped += 1
            if self.num_dropped == 1 or self.num_dropped % 1000 == 0:
                log.warning("redis: %d write(s) dropped, %d pending", self.num_dropped, self._queue.qsize())
            return
        self._queue.put_nowait(write)
        if self._writer is None or self._writer.done():
            self._writer = asyncio.get_running_loop().create_task(self._write_all(), name="redis-recorder")

    async def _write_all(self) -> None:
        while True:
            write = await self._queue.get()
            try:
                await write()
                if self._failing:
                    log.info("redis: writes succeed again")
                self._failing = False
            except (RedisError, OSError) as exc:
                if not self._failing:
                    log.warning("redis: write failed (%s); records are incomplete until it is back", exc)
                self._failing = True
            except Exception:  # noqa: BLE001 - a bad record must not stop the writer
                log.exception("redis: write failed")
            finally:
                self._queue.task_done()
