"""One trace per request across scheduler, draft and target (architecture.md §6).

The span tree of one request::

    tandem.v1.Tandem/Generate        SERVER span (rpc interceptor); child of the client's span if it sent one;
                                     the request's summary (below) for trace lists
      request                        submission -> end: prompt/SLO/speculation in, outcome and latencies out
        queue                        submission -> first prefill (again after a preemption)
        prefill                      one per worker call (tandem.worker = target | draft)
        speculate                    one per step it speculated in: k (or tree d x w), drafted
        verify                       one per step: tree size, accepted length
        commit                       one per step: k chosen (tandem.k), accepted length, tokens emitted,
                                     finish reason, the step's phase times (tandem.step_{total,verify,...}_ms)
                                     and its k over the batch (tandem.step_k_mean, tandem.step_k_max),
                                     what the length policy's decision rested on (tandem.policy.*)
        release                      the worker calls that free its KV cache (tandem.worker = target | draft)
          └╌▶ TargetService/Verify, DraftService/Speculate, .../Release ...   SERVER spans of the model services

The summary, on the request span and on the top span of the request this process owns (the Generate
server span; the request span itself behind the HTTP API): ``tandem.num_prompt_tokens``,
``tandem.num_generated``, ``tandem.ttft_ms``, ``tandem.tpot_ms``, ``tandem.mean_accepted_length``
(tokens per verify step), ``tandem.acceptance_rate``, ``tandem.slo_class``
(services.scheduler.slo_class), ``tandem.slo_attained``, ``tandem.finish_reason`` (the loop's:
length, stop_token, stop_string, aborted, error), ``tandem.num_steps``; the top span also carries
OpenInference's ``openinference.span.kind`` = LLM and ``llm.token_count.{prompt,
completion,total}``, which Arize Phoenix shows in its trace list.

Nothing else is a root: the model services trace a call only when it carries a trace context
(shared.rpc.interceptors), so the scheduler's startup Info, health and target probes, and releases of
sequences no live request owns, leave no spans; worker calls with no traced request run with no
context at all.

The catch is batching: one Verify RPC serves every running request, but an
RPC carries a single trace context. So each worker call opens a phase span
per request of its batch, all children of their own request spans, and
makes ONE of them, the representative, current while the RPC is in flight:
the model service's server span (and anything under it) joins that
request's trace. The other requests' phase spans carry a link to the
representative span, so from any request one hop reaches the RPC that
served it. The representative is the request of the batch that has
represented the fewest calls so far (ties: batch order), so every request's
trace gets its share of draft and target spans, not just the oldest one's.

``TracedTarget`` / ``TracedDraft`` wrap the workers (they need the call, to
make the span current around it); ``RequestTracer`` owns the request spans
and is the observer (``on_submit`` opens, ``on_step`` adds commit spans,
``on_summary`` writes the summary, ``on_finish`` closes). Span attributes are ``tandem.*``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import Link, Span, Status, StatusCode

from scheduler.report import StepReport
from scheduler.request import Request
from scheduler.prefill_chunks import target_step
from scheduler.workers import DraftWorker, TargetWorker
from services.scheduler.slo_class import slo_class
from services.scheduler.summary import slo_attained
from shared.engine.types import AcceptResult, PrefillItem, PrefillResult, SpecItem, TokenTree, VerifyItem
from shared.rpc.gen.tandem.v1 import tandem_pb2

Attributes = dict[str, Any]


@dataclass
class _Live:
    span: Span  # the request span
    queue: Span | None  # open while the request waits for (re-)admission
    top: Span  # this process's top span of the request: the Generate server span, or the request span itself
    num_represented: int = 0  # worker calls whose RPC ran in this request's context
    num_steps: int = 0  # verify steps it took part in (as the ledger counts them for GenerateSummary)
    summarized: bool = False  # its outcome is written


class RequestTracer:
    """Request spans and per-request phase spans; also the ``IterationObserver`` that ends them."""

    def __init__(self, tracer_provider: trace.TracerProvider | None = None) -> None:
        self.tracer = trace.get_tracer("tandem.scheduler", tracer_provider=tracer_provider)
        self._live: dict[str, _Live] = {}

    # ------------------------------------------------------------------ observer hooks
    def on_submit(self, request: Request) -> None:
        """Open the request span under the current context (the Generate call's server span)."""
        spec = request.speculation
        parent = trace.get_current_span()  # recording: the local server span; else a remote caller's context
        span = self.tracer.start_span(
            "request",
            attributes={
                "tandem.request_id": request.id,
                "tandem.num_prompt_tokens": len(request.prompt_ids),
                "tandem.max_new_tokens": request.max_new_tokens,
                "tandem.slo.tpot_ms": request.slo.tpot_ms or 0.0,
                "tandem.slo.ttft_ms": request.slo.ttft_ms or 0.0,
                "tandem.speculation.mode": spec.mode.value,
                "tandem.speculation.k": spec.k,
                "tandem.temperature": request.sampling.temperature,
                "tandem.slo_class": slo_class(request.slo),
            },
        )
        top = parent if parent.is_recording() else span
        if top is parent:
            parent.set_attribute("tandem.request_id", request.id)
        self._live[request.id] = _Live(span, self._child(span, "queue"), top)

    def on_step(self, report: StepReport) -> None:
        if not self._touches_live(report):  # a synchronous observer: nothing to build when no traced request took part
            return
        end_ns = time.time_ns()
        start_ns = end_ns - round(report.times.commit * 1e9)
        t = report.times  # the whole step's phase times, on every commit span of it (bench.overhead reads them)
        step_attrs: Attributes = {
            f"tandem.step_{name}_ms": getattr(t, name) * 1e3
            for name in ("total", "prefill", "speculate", "draft_sync", "select", "verify", "commit", "overhead")
        }
        ks = [o.shape.max_depth for o in report.outcomes]  # the k chosen this step, per request and for the step
        if ks:
            step_attrs.update({"tandem.step_k_mean": sum(ks) / len(ks), "tandem.step_k_max": max(ks)})
        step_attrs.update({f"tandem.policy.{key}": float(value) for key, value in report.policy.items()})
        for o in report.outcomes:
            live = self._live.get(o.request_id)
            if live is None:
                continue
            attrs: Attributes = {
                "tandem.step": report.step,
                "tandem.batch_size": report.batch_size,
                "tandem.k": o.shape.max_depth,
                "tandem.num_drafted": o.num_drafted,
                "tandem.accepted_length": o.num_accepted,
                "tandem.num_emitted": o.num_emitted,
                **step_attrs,
            }
            if o.finish_reason is not None:
                attrs["tandem.finish_reason"] = o.finish_reason.value
            self._child(live.span, "commit", attrs, start_ns).end(end_ns)
        for request_id in report.preempted_ids:
            live = self._live.get(request_id)
            if live is not None and live.queue is None:
                live.queue = self._child(live.span, "queue", {"tandem.preempted": True})
        for request_id in report.resumed_ids:  # readmitted with its KV kept: no prefill ends the wait
            live = self._live.get(request_id)
            if live is not None and live.queue is not None:
                live.queue.end()
                live.queue = None

    def _touches_live(self, report: StepReport) -> bool:
        """Whether the step names a traced request (one of its outcomes, preemptions or resumptions)."""
        live = self._live
        if not live:
            return False
        return (any(o.request_id in live for o in report.outcomes) or any(r in live for r in report.preempted_ids)
                or any(r in live for r in report.resumed_ids))  # fmt: skip

    def on_summary(self, request: Request, summary: tandem_pb2.GenerateSummary) -> None:
        """The servicer is about to send the final message: its server span is still open, so write the outcome."""
        live = self._live.get(request.id)
        if live is not None:
            self._write_outcome(live, request)

    def on_finish(self, request: Request) -> None:
        live = self._live.pop(request.id, None)
        if live is None:
            return
        if live.queue is not None:
            live.queue.end()
        self._write_outcome(live, request)  # unless on_summary did: the loop may report first, or no reply went out
        span = live.span
        span.set_attributes({"tandem.num_drafted": request.num_drafted_tokens,
                             "tandem.num_accepted": request.num_accepted_tokens})  # fmt: skip
        if request.error:
            span.set_status(Status(StatusCode.ERROR, request.error))
        span.end()

    def _write_outcome(self, live: _Live, request: Request) -> None:
        """The summary on the request span and the top span (whichever of on_summary / on_finish comes first,
        while the top span is still open; both read the finished request, so both write the same)."""
        if live.summarized:
            return
        live.summarized = True
        attrs = summary_attributes(request, live.num_steps)
        live.span.set_attributes(attrs)
        if live.top is not live.span and live.top.is_recording():  # not when the call ended first (cancelled)
            live.top.set_attributes(attrs)
        if live.top.is_recording():
            live.top.set_attributes(_openinference(request))

    def counted_steps(self, seq_ids: Sequence[str]) -> None:
        """A verify call took these sequences one step further."""
        for sid in seq_ids:
            if (live := self._live.get(sid)) is not None:
                live.num_steps += 1

    # ------------------------------------------------------------------ phases of a batched call
    def untraced(self, seq_ids: Sequence[str]) -> bool:
        """No request of the batch is traced and no span is current: ``batch_phase`` would open no span and
        change no context (the worker's RPC carries none either way), so a call may skip it (most steps of a
        scheduler whose requests are not traced: a generator context manager and a context attach per call)."""
        live = self._live
        return (not live or not any(sid in live for sid in seq_ids)) and trace.get_current_span() is trace.INVALID_SPAN

    @contextmanager
    def batch_phase(
        self, name: str, seq_ids: Sequence[str], attrs: Sequence[Attributes]
    ) -> Iterator[list[Span | None]]:
        """A ``name`` span per traced request of the batch; the representative's is current inside."""
        lives = [self._live.get(sid) for sid in seq_ids]
        traced = [i for i, live in enumerate(lives) if live is not None]
        spans: list[Span | None] = [None] * len(seq_ids)
        if not traced:  # no context on the wire: the service's server span would be a root of its own
            with trace.use_span(trace.INVALID_SPAN, end_on_exit=False):
                yield spans
            return
        rep = min(traced, key=lambda i: lives[i].num_represented)
        lives[rep].num_represented += 1
        common = {"tandem.batch_size": len(seq_ids)}
        spans[rep] = self._child(lives[rep].span, name, {**common, **attrs[rep], "tandem.representative": True})
        link = [Link(spans[rep].get_span_context())]
        for i in traced:
            if i != rep:
                spans[i] = self._child(lives[i].span, name, {**common, **attrs[i]}, links=link)
        try:
            with trace.use_span(spans[rep], end_on_exit=False, record_exception=False, set_status_on_exception=False):
                yield spans
        except BaseException as exc:
            for span in spans:
                if span is not None:
                    span.record_exception(exc)
                    span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
            raise
        finally:
            for span in spans:
                if span is not None:
                    span.end()

    def admitted(self, seq_ids: Sequence[str]) -> None:
        """End the queue spans of requests whose prefill starts now."""
        for sid in seq_ids:
            live = self._live.get(sid)
            if live is not None and live.queue is not None:
                live.queue.end()
                live.queue = None

    def _child(
        self, parent: Span, name: str, attrs: Attributes | None = None, start_ns: int | None = None, links=()
    ) -> Span:
        return self.tracer.start_span(
            name, context=trace.set_span_in_context(parent), attributes=attrs, links=links, start_time=start_ns
        )


class TracedTarget:
    """A ``TargetWorker`` whose prefill / verify calls run inside the requests' phase spans."""

    def __init__(self, target: TargetWorker, tracer: RequestTracer) -> None:
        self.target = target
        self.tracer = tracer

    def __getattr__(self, name: str) -> Any:
        return getattr(self.target, name)

    async def prefill(self, items: list[PrefillItem]) -> list[PrefillResult]:
        ids = [it.seq_id for it in items]
        self.tracer.admitted(ids)
        attrs = [{"tandem.worker": "target", "tandem.num_prompt_tokens": len(it.prompt_ids)} for it in items]
        with self.tracer.batch_phase("prefill", ids, attrs):
            return await self.target.prefill(items)

    async def verify(self, items: list[VerifyItem]) -> list[AcceptResult]:
        ids = [it.seq_id for it in items]
        if self.tracer.untraced(ids):  # no spans to open (RequestTracer.untraced)
            results = await self.target.verify(items)
            self.tracer.counted_steps(ids)
            return results
        attrs = [{"tandem.worker": "target", "tandem.tree_size": len(it.tree)} for it in items]
        with self.tracer.batch_phase("verify", ids, attrs) as spans:
            results = await self.target.verify(items)
            self.tracer.counted_steps(ids)
            for span, res in zip(spans, results):
                if span is not None:
                    span.set_attributes(
                        {"tandem.accepted_length": res.num_accepted, "tandem.num_committed": len(res.tokens)}
                    )
            return results

    async def step(self, prefills: list[PrefillItem], verifies: list[VerifyItem]):
        """Prefill chunks + verifies in one forward: one verify-phase span per request of either kind."""
        self.tracer.admitted([it.seq_id for it in prefills if not it.resume])
        ids = [it.seq_id for it in prefills] + [it.seq_id for it in verifies]
        if self.tracer.untraced(ids):
            prefilled, results = await target_step(self.target, prefills, verifies)
            self.tracer.counted_steps([it.seq_id for it in verifies])
            return prefilled, results
        attrs = [{"tandem.worker": "target", "tandem.prefill_chunk": it.max_tokens} for it in prefills]
        attrs += [{"tandem.worker": "target", "tandem.tree_size": len(it.tree)} for it in verifies]
        with self.tracer.batch_phase("verify", ids, attrs):
            prefilled, results = await target_step(self.target, prefills, verifies)
            self.tracer.counted_steps([it.seq_id for it in verifies])
            return prefilled, results

    async def release(self, seq_ids: list[str]) -> None:
        with self.tracer.batch_phase("release", seq_ids, [{"tandem.worker": "target"}] * len(seq_ids)):
            await self.target.release(seq_ids)

    async def resize_kv(self, num_blocks: int) -> int:
        """A span of its own, like draft.offload: the target's ResizeKV server span hangs under it."""
        with self.tracer.tracer.start_as_current_span("kv.resize") as span:
            span.set_attribute("tandem.kv_blocks_asked", num_blocks)
            total = await self.target.resize_kv(num_blocks)
            span.set_attribute("tandem.kv_blocks_total", total)
            return total


class TracedDraft:
    """A ``DraftWorker`` whose prefill / speculate calls run inside the requests' phase spans."""

    def __init__(self, draft: DraftWorker, tracer: RequestTracer) -> None:
        self.draft = draft
        self.tracer = tracer

    def __getattr__(self, name: str) -> Any:
        return getattr(self.draft, name)

    async def prefill(self, items: list[PrefillItem]) -> None:
        attrs = [{"tandem.worker": "draft", "tandem.num_prompt_tokens": len(it.prompt_ids)} for it in items]
        with self.tracer.batch_phase("prefill", [it.seq_id for it in items], attrs):
            await self.draft.prefill(items)

    async def speculate(self, items: list[SpecItem]) -> list[TokenTree]:
        ids = [it.seq_id for it in items]
        if self.tracer.untraced(ids):  # no spans to open (RequestTracer.untraced)
            return await self.draft.speculate(items)
        attrs = [_shape_attrs(it) for it in items]
        with self.tracer.batch_phase("speculate", ids, attrs) as spans:
            trees = await self.draft.speculate(items)
            for span, tree in zip(spans, trees):
                if span is not None:
                    span.set_attribute("tandem.num_drafted", len(tree))
            return trees

    async def release(self, seq_ids: list[str]) -> None:
        with self.tracer.batch_phase("release", seq_ids, [{"tandem.worker": "draft"}] * len(seq_ids)):
            await self.draft.release(seq_ids)

    async def offload(self) -> int:
        """A span of its own (no request owns it); the draft's server span hangs under it."""
        with self.tracer.tracer.start_as_current_span("draft.offload") as span:
            moved = await self.draft.offload()
            span.set_attribute("tandem.bytes_moved", moved)
            return moved

    async def reload(self) -> int:
        with self.tracer.tracer.start_as_current_span("draft.reload") as span:
            moved = await self.draft.reload()
            span.set_attribute("tandem.bytes_moved", moved)
            return moved


def summary_attributes(request: Request, num_steps: int) -> Attributes:
    """What a user looks for in a finished request's trace; the definitions of GenerateSummary (summary.py)."""
    return {
        "tandem.num_prompt_tokens": len(request.prompt_ids),
        "tandem.num_generated": len(request.output_ids),
        "tandem.ttft_ms": (request.ttft or 0.0) * 1e3,
        "tandem.tpot_ms": (request.tpot or 0.0) * 1e3,
        "tandem.mean_accepted_length": (request.num_accepted_tokens + num_steps) / num_steps if num_steps else 0.0,
        "tandem.acceptance_rate": request.acceptance_rate or 0.0,
        "tandem.num_steps": num_steps,
        "tandem.slo_class": slo_class(request.slo),
        "tandem.slo_attained": slo_attained(request),
        "tandem.finish_reason": request.finish_reason.value if request.finish_reason else "",
    }


def _openinference(request: Request) -> Attributes:
    """OpenInference's names for the token counts: Phoenix lists a trace's kind and tokens from them."""
    prompt, completion = len(request.prompt_ids), len(request.output_ids)
    return {
        "openinference.span.kind": "LLM",
        "llm.token_count.prompt": prompt,
        "llm.token_count.completion": completion,
        "llm.token_count.total": prompt + completion,
    }


def _shape_attrs(item: SpecItem) -> Attributes:
    attrs: Attributes = {"tandem.worker": "draft", "tandem.num_new_tokens": len(item.new_tokens)}
    if item.tree_depth:
        attrs.update({"tandem.tree.depth": item.tree_depth, "tandem.tree.width": item.tree_width})
    else:
        attrs["tandem.k"] = item.chain_len
    return attrs
