"""Observers over the fake stack: request traces (span tree, batching links) and Redis records."""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from opentelemetry import trace

from sdk import Client
from shared.state.redis_server import start_redis
from shared.state.store import AsyncStateStore
from shared.telemetry import setup_tracing
from tests.support.fake_stack import fake_stack

PHASES = {"queue", "prefill", "speculate", "verify", "commit", "release"}


def _by_name(spans, name):
    return [s for s in spans if s.name == name]


def _finished(stack, num_requests: int, timeout: float = 5.0):
    """The finished spans once ``num_requests`` request spans ended (they end after the step that
    finished them, so just after the client got its result)."""
    deadline = time.monotonic() + timeout
    while True:
        spans = stack.tracer_provider.memory_exporter.get_finished_spans()
        if len(_by_name(spans, "request")) >= num_requests or time.monotonic() > deadline:
            return spans
        time.sleep(0.01)


def test_one_request_one_trace_with_phase_spans(token_stack):
    client_provider = setup_tracing("client", "memory")
    tracer = client_provider.get_tracer("test")
    with tracer.start_as_current_span("client-call") as client_span, Client(token_stack.address) as client:
        result = client.generate([1, 2, 3], max_new_tokens=9, speculation=2, slo_tpot_ms=40)
    spans = _finished(token_stack, num_requests=1)
    trace_id = client_span.get_span_context().trace_id
    assert {s.context.trace_id for s in spans} == {trace_id}  # the client's trace covers the scheduler's spans

    (server,) = _by_name(spans, "tandem.v1.Tandem/GenerateUnary")
    (request,) = _by_name(spans, "request")
    assert request.parent.span_id == server.context.span_id
    assert request.attributes["tandem.request_id"] == result.request_id
    assert request.attributes["tandem.num_generated"] == 9
    assert request.attributes["service.name"] == "scheduler"
    children = [s for s in spans if s.parent is not None and s.parent.span_id == request.context.span_id]
    assert {s.name for s in children} == PHASES
    assert len(_by_name(children, "queue")) == 1
    assert {s.attributes["tandem.worker"] for s in _by_name(children, "prefill")} == {"target", "draft"}
    verifies = _by_name(children, "verify")
    assert len(verifies) == result.stats.num_steps
    assert sum(s.attributes["tandem.accepted_length"] for s in verifies) == result.stats.num_accepted_tokens
    assert all(s.attributes["tandem.k"] == 2 for s in _by_name(children, "speculate"))
    assert all(s.attributes["tandem.batch_size"] == 1 for s in verifies)
    assert {s.attributes["tandem.worker"] for s in _by_name(children, "release")} == {"target", "draft"}
    # the request's outcome, as the client got it, on the request span and on the call's server span
    for span in (server, request):
        a = span.attributes
        assert (a["tandem.num_prompt_tokens"], a["tandem.num_generated"]) == (3, 9)
        assert a["tandem.ttft_ms"] == pytest.approx(result.ttft_ms) and a["tandem.tpot_ms"] == pytest.approx(result.tpot_ms)
        assert a["tandem.mean_accepted_length"] == pytest.approx(result.stats.mean_accepted_length)
        assert (a["tandem.slo_class"], a["tandem.slo_attained"]) == ("tpot<=50ms", result.slo_attained)
        assert a["tandem.finish_reason"] == "length"
    assert server.attributes["llm.token_count.total"] == 12 and "llm.token_count.total" not in request.attributes
    assert server.attributes["openinference.span.kind"] == "LLM"


def test_commit_spans_carry_what_the_length_policy_decided_on():
    """A length policy's explain() lands on its step's commit spans (tandem.policy.*), so a trace shows why
    a step speculated as it did; a policy without one adds nothing."""
    from scheduler.policies.smartspec import SmartSpec

    with fake_stack(None, spec_policy=SmartSpec()) as stack, Client(stack.address) as client:
        client.generate([1, 2, 3], max_new_tokens=12, speculation="auto")
        commits = _by_name(_finished(stack, num_requests=1), "commit")
    assert commits and all(0 < s.attributes["tandem.policy.alpha"] < 1 for s in commits)
    assert all(s.attributes["tandem.policy.k"] == s.attributes["tandem.step_k_max"] for s in commits)
    assert all("tandem.policy.goodput_k1" in s.attributes for s in commits)


