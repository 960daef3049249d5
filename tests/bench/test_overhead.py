"""Overhead share of iteration time from hand-built spans."""

import pytest

from bench.overhead import breakdown, by_config, steps_of
from bench.spans import Span

MS = 1_000_000  # ns


def commit(trace, step, end_ms, total, speculate, verify, prefill=0.0):
    attrs = {"tandem.step": step, "tandem.step_total_ms": total, "tandem.step_speculate_ms": speculate,
             "tandem.step_verify_ms": verify, "tandem.step_prefill_ms": prefill, "tandem.step_select_ms": 0.1}
    return Span("commit", "scheduler", trace, f"c{step}{trace}", "", (end_ms - 0.2) * MS, end_ms * MS, attrs)


def call(name, start_ms, dur_ms, work_ms, trace="t1"):
    attrs = {"tandem.engine_work_ms": work_ms, "tandem.engine_queue_ms": 0.0}
    return Span(name, "target", trace, f"s{start_ms}", "", int(start_ms * MS), int((start_ms + dur_ms) * MS), attrs)


def request(trace, request_id):
    return Span("request", "scheduler", trace, f"r{trace}", "", 0, 1, {"tandem.request_id": request_id})


def test_breakdown_of_two_steps():
    # step 1: [0, 10] ms: speculate 3 ms (draft work 2, served 2.5), verify 5 ms (target work 4, served 4.5)
    # step 2: [20, 30] ms: the same
    spans = [
        commit("t1", 1, 10, total=10, speculate=3, verify=5),
        call("DraftService/Speculate", 0.5, 2.5, 2.0),
        call("TargetService/Verify", 4.0, 4.5, 4.0),
        commit("t1", 2, 30, total=10, speculate=3, verify=5),
        call("DraftService/Speculate", 20.5, 2.5, 2.0),
        call("TargetService/Verify", 24.0, 4.5, 4.0),
        call("TargetService/Verify", 45.0, 4.5, 4.0),  # outside every step: not counted
    ]
    b = breakdown(spans, {"t1"})
    assert b["num_steps"] == 2 and b["mean_step_ms"] == pytest.approx(10)
    assert b["model_s"] == pytest.approx(0.012)  # (2 + 4) x 2 ms
    assert b["service_s"] == pytest.approx(0.002)  # served - work: 1 ms per step
    assert b["rpc_s"] == pytest.approx(0.002)  # (3 + 5) - 7 ms served, per step
    assert b["scheduler_s"] == pytest.approx(0.004)  # 10 - 8 ms per step
    assert b["overhead_share"] == pytest.approx(0.4)
    assert sum(b[f"{p}_share"] for p in ("model", "service", "rpc", "scheduler")) == pytest.approx(1.0)
    assert b["phase_s"]["speculate"] == pytest.approx(0.006) and b["phase_s"]["verify"] == pytest.approx(0.010)
    assert b["model_s_by_service"] == {"target": pytest.approx(0.012)}  # call() spans are all the target's
    assert b["model_s_by_call"] == {"target:Speculate": pytest.approx(0.004), "target:Verify": pytest.approx(0.008)}


def test_steps_are_counted_once_whatever_the_batch():
    spans = [commit("t1", 7, 10, 10, 3, 5), commit("t2", 7, 10, 10, 3, 5), commit("t3", 8, 30, 10, 3, 5)]
    assert [s.number for s in steps_of(spans, {"t1", "t2"})] == [7]
    assert breakdown(spans, {"t9"}) is None


def test_by_config_groups_traces_by_request_id():
    spans = [request("t1", "a/1"), request("t2", "b/1"), commit("t1", 1, 10, 10, 3, 5),
             commit("t2", 2, 30, 10, 3, 5), call("TargetService/Verify", 24.0, 4.5, 4.0, trace="t2")]
    out = by_config(spans, {"a/1": "a", "b/1": "b", "c/1": "c"})
    assert set(out) == {"a", "b"}
    assert out["a"]["model_s"] == 0.0 and out["b"]["model_s"] == pytest.approx(0.004)


def test_step_costs_by_batch_size_and_chain_length():
    """Median phase times per (batch size, longest chain), and bench.step_costs pooling them over loads."""
    from bench.step_costs import pooled

    def at(trace, step, end_ms, batch, k, verify, speculate):
        span = commit(trace, step, end_ms, total=verify + speculate + 1, speculate=speculate, verify=verify)
        span.attributes.update({"tandem.batch_size": batch, "tandem.step_k_max": k})
        return span

    spans = [at("t1", 1, 10, 2, 1, 22, 5), at("t1", 2, 40, 2, 1, 24, 5), at("t1", 3, 70, 2, 1, 40, 5),
             at("t1", 4, 100, 8, 0, 27, 0)]  # fmt: skip
    cells = breakdown(spans, {"t1"})["step_ms_by_batch_k"]
    medians = {key: {f: v for f, v in row.items() if not f.endswith("_mean")} for key, row in cells.items()}
    assert medians == {"b=2,k=1": {"n": 3, "total": 30.0, "verify": 24.0, "speculate": 5.0},
                       "b=8,k=0": {"n": 1, "total": 28.0, "verify": 27.0, "speculate": 0.0}}  # fmt: skip
    # beside the medians, the means of the phases present (they add up where medians do not)
    assert cells["b=2,k=1"]["total_mean"] == pytest.approx((28 + 30 + 46) / 3)
    assert cells["b=2,k=1"]["select_mean"] == pytest.approx(0.1) and "commit_mean" not in cells["b=2,k=1"]
    other = {"b=2,k=1": {"n": 1, "total": 50.0, "verify": 40.0, "speculate": 9.0}}
    results = {"sweep": {"rate=1": {"k1": {"overhead": {"step_ms_by_batch_k": cells}}},
                         "rate=2": {"k1": {"overhead": {"step_ms_by_batch_k": other}}}}}  # fmt: skip
    got = pooled(results)["k1"]
    assert got[(2, 1)]["n"] == 4 and got[(2, 1)]["verify"] == pytest.approx((3 * 24 + 40) / 4)
    assert pooled(results, config="nope") == {}


def test_what_the_length_policy_rested_on_beside_the_measured_steps():
    """The policy's explain() on the commit spans (tandem.policy.*): medians per (batch size, longest chain)."""
    spans = []
    for step, (k, g0, g1, switch) in enumerate([(0, 30.0, 28.0, 12.0), (0, 32.0, 27.0, 8.0), (1, 30.0, 31.0, 0.0)]):
        span = commit("t1", step, 10 + 30 * step, total=25, speculate=3 * k, verify=20)
        span.attributes.update({"tandem.batch_size": 4, "tandem.step_k_max": k, "tandem.policy.goodput_k0": g0,
                                "tandem.policy.goodput_k1": g1, "tandem.policy.switch_tokens": switch})  # fmt: skip
        spans.append(span)
    cells = breakdown(spans, {"t1"})["step_ms_by_batch_k"]
    assert cells["b=4,k=0"]["policy_goodput_k0"] == 31.0 and cells["b=4,k=0"]["policy_switch_tokens"] == 10.0
    assert cells["b=4,k=1"]["policy_goodput_k1"] == 31.0 and "policy_alpha" not in cells["b=4,k=1"]
