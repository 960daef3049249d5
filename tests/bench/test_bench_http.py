"""bench.http_overhead's summary: ratios from interleaved rows, one-token requests left out of TPOT."""

import math

from bench.http_overhead import render, summarize


def test_summary_ratios_and_one_token_rows_left_out():
    raw = {
        "batch1": {"grpc": [(1.0, 0.030, 30), (0.05, math.nan, 1)], "http": [(1.1, 0.033, 30), (0.05, math.nan, 1)]},
        "load": {"grpc": [{"tok_s": 100.0, "latency_s": 2.0}], "http": [{"tok_s": 90.0, "latency_s": 2.2}]},
    }
    s = summarize(raw)
    r = s["http_over_grpc"]
    assert math.isclose(r["batch1_tpot"], 1.1) and math.isclose(r["batch1_tpot_extra_ms"], 3.0)
    assert math.isclose(r["load_throughput"], 0.9) and math.isclose(r["load_latency"], 1.1)
    text = render({"date": "d", "command": "c", "machine": "m", "pair": "demo", "options": "o"}, s)
    assert "| batch 1: time per token (ms, median) | 30.00 | 33.00 | 1.100 (+3.00 ms) |" in text
