"""Request (scheduler) -> GenerateSummary (wire): finish reason, latencies, SLO outcome, acceptance.

Definitions, shared with the metrics and the Redis records (architecture.md §6)::

    TTFT   = t_first - t_arrival
    TPOT   = (t_last - t_first) / (n - 1)                      0 for n < 2
    SLO    attained <=> finished normally, TPOT <= slo.tpot_ms (if set), TTFT <= slo.ttft_ms (if set)
    mean accepted length = (accepted draft tokens + verify steps) / verify steps   (1.0 without speculation)
"""

from __future__ import annotations

from collections.abc import Collection

from scheduler.request import FinishReason, Request, RequestState
from services.scheduler.ledger import LedgerEntry
from services.scheduler.timebase import Timebase
from shared.rpc.gen.tandem.v1 import common_pb2, tandem_pb2

_FINISH_TO_PB = {
    FinishReason.LENGTH: tandem_pb2.FINISH_REASON_LENGTH,
    FinishReason.STOP_TOKEN: tandem_pb2.FINISH_REASON_STOP,
    FinishReason.STOP_STRING: tandem_pb2.FINISH_REASON_STOP,
    FinishReason.ABORTED: tandem_pb2.FINISH_REASON_ABORTED,
    FinishReason.ERROR: tandem_pb2.FINISH_REASON_ERROR,
}


def slo_attained(req: Request) -> bool:
    """Finished normally within its TPOT and TTFT targets; a request without an SLO attains it by finishing."""
    if req.state is not RequestState.FINISHED:
        return False
    ok = True
    if req.slo.tpot_ms is not None and req.tpot is not None:
        ok = ok and req.tpot * 1e3 <= req.slo.tpot_ms
    if req.slo.ttft_ms is not None and req.ttft is not None:
        ok = ok and req.ttft * 1e3 <= req.slo.ttft_ms
    return ok


def finish_reason_pb(req: Request, eos_ids: Collection[int]) -> int:
    """EOS when the stop token was the model's end-of-sequence token (and not one the client named)."""
    if req.finish_reason is FinishReason.STOP_TOKEN and req.output_ids and req.output_ids[-1] in eos_ids:
        return tandem_pb2.FINISH_REASON_EOS
    if req.finish_reason is None:
        return tandem_pb2.FINISH_REASON_UNSPECIFIED
    return _FINISH_TO_PB[req.finish_reason]


def acceptance_pb(req: Request, entry: LedgerEntry) -> tandem_pb2.AcceptanceStats:
    steps = entry.num_steps
    return tandem_pb2.AcceptanceStats(
        num_steps=steps,
        num_draft_tokens=req.num_drafted_tokens,
        num_accepted_tokens=req.num_accepted_tokens,
        mean_accepted_length=(req.num_accepted_tokens + steps) / steps if steps else 0.0,
        acceptance_rate=req.acceptance_rate or 0.0,
    )


def summary_pb(
    req: Request, entry: LedgerEntry, timebase: Timebase, eos_ids: Collection[int]
) -> tandem_pb2.GenerateSummary:
    arrival = req.arrival_time if req.arrival_time is not None else timebase.clock.now()
    finish = req.finish_time if req.finish_time is not None else timebase.clock.now()
    admitted = entry.admitted_at if entry.admitted_at is not None else finish
    return tandem_pb2.GenerateSummary(
        finish_reason=finish_reason_pb(req, eos_ids),
        error=req.error or "",
        num_prompt_tokens=len(req.prompt_ids),
        num_generated_tokens=len(req.output_ids),
        ttft_ms=(req.ttft or 0.0) * 1e3,
        tpot_ms=(req.tpot or 0.0) * 1e3,
        slo_attained=slo_attained(req),
        stats=acceptance_pb(req, entry),
        timing=common_pb2.Timing(
            queue_ns=max(0, round((admitted - arrival) * 1e9)),
            total_ns=max(0, round((finish - arrival) * 1e9)),
            start_unix_ns=timebase.unix_ns(arrival),
        ),
    )
