"""Nightjar's ADA-BINGREEDY on synthetic rewards: converges, pays the switching cost, keeps batch sizes apart."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from scheduler.policies.nightjar import (
    Nightjar,
    NightjarConfig,
    SwitchCostTable,
    bucket,
    draft_lag,
    draw_weights,
    estimate_gaps,
    estimate_surviving_arms,
    exploit,
    local_arms,
)
from scheduler.policies.nightjar_arms import chain_tokens
from scheduler.policies.shared_state import SharedState
from scheduler.policies.speculation import SpecContext, plan_shapes
from scheduler.report import PhaseTimes, RequestOutcome, StepReport
from scheduler.request import Request, SpecMode, SpeculationSetting
from services.scheduler.policies import speculation_policy
from shared.profiling.cost_model import CostModel
from scheduler.policies.step_cost import StepCost
from tests.scheduler.sim_reports import requests, run_steps

# each drafted depth costs 20 % of a 20 ms step, nothing else: k = 1, 2, 3 take 1.2, 1.4, 1.6 steps
LINEAR_DRAFT = StepCost(delta_t=0.020, gamma_t=0.0, alpha_t=0.0, call_d=0.0, delta_d=0.004, gamma_d=0.0, alpha_d=0.0)


def run(policy: Nightjar, goodput, batch_sizes, steps: int, seed: int = 0, start: int = 0) -> list[tuple[int, int]]:
    """Steps with a reward of ``goodput(batch_size, k)`` (+ noise); returns (batch size, k) per step."""
    rng = random.Random(seed)
    pools = {b: requests(b, prefix=f"b{b}-") for b in set(batch_sizes)}
    played = []
    for step in range(start, start + steps):
        b = batch_sizes[step % len(batch_sizes)]
        batch = pools[b]
        shapes = plan_shapes(policy, batch, SpecContext(now=float(step), step=step, draft_available=True))
        k = shapes[0].max_depth
        played.append((b, k))
        g = goodput(b, k) * (1 + 0.1 * rng.uniform(-1, 1))  # tokens per second, noisy
        tokens = b * (1 + k // 2)
        report = StepReport(step=step, started_at=float(step), batch_size=b)
        report.times = PhaseTimes(verify=tokens / g)
        report.outcomes = [RequestOutcome(r.id, s, k, k // 2, 1 + k // 2) for r, s in zip(batch, shapes)]
        policy.observe(report)
    return played


def test_bucketing_and_bins_follow_algorithm_1():
    assert [bucket(b) for b in (1, 2, 3, 4, 5, 8, 9, 16, 17, 64)] == [1, 2, 3, 4, 8, 8, 16, 16, 32, 64]
    policy = Nightjar(NightjarConfig(max_k=3, switch_cost=False))  # every round a reward (charged_once below)
    # a bin ends once tau > sqrt(H) (floor(sqrt H) rounds), a block once b > sqrt(H):
    # H=1: 1 bin x 1 round, H=2: 1 x 1, H=4: 2 x 2, H=8: 2 x 2
    run(policy, lambda b, k: 10.0, [1], 1 + 1 + 4 + 4)
    st = policy.bucket_state(1)
    assert (st["j"], st["H"], st["b"], st["tau"]) == (5, 16, 1, 1)
    assert sum(st["n"]) == 10
    run(policy, lambda b, k: 10.0, [1], 16 + 3, start=10)  # H=16: 4 bins x 4 rounds, then 3 rounds of H=32
    st = policy.bucket_state(1)
    assert (st["j"], st["H"], st["b"], st["tau"]) == (6, 32, 1, 4)


def test_global_exploration_keeps_counting_bins_across_blocks():
    """Lemma 2's reading: b of the 1/√b coin is every bin so far; Alg. 1's is the bin within the block."""
    printed, lemma2 = Nightjar(NightjarConfig(max_k=3)), Nightjar(NightjarConfig(max_k=3, exploration="global"))
    for policy in (printed, lemma2):
        run(policy, lambda b, k: 10.0, [1], 1 + 1 + 4 + 4 + 16)  # blocks H=1,2,4,8,16: 1+1+2+2+4 bins
    st_p, st_g = printed.bucket_state(1), lemma2.bucket_state(1)
    assert (st_p["j"], st_p["b"]) == (st_g["j"], st_g["b"]) == (6, 1)  # same blocks and bins
    assert st_p["bins"] == st_g["bins"] == 11  # the 11th bin begins next
    assert printed.bin_index(st_p) == 1 and lemma2.bin_index(st_g) == 11
    assert lemma2.name == "nightjar-global" and lemma2.state.name == "policy:nightjar-global"
    assert printed.state.name == "policy:nightjar"
    # a stored state from before the counter: the per-block b stands in
    legacy = {k: v for k, v in st_g.items() if k != "bins"}
    assert lemma2.bin_index(legacy) == 1


def test_global_exploration_explores_less_and_still_converges():
    best = 1
    goodput = lambda b, k: 100.0 - 15.0 * abs(k - best)  # noqa: E731
    shares = {}
    for schedule in ("block", "global"):
        policy = Nightjar(NightjarConfig(max_k=5, switch_cost=False, exploration=schedule))
        played = run(policy, goodput, [1], 3000)
        shares[schedule] = sum(k != best for _, k in played[-1500:]) / 1500
        st = policy.bucket_state(1)
        assert exploit(st["g"], st["n"], prev_k=best, c_prefill=0.0) == best
    assert shares["global"] < shares["block"]


def test_converges_to_the_best_arm():
    best = 3
    goodput = lambda b, k: 100.0 - 12.0 * abs(k - best)  # noqa: E731 - a peak at k = 3
    policy = Nightjar(NightjarConfig(max_k=5, switch_cost=False))
    played = run(policy, goodput, [1], 2000)
    st = policy.bucket_state(1)
    assert exploit(st["g"], st["n"], prev_k=3, c_prefill=0.0) == best
    late = [k for _, k in played[-500:]]
    assert late.count(best) / len(late) > 0.6  # exploitation bins (most of them by now) all play it
    assert st["n"][best] == max(st["n"])


def test_cumulative_mean_is_the_average_reward():
    policy = Nightjar(NightjarConfig(max_k=2, switch_cost=False))
    run(policy, lambda b, k: 50.0 + 10 * k, [2], 300)
    st = policy.bucket_state(2)
    for k in range(3):
        if st["n"][k]:
            assert st["g"][k] == pytest.approx(50.0 + 10 * k, rel=0.06)


def test_switching_cost_keeps_speculation_off_when_it_barely_pays():
    means, counts = [100.0, 100.5, 101.0], [10, 10, 10]
    assert exploit(means, counts, prev_k=2, c_prefill=0.0) == 2
    assert exploit(means, counts, prev_k=1, c_prefill=1.0) == 2  # already speculating: no switch cost
    assert exploit(means, counts, prev_k=0, c_prefill=1e-3) == 0  # eq. 3: 1/101 + 1e-3/2 > 1/100
    assert exploit(means, counts, prev_k=0, c_prefill=1e-5) == 2  # cheap catch-up: switch
    # longer chains amortize the catch-up better (c_prefill / gamma)
    assert exploit([100.0, 150.0, 150.0], [1, 1, 1], prev_k=0, c_prefill=2e-3) == 2
    assert exploit([100.0, 0.0], [5, 0], prev_k=0, c_prefill=0.0) == 0  # an unplayed arm is never exploited


def test_switching_cost_in_the_loop():
    # arms 0 and 2 are nearly equal; with an expensive catch-up the policy stays at 0 once there
    goodput = lambda b, k: 100.0 if k == 0 else 101.0 if k == 2 else 60.0  # noqa: E731
    # the requests are not on the draft: leaving 0 costs a re-prefill of ~20 tokens (~10 ms, the default model)
    ctx_policy = Nightjar(NightjarConfig(max_k=2))
    played = []
    for chunk in range(4):
        played += run(ctx_policy, goodput, [1], 300, seed=chunk, start=300 * chunk)
    free_policy = Nightjar(NightjarConfig(max_k=2, switch_cost=False))
    played_free = []
    for chunk in range(4):
        played_free += run(free_policy, goodput, [1], 300, seed=chunk, start=300 * chunk)
    # without the switch cost the greedy arm is 2; with it the exploitation after a 0 stays at 0 more often
    zeros = sum(1 for _, k in played[-600:] if k == 0)
    zeros_free = sum(1 for _, k in played_free[-600:] if k == 0)
    assert zeros > zeros_free


def test_switch_cost_is_t_sd_less_t_base_with_the_cached_context():
    """c_prefill = T_SD − T_base (§4.2): the first draft forward with every request catching up on L_max tokens,
    less the same forward in the steady state; the cached context is in both (it cancels in a linear model), and
    the forward's δ, paid either way, is not a switching cost."""
    cost = CostModel(alpha_s=1e-6, gamma_s=1e-4, delta_s=1e-3)
    table = SwitchCostTable(cost)
    assert table(0, 4) == 0.0
    t_sd = cost.predict(num_context_tokens=5000 + 8 * 11, num_batched_tokens=8 * 11)
    t_base = cost.predict(num_context_tokens=5000 + 8, num_batched_tokens=8)
    assert table(10, 8, cached=5000) == pytest.approx(t_sd - t_base) == pytest.approx((1e-6 + 1e-4) * 8 * 10)
    assert table(100, 8) > table(10, 8) > table(1, 8) > 0
    assert table(64, 64) > table(64, 32)


