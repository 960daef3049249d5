"""SmartSpec on synthetic iterations: goodput-optimal k from alpha and the step cost model."""

from __future__ import annotations

import numpy as np
import pytest

from scheduler.policies.shared_state import SharedState
from scheduler.policies.length_solver import best_request_ks, best_uniform_k
from scheduler.policies.smartspec import (
    SmartSpec,
    SmartSpecConfidence,
    SmartSpecConfig,
    chain_alpha_counts,
    expected_length,
)
from scheduler.policies.speculation import SpecContext, plan_shapes
from scheduler.policies.step_cost import OnlineFit, StepCostConfig, StepCostModel
from scheduler.request import Request, SpecMode, SpeculationSetting
from shared.engine.types import TokenTree
from shared.profiling.cost_model import CostModel
from tests.scheduler.sim_reports import CHEAP_DRAFT, EXPENSIVE_VERIFY, requests, run_steps


def test_expected_length_is_eq_8():
    assert expected_length(0.5, 0) == pytest.approx(1.0)
    assert expected_length(0.5, 3) == pytest.approx(1 + 0.5 + 0.25 + 0.125)
    assert expected_length(1.0, 4) == pytest.approx(5.0)  # alpha -> 1: every token accepted
    assert chain_alpha_counts(4, 4) == (4, 4) and chain_alpha_counts(4, 1) == (1, 2)


def test_uniform_k_grows_with_alpha_and_shrinks_with_batch():
    def k_for(alpha, n):
        ctx = np.full(n, 100.0)
        free = np.ones(n, bool)
        ks, _ = best_uniform_k(np.full(n, alpha), free, np.full(n, 8), np.zeros(n, int), ctx, EXPENSIVE_VERIFY, 8)
        return int(ks[0])

    assert k_for(0.9, 1) > k_for(0.5, 1) > 0
    assert k_for(0.7, 1) >= k_for(0.7, 8) >= k_for(0.7, 64)
    assert k_for(0.7, 64) == 0  # verifying is compute-bound at this batch: no speculation


def test_request_ks_give_more_to_the_predictable_request():
    alphas = np.array([0.95, 0.3])
    gains = alphas[:, None] ** np.arange(1, 9)[None, :]
    ks, g = best_request_ks(gains, np.ones(2, bool), np.full(2, 8), np.zeros(2, int), np.full(2, 50.0), CHEAP_DRAFT, 8)
    assert ks[0] > ks[1]
    # exact: no single change of one k improves the goodput
    def goodput(k):
        return float(expected_length(alphas, k).sum()) / CHEAP_DRAFT.step(k, [50, 50])
    assert goodput(ks) == pytest.approx(g)
    for i in range(2):
        for d in (-1, 1):
            other = ks.copy()
            other[i] += d
            if 0 <= other[i] <= 8:
                assert goodput(other) <= g + 1e-12


def _goodput(alphas, ks, contexts, cost, switch=None):
    """Eq. 3 as the policies model it: T(k) plus the steady-state feed, c_f per token a speculating request
    generates (step_cost.py; 0 unless the cost has a feed), plus c_f per catch-up token s_i of a request
    that resumes speculating (``switch``)."""
    ks = np.asarray(ks)
    lengths = expected_length(alphas, ks)
    fed = lengths + (0.0 if switch is None else switch)
    return float(lengths.sum()) / (cost.step(ks, contexts) + cost.feed_d * float(fed[ks > 0].sum()))


