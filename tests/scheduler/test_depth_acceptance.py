"""Acceptance per draft depth (depth_acceptance.py) and SmartSpec's use of it (eq. 8 with alpha_j)."""

import numpy as np
import pytest

from scheduler.policies.depth_acceptance import (
    add_counts,
    chain_depth_counts,
    conditional_rates,
    decay_into,
    depth_gains,
)
from scheduler.policies.length_solver import best_uniform_k
from scheduler.policies.smartspec import SmartSpec, SmartSpecConfig
from scheduler.policies.speculation import SpecContext, plan_shapes
from scheduler.policies.step_cost import StepCost
from shared.profiling.cost_model import CostModel
from tests.scheduler.sim_reports import requests

# a draft-heavy step: at batch 8 a second token is worth it only if it is accepted more often than the first
COST = StepCost(delta_t=0.030, gamma_t=0.0004, alpha_t=0.0, call_d=0.002, delta_d=0.002, gamma_d=0.0001, alpha_d=0.0)
PROFILE = CostModel(alpha_s=0.0, gamma_s=COST.gamma_t, delta_s=COST.delta_t)  # what a profile would give
DRAFT = CostModel(alpha_s=0.0, gamma_s=COST.gamma_d, delta_s=COST.delta_d)


def test_what_a_chain_says_per_depth():
    assert chain_depth_counts(3, 1) == [[1.0, 1.0], [0.0, 1.0]]  # depth 3 never tested
    assert chain_depth_counts(2, 2) == [[1.0, 1.0], [1.0, 1.0]]
    assert chain_depth_counts(4, 0) == [[0.0, 1.0]]
    assert add_counts([[1.0, 2.0]], [[0.0, 1.0], [1.0, 1.0]]) == [[1.0, 3.0], [1.0, 1.0]]


def test_a_depth_decays_only_when_tested_again():
    state = decay_into([], [[4.0, 10.0], [6.0, 8.0]], decay=0.5, max_depth=8)
    state = decay_into(state, [[1.0, 2.0]], decay=0.5, max_depth=8)
    assert state == [[3.0, 7.0], [6.0, 8.0]]


def test_rates_keep_the_pooled_level_and_take_the_shape_over_depth():
    state = [[44.0, 100.0], [28.0, 50.0]]  # depth 1: 0.44; depth 2 after an accepted first: 0.56
    rates = conditional_rates(state, pooled=0.48, prior_trials=0.0, depth=3)
    mean = 72.0 / 150.0
    assert rates[0] == pytest.approx(0.48 * 0.44 / mean) and rates[1] == pytest.approx(0.48 * 0.56 / mean)
    assert rates[2] == pytest.approx(0.48)  # never tested: the pooled alpha
    # the level follows the pooled alpha (its drift back to the prior), the counts only the shape
    assert conditional_rates(state, pooled=0.24, prior_trials=0.0, depth=2) == pytest.approx(rates[:2] / 2)
    assert conditional_rates([], pooled=0.5, prior_trials=4.0, depth=2) == pytest.approx([0.5, 0.5])
    assert depth_gains(np.array([0.5, 0.6])) == pytest.approx([0.5, 0.3])


def test_a_second_token_accepted_more_often_than_the_first_earns_k_2():
    n = 8
    args = (np.ones(n, bool), np.full(n, 8), np.zeros(n, int), np.full(n, 100.0), COST, 8)
    assert best_uniform_k(np.full(n, 0.44), *args)[0][0] == 1  # eq. 8 with one alpha: 0.44^2 for token 2
    gains = np.tile(depth_gains(np.array([0.44, 0.56, 0.49, 0.6, 0.5, 0.5, 0.5, 0.5])), (n, 1))
    assert best_uniform_k(gains, *args)[0][0] == 2  # 0.44 x 0.56 for token 2


def test_smartspec_drafts_two_where_one_alpha_drafts_one():
    """Mostly k = 1 so far: the pooled alpha is the first token's 0.44, but the chains that went deeper
    showed a second token accepted 56 % of the time after an accepted first."""
    ctx = SpecContext(now=0.0, step=0, draft_available=True, cost_model=PROFILE, draft_cost_model=DRAFT)
    chosen = {}
    for per_depth in (True, False):
        policy = SmartSpec(SmartSpecConfig(per_depth=per_depth, prior_trials=0.0))
        policy.state.record({"alpha": [44, 100], "depth": [[44.0, 100.0], [14.0, 25.0]]})
        chosen[per_depth] = {s.max_depth for s in plan_shapes(policy, requests(8), ctx)}
    assert chosen == {True: {2}, False: {1}}