def test_the_switching_cost_is_charged_once():
    """Eq. 3 charges c_prefill to a 0 -> γ > 0 step; that step's reward, whose speculate call ran the catch-up,
    is not recorded (the bin advances, the arm's mean does not move). Without eq. 3's term the reward keeps it."""
    for charged in (True, False):
        policy = Nightjar(NightjarConfig(max_k=2, switch_cost=charged))
        batch = requests(1)
        played = []
        for step in range(40):
            shapes = plan_shapes(policy, batch, SpecContext(now=float(step), step=step, draft_available=True))
            k = shapes[0].max_depth
            switching = (not played or played[-1] == 0) and k > 0  # the request is not on the draft: it lags
            # a speculating step takes 10 ms, and 50 ms more when it catches up after a plain one
            report = StepReport(step=step, started_at=float(step), batch_size=1)
            report.times = PhaseTimes(speculate=0.05 if switching else 0.0, verify=0.01)
            report.outcomes = [RequestOutcome(batch[0].id, shapes[0], k, k, 1 + k)]
            policy.observe(report)
            played.append(k)
        st = policy.bucket_state(1)
        switches = sum(1 for a, b in zip([0] + played, played) if a == 0 and b > 0)
        assert switches > 0
        if charged:  # every recorded reward is a steady-state one: (1 + k) tokens in 10 ms
            assert sum(st["n"]) == len(played) - switches
            assert all(g == pytest.approx(100.0 * (1 + k)) for k, (g, n) in enumerate(zip(st["g"], st["n"])) if n)
        else:  # the switch steps' rewards carry the catch-up: some arm's mean is below its steady state
            assert sum(st["n"]) == len(played)
            assert any(g < 100.0 * (1 + k) - 1e-6 for k, (g, n) in enumerate(zip(st["g"], st["n"])) if n and k)