@pytest.mark.parametrize("feed,switch", [(False, False), (True, False), (True, True)])
def test_request_ks_are_the_exhaustive_optimum(feed, switch):
    """Dinkelbach per max depth (all depths solved at once) against every assignment of k in 0..K, with caps,
    a request held at a fixed k, and the verify-mode and draft-call costs that make k = 0 a corner; with a
    feed, which makes a request's first drafted token dearer (its bonus token is fed too) and every token a
    little dearer in proportion to its gain; with a switch, a catch-up that only a speculating request pays.
    Algorithm 2's one k is checked against the same goodput."""
    import dataclasses
    import itertools

    rng = np.random.default_rng(11 if switch else 7 if feed else 1)
    for _ in range(60):
        n, max_k = int(rng.integers(1, 4)), int(rng.integers(1, 5))
        alphas = rng.uniform(0.1, 0.95, n)
        gains = alphas[:, None] ** np.arange(1, max_k + 1)[None, :]
        free = np.array([True] * (n - 1) + [bool(rng.random() < 0.7)])
        caps = rng.integers(0, max_k + 1, n)
        fixed = np.where(free, 0, rng.integers(0, max_k + 1, n))
        contexts = rng.integers(10, 500, n).astype(float)
        cost = dataclasses.replace(CHEAP_DRAFT, call_t=float(rng.uniform(0, 0.01)), call_d=float(rng.uniform(0, 0.01)),
                                   feed_d=float(rng.uniform(0, 0.02)) if feed else 0.0)  # fmt: skip
        lag = rng.uniform(0, 30, n) * (rng.random(n) < 0.6) if switch else None  # some requests resume
        ks, g = best_request_ks(gains, free, caps, fixed, contexts, cost, max_k, switch=lag)
        choices = [range(int(c) + 1) if f else (int(k),) for f, c, k in zip(free, caps, fixed)]
        best = max(_goodput(alphas, k, contexts, cost, lag) for k in itertools.product(*choices))
        assert g == pytest.approx(best, rel=1e-9)
        assert _goodput(alphas, ks, contexts, cost, lag) == pytest.approx(g, rel=1e-9)
        uniform, gu = best_uniform_k(alphas, free, caps, fixed, contexts, cost, max_k, lag)
        assert gu == pytest.approx(_goodput(alphas, uniform, contexts, cost, lag), rel=1e-9)


def test_the_feed_is_what_makes_drafting_dear_at_large_batches():
    """The feature draft's measured shape (adaptive-eagle traces): a plain step ~22 ms + 0.7 ms per request, a
    speculate call ~4 ms + 1.6 ms per depth, and c_f ~0.3 ms per token fed. Without the feed, k = 1 looks as
    good at batch 8 as at batch 1; with it, batch 1 still drafts and batch 8 decodes plainly."""
    import dataclasses

    cost = dataclasses.replace(CHEAP_DRAFT, delta_t=0.022, gamma_t=0.0007, alpha_t=0.0, call_t=0.0, call_d=0.0025,
                               delta_d=0.0016, gamma_d=0.0003, alpha_d=0.0, feed_d=0.0003)  # fmt: skip
    no_feed = dataclasses.replace(cost, feed_d=0.0)

    def k_for(c, n):
        ctx = np.full(n, 200.0)
        return int(best_uniform_k(np.full(n, 0.45), np.ones(n, bool), np.full(n, 8), np.zeros(n, int), ctx, c, 8)[0][0])

    assert k_for(cost, 1) >= 1 and k_for(no_feed, 1) >= 1
    assert k_for(no_feed, 8) >= 1
    assert k_for(cost, 8) == 0

    ablation = SmartSpec(SmartSpecConfig(charge_feed=False))  # the policy's own switch: c_f stays fitted, unused
    assert ablation.name == "smartspec-nofeed" and ablation.step_cost(SpecContext(0.0, 0, True)).feed_d == 0.0


def test_a_resumed_request_pays_its_catch_up_spread_over_the_horizon():
    """s_i (the switch): the lag of a request the draft holds that did not speculate in the last step, over
    switch_horizon steps or the tokens it has left; 0 for one that speculated (the feed priced it) or that the
    draft does not hold (a resync, out of the fit)."""
    policy = SmartSpec(SmartSpecConfig(switch_horizon=4))
    resumed, steady, short, off_draft = (Request(n, [1] * 10, max_new_tokens=100) for n in ("a", "b", "c", "d"))
    for r in (resumed, steady, short, off_draft):
        r.output_ids = [2] * 30  # 40 tokens; the draft was given 10 (a, c, d) or 38 (b)
        r.on_draft, r.draft_seen = True, 10
    steady.draft_seen = 38
    short.max_new_tokens = 32  # 2 tokens left
    off_draft.on_draft = False
    policy._last = (7, {"a": (0, 40, True), "b": (3, 40, True), "c": (0, 40, True)})
    assert policy._switch([resumed, steady, short, off_draft]).tolist() == [29 / 4, 0.0, 29 / 2, 0.0]
    steady.draft_seen = 10  # a request new to the batch (not in the last step) is charged its lag too
    policy._last = (7, {})
    assert policy._switch([steady]).tolist() == [29 / 4]