def test_batched_calls_pick_a_representative_and_link_the_rest(token_stack):
    with Client(token_stack.address, timeout=30) as client, ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda i: client.generate([i + 1, 7], max_new_tokens=30, speculation=2), range(4)))
    spans = _finished(token_stack, num_requests=4)
    requests = {s.context.span_id: s for s in _by_name(spans, "request")}
    assert len(requests) == 4 and len({s.context.trace_id for s in requests.values()}) == 4
    phases = [s for s in spans if s.name in ("prefill", "speculate", "verify")]
    assert any(s.attributes["tandem.batch_size"] > 1 for s in phases), "the four requests never shared a step"
    reps = {s.context.span_id: s for s in phases if s.attributes.get("tandem.representative")}
    for span in phases:
        assert span.parent.span_id in requests  # a child of its own request
        if span.context.span_id not in reps:
            (link,) = span.links
            assert link.context.span_id in reps
    # every request represented some calls, so every trace holds some worker RPCs
    assert {s.parent.span_id for s in reps.values()} == set(requests)


def test_trace_context_reaches_the_workers(token_stack):
    """What a worker sees as current during its call is the representative's phase span."""
    seen = []
    verify = token_stack.target.verify

    async def spy(items):
        seen.append(trace.get_current_span().get_span_context())
        return await verify(items)

    token_stack.target.verify = spy
    with Client(token_stack.address) as client:
        client.generate([5, 6], max_new_tokens=4, speculation="off")
    spans = token_stack.tracer_provider.memory_exporter.get_finished_spans()
    verify_ids = {s.context.span_id for s in _by_name(spans, "verify")}
    assert seen and all(ctx.span_id in verify_ids for ctx in seen)


@pytest.fixture(scope="module")
def redis_url():
    server = start_redis()
    yield server.url
    server.stop()


def test_redis_holds_records_tokens_and_acceptance(redis_url):
    with fake_stack(redis_url=redis_url) as stack, Client(stack.address, timeout=30) as client:
        fixed = client.generate([1, 2, 3], max_new_tokens=20, speculation=3, slo_tpot_ms=100, priority=2)
        off = client.generate([4, 5], max_new_tokens=6, speculation="off")
        one = client.generate([6], max_new_tokens=1)  # ends at prefill
        stack.loop.run(stack.recorder.flush())
        store: AsyncStateStore = stack.recorder.store

        async def read():
            records = {r.request_id: await store.get_request(r.request_id) for r in (fixed, off, one)}
            tokens = {r.request_id: await store.get_tokens(r.request_id) for r in (fixed, off, one)}
            stats = {
                "request": await store.acceptance("request", fixed.request_id),
                "policy": await store.acceptance("policy", "client_fixed"),
                "global": await store.acceptance("global"),
            }
            return records, tokens, stats, await store.live_request_ids()

        records, tokens, stats, live = stack.loop.run(read())
    for r in (fixed, off, one):
        rec = records[r.request_id]
        assert rec.state == "finished" and rec.finish_reason == "length"
        assert tokens[r.request_id] == r.token_ids and rec.num_generated == len(r.token_ids)
        assert rec.first_token_unix_ns <= rec.last_token_unix_ns <= rec.finish_unix_ns
        assert rec.arrival_unix_ns <= rec.first_token_unix_ns
    rec = records[fixed.request_id]
    assert rec.slo_tpot_ms == 100 and rec.priority == 2 and rec.prompt_len == 3 and rec.policy == "client_fixed"
    assert records[off.request_id].policy is None
    assert abs(rec.tpot_ms - fixed.tpot_ms) < 1.0
    assert stats["request"].num_proposed == fixed.stats.num_draft_tokens
    assert stats["request"].num_accepted == fixed.stats.num_accepted_tokens
    assert stats["policy"].num_accepted == fixed.stats.num_accepted_tokens
    assert stats["global"].num_proposed == fixed.stats.num_draft_tokens  # "off" proposed nothing
    assert stats["request"].position_proposed[0] > 0
    assert live == []


def test_redis_outage_costs_records_not_requests(redis_url):
    server = start_redis()
    with fake_stack(redis_url=server.url) as stack, Client(stack.address, timeout=30) as client:
        server.stop()
        t = time.monotonic()
        result = client.generate([1, 2], max_new_tokens=10, speculation=2)
        assert len(result.token_ids) == 10 and time.monotonic() - t < 10
        stack.loop.run(asyncio.wait_for(stack.recorder.flush(), 30))