def test_draft_lag():
    r = Request("a", [1] * 10, max_new_tokens=50)
    assert draft_lag(r) == 9  # never on the draft: full re-prefill
    r.on_draft, r.draft_seen = True, 10
    r.output_ids.extend([5, 6, 7])
    assert draft_lag(r) == 2


def test_batch_sizes_learn_apart():
    # speculation pays at batch 1 (best k = 4), not at batch 16 (best k = 0)
    goodput = lambda b, k: (80.0 + 10 * k) if b == 1 else (400.0 - 40 * k)  # noqa: E731
    policy = Nightjar(NightjarConfig(max_k=4, switch_cost=False))
    run(policy, goodput, [1, 16], 3000)
    one, sixteen = policy.bucket_state(1), policy.bucket_state(16)
    assert exploit(one["g"], one["n"], 4, 0.0) == 4
    assert exploit(sixteen["g"], sixteen["n"], 0, 0.0) == 0
    assert sum(one["n"]) == sum(sixteen["n"]) == 1500


def test_state_survives_a_restart_and_merges_across_replicas():
    goodput = lambda b, k: 100.0 - 10 * abs(k - 2)  # noqa: E731
    a = Nightjar(NightjarConfig(max_k=3, switch_cost=False))  # every round a reward (charged_once below)
    run(a, goodput, [1], 200)
    stored = a.state.merge(None, a.state.take())
    restarted = Nightjar(NightjarConfig(max_k=3, seed=1))
    restarted.state.adopt(stored)
    assert restarted.bucket_state(1) == a.bucket_state(1)
    # a second replica's rounds fold in: counts add up
    b = Nightjar(NightjarConfig(max_k=3, seed=2, switch_cost=False))
    run(b, goodput, [1], 50)
    merged = b.state.merge(stored, b.state.take())
    assert sum(merged["buckets"]["1"]["n"]) == 250
    # a state of another Γ_max is padded, not misread
    wider = Nightjar(NightjarConfig(max_k=5))
    wider.state.adopt(stored)
    run(wider, goodput, [1], 5, start=200)
    assert len(wider.bucket_state(1)["n"]) == 6
    assert isinstance(a.shared_state(), SharedState) and a.state.name == "policy:nightjar"