def test_the_switch_keeps_a_lagging_batch_plain_where_a_caught_up_one_drafts():
    """The feature draft's shape (as above): at batch 4 and alpha 0.7, k > 0 pays for requests the draft is caught
    up with, but not when each would first feed 60 tokens of catch-up spread over 4 steps (c_f x 15 each)."""
    import dataclasses

    cost = dataclasses.replace(CHEAP_DRAFT, delta_t=0.022, gamma_t=0.0007, alpha_t=0.0, call_t=0.0, call_d=0.0025,
                               delta_d=0.0016, gamma_d=0.0003, alpha_d=0.0, feed_d=0.0003)  # fmt: skip
    n, ctx = 4, np.full(4, 200.0)
    args = (np.full(n, 0.7), np.ones(n, bool), np.full(n, 8), np.zeros(n, int), ctx, cost, 8)
    assert best_uniform_k(*args)[0][0] >= 1
    assert best_uniform_k(*args, np.full(n, 15.0))[0][0] == 0
    gains = np.full(n, 0.7)[:, None] ** np.arange(1, 9)[None, :]
    assert best_request_ks(gains, *args[1:])[0].max() >= 1
    assert best_request_ks(gains, *args[1:], switch=np.full(n, 15.0))[0].max() == 0
    assert SmartSpec(SmartSpecConfig(charge_switch=False)).name == "smartspec-noswitch"
    assert SmartSpec(SmartSpecConfig(charge_switch=False, granularity="request")).name == "smartspec-request-noswitch"


def test_learns_alpha_and_costs_then_speculates_long_when_acceptance_is_high():
    policy = SmartSpec()
    chosen = run_steps(policy, requests(2), [0.95, 0.95], CHEAP_DRAFT, steps=60)
    assert policy.alpha() > 0.85
    assert np.mean(chosen[-10:]) >= 5
    cost = policy.step_cost(SpecContext(0.0, 0, True))
    ks, ctx = chosen[-1], [r.num_tokens for r in requests(2)]
    assert cost.step(ks, ctx) == pytest.approx(CHEAP_DRAFT.step(ks, ctx), rel=0.05)  # learned from measured times

    low = SmartSpec()
    chosen_low = run_steps(low, requests(2), [0.2, 0.2], CHEAP_DRAFT, steps=60)
    assert np.mean(chosen_low[-10:]) < np.mean(chosen[-10:])


def test_expensive_verification_at_large_batch_means_no_speculation():
    profiled = CostModel(alpha_s=0.0, gamma_s=EXPENSIVE_VERIFY.gamma_t, delta_s=EXPENSIVE_VERIFY.delta_t)
    policy = SmartSpec()
    ctx = {"cost_model": profiled}
    small = run_steps(policy, requests(1), [0.8], EXPENSIVE_VERIFY, steps=30, ctx_extra=ctx)
    big = run_steps(policy, requests(48, prefix="b"), [0.8] * 48, EXPENSIVE_VERIFY, steps=20, start_step=30, ctx_extra=ctx)
    assert np.mean(small[-5:]) >= 2
    assert all(k == 0 for ks in big[-5:] for k in ks)


def test_per_request_granularity_and_fixed_or_off_requests():
    policy = SmartSpec(SmartSpecConfig(granularity="request"))
    assert policy.name == "smartspec-request"
    batch = requests(2)
    run_steps(policy, batch, [0.95, 0.1], CHEAP_DRAFT, steps=80)
    ks = [s.max_depth for s in plan_shapes(policy, batch, SpecContext(0.0, 999, True))]
    assert ks[0] > ks[1]
    fixed = Request("f", [1] * 5, max_new_tokens=50, speculation=SpeculationSetting(SpecMode.FIXED, 2))
    off = Request("o", [1] * 5, max_new_tokens=50, speculation=SpeculationSetting(SpecMode.OFF))
    shapes = plan_shapes(policy, [*batch, fixed, off], SpecContext(0.0, 1000, True))
    assert shapes[2].k == 2 and not shapes[3].speculates


def test_prefill_disabling_rule():
    policy = SmartSpec(SmartSpecConfig(prefill_min_decisions=8))
    fresh = Request("new", [1] * 5)
    assert policy.wants_draft(fresh)
    run_steps(policy, requests(48), [0.6] * 48, EXPENSIVE_VERIFY, steps=5)  # high load: k = 0 throughout
    late = Request("late", [1] * 5)
    assert not policy.wants_draft(late)
    shapes = plan_shapes(policy, [late], SpecContext(0.0, 100, True))
    assert not shapes[0].speculates  # classified non-speculative for good, even alone in the batch


