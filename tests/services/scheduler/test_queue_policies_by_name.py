"""Queue policies by configured name (TANDEM_QUEUE_POLICY), with their options and the profiled costs."""

from __future__ import annotations

import pytest

from scheduler.policies.laps_sd import LapsSD
from scheduler.policies.order_baselines import LAS, LPSJF
from services.scheduler.policies import queue_policy
from services.settings import ServiceSettings
from shared.profiling.cost_model import CostModel


def test_names():
    assert queue_policy("fcfs").name == "fcfs"
    assert isinstance(queue_policy("las"), LAS) and queue_policy("las:0.2").quantum_s == 0.2
    assert isinstance(queue_policy("lp-sjf"), LPSJF)
    assert isinstance(queue_policy("laps-sd"), LapsSD) and isinstance(queue_policy("LAPS_SD"), LapsSD)


def test_laps_sd_options_and_costs():
    target = CostModel(gamma_s=1e-3, delta_s=0.05)
    p = queue_policy("laps-sd:k=3,m=4,s1=0.1,gamma=6,delta=0.02", cost_model=target)
    levels, stability = p.config.levels, p.config.stability
    assert (levels.num_queues, levels.growth, levels.first_threshold, levels.unit) == (3, 4.0, 0.1, "s")
    assert (stability.rounds, stability.tolerance) == (6, 0.02)
    assert p.config.costs.target is target and p.config.costs.draft is None
    assert p.config.unstable == "fcfs" and queue_policy("laps-sd:est=1").config.unstable == "estimate"
    joined = queue_policy("laps-sd:est=1+s1=2").config  # "+" joins options where "," separates list items
    assert joined.unstable == "estimate" and joined.levels.first_threshold == 2.0
    assert queue_policy("laps-sd:est=1").config.prior_tokens == 16.0
    assert queue_policy("laps-sd:est=1+prior=0").config.prior_tokens == 0.0
    assert queue_policy("laps-sd:est=1+share=1").config.share_rounds is True
    assert queue_policy("laps-sd:est=1").config.share_rounds is False


def test_laps_sd_first_threshold_is_counted_in_rounds_unless_given_in_seconds():
    from scheduler.policies.priority_queues import Q1_ROUNDS

    target = CostModel(alpha_s=1e-5, gamma_s=2e-3, delta_s=0.06)
    for p in (queue_policy("laps-sd"), queue_policy("laps-sd", cost_model=target)):  # a profile changes nothing
        levels = p.config.levels
        assert (levels.first_threshold, levels.unit) == (Q1_ROUNDS, "rounds")
    rounds = queue_policy("laps-sd:s1=20r").config.levels
    assert (rounds.first_threshold, rounds.unit, rounds.describe()) == (20, "rounds", "S_1 = 20 rounds")
    given = queue_policy("laps-sd:s1=2", cost_model=target).config.levels
    assert (given.first_threshold, given.unit, given.describe()) == (2.0, "s", "S_1 = 2 s")


@pytest.mark.parametrize(
    "spec", ["nope", "las:-1", "las:x", "laps-sd:k=0", "laps-sd:k=2.5", "laps-sd:m=1", "laps-sd:foo=1", "laps-sd:k",
             "laps-sd:est=2", "laps-sd:prior=-1", "laps-sd:prior=x", "laps-sd:share=2", "laps-sd:share=yes"]
)
def test_bad_specs(spec):
    with pytest.raises(ValueError):
        queue_policy(spec)


def test_settings():
    s = ServiceSettings.from_env(env={"TANDEM_QUEUE_POLICY": "laps-sd", "TANDEM_MAX_BATCH_SIZE": "4"})
    assert (s.queue_policy, s.max_batch_size) == ("laps-sd", 4)
