"""FASER's Adaptive Drafter on synthetic iterations: per-request GP-LCB over a sliding window."""

from __future__ import annotations

import time

import numpy as np
import pytest

from scheduler.policies.faser import Faser, FaserConfig
from scheduler.policies.gp import ExactGP
from scheduler.policies.speculation import SpecContext, plan_shapes
from shared.profiling.cost_model import CostModel
from tests.scheduler.sim_reports import CHEAP_DRAFT, EXPENSIVE_VERIFY, requests, run_steps


def test_exact_gp_interpolates_and_is_uncertain_far_away():
    gp = ExactGP((0.3,), signal_var=1.0, noise_var=1e-4)
    x = np.array([[0.0], [0.5], [1.0]])
    gp.fit(x, np.sin(3 * x[:, 0]))
    mean, sd = gp.predict(np.array([[0.5], [3.0]]))
    assert mean[0] == pytest.approx(np.sin(1.5), abs=1e-2) and sd[0] < 0.05
    assert sd[1] == pytest.approx(1.0, abs=1e-3)  # the prior far from data
    empty = ExactGP((0.3,), 4.0, 0.1)
    assert empty.predict(np.zeros((2, 1)))[1].tolist() == [2.0, 2.0]


def test_predictable_requests_get_longer_chains_than_unpredictable_ones():
    policy = Faser()
    batch = requests(2)
    chosen = run_steps(policy, batch, [0.95, 0.15], CHEAP_DRAFT, steps=80)
    last = np.array(chosen[-10:])
    assert last[:, 0].mean() >= 4
    assert last[:, 0].mean() > last[:, 1].mean() + 2
    assert len(policy.state.state["window"]) == 64  # the sliding window is full and no larger


def test_expensive_verification_at_large_batch_means_no_speculation():
    policy = Faser()
    chosen = run_steps(policy, requests(48), [0.7] * 48, EXPENSIVE_VERIFY, steps=40)
    assert np.mean(chosen[-5:]) < 0.5
    small = run_steps(policy, requests(1, prefix="s"), [0.9], EXPENSIVE_VERIFY, steps=40, start_step=40)
    assert np.mean(small[-5:]) >= 2  # the same policy speculates once the batch is small


def test_state_survives_into_a_new_policy_and_events_merge():
    a = Faser()
    run_steps(a, requests(3), [0.8] * 3, CHEAP_DRAFT, steps=20)
    stored = a.state.merge(None, a.state.take())
    b = Faser()
    b.state.adopt(stored)
    assert b.state.state["window"] == a.state.state["window"]
    ctx = SpecContext(0.0, 0, True)
    batch = requests(3)
    assert plan_shapes(a, batch, ctx) == plan_shapes(b, batch, ctx)


def test_gp_cost_per_iteration(capsys):
    """Not a timing assertion: prints what one decision costs with a full window (the paper: < 1 % of a step)."""
    policy = Faser(FaserConfig(window=64))
    batch = requests(32)
    run_steps(policy, batch, [0.7] * 32, CHEAP_DRAFT, steps=70)
    ctx = SpecContext(0.0, 1000, True)
    samples = []
    for _ in range(50):
        t0 = time.perf_counter()
        policy.decide(batch, ctx)
        samples.append(time.perf_counter() - t0)
    with capsys.disabled():
        print(f"\nFASER decide, window 64, batch 32: median {np.median(samples) * 1e3:.3f} ms "
              f"(GP part measured by the policy: {policy.last_decide_s * 1e3:.3f} ms)")  # fmt: skip
    assert policy.last_decide_s is not None


def test_an_unlucky_start_does_not_keep_a_request_at_s0():
    """A request whose first chains were all rejected looks hopeless next to the global rate; at s = 0 it sees
    nothing new, so its own evidence must fade while it idles, or it never drafts again (a third of the
    requests on the feature draft did so before)."""
    import dataclasses

    cheap = dataclasses.replace(CHEAP_DRAFT, delta_t=0.02, call_d=0.003, delta_d=0.0015, call_t=0.002)
    for decay, drafts_again in ((1.0, False), (0.9, True)):
        policy = Faser(FaserConfig(request_idle_decay=decay))
        run_steps(policy, requests(1, prefix="warm"), [0.5], cheap, steps=60)  # the global rate: about 0.5
        unlucky = requests(1, prefix="unlucky")
        unlucky[0].position_drafted, unlucky[0].position_accepted = [12] * 8, [0] * 8  # nothing taken yet
        chosen = run_steps(policy, unlucky, [0.5], cheap, steps=40, start_step=60)
        assert chosen[0] == [0]  # with that history it stops drafting at first
        assert any(ks[0] > 0 for ks in chosen) is drafts_again