def test_request_granularity_counts_steps_not_requests_for_the_prefill_rule():
    """§5 records the proposed length per step: one predictable request drafting beside three that are
    not worth a token is a speculating step, and new requests still go onto the draft."""
    policy = SmartSpec(SmartSpecConfig(granularity="request", prefill_min_decisions=8, prefill_disable_threshold=0.6))
    good, bad = requests(1, prefix="g"), requests(3, prefix="b")
    run_steps(policy, good, [0.95], EXPENSIVE_VERIFY, steps=40)
    chosen = run_steps(policy, good + bad, [0.95, 0.0, 0.0, 0.0], EXPENSIVE_VERIFY, steps=100, start_step=40)
    window = chosen[-policy.config.prefill_window :]
    per_request = sum(k == 0 for ks in window for k in ks) / sum(len(ks) for ks in window)
    assert per_request > policy.config.prefill_disable_threshold  # counted one by one, the rule would bar
    assert sum(ks[0] > 0 for ks in window) > 0.9 * len(window)  # while the predictable request drafts
    assert policy._zero_share() < policy.config.prefill_disable_threshold
    assert policy.wants_draft(Request("late", [1] * 5))
    # a step where no request drafts is a k = 0 decision: under load the rule fires as in batch granularity
    run_steps(policy, requests(48, prefix="c"), [0.6] * 48, EXPENSIVE_VERIFY, steps=70, start_step=140)
    assert not policy.wants_draft(Request("later", [1] * 5))


def test_prefill_rule_lifts_when_the_load_drops():
    policy = SmartSpec(SmartSpecConfig(prefill_min_decisions=8))
    run_steps(policy, requests(48), [0.6] * 48, EXPENSIVE_VERIFY, steps=5)  # high load: the rule fires
    late = requests(2, prefix="late")
    assert not any(policy.wants_draft(r) for r in late)
    # low load now: the late requests do not speculate at first, but what they *would* get is recorded,
    # the window moves on, and once k = 0 is no longer the rule they come back to the draft
    chosen = run_steps(policy, late, [0.6, 0.6], EXPENSIVE_VERIFY, steps=85, start_step=5)
    assert all(k == 0 for k in chosen[0])
    assert all(k > 0 for ks in chosen[-10:] for k in ks)  # the high-load steps left the 64-step window
    assert policy.wants_draft(Request("next", [1] * 5))  # new requests draft again too


def test_prefill_rule_lifts_within_a_few_steps_of_the_lull():
    """The lift reads the last prefill_lift_steps steps: a burst's 48-decision steps, still in the 64-step
    window, must not keep the lull's requests off the draft for the window's length."""
    policy = SmartSpec(SmartSpecConfig(prefill_min_decisions=8))
    run_steps(policy, requests(48), [0.6] * 48, EXPENSIVE_VERIFY, steps=20)  # a burst: 20 steps of 48 x k = 0
    late = requests(1, prefix="late")
    assert not policy.wants_draft(late[0])
    chosen = run_steps(policy, late, [0.6], EXPENSIVE_VERIFY, steps=20, start_step=20)
    back = next(i for i, ks in enumerate(chosen) if ks[0] > 0)
    assert back <= policy.config.prefill_lift_steps + 1
    assert policy._zero_share() > policy.config.prefill_disable_threshold  # the whole window still says k = 0
    assert policy.wants_draft(Request("next", [1] * 5))  # and new requests draft: the load now decides


def test_prefill_rule_for_good_as_in_the_paper():
    policy = SmartSpec(SmartSpecConfig(prefill_min_decisions=8, prefill_lift_threshold=None))
    run_steps(policy, requests(48), [0.6] * 48, EXPENSIVE_VERIFY, steps=5)
    late = requests(2, prefix="late")
    assert not any(policy.wants_draft(r) for r in late)
    chosen = run_steps(policy, late, [0.6, 0.6], EXPENSIVE_VERIFY, steps=70, start_step=5)
    assert all(k == 0 for ks in chosen for k in ks)  # §5: non-speculative for all subsequent steps
    assert policy.wants_draft(Request("next", [1] * 5))


