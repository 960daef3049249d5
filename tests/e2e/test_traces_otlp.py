"""Traces as a trace UI receives them: `tandem up`'s three processes exporting OTLP/gRPC to a receiver.

Eight concurrent requests must give exactly eight traces, one per request, each holding its phases
across scheduler, draft and target (release included), and nothing else: no root for the startup
Info probes, health checks, `tandem status`, or a batch's KV release.
"""

from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor

import pytest

from sdk import Client
from services.launcher import LaunchConfig, launch
from tests.support.otlp_receiver import OtlpReceiver
from tests.support.tiny_stack import VOCAB

NUM_REQUESTS = 8
MAX_NEW_TOKENS = 12
PHASES = {"request", "queue", "prefill", "speculate", "verify", "commit", "release"}


def _streamed(client: Client, prompt: list[int], **kwargs):
    with client.stream(prompt, **kwargs) as stream:
        return stream.collect()


def test_eight_concurrent_requests_are_eight_traces(tiny_pair, tmp_path):
    target_dir, draft_dir = tiny_pair
    rng = random.Random(7)
    prompts = [[rng.randrange(VOCAB) for _ in range(rng.randint(3, 30))] for _ in range(NUM_REQUESTS)]
    slos = [None if i % 4 < 2 else 500.0 for i in range(NUM_REQUESTS)]
    with OtlpReceiver() as receiver:
        env = {"TANDEM_TRACE_EXPORTER": "otlp", "TANDEM_OTLP_ENDPOINT": receiver.endpoint,
               "OTEL_BSP_SCHEDULE_DELAY": "200"}  # fmt: skip
        config = LaunchConfig(
            target_model=str(target_dir), draft_model=str(draft_dir), port=0, metrics_port=None, device="cpu",
            log_dir=tmp_path / "logs", startup_timeout_s=180, extra_env=env,
        )  # fmt: skip
        with launch(config) as stack, Client(stack.endpoints.scheduler, timeout=120) as client:
            assert client.health() == "SERVING" and client.info().target is not None  # probes: no traces
            # half streamed (Generate), half unary (GenerateUnary)
            calls = [lambda p, **kw: _streamed(client, p, **kw), client.generate]
            with ThreadPoolExecutor(NUM_REQUESTS) as pool:
                futures = [
                    pool.submit(calls[i % 2], p, max_new_tokens=MAX_NEW_TOKENS, speculation=2, slo_tpot_ms=slo)
                    for i, (p, slo) in enumerate(zip(prompts, slos))
                ]
                results = [f.result() for f in futures]
        # leaving launch() stops the services gracefully: each flushes its exporter on the way out
        spans = receiver.spans()
        traces = receiver.traces()

    roots = [s for s in spans if s.is_root]
    assert len(roots) == NUM_REQUESTS, sorted((s.service, s.name) for s in roots)
    assert {s.name for s in roots} == {"tandem.v1.Tandem/Generate", "tandem.v1.Tandem/GenerateUnary"}
    assert len(traces) == NUM_REQUESTS  # every span sits in one of the requests' traces
    by_request = {r.attributes["tandem.request_id"]: r for r in roots}
    assert set(by_request) == {r.request_id for r in results}

    for result, prompt, slo in zip(results, prompts, slos):
        root = by_request[result.request_id]
        trace = traces[root.trace_id]
        ids = {s.span_id for s in trace}
        assert all(s.parent_span_id in ids for s in trace if not s.is_root)  # no orphans: every parent arrived
        scheduler = {s.name for s in trace if s.service == "scheduler"}
        assert PHASES <= scheduler, PHASES - scheduler
        releases = [s for s in trace if s.name == "release"]
        assert {s.attributes["tandem.worker"] for s in releases} == {"target", "draft"}
        assert any(s.service == "target" for s in trace)  # batched calls: the RPC joins one request's trace
        a = root.attributes  # what a user looks for, on the root
        assert a["tandem.num_prompt_tokens"] == len(prompt) == a["llm.token_count.prompt"]
        assert a["tandem.num_generated"] == MAX_NEW_TOKENS == a["llm.token_count.completion"]
        assert a["tandem.ttft_ms"] > 0 and a["tandem.tpot_ms"] > 0
        assert a["tandem.mean_accepted_length"] == pytest.approx(result.stats.mean_accepted_length) and a["tandem.num_steps"] > 0
        assert a["tandem.slo_class"] == ("none" if slo is None else "tpot<=500ms")
        assert a["tandem.finish_reason"] == "length" and a["openinference.span.kind"] == "LLM"

    # A batched RPC (one Prefill, Verify, Release ... for many requests) joins one of them, the representative;
    # the others' phase spans link to its span, so one hop reaches the call that served them.
    served = {(s.service, s.name.rpartition("/")[2]) for s in spans if s.service in ("target", "draft")}
    # (over step streams a release rides on the next plan, whose span is named for what else it carries: a
    # Release span is a plan of releases alone; the scheduler's "release" phases above are there either way)
    assert {(role, "Prefill") for role in ("target", "draft")} <= served
    assert {("target", "Verify"), ("draft", "Speculate")} <= served
    span_ids = {s.span_id for s in spans}
    linked = [s for s in spans if s.links]
    assert linked and all(set(s.links) <= span_ids for s in linked)