def test_depths_never_drafted_are_not_as_good_as_the_first():
    """P(d) is a path probability: before any data it falls as a chain's would (the prior's d+1-th power), and
    with data it never rises with depth. A flat prior made s = K_max look as good as s = 1 per token."""
    policy = Faser()
    q = policy.config.prior_position_rate
    assert np.allclose(policy.global_position_rates(), q ** np.arange(1, policy.config.max_k + 1))
    policy.state.state["drafted"], policy.state.state["accepted"] = [100.0, 100.0, 1.0], [50.0, 30.0, 1.0]
    rates = policy.global_position_rates()
    assert rates[0] == pytest.approx((50 + 0.6 * 4) / 104)
    assert np.all(np.diff(rates) <= 0)  # depth 2's one lucky acceptance cannot lift it above depth 1
    assert rates[3] == pytest.approx(rates[2] * q)  # never drafted: one more token at the prior's rate
    req = requests(1)[0]
    req.position_drafted, req.position_accepted = [10, 10, 10], [2, 1, 1]
    per_token = np.diff(policy.expected_accepted(req, rates))
    assert np.all(np.diff(per_token) <= 1e-12)


def test_a_good_draft_at_batch_one_settles_on_a_moderate_chain():
    """The feature draft's shape (0.44 first token, then 0.56 each): a long chain must not look like it pays."""
    import dataclasses

    cheap = dataclasses.replace(CHEAP_DRAFT, delta_t=0.018, call_d=0.002, delta_d=0.0015, call_t=0.002)
    policy = Faser()
    chosen = run_steps(policy, requests(1), [0.5], cheap, steps=200)
    late = [ks[0] for ks in chosen[100:]]
    assert np.mean([k >= 6 for k in late]) < 0.05


def test_the_gp_amplitude_is_what_the_cost_model_misses():
    """An exact cost model leaves residuals of noise only: the empirical signal sd falls to its floor (2 % of a
    step), so at a batch size the window has not seen a long chain is not 30 % cheaper than the model says; the
    fixed amplitude keeps that optimism. With a cost model that is off, the empirical amplitude grows to match."""
    import dataclasses

    from services.scheduler.policies import speculation_policy

    cfgs = {"empirical": FaserConfig(), "fixed": FaserConfig(signal="fixed")}
    lcb_gap = {}
    for name, cfg in cfgs.items():
        policy = Faser(cfg)
        run_steps(policy, requests(1), [0.5], CHEAP_DRAFT, steps=80)
        cost = policy.step_cost(SpecContext(0.0, 80, True))
        ctx_sum = float(sum(r.num_tokens for r in requests(16)))
        mu, sd = policy.latency_bounds(16, ctx_sum, cost)
        scale = float(np.mean(np.asarray(policy.state.state["window"])[:, 3]))  # the mean observed step
        lcb_gap[name] = float(sd[-1]) / scale  # optimism at s = K_max, batch 16 (never seen), in steps
        assert policy.last_signal_sd is not None
    assert lcb_gap["empirical"] < 0.03 and lcb_gap["fixed"] > 0.25
    slow = dataclasses.replace(CHEAP_DRAFT, delta_t=0.060)  # the truth is twice the model's plain step
    policy = Faser()
    run_steps(policy, requests(1, prefix="slow"), [0.5], slow, steps=10)
    policy.latency_bounds(1, 20.0, policy.step_cost(SpecContext(0.0, 10, True)))
    empirical_sd = policy.last_signal_sd
    assert empirical_sd > 0.02 * 0.030  # above its floor: the model is seen to be off
    named = speculation_policy("faser-fixedgp")
    assert named.config.signal == "fixed" and named.name == "faser-fixedgp" and named.state.name == "policy:faser-fixedgp"
    assert speculation_policy("faser").state.name == "policy:faser"


def _modelled_goodput(policy: Faser, batch, ks, ctx: SpecContext) -> float:
    """Expected committed tokens over the step cost model's time (feed included) of lengths ``ks``."""
    cost = policy.step_cost(ctx)
    rates = policy.global_position_rates()
    tokens = np.array([1.0 + policy.expected_accepted(r, rates)[k] for r, k in zip(batch, ks)])
    contexts = [r.num_tokens for r in batch]
    return float(tokens.sum() / (cost.step(ks, contexts) + cost.feed(np.array([ks]), tokens[None, :])[0]))


