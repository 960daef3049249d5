"""The order replay: mean completion of jobs on a few servers, and the bounds it gives bench-order's goal."""

import pytest

from bench.order_replay import distinct_samples, order_bounds, replay


def test_replay_is_list_scheduling_on_the_first_free_server():
    assert replay([3, 1, 2], slots=1) == pytest.approx((3 + 4 + 6) / 3)
    assert replay([3, 1, 2], slots=2) == pytest.approx((3 + 1 + 3) / 3)  # the 2 starts when the 1 ends
    assert replay([], slots=4) == 0.0


def row(i, bound, tokens, steps, ttft, rep=0):
    return {"id": f"order:fcfs/closed0-r{rep}-i{i}", "max_new_tokens": bound, "tokens": tokens, "steps": steps,
            "ttft_s": ttft, "latency_s": ttft + 1}  # fmt: skip


def test_bounds_are_relative_to_fcfs_order_by_ttft():
    # FCFS ran the long job first; SJF by anything puts the short one first: (1 + 4) / 2 vs (3 + 4) / 2
    rows = [row(0, 100, 90, 3, ttft=0.1), row(1, 10, 10, 1, ttft=0.2)]
    b = order_bounds(rows, slots=1)
    assert b == pytest.approx({"sjf_bound": 5 / 7, "sjf_tokens": 5 / 7, "sjf_steps": 5 / 7})
    # the bound misleads (a stop token): SJF by bound keeps FCFS's order, the oracles do not
    rows = [row(0, 10, 10, 3, ttft=0.1), row(1, 100, 5, 1, ttft=0.2)]
    assert order_bounds(rows, slots=1) == pytest.approx({"sjf_bound": 1.0, "sjf_tokens": 5 / 7, "sjf_steps": 5 / 7})


def test_each_repeat_is_replayed_alone():
    rows = [row(0, 100, 90, 3, 0.1, rep=0), row(1, 10, 10, 1, 0.2, rep=0),  # 5/7
            row(0, 10, 10, 1, 0.1, rep=1), row(1, 100, 90, 3, 0.2, rep=1)]  # already SJF: 1.0  # fmt: skip
    assert order_bounds(rows, slots=1)["sjf_steps"] == pytest.approx((5 / 7 + 1) / 2)
    assert order_bounds([row(0, 1, 1, 1, 0.1)], slots=1) is None  # nothing to reorder


def test_distinct_samples_tells_one_sample_repeated_from_a_draw_per_repeat():
    def rows(rep, prompts):
        return [{"id": f"order:fcfs/closed0-r{rep}-i{i}", "prompt_tokens": p, "max_new_tokens": 8}
                for i, p in enumerate(prompts)]  # fmt: skip

    assert not distinct_samples(rows(0, [10, 20]) + rows(1, [20, 10]))  # the same requests, finished in another order
    assert distinct_samples(rows(0, [10, 20]) + rows(1, [10, 30]))