def test_request_modes_and_registration():
    policy = speculation_policy("nightjar:3")
    assert isinstance(policy, Nightjar) and policy.config.max_k == 3
    assert speculation_policy("nightjar").config.max_k == 8  # Γ_max as SmartSpec's and FASER-AD's
    assert NightjarConfig().max_k == 8
    assert speculation_policy("nightjar").config.exploration == "block"
    lemma2 = speculation_policy("nightjar-global:4")
    assert isinstance(lemma2, Nightjar) and lemma2.config.exploration == "global" and lemma2.config.max_k == 4
    batch = requests(2)
    batch[1].speculation = SpeculationSetting(mode=SpecMode.OFF)
    shapes = policy.decide(batch, SpecContext(now=0.0, step=0, draft_available=True))
    assert not shapes[1].speculates
    # an exploration bin at the very first round (1/sqrt(1) = 1): uniform over 0..3
    assert 0 <= shapes[0].max_depth <= 3
    assert math.isclose(policy.last_c_prefill, 0.0)


def test_chain_estimate_pools_what_longer_chains_show_about_shorter_ones():
    """A chain of 4 that accepted 2 is a chain of 2 that accepted 2: per-depth acceptance pools over every play
    that reached the depth; each arm's time is its own plays'. Exact on a known history."""
    from scheduler.policies.nightjar import chain_goodputs

    st = {"n": [1, 0, 1, 0], "t": [0.020, 0.0, 0.030, 0.0], "depth": [[3.0, 4.0], [1.0, 2.0]]}
    g = chain_goodputs(st, 4)
    assert g[0] == pytest.approx(1 / 0.020)
    assert g[1] == 0.0 and g[3] == 0.0  # never played: no estimate, as with observed means
    assert g[2] == pytest.approx((1 + 0.75 + 0.75 * 0.5) / 0.030)


def test_chain_estimate_is_closer_to_the_truth_than_observed_means():
    """Acceptance 0.5 at every depth, each depth costing 20 % of a step: the true goodputs of k = 1, 2, 3 are
    62.5, 62.5 and 58.6 tokens/s (1.5/24 ms, 1.75/28 ms, 1.875/32 ms). After 60 steps on 10 seeds the chain
    estimate is off by 6 % on average, the observed means by 9 %: same plays, less noise."""
    from scheduler.policies.nightjar import chain_goodputs

    truth = [50.0, 62.5, 62.5, 1.875 / 0.032]
    errors: dict[str, list[float]] = {"chain": [], "observed": []}
    for seed in range(10):
        for estimate, err in errors.items():
            policy = Nightjar(NightjarConfig(max_k=3, seed=seed, estimate=estimate))
            run_steps(policy, requests(1, prefix=f"s{seed}"), [0.5], LINEAR_DRAFT, steps=60, seed=seed)
            st = policy.bucket_state(1)
            g = chain_goodputs(st, 4) if estimate == "chain" else list(st["g"])
            err += [abs(g[k] - truth[k]) / truth[k] for k in (1, 2, 3) if st["n"][k] > 0]
    mean = {e: sum(v) / len(v) for e, v in errors.items()}
    assert mean["chain"] < 0.8 * mean["observed"]
    assert Nightjar(NightjarConfig(estimate="chain")).name == "nightjar-chain"


