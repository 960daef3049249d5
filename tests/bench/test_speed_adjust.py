"""The machine-speed adjustment of latency ratios: each run scaled by its own step times at a shared shape."""

import pytest

from bench.speed_adjust import adjusted_ratios, shared_shape


def run(rep, latency, verify_ms, n=100, other=None):
    steps = {"b=4,k=3": {"n": n, "total": verify_ms + 5, "verify": verify_ms}}
    steps.update(other or {})
    return {"repeat": rep, "latency_mean_s": latency, "step_ms_by_batch_k": steps}


def test_a_run_on_a_slower_machine_is_scaled_back_by_its_step_time():
    fcfs = [run(0, 30.0, 100.0), run(1, 36.0, 120.0)]  # the same work, the machine 20 % slower in repeat 1
    policy = [run(0, 24.0, 100.0), run(1, 24.0, 100.0)]  # repeat 1 looks 33 % faster only because FCFS was slow
    assert [x for x in adjusted_ratios(policy, fcfs)] == pytest.approx([0.8, 0.8])


def test_the_gauge_is_the_shape_both_ran_most_and_every_run_measured():
    a = [run(0, 1.0, 10.0, n=5, other={"b=1,k=3": {"n": 50, "verify": 3.0}})]
    b = [run(0, 1.0, 10.0, n=90)]
    assert shared_shape(a, b) == "b=4,k=3"  # b=1 has more steps in a, but b never ran it
    assert shared_shape(a, [{"repeat": 0, "latency_mean_s": 1.0}]) is None


def test_runs_without_step_times_give_no_adjustment():
    assert adjusted_ratios([{"repeat": 0, "latency_mean_s": 1.0}], [run(0, 1.0, 10.0)]) is None
    assert adjusted_ratios([run(0, 1.0, 10.0)], [run(1, 1.0, 10.0)]) is None  # no repeat in common