def test_alpha_falls_back_to_the_prior_after_a_window_without_speculation():
    cfg = SmartSpecConfig(alpha_window=8)
    policy = SmartSpec(cfg)
    run_steps(policy, requests(4), [0.0] * 4, EXPENSIVE_VERIFY, steps=6)  # nothing accepted: alpha collapses
    assert policy.alpha() < 0.35
    chosen = run_steps(policy, requests(4), [0.6] * 4, EXPENSIVE_VERIFY, steps=40, start_step=6)
    first_off = next(i for i, ks in enumerate(chosen) if not any(ks))
    probe = next((i for i, ks in enumerate(chosen) if i > first_off and any(ks)), None)
    assert probe is not None and probe <= first_off + cfg.alpha_window + 1  # tries again within a window
    assert policy.alpha() > 0.4  # and learns the real acceptance


def test_a_faded_alpha_probes_with_the_shortest_chain():
    """What the policy saw fades per step (alpha_decay), so the estimate drifts back toward the prior
    and crosses k = 1's break-even first: probes are short chains, not the prior's long ones (the
    draft fit fades toward its prior too, cheaper here than the truth, so one probe may take two).
    Costs as profiled on this project's CPU (k = 1 breaks even near alpha 0.27), true alpha 0.28."""
    from scheduler.policies.step_cost import StepCost
    from shared.profiling.cost_model import CostModel

    cpu = StepCost(delta_t=0.0645, gamma_t=0.0017, alpha_t=1.2e-5, call_d=0.002, delta_d=0.0057, gamma_d=0.0003,
                   alpha_d=0.0, call_t=0.0103)  # fmt: skip
    prior = CostModel(alpha_s=1.2e-5, gamma_s=0.0017, delta_s=0.0645, verify_s=0.0103)
    policy = SmartSpec()
    chosen = run_steps(policy, requests(6, prompt=300), [0.28] * 6, cpu, steps=400, ctx_extra={"cost_model": prior})
    probes = [max(ks) for ks in chosen[50:] if any(ks)]
    assert probes and max(probes) <= 2 and probes.count(1) > 0.9 * len(probes)  # it does look again, short
    assert len(probes) < 0.1 * len(chosen[50:])  # rarely
    window = SmartSpec(SmartSpecConfig(alpha_window=8, alpha_decay=0.5))
    window.state.state["alpha"] = [[1.0, 4.0], [0, 0], [0, 0]]  # one observation, two dry steps since
    assert window.alpha() == pytest.approx((0.25 * 1.0 + 0.6 * 4.0) / (0.25 * 4.0 + 4.0))


def test_confidence_variant_drafts_with_threshold_and_verifies_the_goodput_prefix():
    policy = SmartSpecConfidence(SmartSpecConfig(confidence_threshold=0.4, max_k=6))
    batch = requests(2)
    shapes = plan_shapes(policy, batch, SpecContext(0.0, 0, True))
    assert shapes[0] == shapes[1] and shapes[0].k == 6 and shapes[0].confidence_threshold == 0.4
    sure = TokenTree.chain([5, 6, 7, 8], [0.99, 0.99, 0.98, 0.97])
    unsure = TokenTree.chain([5, 6, 7, 8], [0.9, 0.05, 0.5, 0.5])
    out = policy.tree_selector().select(batch, [sure, unsure], SpecContext(0.0, 0, True))
    assert len(out[0]) == 4 and len(out[1]) == 1 and out[1].token_ids == [5]


def test_learned_state_merges_like_applying_locally():
    a = SmartSpec()
    run_steps(a, requests(3), [0.7] * 3, CHEAP_DRAFT, steps=10)
    events = a.state.take()
    stored = a.state.merge(None, events)
    b = SmartSpec()
    b.state.adopt(stored)
    assert b.alpha() == pytest.approx(a.alpha())
    assert b.state.state["costs"] == a.state.state["costs"]
    other = SharedState("x", 99, dict, lambda s, e: s)
    other.adopt(stored)  # another version: ignored
    assert other.num_adopted == 0


def test_online_fit_recovers_a_linear_cost():
    fit = OnlineFit((1.0, 16.0, 4096.0), (0.0, 0.0, 0.0), prior_steps=0.1, forgetting=1.0)
    state = fit.empty()
    rng = np.random.default_rng(0)
    for _ in range(50):
        x = [1.0, float(rng.integers(1, 64)), float(rng.integers(10, 5000))]
        state = fit.update(state, x, 0.01 + 0.002 * x[1] + 1e-6 * x[2])
    assert fit.solve(state) == pytest.approx([0.01, 0.002, 1e-6], rel=0.05)
    assert StepCostModel.measurement([0, 0], [10, 20], 0.05, None) == {"verify_s": 0.05,
                                                                       "x_target": [1.0, 2, 30.0, 0.0, 2.0]}  # fmt: skip
    assert StepCostModel.measurement([1, 0], [10, 20], 0.06, 0.01)["x_target"] == [1.0, 3, 30.0, 1.0, 2.0]


