"""The budgeted tree policies (AdaServe and its baselines) over real gRPC, tiny models and Redis.

One target and one draft service for the module (conftest's stack); each
test starts schedulers of its own over them, configured with the policy
under test, the way `tandem up --speculation-policy adaserve` would.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from types import SimpleNamespace

import pytest

from sdk import Client, FinishReason
from shared.profiling.cost_model import CostModel, Knee, Profile, save_profile
from tests.support.tiny_stack import VOCAB

TREE_POLICIES = ["adaserve", "global_greedy", "equal_greedy", "specinfer"]


@contextmanager
def scheduler_for(stack, policy: str, **settings) -> Iterator:
    """A second scheduler over the stack's target and draft, with ``policy`` for AUTO requests."""
    from services.scheduler.main import start
    from services.settings import ServiceSettings

    running = stack.loop.run(
        start(
            ServiceSettings(
                port=0, trace_exporter="none", shutdown_grace_s=0.5, model=str(stack.target_model),
                target_addr=stack.target.address, draft_addr=stack.draft.address, redis_url=stack.redis_url,
                speculation_policy=policy, **settings,
            )  # fmt: skip
        )
    )
    try:
        yield running
    finally:
        stack.loop.run(running.stop())


@pytest.fixture(scope="module")
def services(stack, tiny_pair, tmp_path_factory) -> SimpleNamespace:
    return SimpleNamespace(
        loop=stack.loop, target=stack.target, draft=stack.draft, redis_url=stack.redis_url,
        target_model=tiny_pair[0],
        home=tmp_path_factory.mktemp("home"),  # no profiles: B is the policies' default unless a test sets it
    )  # fmt: skip


def _prompts(n: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(VOCAB) for _ in range(rng.randint(2, 30))] for _ in range(n)]


def _generate_all(address: str, requests: list[dict]) -> list:
    with Client(address, timeout=120) as client, ThreadPoolExecutor(len(requests)) as pool:
        return [f.result() for f in [pool.submit(client.generate, **r) for r in requests]]


@pytest.mark.parametrize("policy", TREE_POLICIES)
def test_tree_policy_is_lossless_over_grpc_with_mixed_slos_and_modes(services, reference, policy):
    prompts = _prompts(8, seed=7)
    slos = [None, 0.01, 5_000.0, None, 0.01, 5_000.0, None, 0.01]  # best effort, unattainable, generous
    specs = ["auto"] * 6 + [2, "off"]  # tree policies share the batch with client-fixed chains and plain decoding
    requests = [
        dict(prompt=p, max_new_tokens=6 + 2 * i, slo_tpot_ms=slo, speculation=spec)
        for i, (p, slo, spec) in enumerate(zip(prompts, slos, specs))
    ]
    with scheduler_for(services, policy, home=services.home) as running:
        assert running.budget.source == "none"  # no profile: the policy's own default B
        results = _generate_all(running.address, requests)
    for i, (req, r) in enumerate(zip(requests, results)):
        assert r.finish_reason == FinishReason.LENGTH
        assert r.token_ids == reference.greedy(req["prompt"], req["max_new_tokens"]), f"request {i} ({policy})"
    assert sum(r.stats.num_draft_tokens for r in results[:6]) > 0  # AUTO requests got trees verified
    assert results[7].stats.num_draft_tokens == 0
    # the SLO travels with each request: generous ones are met, unattainable ones missed
    assert all(r.slo_attained for r, slo in zip(results, slos) if slo == 5_000.0)
    assert not any(r.slo_attained for r, slo in zip(results, slos) if slo == 0.01)


def test_adaserve_spends_a_tight_budget_on_the_request_with_an_slo(services, reference):
    # B = 6 for 2 requests: 2 roots + 4 nodes. The SLO-customized step (Algorithm 2) gives them all
    # to the request that is behind its SLO; the best-effort one only gets what is left: nothing.
    prompt_a, prompt_b = _prompts(2, seed=11)
    requests = [
        dict(prompt=prompt_a, max_new_tokens=12, slo_tpot_ms=0.01, speculation="auto"),
        dict(prompt=prompt_b, max_new_tokens=12, slo_tpot_ms=None, speculation="auto"),
    ]
    with scheduler_for(services, "adaserve", home=services.home, token_budget=6) as running:
        assert running.budget.source == "setting" and running.scheduler.config.token_budget == 6
        stringent, best_effort = _generate_all(running.address, requests)
    assert stringent.token_ids == reference.greedy(prompt_a, 12)
    assert best_effort.token_ids == reference.greedy(prompt_b, 12)
    assert stringent.stats.num_draft_tokens > best_effort.stats.num_draft_tokens
    assert stringent.stats.num_draft_tokens <= 4 * stringent.stats.num_steps  # never more than B allows


def test_scheduler_takes_b_from_the_targets_profile(services, tmp_path):
    knee = Knee(budget=9, method="ridge", slope_before_s=1e-4, slope_after_s=1e-4,
                latency_at_budget_s=2e-3, latency_at_one_s=1e-3)  # fmt: skip
    profile = Profile(model=services.target_model.name, hardware="cpu test", device="cpu", dtype="float32",
                      token_budget=9, knee=knee, cost_model=CostModel(gamma_s=1e-4, delta_s=1e-3),
                      sweep=[(1, 1e-3), (9, 2e-3)])  # fmt: skip
    path = save_profile(profile, tmp_path)
    with scheduler_for(services, "adaserve", home=tmp_path) as running:
        assert running.budget.source == f"file:{path}"
        assert running.scheduler.config.token_budget == 9
        assert running.budget.cost_model.gamma_s == pytest.approx(1e-4)
        with Client(running.address, timeout=60) as client:
            r = client.generate([5, 6, 7], max_new_tokens=5)
        assert r.finish_reason == FinishReason.LENGTH
