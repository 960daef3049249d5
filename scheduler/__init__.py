"""Tandem scheduler: the iteration loop and its policies, written against narrow worker interfaces.

    request.py        Request (the unit that flows everywhere) + validation
    workers.py        TargetWorker / DraftWorker / Clock / IterationObserver protocols; RealClock, FakeClock
    policies/         queue order (FCFS), speculation shape (NoSpeculation, FixedChain), tree selection
    engine_loop.py    Scheduler: admit -> prefill -> plan -> speculate -> select -> verify -> commit
    report.py         StepReport: per-iteration outcomes and phase timings
    testing.py        toy LM and fake workers (tests, simulator)
    grpc_workers.py   the workers over gRPC (deployment): GrpcTargetWorker, GrpcDraftWorker
    local_workers.py  the workers over in-process engines (tests, one process): LocalTargetWorker, LocalDraftWorker

The core imports no grpc, redis or torch; only the worker adapters do (grpc_workers grpc, local_workers
torch), and this package does not import them. The scheduler service runs without torch: it relays the
draft's distributions to the target as the wire's lists (``shared.rpc.convert.tree_from_pb(relay=True)``).
"""

from scheduler.engine_loop import RequestStream, Scheduler, SchedulerConfig, TokenEvent
from scheduler.report import PhaseTimes, RequestOutcome, StepReport
from scheduler.request import (
    SLO,
    FinishReason,
    Request,
    RequestState,
    SpecMode,
    SpeculationSetting,
    validate_request,
)
from scheduler.workers import Clock, DraftWorker, FakeClock, IterationObserver, NullObserver, RealClock, TargetWorker

__all__ = [
    "SLO",
    "Clock",
    "DraftWorker",
    "FakeClock",
    "FinishReason",
    "IterationObserver",
    "NullObserver",
    "PhaseTimes",
    "RealClock",
    "Request",
    "RequestOutcome",
    "RequestState",
    "RequestStream",
    "Scheduler",
    "SchedulerConfig",
    "SpecMode",
    "SpeculationSetting",
    "StepReport",
    "TargetWorker",
    "TokenEvent",
    "validate_request",
]