def test_the_fit_tells_a_request_from_a_token():
    """gamma_r: what a request costs beyond its token (the feature-draft stack: ~1.1 ms per request in a plain
    step, ~0.8 per extra verified token). Plain steps alone cannot split the two; verify steps of several chain
    lengths beside them do, and a k = 1 step at batch 8 is then modelled as it is measured."""
    import dataclasses

    truth = dataclasses.replace(CHEAP_DRAFT, delta_t=0.045, gamma_t=0.0008, gamma_r=0.0003, alpha_t=0.0)
    model = StepCostModel(config=StepCostConfig(per_request=True))  # smartspec-reqcost
    state = model.empty()
    rng = np.random.default_rng(3)
    events = []
    for _ in range(200):
        n = int(rng.integers(1, 11))
        ks = [int(rng.integers(0, 3)) if rng.random() < 0.7 else 0 for _ in range(n)]
        contexts = [200] * n
        verify = truth.step([0] * n, contexts) + sum(ks) * truth.gamma_t  # the target's share of the step
        events.append(StepCostModel.measurement(ks, contexts, verify, None))
        state = model.apply(state, events[-1])
    cost = model.current(state)
    assert cost.gamma_t == pytest.approx(0.0008, rel=0.1) and cost.gamma_r > 0.00015  # the ridge prior holds it at 0
    ablation = StepCostModel()  # the default: eq. 4-7's per-token cost alone
    ablated = ablation.empty()
    for event in events:
        ablated = ablation.apply(ablated, event)
    assert ablation.current(ablated).gamma_r == 0.0
    ctx = np.full(8, 200.0)
    assert cost.base(ctx) == pytest.approx(truth.base(ctx), rel=0.02)  # a plain step at batch 8
    assert cost.step([1] * 8, ctx) - cost.spec_overhead() - 8 * cost.gamma_d - cost.delta_d == pytest.approx(
        truth.base(ctx) + 8 * truth.gamma_t, rel=0.02)  # its target side at k = 1  # fmt: skip


def test_learns_the_verify_mode_overhead_and_stops_speculating_where_it_eats_the_gain():
    import dataclasses

    truth = dataclasses.replace(CHEAP_DRAFT, call_t=0.02)  # a verify pass costs 20 ms more than a decode
    policy = SmartSpec(SmartSpecConfig(alpha_window=16))
    chosen = run_steps(policy, requests(1), [0.3], truth, steps=300)
    learned = policy.step_cost(SpecContext(0.0, 0, True))
    assert 0.01 < learned.call_t < 0.03  # seen only on the probing steps, against a prior of 0
    assert np.mean([ks[0] > 0 for ks in chosen[-100:]]) < 0.25  # k = 1 would gain 0.3 tokens for +70 % time
    plain = SmartSpec(SmartSpecConfig(alpha_window=16))  # without the overhead the same acceptance pays
    chosen = run_steps(plain, requests(1, prefix="p"), [0.3], CHEAP_DRAFT, steps=300)
    assert np.mean([ks[0] > 0 for ks in chosen[-100:]]) > 0.75


def test_a_stack_overhead_the_profile_missed_is_a_per_step_cost_not_a_verify_cost():
    """The profile times the bare engine (14.7 ms a step); the stack costs 22.5 ms a step whether it verifies
    or decodes. With 1 plain decode in 12 steps (what SmartSpec's window held at low load) the excess belongs to
    delta_t: a plain decode is predicted at its cost, and c_t stays near the truth, 0 (it came out 2.3-3.1 ms
    when the prior held delta_t as firmly as c_t, and k = 0 looked 2.5 ms cheaper than it is)."""
    profile = CostModel(alpha_s=5.8e-6, gamma_s=6.65e-4, delta_s=14.66e-3)
    model = StepCostModel(profile)
    state = model.empty()
    for step in range(120):
        ks = [0] if step % 12 == 0 else [1 + step % 2]
        state = model.apply(state, StepCostModel.measurement(ks, [400], 0.0225, 0.005 if ks[0] else None))
    cost = model.current(state)
    assert cost.call_t < 0.5e-3
    assert cost.step([0], [400]) == pytest.approx(0.0225, rel=0.05)  # 20.0 ms, 11 % low, before