def test_surviving_arms_keeps_arms_whose_bounds_overlap_the_best():
    from scheduler.policies.nightjar import surviving_arms

    # arm 0: mean 50, sd 1 (n 10); arm 1: 80 +- 1 (n 10); arm 2: 79 +- 10 (n 10); arm 3: 10, too few plays
    m2 = [1.0 * 9, 1.0 * 9, 100.0 * 9, 0.0]
    assert surviving_arms([50.0, 80.0, 79.0, 10.0], m2, [10, 10, 10, 2], z=2.0, min_plays=5) == [1, 2, 3]
    # no arm with enough plays: nobody is out
    assert surviving_arms([50.0, 80.0], [0.0, 0.0], [3, 4], z=2.0, min_plays=5) == [0, 1]
    # 78 against 80: out at sd 1 (bounds 78.6 < 79.4), in at sd 3 (79.9 > 78.1)
    assert surviving_arms([78.0, 80.0], [9.0, 9.0], [10, 10], z=2.0, min_plays=5) == [1]
    assert surviving_arms([78.0, 80.0], [81.0, 81.0], [10, 10], z=2.0, min_plays=5) == [0, 1]


def test_elimination_spends_exploration_on_the_arms_still_in_the_running():
    """Peak at k = 1, each step away 15 % worse: after its early blocks the eliminating bandit's exploration
    bins play the losing arms far less; both end on the best arm. The default draws from every arm."""
    best = 1
    goodput = lambda b, k: 100.0 - 15.0 * abs(k - best)  # noqa: E731
    played, policies = {}, {}
    for z in (None, 2.0):
        policy = policies[z] = Nightjar(NightjarConfig(max_k=5, switch_cost=False, eliminate=z))
        played[z] = run(policy, goodput, [3], 400)
        st = policy.bucket_state(3)
        assert exploit(st["g"], st["n"], prev_k=best, c_prefill=0.0) == best
    losers = {z: sum(k not in (0, 1, 2) for _, k in p[100:]) for z, p in played.items()}
    assert losers[2.0] < 0.25 * losers[None]
    assert policies[2.0].arms_in_play(policies[2.0].bucket_state(3)) == [best]
    assert policies[None].arms_in_play(policies[None].bucket_state(3)) == list(range(6))
    assert policies[2.0].name == "nightjar-elim" and policies[2.0].state.name == "policy:nightjar-elim"
    policies[2.0].decide(requests(3, prefix="e-"), SpecContext(now=0.0, step=400, draft_available=True))
    assert policies[2.0].explain()["arms_in_play"] == 1.0
    named = speculation_policy("nightjar-elim:4")
    assert isinstance(named, Nightjar) and named.config.eliminate == 2.0 and named.config.max_k == 4


def test_the_lean_variant_loses_less_to_exploration_than_alg_1_as_printed():
    """Nightjar's three extensions together (Lemma 2's schedule, elimination, the chain estimate), against
    Alg. 1 as printed, on synthetic stacks where the best chain is short and long arms are dear (the feature
    draft's regime: k = 1-2 best of 0..8): over a bench-length life of a bucket (300 steps) the lean bandit's
    expected goodput is higher in each case and within 10 % of the best fixed k."""
    import dataclasses

    from bench.diagnostics.bandit_sim import goodput
    from tests.scheduler.sim_reports import CHEAP_DRAFT, EXPENSIVE_VERIFY, run_steps

    lean = speculation_policy("nightjar-lean")
    assert lean.name == "nightjar-global-chain-elim" and lean.config.max_k == 8
    for truth, alphas in ((dataclasses.replace(CHEAP_DRAFT, delta_d=0.004), [0.5, 0.4]),
                          (dataclasses.replace(EXPENSIVE_VERIFY, delta_d=0.002), [0.6, 0.5, 0.45])):
        contexts = [20] * len(alphas)
        best = max(goodput([[k] * len(alphas)], alphas, truth, contexts) for k in range(9))
        got = {}
        for name in ("nightjar", "nightjar-lean"):
            rows = run_steps(speculation_policy(name), requests(len(alphas), prefix=name), alphas, truth, steps=300)
            got[name] = goodput(rows, alphas, truth, contexts) / best
        assert got["nightjar-lean"] > got["nightjar"] and got["nightjar-lean"] > 0.9, got


