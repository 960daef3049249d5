"""The order replay: mean completion of jobs on a few servers, and the bounds it gives bench-order's goal."""

import pytest

from bench.order_replay import LoopCosts, distinct_samples, loop_replay, order_bounds, replay, replayed_order


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
    assert b.pop("model") == "slots"  # no spans, no prompt lengths: a server per request for its rounds
    assert b == pytest.approx({"sjf_bound": 5 / 7, "sjf_tokens": 5 / 7, "sjf_steps": 5 / 7})
    # the bound misleads (a stop token): SJF by bound keeps FCFS's order, the oracles do not
    rows = [row(0, 10, 10, 3, ttft=0.1), row(1, 100, 5, 1, ttft=0.2)]
    b = order_bounds(rows, slots=1)
    del b["model"]
    assert b == pytest.approx({"sjf_bound": 1.0, "sjf_tokens": 5 / 7, "sjf_steps": 5 / 7})


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


def test_the_loop_stalls_the_batch_for_each_prefill_and_runs_a_round_for_all():
    costs = LoopCosts({1: 1.0, 2: 1.5}, prefill_s_per_token=0.01)
    # two slots: both prefilled (100 + 300 tokens: 4 s), rounds of 2 at 1.5 s: the 1-round job ends at 5.5,
    # the 2-round one runs its second round alone (1 s): 6.5
    assert loop_replay([(1, 100), (2, 300)], slots=2, costs=costs) == pytest.approx((5.5 + 6.5) / 2)
    # one slot: 1 s prefill + 1 round = 2; then 3 s prefill + 2 rounds = 7
    assert loop_replay([(1, 100), (2, 300)], slots=1, costs=costs) == pytest.approx((2 + 7) / 2)
    assert costs.round(3) == 1.5 and LoopCosts({2: 1.5}, 0.0).round(1) == 1.5  # unmeasured sizes: the nearest


def test_with_fcfs_spans_the_bounds_replay_the_engine_loop():
    rows = [dict(row(0, 100, 90, 3, ttft=0.1), prompt_tokens=1000), dict(row(1, 10, 10, 1, ttft=0.2), prompt_tokens=10),
            dict(row(2, 50, 50, 2, ttft=0.3), prompt_tokens=10)]  # fmt: skip
    overhead = {"phase_s": {"prefill": 1.02},  # 1 ms per prompt token
                "step_ms_by_batch_k": {"b=1,k=3": {"n": 10, "total": 100.0}, "b=2,k=3": {"n": 30, "total": 150.0}}}
    costs = LoopCosts.of(overhead, rows)
    assert costs.round_s == pytest.approx({1: 0.1, 2: 0.15}) and costs.prefill_s_per_token == pytest.approx(1e-3)
    b = order_bounds(rows, slots=2, overhead=overhead)
    assert b["model"] == "loop"
    fcfs = loop_replay([(3, 1000), (1, 10), (2, 10)], 2, costs)
    assert b["sjf_steps"] == pytest.approx(loop_replay([(1, 10), (2, 10), (3, 1000)], 2, costs) / fcfs)
    assert LoopCosts.of(None, rows) is None and LoopCosts.of(overhead, [row(0, 1, 1, 1, 0.1)]) is None


def test_a_policy_s_own_order_is_replayed_on_fcfs_s_work_and_costs():
    def rows(policy, ttfts, steps=(3, 1, 2), prompts=(1000, 10, 10)):
        return [{"id": f"{policy}/closed0-r0-i{i}", "steps": s, "prompt_tokens": p, "ttft_s": t, "max_new_tokens": 9,
                 "tokens": 9} for i, (s, p, t) in enumerate(zip(steps, prompts, ttfts))]  # fmt: skip

    overhead = {"phase_s": {"prefill": 1.02},
                "step_ms_by_batch_k": {"b=1,k=3": {"n": 10, "total": 100.0}, "b=2,k=3": {"n": 30, "total": 150.0}}}
    fcfs = rows("order:fcfs", (0.1, 0.2, 0.3))
    costs = LoopCosts.of(overhead, fcfs)
    assert replayed_order(rows("order:laps-sd", (0.1, 0.2, 0.3)), fcfs, 2, overhead) == pytest.approx([1.0])
    # its own rounds do not count (a policy's preemptions and the machine's speed in its run): FCFS's work does
    sjf = rows("order:lp-sjf", (0.3, 0.1, 0.2), steps=(9, 9, 9))
    expected = loop_replay([(1, 10), (2, 10), (3, 1000)], 2, costs) / loop_replay([(3, 1000), (1, 10), (2, 10)], 2, costs)
    assert replayed_order(sjf, fcfs, 2, overhead) == pytest.approx([expected]) and expected < 1
    assert replayed_order(sjf, fcfs, 2, None) is None  # no spans: no loop model