def test_the_joint_choice_lets_weak_requests_ride_along_and_never_models_worse():
    """One predictable request among three unpredictable ones (a profiled cheap draft): drafted alone, eq. 1-2
    leave the weak ones at s = 0 although the step pays the draft's depth anyway; chosen together they draft
    what their first tokens are worth at that depth, and the batch's modelled goodput is at least the
    per-request choice's."""
    batch = requests(4)
    strong, *weak = batch
    strong.position_drafted, strong.position_accepted = [40] * 8, [38, 36, 34, 32, 30, 28, 26, 24]
    for r in weak:
        r.position_drafted, r.position_accepted = [40, 10], [12, 2]
    ctx = SpecContext(0.0, 0, True, cost_model=CostModel(alpha_s=0.0, gamma_s=1e-3, delta_s=20e-3),
                      draft_cost_model=CostModel(alpha_s=0.0, gamma_s=1e-4, delta_s=1e-3))
    each, joint = Faser(), Faser(FaserConfig(joint=True))
    ks_each = [s.k for s in plan_shapes(each, batch, ctx)]
    ks_joint = [s.k for s in plan_shapes(joint, batch, ctx)]
    assert ks_each[0] >= 4 and ks_each[1:] == [0, 0, 0]
    assert all(k >= 1 for k in ks_joint[1:]) and ks_joint[0] > max(ks_joint[1:])
    assert _modelled_goodput(joint, batch, ks_joint, ctx) >= _modelled_goodput(joint, batch, ks_each, ctx)


def test_the_joint_variant_learns_its_residual_against_the_mixed_step():
    """Its window rows carry the gap between the model of the step's actual lengths and of a uniform s at their
    mean, and a learned state keeps deciding (it is its own state: ``faser-joint``)."""
    policy = Faser(FaserConfig(joint=True))
    assert policy.name == "faser-joint"
    chosen = run_steps(policy, requests(3), [0.9, 0.3, 0.1], CHEAP_DRAFT, steps=60)
    window = np.asarray(policy.state.state["window"]).reshape(-1, 5)
    mixed = np.array([len(set(ks)) > 1 for ks in chosen[-len(window):]])
    assert mixed.any() and (window[mixed, 4] > 0).all()  # a max depth above the mean costs the draft more
    assert max(chosen[-1]) >= 2


def test_the_joint_switch_charges_a_resumed_requests_catch_up():
    """With ``charge_switch`` a request the draft holds but that decoded plainly last step is charged the catch-up
    on what it decoded meanwhile: with a long lag it stays plain where the same request without a lag drafts."""
    from shared.profiling.cost_model import CostModel as Model

    ctx = SpecContext(0.0, 0, True, cost_model=Model(alpha_s=0.0, gamma_s=1e-3, delta_s=20e-3),
                      draft_cost_model=Model(alpha_s=0.0, gamma_s=1e-4, delta_s=1e-3))

    def chosen(lag: int) -> int:
        policy = Faser(FaserConfig(joint=True, charge_switch=True))
        assert policy.name == "faser-joint-switch"
        (req,) = requests(1, prompt=200, max_new=3)
        req.position_drafted, req.position_accepted = [40, 30], [14, 6]
        req.on_draft, req.draft_seen = True, req.num_tokens - 1 - lag  # the draft last saw it ``lag`` tokens ago
        return plan_shapes(policy, [req], ctx)[0].k

    assert chosen(0) >= 1
    assert chosen(150) == 0


def test_recent_acceptance_follows_a_request_whose_text_turns_predictable():
    """faser-joint-recent (request_decay 0.9): a^_i from the request's recent steps (§4.1: "from recent batches").
    A request that drafted into rejections for 60 steps and then into a predictable span lengthens its chains
    within a few steps; counting every step since it began, it stays short far longer."""
    import dataclasses

    cheap = dataclasses.replace(CHEAP_DRAFT, delta_t=0.018, call_d=0.002, delta_d=0.0015, call_t=0.002)
    late_ks = {}
    for decay in (1.0, 0.9):
        policy = Faser(FaserConfig(joint=True, request_decay=decay))
        assert policy.name == ("faser-joint-recent" if decay < 1 else "faser-joint")
        run_steps(policy, requests(1, prefix="warm"), [0.6], cheap, steps=60)  # the global rates
        batch = requests(1, prefix="shift")
        run_steps(policy, batch, [0.15], cheap, steps=60, start_step=60)  # a hard span
        chosen = run_steps(policy, batch, [0.95], cheap, steps=25, start_step=120)  # then an easy one
        late_ks[decay] = np.mean([ks[0] for ks in chosen[10:]])
    assert late_ks[0.9] >= 3
    assert late_ks[0.9] > late_ks[1.0] + 1
    policy = Faser(FaserConfig(joint=True, request_decay=0.9))
    batch = requests(2, prefix="gone")
    run_steps(policy, batch, [0.5, 0.5], cheap, steps=5)
    assert set(policy._recent) == {r.id for r in batch}  # its own counts, per request ...
    from scheduler.report import RequestOutcome, StepReport
    from scheduler.policies.speculation import SpecShape

    report = StepReport(step=5, started_at=5.0, failed_ids=[batch[1].id])
    report.outcomes.append(RequestOutcome(batch[0].id, SpecShape.none(), 0, 0, 1, finish_reason="length"))
    policy.observe(report)
    assert policy._recent == {}  # ... dropped when the request ends or fails