def test_pooled_time_fits_a_line_over_the_speculating_arms():
    from scheduler.policies.nightjar import pooled_times

    # arms 1..3 played 10 / 10 / 2 times; arm 3's two plays hit a stall (0.2 s against a 0.05 s line)
    n, t = [4, 10, 10, 2, 0], [0.03, 0.04, 0.05, 0.2, 0.0]
    fitted = pooled_times(n, t)
    assert fitted[0] == 0.03  # plain decoding keeps its own mean
    assert fitted[1] < fitted[2] < fitted[3] < fitted[4]  # every speculating arm on one line, unplayed ones too
    assert fitted[3] < 0.75 * t[3]  # the stalled arm is pulled toward what the well-played arms say
    assert pooled_times([1, 5, 0], [0.03, 0.04, 0.0]) == [0.03, 0.04, 0.0]  # one speculating arm: as given


def test_pooled_time_keeps_the_chain_estimate_when_step_times_stall():
    """Step times that a shared CPU scales by ±15 % and stalls 10x one step in fifty: the chain estimate's time
    per arm, the mean of the arm's own plays, lets a stall or two push an arm out (elimination draws on observed
    rewards, and the estimate is not corrected); the pooled line holds better over bench.diagnostics.bandit_sim's first 8
    synthetic stacks (scored on the noiseless truth). Not in every case: on average."""
    import numpy as np

    from bench.diagnostics.bandit_sim import compare

    lean = {"exploration": "global", "eliminate": 2.0, "estimate": "chain"}
    ratios, _ = compare({"lean": lean, "pooled": {**lean, "chain_time": "pooled"}}, cases=8, seeds=2, noise=0.15,
                        stall=0.02)
    assert np.mean(ratios["pooled"]) > np.mean(ratios["lean"]) and np.mean(ratios["pooled"]) > 0.93
    assert speculation_policy("nightjar-lean-pooled").name == "nightjar-global-chain-elim-pooled"


def test_drift_keeps_the_arms_apart_when_the_machine_slows_down_under_one_of_them():
    """Two arms, arm 2 truly 1.3x arm 1's time per request. Played alike while the machine is fast, then the
    machine halves its speed while the bandit mostly plays arm 1: the arms' own means mix the two speeds in
    different shares, and arm 2 (played mostly fast) looks the quicker; with ``drift`` each play is read
    against the speed tracked over all plays, and the ratio stays near the truth."""
    import math

    def estimates(drift: bool) -> list[float]:
        policy = Nightjar(NightjarConfig(max_k=2, exploration="global", estimate="chain", drift=drift))
        plays = [(k, 1.0) for _ in range(50) for k in (1, 2)]  # fast: both alike
        plays += [(2 if i % 20 == 0 else 1, 2.0) for i in range(200)]  # slow: arm 1 mostly
        for k, speed in plays:
            seconds = 0.05 * (1.3 if k == 2 else 1.0) * speed
            policy.state.record({"bucket": 1, "k": k, "reward": 1.0 / seconds, "explore": False,
                                 "seconds_per_request": seconds, "depth": []})
        return policy.goodputs(policy.bucket_state(1))

    plain, tracked = estimates(False), estimates(True)
    assert plain[2] > plain[1]  # the confounded means rank the slower arm first
    assert tracked[1] / tracked[2] == pytest.approx(1.3, rel=0.08)
    assert Nightjar(NightjarConfig(exploration="global", estimate="chain", drift=True)).name.endswith("-drift")
    with pytest.raises(ValueError):
        Nightjar(NightjarConfig(drift=True))  # the observed means have no time factor to correct
    assert math.isfinite(tracked[0]) and tracked[0] == 0.0  # an arm never played has no estimate


def test_local_arms_are_the_leaders_neighbours():
    assert local_arms(range(9), [0.0] * 9, 1) == list(range(9))  # nothing known yet: every arm
    goodputs = [10.0, 14.0, 15.0, 13.0, 0.0, 0.0, 0.0, 0.0, 9.0]
    assert local_arms(range(9), goodputs, 1) == [1, 2, 3]
    assert local_arms(range(9), goodputs, 2) == [0, 1, 2, 3, 4]
    assert local_arms([0, 2, 8], goodputs, 1) == [2]  # elimination first, then the neighbourhood
    assert local_arms([8], goodputs, 1) == [2]  # never empty: the leader stays