def test_cost_probes_show_the_fit_a_plain_decode_now_and_then():
    """A policy that always speculates decodes plainly once per ``cost_probe_steps``; the probe is not a
    decision (the prefill rule and the deferral do not count it)."""
    policy = SmartSpec(SmartSpecConfig(cost_probe_steps=8))
    chosen = run_steps(policy, requests(1), [0.9], CHEAP_DRAFT, steps=40)
    plain = [i for i, ks in enumerate(chosen) if ks == [0]]
    assert plain == [8, 17, 26, 35]  # 8 speculating steps, then a probe
    assert policy._zero_share() == 0.0 and policy.explain()["cost_probe"] == 0.0
    never = SmartSpec(SmartSpecConfig(cost_probe_steps=None))
    assert all(ks != [0] for ks in run_steps(never, requests(1, prefix="n"), [0.9], CHEAP_DRAFT, steps=40))


def test_a_draft_resync_is_no_drafting_cost_and_a_slow_call_fades():
    """The first speculate for a request re-prefills it on the draft (a feature draft: through the target
    too); charged to the speculate fit, one such 60 ms call lifted c_d from 2 to 17 ms on a real stack and
    SmartSpec never drafted again, since only drafting refreshed the fit. The resync is now timed apart and
    left out, and a fit that drafting no longer refreshes fades toward its prior."""
    from scheduler.report import PhaseTimes, RequestOutcome, StepReport

    def step(policy: SmartSpec, n: int, speculate_s: float, sync_s: float) -> list[int]:
        batch = requests(1)
        ks = [s.max_depth for s in plan_shapes(policy, batch, SpecContext(float(n), n, True))]
        report = StepReport(step=n, started_at=float(n), times=PhaseTimes(verify=0.02, speculate=speculate_s if ks[0]
                                                                           else 0.0, draft_sync=sync_s if ks[0] else 0.0))
        report.outcomes = [RequestOutcome("r0", plan_shapes(policy, batch, SpecContext(float(n), n, True))[0], ks[0],
                                          min(ks[0], 1), min(ks[0], 1) + 1)]  # fmt: skip
        policy._last = (n, {"r0": (ks[0], 20, True)})  # the decision observed is the first one above
        policy.observe(report)
        return ks

    cheap = CostModel(alpha_s=0.0, gamma_s=6e-4, delta_s=0.0174)
    resynced = SmartSpec()
    resynced._costs = StepCostModel(cheap, None)
    resynced._cost_priors = (None, None)
    assert step(resynced, 0, 0.060, 0.052)[0] > 0  # drafts, and the call was mostly a resync
    assert resynced.step_cost(SpecContext(0.0, 1, True)).call_d < 0.005
    assert StepCostModel.observed([2], [20], StepReport(0, 0.0, PhaseTimes(speculate=0.06, draft_sync=0.05,
                                                                          verify=0.02)))["speculate_s"] == pytest.approx(0.01)

    clipped = StepCostModel()  # the default holds a measurement within +-50 % of the prediction
    once = clipped.apply(clipped.empty(), StepCostModel.measurement([2], [20], 0.02, 0.080))
    assert clipped.current(once).call_d < 0.004
    model = StepCostModel(config=StepCostConfig(outlier_clip=None))  # as measured: the fade must undo it
    slow = model.apply(model.empty(), StepCostModel.measurement([2], [20], 0.02, 0.080))  # one cold 80 ms call
    assert model.current(slow).call_d > 0.01
    for _ in range(300):  # plain decoding since (6 s of 20 ms steps): the verify fit is observed, the draft fit is not
        slow = model.apply(slow, StepCostModel.measurement([0], [20], 0.02, None))
    assert model.current(slow).call_d < 0.003  # back near the prior (2 ms): the policy will look again


