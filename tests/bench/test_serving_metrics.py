"""Metric definitions on hand-built traces."""

import pytest

from bench.metrics import RequestTrace, percentile, summarize


def trace(rid, cls, slo_ms, sent, times, reason="length", **kw):
    return RequestTrace(rid, cls, slo_ms, sent, times, finish_reason=reason, **kw)


def test_tpot_is_time_between_first_and_last_token_over_n_minus_one():
    t = trace("a", "stringent", 50.0, 0.0, [0.5, 0.6, 0.6, 0.8])  # a 2-token chunk shares a timestamp
    assert t.ttft_s == pytest.approx(0.5)
    assert t.tpot_s == pytest.approx((0.8 - 0.5) / 3)
    assert t.latency_s == pytest.approx(0.8)
    assert not t.attained  # 100 ms/token > 50 ms
    t_fast = trace("b", "stringent", 150.0, 0.0, [0.5, 0.6, 0.6, 0.8])
    assert t_fast.attained


def test_attainment_edges():
    assert not trace("a", "x", 99.0, 0.0, [0.0, 0.1, 0.2]).attained  # 100 ms > 99 ms
    assert trace("a", "x", 100.0, 0.0, [0.0, 0.1, 0.2]).attained  # equal attains
    assert trace("a", "x", 1.0, 0.0, [0.3]).attained  # one token: no TPOT to judge
    assert not trace("a", "x", 1e9, 0.0, [0.1, 0.2], reason="error").attained
    assert not trace("a", "x", None, 0.0, [], reason="aborted").attained
    assert not trace("a", "x", 1e9, 0.0, [0.5, 0.6], ttft_slo_ms=400.0).attained
    assert trace("a", "x", None, 0.0, [0.5, 0.6], ttft_slo_ms=600.0).attained


def test_summary_goodput_counts_only_attaining_requests():
    traces = [
        trace("fast", "stringent", 20.0, 0.0, [0.1, 0.11, 0.12, 0.13]),  # 10 ms/token: attains
        trace("slow", "stringent", 20.0, 0.0, [0.1, 0.2, 0.3]),  # 100 ms/token: violates
        trace("relaxed", "relaxed", 200.0, 1.0, [1.2, 1.3]),  # attains
        trace("failed", "relaxed", 200.0, 1.0, [1.2], reason="error"),
    ]
    s = summarize(traces, wall_s=2.0)
    assert s.num_requests == 4 and s.num_ok == 3
    assert s.throughput_tok_s == pytest.approx((4 + 3 + 2 + 1) / 2.0)
    assert s.goodput_tok_s == pytest.approx((4 + 2) / 2.0)
    assert s.attainment == pytest.approx(2 / 4)
    assert s.attainment_by_class == {"relaxed": 0.5, "stringent": 0.5}
    assert s.tpot_s["mean"] == pytest.approx((0.01 + 0.1 + 0.1) / 3)
    with pytest.raises(ValueError):
        summarize(traces, wall_s=0)


def test_acceptance_statistics():
    traces = [
        trace("a", "x", None, 0, [0.1, 0.2], num_steps=4, num_draft_tokens=12, num_accepted_tokens=6),
        trace("b", "x", None, 0, [0.1, 0.2], num_steps=2, num_draft_tokens=6, num_accepted_tokens=3),
    ]
    s = summarize(traces, wall_s=1.0)
    assert s.acceptance_rate == pytest.approx(9 / 18)
    assert s.mean_accepted_length == pytest.approx((9 + 6) / 6)  # accepted + one bonus per step
    assert summarize([trace("c", "x", None, 0, [0.1])], 1.0).acceptance_rate is None


def test_percentile_interpolates_like_numpy():
    xs = [1.0, 2.0, 3.0, 4.0]
    assert percentile(xs, 50) == pytest.approx(2.5)
    assert percentile(xs, 99) == pytest.approx(3.97)
    assert percentile([], 50) is None
    assert percentile([7.0], 99) == 7.0
