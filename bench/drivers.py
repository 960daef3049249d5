"""Load drivers: send a workload to a ``Sender`` and record what the client saw, token by token.

    open_loop     request i is sent at its arrival offset, whatever is still running (Poisson,
                  bursty traces): the load does not slow down when the server does
    closed_loop   ``concurrency`` requests in flight; each one finished is replaced at once
                  (concurrency 1 is the batch-1 measurement)

A ``Sender`` runs one request and reports every streamed chunk through
``on_chunk(token_ids, num_accepted, is_step)``; the driver stamps each chunk
with its own clock on arrival, so TTFT/TPOT are client-side times (all tokens
of a chunk share its time). The clock is a ``Timer``: real time in the
harness, a virtual one in tests, which is how the timing logic is tested
without sleeping.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from bench.metrics import RequestTrace
from bench.tokens import EncodedItem


@dataclass(frozen=True)
class Job:
    """One request to send: the encoded prompt, its TPOT SLO (ms, None = none) and id, and a TTFT SLO where it has one."""

    encoded: EncodedItem
    tpot_slo_ms: float | None
    request_id: str
    ttft_slo_ms: float | None = None  # long-prompt arrivals (bench.long_prompts) carry one
    cache_salt: str = ""  # prefix-cache tenant; long-prompt arrivals take their own id, so each prefills cold

    @property
    def max_new_tokens(self) -> int:
        return self.encoded.item.max_new_tokens


@dataclass
class Outcome:
    """What a sender knows once the request ended (server-side counts where the server reports them)."""

    finish_reason: str = "length"
    num_steps: int | None = None  # None: count the chunks marked as steps
    num_draft_tokens: int = 0
    num_accepted_tokens: int | None = None  # None: sum the chunks' accepted counts
    error: str | None = None


OnChunk = Callable[[Sequence[int], int, bool], None]  # (token ids, accepted draft tokens, is a step)
Sender = Callable[[Job, OnChunk], Awaitable[Outcome]]


class Timer(Protocol):
    def now(self) -> float: ...

    async def sleep_until(self, t: float) -> None: ...


class RealTimer:
    def now(self) -> float:
        return time.perf_counter()

    async def sleep_until(self, t: float) -> None:
        delay = t - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)


@dataclass
class Record:
    """One request as the client saw it."""

    config: str
    job: Job
    trace: RequestTrace
    step_accepts: list[int] = field(default_factory=list)  # accepted draft tokens per speculation step
    step_tokens: list[int] = field(default_factory=list)  # tokens emitted per step (accepted + bonus)
    error: str | None = None
    token_ids: list[int] = field(default_factory=list)


@dataclass
class Run:
    """The records of one driver run; ``wall_s`` from the first send to the last token."""

    config: str
    records: list[Record]
    started_s: float
    ended_s: float

    @property
    def wall_s(self) -> float:
        return max(self.ended_s - self.started_s, 1e-9)

    @property
    def traces(self) -> list[RequestTrace]:
        return [r.trace for r in self.records]


async def send_one(config: str, job: Job, send: Sender, timer: Timer, sent_s: float, t0: float) -> Record:
    """Send ``job`` now and record its chunks; times are offsets from ``t0``. Failures become records."""
    times: list[float] = []
    token_ids: list[int] = []
    step_accepts: list[int] = []
    step_tokens: list[int] = []

    def on_chunk(ids: Sequence[int], num_accepted: int, is_step: bool) -> None:
        t = timer.now() - t0
        times.extend([t] * len(ids))
        token_ids.extend(ids)
        if is_step:
            step_accepts.append(num_accepted)
            step_tokens.append(len(ids))

    try:
        out = await send(job, on_chunk)
    except Exception as exc:  # a failed request is a result (it misses its SLO), not the end of the run
        out = Outcome(finish_reason="error", error=f"{type(exc).__name__}: {exc}")
    trace = RequestTrace(
        request_id=job.request_id,
        slo_class=job.encoded.item.slo.name,
        tpot_slo_ms=job.tpot_slo_ms,
        ttft_slo_ms=job.ttft_slo_ms,
        sent_s=sent_s,
        token_times_s=times,
        finish_reason=out.finish_reason,
        num_steps=len(step_accepts) if out.num_steps is None else out.num_steps,
        num_draft_tokens=out.num_draft_tokens,
        num_accepted_tokens=sum(step_accepts) if out.num_accepted_tokens is None else out.num_accepted_tokens,
    )
    return Record(config, job, trace, step_accepts, step_tokens, out.error, token_ids)


async def open_loop(config: str, jobs: Sequence[Job], send: Sender, timer: Timer) -> Run:
    """Send job i at ``t0 + arrival_s``; wait for all to finish."""
    if any(j.encoded.item.arrival_s is None for j in jobs):
        raise ValueError("open-loop jobs need arrival times")
    t0 = timer.now()

    async def at_arrival(job: Job) -> Record:
        await timer.sleep_until(t0 + job.encoded.item.arrival_s)
        return await send_one(config, job, send, timer, timer.now() - t0, t0)

    records = await asyncio.gather(*(at_arrival(j) for j in jobs))
    return Run(config, list(records), 0.0, _last_token(records, timer.now() - t0))


async def closed_loop(config: str, jobs: Sequence[Job], send: Sender, timer: Timer, concurrency: int) -> Run:
    """Keep ``concurrency`` jobs in flight, in job order, until all are done."""
    if concurrency < 1:
        raise ValueError("concurrency must be >= 1")
    t0 = timer.now()
    queue = list(jobs)
    queue.reverse()
    records: list[Record] = []

    async def worker() -> None:
        while queue:
            job = queue.pop()
            records.append(await send_one(config, job, send, timer, timer.now() - t0, t0))

    await asyncio.gather(*(worker() for _ in range(min(concurrency, len(jobs)))))
    records.sort(key=lambda r: r.job.encoded.index)
    return Run(config, records, 0.0, _last_token(records, timer.now() - t0))


def _last_token(records: Sequence[Record], fallback: float) -> float:
    ends = [r.trace.token_times_s[-1] for r in records if r.trace.token_times_s]
    return max(ends) if ends else fallback