def test_explain_reports_what_the_decision_rested_on():
    """The numbers behind a decision, for the step's trace attributes: alpha, k, fitted costs, modelled goodput."""
    from scheduler.policies.nightjar import Nightjar
    from tests.scheduler.sim_reports import CHEAP_DRAFT, requests, run_steps

    policy = SmartSpec()
    assert policy.explain() == {}
    run_steps(policy, requests(2), [0.8, 0.8], CHEAP_DRAFT, steps=30)
    info = policy.explain()
    assert 0 < info["alpha"] < 1 and info["num_free"] == 2
    assert info["goodput"] == pytest.approx(max(info[f"goodput_k{j}"] for j in range(4))) or info["k"] > 3
    assert info["delta_t_ms"] > 0 and all(isinstance(v, float) for v in info.values())
    bandit = Nightjar()
    batch = requests(1)
    run_steps(bandit, batch, [0.8], CHEAP_DRAFT, steps=10)
    plan_shapes(bandit, batch, SpecContext(now=10.0, step=10, draft_available=True))  # explain follows a decide
    info = bandit.explain()
    assert info["bucket"] == 1.0 and sum(info[f"plays_k{j}"] for j in range(bandit.num_arms)) >= 9


def test_one_stalled_verify_does_not_drag_the_fit():
    """A 258 ms verify among 25 ms ones (seen on the stack) enters held at 1.5x the prediction."""
    model = StepCostModel()
    state = model.empty()
    for _ in range(60):
        state = model.apply(state, StepCostModel.measurement([0] * 8, [150] * 8, 0.025, None))
    before = model.current(state).step([0] * 8, [150] * 8)
    after = model.current(model.apply(state, StepCostModel.measurement([0] * 8, [150] * 8, 0.258, None)))
    assert before == pytest.approx(0.025, rel=0.05)
    assert after.step([0] * 8, [150] * 8) < before * 1.05
    raw = StepCostModel(config=StepCostConfig(outlier_clip=None))
    assert raw.current(raw.apply(state, StepCostModel.measurement([0] * 8, [150] * 8, 0.258, None))).step(
        [0] * 8, [150] * 8) > before * 1.2  # fmt: skip


def test_a_failing_explain_costs_nothing_but_its_attributes():
    from scheduler.policies.speculation import FixedChain, explained

    class Broken(FixedChain):
        def explain(self) -> dict[str, float]:
            raise RuntimeError("bug")

    assert explained(Broken(2)) == {} and explained(FixedChain(2)) == {}


def test_batch_prefix_search_is_algorithm_2_lines_2_to_11():
    """batch_search: of the FCFS prefixes of the running requests, the best goodput with its own optimal k that
    has the slots; a request left out max_hold_steps steps in a row is in every candidate."""
    from scheduler.policies.step_cost import StepCost

    # attending to context is dear: a 20 000-token request costs the step more than its tokens are worth
    dear_context = StepCost(delta_t=0.010, gamma_t=0.001, alpha_t=2e-6, call_d=0.001, delta_d=0.002,
                            gamma_d=0.0001, alpha_d=0.0)  # fmt: skip
    policy = SmartSpec(SmartSpecConfig(batch_search=True, max_hold_steps=3))
    policy.step_cost = lambda ctx: dear_context
    batch = requests(3, prompt=50)
    batch.append(Request("long", [1] * 20_000, max_new_tokens=1000))
    for i, r in enumerate(batch):
        r.arrival_time = float(i)  # FCFS order: r0, r1, r2, long
    ctx = SpecContext(0.0, 0, True)
    assert [r.id for r in policy.step_batch(list(reversed(batch)), ctx)] == ["r0", "r1", "r2"]
    # the same rule as decide: the prefix's goodput at its own k beats the whole batch's at its own
    alpha, alphas, free, caps, fixed, contexts, cost, switch = policy._inputs(batch, ctx)
    g_all = policy._optimise(alpha, alphas, free, caps, fixed, contexts, cost, switch)[1]
    g_three = policy._optimise(alpha, alphas, free[:3], caps[:3], fixed[:3], contexts[:3], cost, switch[:3])[1]
    assert g_three > g_all
    # HasSlot: a KV budget that only fits two requests and their drafts
    tight = SpecContext(0.0, 0, True, max_tokens_in_flight=2 * 50 + 20)
    assert [r.id for r in SmartSpec(SmartSpecConfig(batch_search=True)).step_batch(batch, tight)] == ["r0", "r1"]
    # left out three steps in a row (once above, twice here): then it runs, with everything before it
    assert len(policy.step_batch(batch, ctx)) == 3
    assert len(policy.step_batch(batch, ctx)) == 3
    assert [r.id for r in policy.step_batch(batch, ctx)] == ["r0", "r1", "r2", "long"]
    # off (the default): the batch as admission formed it
    assert SmartSpec().step_batch(batch, ctx) == batch
    assert SmartSpec(SmartSpecConfig(batch_search=True)).name == "smartspec-prefix"