def test_local_exploration_climbs_to_the_best_arm_and_leaves_far_arms_alone():
    """Peak at k = 2, each step away 12 % worse: with neighbors=2 the exploration bins after the first blocks
    play only arms within 2 of the leader, so arms 5-8 are all but unplayed, and the bandit ends on the peak."""
    best = 2
    goodput = lambda b, k: 100.0 - 12.0 * abs(k - best)  # noqa: E731
    far = {}
    for neighbors in (None, 2):
        policy = Nightjar(NightjarConfig(switch_cost=False, exploration="global", estimate="observed",
                                         eliminate=2.0, neighbors=neighbors))
        played = run(policy, goodput, [2], 400)
        far[neighbors] = sum(k >= 5 for _, k in played[50:])
        st = policy.bucket_state(2)
        assert exploit(policy.goodputs(st), st["n"], prev_k=best, c_prefill=0.0) == best
    assert far[2] < 0.5 * far[None], far
    named = speculation_policy("nightjar-lean-local")
    assert named.config.neighbors == 2 and named.config.drift and named.name.endswith("-drift-local2")


def test_local_exact_keeps_every_arm_in_buckets_that_mix_batch_sizes():
    """nightjar-lean-local-exact: the neighbourhood in the exact buckets (1-4) only; a bucket that mixes batch
    sizes (8: batches of 5-8) draws from every arm elimination keeps, as the drift variant does."""
    policy = speculation_policy("nightjar-lean-local-exact")
    assert policy.config.neighbors_up_to == 4 and policy.name.endswith("-local2-upto4")
    policy.config.eliminate = None  # every arm stays in the running: the neighbourhood is all that narrows
    run(policy, lambda b, k: 100.0 - 10.0 * abs(k - 1), [8], 200)
    st = policy.bucket_state(8)
    assert policy.arms_in_play(st, 8) == list(range(9))
    assert policy.arms_in_play(st, 3) == local_arms(range(9), policy.goodputs(st), 2)
    assert max(policy.arms_in_play(st, 3)) <= 3


def test_chain_tokens_gradient_matches_a_finite_difference():
    """chain_tokens: l(γ) per arm from the raw rates, and its gradient over the (smoothed) depth rates is the
    derivative of 1 + Σ_d Π_{j≤d} q_j; a depth never tested still has a finite variance (one trial at 1/2)."""
    counts = [[60.0, 100.0], [30.0, 60.0], [10.0, 30.0], [0.0, 0.0]]
    tokens, grads, var_q = chain_tokens(counts, max_trials=200.0)
    assert tokens[0] == 1.0 and tokens[1] == pytest.approx(1.6) and tokens[2] == pytest.approx(1.6 + 0.6 * 0.5)
    assert tokens[4] == tokens[3]  # depth 4 never tested: its raw rate adds nothing
    smooth = [(a + 1) / (t + 2) for a, t in counts]

    def length(q, arm):
        out, p = 1.0, 1.0
        for j in range(arm):
            p *= q[j]
            out += p
        return out

    for arm in range(1, 5):
        for j in range(arm):
            bumped = list(smooth)
            bumped[j] += 1e-6
            assert grads[arm, j] == pytest.approx((length(bumped, arm) - length(smooth, arm)) / 1e-6, rel=1e-4)
    assert var_q[3] == pytest.approx(0.25) and var_q[0] == pytest.approx(smooth[0] * (1 - smooth[0]) / 100)


def test_estimate_bounds_drop_arms_clearly_behind_the_leader_and_keep_close_ones():
    """Pairwise against the leader on the chain estimate: an arm far behind with tight times is out, one whose
    gap is within its error stays, and arms with too few plays stay whatever their estimate."""
    st = {"n": [30, 30, 30, 3], "lr": [-0.2, 0.15, 0.9, 2.0], "lq": [0.3, 0.3, 0.3, 0.0],
          "depth": [[500.0, 1000.0], [250.0, 500.0], [0.0, 0.0]]}
    # l = 1, 1.5, 1.75: log g = 0.2, 0.255, -0.34 (arm 3: 3 plays); leader arm 1, arm 0 0.055 behind (se
    # ≈ 0.035: within 2 se), arm 2 0.6 behind
    kept = estimate_surviving_arms(st, 4, z=2.0, min_plays=5, bound_trials=200.0)
    assert kept == [0, 1, 3]
    st["lq"] = [60.0, 60.0, 60.0, 0.0]  # times 14x as spread (sd 1.4 in log): nothing is clearly behind
    assert estimate_surviving_arms(st, 4, z=2.0, min_plays=5, bound_trials=200.0) == [0, 1, 2, 3]


