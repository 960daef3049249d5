"""Paired speedups and the lossless check, on hand-built records."""

import pytest

from bench.drivers import Job, Record
from bench.metrics import RequestTrace
from bench.prompts import Prompt
from bench.report import acceptance, batch1_wall_s, by_run, lossless, paired_speedup
from bench.slo import STRINGENT
from bench.tokens import EncodedItem
from bench.workload import WorkItem


def rec(config, i, latency, tokens, steps=(), drafted=0, rep=0):
    job = Job(EncodedItem(WorkItem(i, None, Prompt("chat", "q"), STRINGENT, 4), (1, 2)), None, f"{config}/b1-r{rep}-i{i}")
    times = [latency * (k + 1) / len(tokens) for k in range(len(tokens))]
    trace = RequestTrace(job.request_id, "stringent", None, 0.0, times, num_steps=len(steps),
                         num_draft_tokens=drafted, num_accepted_tokens=sum(steps))
    return Record(config, job, trace, list(steps), [a + 1 for a in steps], None, list(tokens))


def test_paired_speedup_is_the_median_of_per_prompt_ratios():
    records = {
        "plain": [rec("plain", 0, 2.0, [1, 2, 3]), rec("plain", 1, 4.0, [4, 5, 6]), rec("plain", 2, 3.0, [7, 8, 9])],
        "spec": [rec("spec", 0, 1.0, [1, 2, 3]), rec("spec", 1, 4.0, [4, 5, 6]), rec("spec", 2, 2.0, [7, 8, 0])],
    }
    assert paired_speedup(records, "spec", "plain") == pytest.approx(1.5)  # ratios 2.0, 1.0, 1.5
    assert lossless(records, "spec", "plain") == {"equal": 2, "compared": 3}
    assert paired_speedup(records, "spec", "missing") is None
    assert batch1_wall_s(records["plain"]) == pytest.approx(9.0)


def test_acceptance_histograms():
    records = [rec("spec", 0, 1.0, [1] * 6, steps=(2, 0, 3), drafted=9), rec("spec", 1, 1.0, [1] * 3, steps=(1,), drafted=3)]
    a = acceptance(records)
    assert a["accepted_per_step_hist"] == {"0": 1, "1": 1, "2": 1, "3": 1}
    assert a["request_acceptance_rates"] == pytest.approx([5 / 9, 1 / 3])
    assert a["mean_tokens_per_step"] == pytest.approx((3 + 1 + 4 + 2) / 4)


def test_output_lengths_tell_how_well_the_bound_predicts_the_length():
    from bench.report import output_lengths

    def bounded(i, bound, n):
        job = Job(EncodedItem(WorkItem(i, None, Prompt("chat", "q"), STRINGENT, bound), (1, 2)), None, f"c/r{i}")
        return Record("c", job, RequestTrace(job.request_id, "stringent", None, 0.0, [0.1] * n))

    exact = [bounded(0, 10, 10), bounded(1, 50, 50), bounded(2, 20, 20)]
    assert output_lengths(exact) == {"mean_tokens": pytest.approx(80 / 3), "mean_max_new_tokens": pytest.approx(80 / 3),
                                     "stopped_early": 0.0, "rank_corr": pytest.approx(1.0)}  # fmt: skip
    reversed_ = [bounded(0, 10, 9), bounded(1, 50, 3), bounded(2, 20, 5)]  # stop tokens came first, longest bound soonest
    out = output_lengths(reversed_)
    assert out["stopped_early"] == 1.0 and out["rank_corr"] == pytest.approx(-1.0)
    assert output_lengths([])["rank_corr"] is None


def test_request_rows_carry_what_an_order_moves():
    from bench.report import request_rows

    (row,) = request_rows([rec("c", 3, 2.0, [1, 2, 3, 4])])
    assert row == {"id": "c/b1-r0-i3", "max_new_tokens": 4, "prompt_tokens": 2, "tokens": 4, "steps": 0,
                   "sent_s": 0.0, "ttft_s": 0.5, "latency_s": 2.0, "finish": "length"}  # fmt: skip


def test_by_run_splits_the_repeats():
    records = [rec("spec", 0, 1.0, [1] * 4, rep=0), rec("spec", 1, 3.0, [1] * 4, rep=0), rec("spec", 0, 2.0, [1] * 4, rep=1)]
    runs = by_run(records, batch1=True)
    assert [(r["repeat"], r["requests"]) for r in runs] == [(0, 2), (1, 1)]
    assert runs[0]["latency_mean_s"] == pytest.approx(2.0) and runs[1]["latency_mean_s"] == pytest.approx(2.0)
    assert runs[0]["throughput_tok_s"] == pytest.approx(8 / 4.0)  # batch 1: busy time = the sum of latencies
    assert runs[1]["tpot_mean_s"] == pytest.approx(0.5)  # tokens at 0.5, 1.0, 1.5, 2.0 s
