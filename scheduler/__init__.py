"""Tandem's scheduling core: the iteration loop and its policies, written against narrow worker interfaces.

Not to be confused with ``services/scheduler/``, the scheduler *service*: the gRPC server (public endpoint,
HTTP API, Redis and Prometheus observers, the workers over gRPC) that runs this loop in a process.

    request.py        Request (the unit that flows everywhere) + validation
    workers.py        TargetWorker / DraftWorker / Clock / IterationObserver protocols; RealClock, FakeClock
    policies/         queue order (FCFS), speculation shape (NoSpeculation, FixedChain), tree selection
    engine_loop.py    Scheduler: admit -> prefill -> plan -> speculate -> select -> verify -> commit
    report.py         StepReport: per-iteration outcomes and phase timings
    testing.py        toy LM and fake workers (tests, simulator)
    local_workers.py  the workers over in-process engines (tests, one process): LocalTargetWorker, LocalDraftWorker

The core imports no grpc, redis or OpenTelemetry (tests/repo/test_layout.py checks it); the workers over gRPC
live in the service (services/scheduler/grpc_workers.py), and the one adapter here that needs torch,
local_workers.py, is not imported by this package. The scheduler service runs without torch: it relays the
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
