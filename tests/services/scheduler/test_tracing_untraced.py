"""Worker calls of requests nobody traces skip the phase spans, and change nothing a traced call would see."""

from __future__ import annotations

import asyncio

from opentelemetry import trace

from scheduler.report import StepReport
from scheduler.request import Request
from services.plan_spans import trace_carrier
from services.scheduler.observers.tracing import RequestTracer, TracedDraft, TracedTarget
from shared.engine.types import AcceptResult, SpecItem, TokenTree, VerifyItem
from shared.telemetry import setup_tracing


class Worker:
    """Records the trace context each call ran in."""

    def __init__(self) -> None:
        self.carriers: list[dict[str, str]] = []

    async def verify(self, items):
        self.carriers.append(trace_carrier())
        return [AcceptResult([], [7], [], []) for _ in items]

    async def speculate(self, items):
        self.carriers.append(trace_carrier())
        return [TokenTree() for _ in items]


def test_untraced_batches_open_no_spans_and_carry_no_context():
    provider = setup_tracing("scheduler", exporter="memory")
    tracer = RequestTracer(provider)
    target, draft = Worker(), Worker()
    traced_target, traced_draft = TracedTarget(target, tracer), TracedDraft(draft, tracer)

    async def main():
        assert tracer.untraced(["a"])
        await traced_target.verify([VerifyItem("a", TokenTree())])
        await traced_draft.speculate([SpecItem("a", [1], chain_len=2)])
        tracer.on_step(StepReport(step=0, started_at=0.0))
        with provider.get_tracer("test").start_as_current_span("outer"):  # a span current: not skipped
            assert not tracer.untraced(["a"])
        tracer.on_submit(Request(id="b", prompt_ids=[1, 2], max_new_tokens=4))
        assert not tracer.untraced(["a", "b"]) and tracer.untraced(["a"])
        await traced_target.verify([VerifyItem("a", TokenTree()), VerifyItem("b", TokenTree())])

    asyncio.run(main())
    assert target.carriers[0] == {} and draft.carriers == [{}]
    assert "traceparent" in target.carriers[1]  # the traced request's verify span is current
    names = [s.name for s in provider.memory_exporter.get_finished_spans()]
    assert names.count("verify") == 1 and "speculate" not in names and "commit" not in names
    assert trace.get_current_span() is trace.INVALID_SPAN
