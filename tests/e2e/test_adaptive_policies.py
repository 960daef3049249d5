"""The speculation-length policies (SmartSpec, FASER) over real gRPC, tiny models and Redis: lossless,
their chosen k in metrics, their learned state in Redis after the scheduler stops."""

from __future__ import annotations

import pytest

from sdk import FinishReason
from shared.state.store import StateStore, StoreConfig
from tests.e2e.test_tree_policies import _generate_all, _prompts, scheduler_for, services  # noqa: F401

# the tiny random draft is never confident: a threshold it clears, so that smartspec-conf drafts at all
ADAPTIVE_POLICIES = ["smartspec", "smartspec-request", "smartspec-conf:0.0001", "faser", "faser-joint",
                     "faser-joint-recent"]


@pytest.mark.parametrize("policy", ADAPTIVE_POLICIES)
def test_adaptive_policy_is_lossless_over_grpc(services, reference, policy):  # noqa: F811
    prompts = _prompts(6, seed=11)
    specs = ["auto"] * 4 + [2, "off"]  # beside client-fixed chains and plain decoding
    requests = [
        dict(prompt=p, max_new_tokens=8 + 3 * i, speculation=spec) for i, (p, spec) in enumerate(zip(prompts, specs))
    ]
    with scheduler_for(services, policy, home=services.home) as running:
        results = _generate_all(running.address, requests)
        sent = list(requests)
        # more rounds: the policy decides from what it learned before. What it learns from real timings may say
        # k = 0 for a while (on a loaded machine the random draft's rare hits do not pay), so up to three more
        for _ in range(4):
            results += _generate_all(running.address, requests[:4])
            sent += requests[:4]
            auto = results[:4] + results[6:]
            if policy.startswith("smartspec-conf") or sum(r.stats.num_draft_tokens for r in auto) > 0:
                break
        exposition = running.metrics.render()
    for i, (req, r) in enumerate(zip(sent, results)):
        assert r.finish_reason == FinishReason.LENGTH
        assert r.token_ids == reference.greedy(req["prompt"], req["max_new_tokens"]), f"request {i} ({policy})"
    if not policy.startswith("smartspec-conf"):  # its verify-length choice rightly drops the random draft's guesses
        assert sum(r.stats.num_draft_tokens for r in results[:4] + results[6:]) > 0  # AUTO requests did speculate
    assert "tandem_speculation_length_tokens_count" in exposition
    with StateStore(StoreConfig(url=services.redis_url)) as store:
        state = store.get_json(f"policy:{policy.split(':')[0]}")
    assert state is not None and state["version"] >= 1  # flushed to Redis when the scheduler stopped


@pytest.mark.parametrize("policy", ["nightjar", "nightjar-lean-drift", "nightjar-lean-bounds", "nightjar-lean-weighted",
                                    "nightjar-lean-local", "nightjar-lean-local-exact"])
def test_nightjar_is_lossless_over_grpc(services, reference, policy):  # noqa: F811
    """Nightjar's bandit (and its drift-reading variant) chooses lengths only: every output stays greedy, and its
    learned state (under the policy's own state name) is in Redis after the scheduler stops."""
    from services.scheduler.policies import speculation_policy

    prompts = _prompts(4, seed=13)
    requests = [dict(prompt=p, max_new_tokens=10 + 2 * i, speculation="auto") for i, p in enumerate(prompts)]
    with scheduler_for(services, policy, home=services.home) as running:
        results = _generate_all(running.address, requests) + _generate_all(running.address, requests)
    for i, (req, r) in enumerate(zip(requests + requests, results)):
        assert r.token_ids == reference.greedy(req["prompt"], req["max_new_tokens"]), f"request {i} ({policy})"
    with StateStore(StoreConfig(url=services.redis_url)) as store:
        state = store.get_json(speculation_policy(policy).state.name)
    assert state is not None and state["buckets"]  # the bandit learned per batch-size bucket
