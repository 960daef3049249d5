"""Frontier pipelining (FASER §4.3, TANDEM_FRONTIER) over real gRPC, the tiny pair and Redis.

A scheduler configured by ``frontier=chunk=2`` (what TANDEM_FRONTIER=chunk=2 gives the
process) over the module's target and draft services: greedy output equals
target-only, and the traces show the overlap: a request's draft ``speculate``
span (the lookahead on the optimistic prefix) and its target ``verify`` span
run at the same time. Those are the scheduler's phase spans, open exactly
while their RPC is in flight, so they overlap whenever the two calls were
concurrent, however fast the tiny models are. Whether the two services'
engines also computed at the same moment depends on timing; the test asks it
of the server spans once over the whole run (both services share this
process's event loop, each engine on a thread of its own).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

from sdk import FinishReason
from tests.e2e.test_tree_policies import _generate_all, _prompts


@contextmanager
def frontier_scheduler(stack, tiny_pair, frontier: str) -> Iterator:
    from services.scheduler.main import start
    from services.settings import ServiceSettings

    settings = ServiceSettings.from_env(
        env={"TANDEM_FRONTIER": frontier},  # read the way the process reads it
        port=0, trace_exporter="memory", shutdown_grace_s=0.5, model=str(tiny_pair[0]),
        target_addr=stack.target.address, draft_addr=stack.draft.address, redis_url=stack.redis_url,
        speculation_policy="fixed:3",
    )  # fmt: skip
    running = stack.loop.run(start(settings))
    try:
        yield running
    finally:
        stack.loop.run(running.stop())


def _overlaps(a, b) -> bool:
    return a.start_time < b.end_time and b.start_time < a.end_time


def test_frontier_setting_is_lossless_and_overlaps_draft_with_verify(stack, tiny_pair, reference):
    prompts = _prompts(5, seed=21)
    requests = [dict(prompt=p, max_new_tokens=10 + 3 * i, speculation=3) for i, p in enumerate(prompts)]
    requests.append(dict(prompt=prompts[0], max_new_tokens=12, speculation="off"))  # plain decoding beside
    for running in (stack.target, stack.draft):
        running.tracer_provider.memory_exporter.clear()
    with frontier_scheduler(stack, tiny_pair, "chunk=2") as running:
        frontier = running.scheduler.frontier
        assert frontier is not None and frontier.config.chunk_size == 2
        results = _generate_all(running.address, requests)
        stats = frontier.stats
        _wait(lambda: _finished_requests(running) >= len(requests))
        spans = running.tracer_provider.memory_exporter.get_finished_spans()

    for i, (req, r) in enumerate(zip(requests, results)):
        assert r.finish_reason == FinishReason.LENGTH
        assert r.token_ids == reference.greedy(req["prompt"], req["max_new_tokens"]), f"request {i}"
    assert sum(r.stats.num_draft_tokens for r in results[:-1]) > 0
    # the tiny random draft mostly misses: resets dominate, but every pipelined step drafted a lookahead
    assert stats.steps > 0 and stats.resets > 0

    # per request: its phase spans hang under its request span; some speculate overlaps some verify
    by_parent: dict[int, dict[str, list]] = {}
    for s in spans:
        if s.name in ("speculate", "verify") and s.parent is not None:
            by_parent.setdefault(s.parent.span_id, {}).setdefault(s.name, []).append(s)
    overlapping = [
        pid
        for pid, phases in by_parent.items()
        if any(_overlaps(a, b) for a in phases.get("speculate", []) for b in phases.get("verify", []))
    ]
    assert overlapping, "no request had a draft speculate span overlapping a target verify span"

    # the services: a DraftService/Speculate server span ran while a TargetService/Verify one did. Not where both
    # services call their engines inline on one event loop (this in-process stack over step streams, one torch
    # thread each: EngineHost.inline_steps): their steps then take turns on it, as separate processes would not
    if stack.target.engine_host.inline_steps and stack.draft.engine_host.inline_steps:
        return
    served = {
        name: [s for s in running_.tracer_provider.memory_exporter.get_finished_spans() if s.name == name]
        for running_, name in ((stack.draft, "tandem.v1.DraftService/Speculate"),
                               (stack.target, "tandem.v1.TargetService/Verify"))  # fmt: skip
    }
    assert any(
        _overlaps(a, b)
        for a in served["tandem.v1.DraftService/Speculate"]
        for b in served["tandem.v1.TargetService/Verify"]
    )


def test_frontier_off_by_default(stack, tiny_pair):
    with frontier_scheduler(stack, tiny_pair, "") as running:
        assert running.scheduler.frontier is None


def _finished_requests(running) -> int:
    return sum(1 for s in running.tracer_provider.memory_exporter.get_finished_spans() if s.name == "request")


def _wait(cond, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond() and time.monotonic() < deadline:
        time.sleep(0.02)
