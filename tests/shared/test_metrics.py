"""Prometheus metrics on a private registry, served over HTTP."""

from __future__ import annotations

import urllib.request

from prometheus_client import REGISTRY

from shared.metrics import TandemMetrics, start_http_server


def _value(metrics: TandemMetrics, name: str, labels: dict[str, str] | None = None) -> float:
    return metrics.registry.get_sample_value(name, labels or {})


def test_request_and_step_metrics() -> None:
    m = TandemMetrics()
    assert m.observe_request(ttft_s=0.1, tpot_s=0.04, num_tokens=100, slo_tpot_ms=50, slo_class="tight") is True
    assert m.observe_request(ttft_s=0.2, tpot_s=0.06, num_tokens=50, slo_tpot_ms=50, slo_class="tight") is False
    assert m.observe_request(ttft_s=3.0, tpot_s=0.01, num_tokens=10, slo_tpot_ms=50, slo_ttft_ms=1000) is False
    assert m.observe_request(ttft_s=None, tpot_s=None, num_tokens=0, finish_reason="error") is False
    assert _value(m, "tandem_slo_requests_total", {"slo_class": "tight", "outcome": "attained"}) == 1
    assert _value(m, "tandem_slo_requests_total", {"slo_class": "tight", "outcome": "violated"}) == 1
    assert _value(m, "tandem_goodput_tokens_total", {"slo_class": "tight"}) == 100
    assert _value(m, "tandem_generated_tokens_total") == 160
    assert _value(m, "tandem_tpot_seconds_count", {"slo_class": "tight"}) == 2
    assert _value(m, "tandem_requests_total", {"finish_reason": "error"}) == 1

    m.observe_step(num_proposed=4, num_accepted=2)
    m.observe_step(num_proposed=0, num_accepted=0)
    assert _value(m, "tandem_draft_tokens_proposed_total") == 4
    assert _value(m, "tandem_draft_tokens_accepted_total") == 2
    assert _value(m, "tandem_accepted_length_tokens_sum") == 4 and _value(m, "tandem_accepted_length_tokens_count") == 2
    assert _value(m, "tandem_position_proposed_total", {"position": "3"}) == 1
    assert _value(m, "tandem_position_accepted_total", {"position": "1"}) == 1
    assert _value(m, "tandem_position_accepted_total", {"position": "2"}) is None
    m.set_load(waiting=7, running=3)
    assert _value(m, "tandem_queue_depth", {"queue": "all"}) == 7

    # private registries: two instances do not clash, the global registry stays clean
    TandemMetrics()
    assert REGISTRY.get_sample_value("tandem_generated_tokens_total") is None


def test_http_exposition() -> None:
    m = TandemMetrics()
    m.observe_request(ttft_s=0.1, tpot_s=0.02, num_tokens=5)
    server, thread = start_http_server(0, m.registry)
    try:
        body = urllib.request.urlopen(f"http://127.0.0.1:{server.server_port}/metrics", timeout=5).read().decode()
    finally:
        server.shutdown()
        server.server_close()
    assert "tandem_ttft_seconds_bucket" in body and "tandem_generated_tokens_total 5.0" in body
    assert m.render().startswith("# HELP")


def test_observe_steps_in_bulk_equals_one_at_a_time() -> None:
    """A batch's steps recorded at once give every series what recording them one by one gives."""
    import random

    rng = random.Random(7)
    steps = []
    for _ in range(200):
        depth = rng.randint(1, 20)  # past max_positions too
        proposed = depth if rng.random() < 0.5 else depth + rng.randint(0, 9)  # chains and trees
        steps.append((proposed, rng.randint(0, depth), depth, rng.randint(0, 3)))
    bulk, single = TandemMetrics(), TandemMetrics()
    bulk.observe_steps(steps)
    for proposed, accepted, depth, pruned in steps:
        single.observe_step(num_proposed=proposed, num_accepted=accepted, depth=depth, num_pruned=pruned)
    # the reference: each step counted position by position, as the per-step definition reads
    want_proposed, want_accepted = [0] * 16, [0] * 16
    for _, accepted, depth, _ in steps:
        for position in range(min(depth, 16)):
            want_proposed[position] += 1
            want_accepted[position] += position < accepted
    samples = lambda m: sorted((s.name, tuple(sorted(s.labels.items())), s.value)  # noqa: E731
                               for metric in m.registry.collect() for s in metric.samples if "created" not in s.name)
    assert samples(bulk) == samples(single)
    for position in range(16):
        assert _value(bulk, "tandem_position_proposed_total", {"position": str(position)}) == want_proposed[position]
        assert (_value(bulk, "tandem_position_accepted_total", {"position": str(position)}) or 0) == want_accepted[position]
    assert _value(bulk, "tandem_draft_tokens_pruned_total") == sum(s[3] for s in steps)