def test_bounds_on_the_estimate_explore_the_far_arms_less():
    """nightjar-lean-bounds against the drift variant on one batch-1 stack (acceptance 0.55, the draft 15 %
    of a step per token): the exploration draws that go to chains of 6-8, far behind the best, fall."""
    from tests.scheduler.sim_reports import CHEAP_DRAFT

    far = {}
    for name in ("nightjar-lean-drift", "nightjar-lean-bounds"):
        policy = speculation_policy(name)
        rows = run_steps(policy, requests(1), [0.55], CHEAP_DRAFT, steps=1500, seed=2)
        far[name] = sum(ks[0] >= 6 for ks in rows[300:])
    assert far["nightjar-lean-bounds"] < far["nightjar-lean-drift"], far
    named = speculation_policy("nightjar-lean-bounds")
    assert named.config.eliminate_on == "estimate" and named.name.endswith("-drift-bounds")
    with pytest.raises(ValueError):
        Nightjar(NightjarConfig(estimate="chain", eliminate=2.0, eliminate_on="estimate"))  # needs drift


def test_draw_weights_follow_each_arms_chance_to_beat_the_leader():
    """Φ(−gap/se): the leader ½, one se behind ≈ 0.16, two ≈ 0.023; an arm too new to be known ½; a
    zero-se arm behind 0, level 1/2."""
    gap = np.array([0.0, 0.1, 0.2, 0.5, 0.3, 0.0])
    se = np.array([0.05, 0.1, 0.1, 0.0, 0.1, 0.0])
    known = np.array([True, True, True, True, False, True])
    w = draw_weights(gap, se, known)
    assert w == pytest.approx([0.5, 0.1587, 0.0228, 0.0, 0.5, 0.5], abs=1e-3)
    st = {"n": [30, 30, 30, 3], "lr": [-0.2, 0.15, 0.9, 2.0], "lq": [0.3, 0.3, 0.3, 0.0],
          "depth": [[500.0, 1000.0], [250.0, 500.0], [0.0, 0.0]]}
    gap, se, known = estimate_gaps(st, 4, min_plays=5, bound_trials=200.0)
    assert gap[1] == 0.0 and list(known) == [True, True, True, False]
    w = draw_weights(gap, se, known)
    assert w[1] == 0.5 and 0.0 < w[0] < 0.5 and w[2] < 1e-6 and w[3] == 0.5  # arm 0 0.055 behind, se ≈ 0.035


def test_weighted_draw_explores_the_survivors_behind_the_leader_less():
    """nightjar-lean-weighted against the bounds variant on the same stack as above: fewer exploration plays
    away from the best chain, the same arms still reached, and it asks for the estimate's elimination."""
    from tests.scheduler.sim_reports import CHEAP_DRAFT

    away, seen = {}, {}
    for name in ("nightjar-lean-bounds", "nightjar-lean-weighted"):
        policy = speculation_policy(name)
        rows = run_steps(policy, requests(1), [0.55], CHEAP_DRAFT, steps=1500, seed=2)
        ks = [r[0] for r in rows[300:]]
        best = max(set(ks), key=ks.count)
        away[name] = sum(k != best for k in ks)
        seen[name] = set(ks)
    assert away["nightjar-lean-weighted"] < away["nightjar-lean-bounds"], away
    assert len(seen["nightjar-lean-weighted"]) >= 2, seen
    named = speculation_policy("nightjar-lean-weighted")
    assert named.config.draw == "weighted" and named.name.endswith("-bounds-weighted")
    with pytest.raises(ValueError):
        Nightjar(NightjarConfig(estimate="chain", eliminate=2.0, drift=True, draw="weighted"))  # needs the bounds
