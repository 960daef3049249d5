"""Synthetic iterations for the learning speculation policies: decide -> simulated outcome -> observe.

Acceptance is geometric with a per-request alpha; step times come from a
``StepCost`` of our choosing (what the policy must discover), on a fake clock.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from scheduler.policies.speculation import SpecContext, SpeculationPolicy, plan_shapes
from scheduler.policies.step_cost import StepCost
from scheduler.report import PhaseTimes, RequestOutcome, StepReport
from scheduler.request import Request

CHEAP_DRAFT = StepCost(delta_t=0.030, gamma_t=0.0002, alpha_t=0.0, call_d=0.001, delta_d=0.002, gamma_d=0.00005, alpha_d=0.0)
# verification that turns compute-bound early: 64 batched tokens cost four plain decodes at batch 1
EXPENSIVE_VERIFY = StepCost(delta_t=0.030, gamma_t=0.002, alpha_t=0.0, call_d=0.002, delta_d=0.004, gamma_d=0.0005, alpha_d=0.0)


def requests(n: int, prompt: int = 20, max_new: int = 1000, prefix: str = "r") -> list[Request]:
    return [Request(f"{prefix}{i}", [1] * prompt, max_new_tokens=max_new) for i in range(n)]


def run_steps(
    policy: SpeculationPolicy,
    batch: Sequence[Request],
    alphas: Sequence[float],
    truth: StepCost,
    steps: int,
    seed: int = 0,
    start_step: int = 0,
    ctx_extra: dict | None = None,
) -> list[list[int]]:
    """Run ``steps`` iterations; returns the chain length chosen per request per step."""
    rng = random.Random(seed)
    chosen = []
    for step in range(start_step, start_step + steps):
        ctx = SpecContext(now=float(step), step=step, draft_available=True, **(ctx_extra or {}))
        shapes = plan_shapes(policy, batch, ctx)
        ks = [s.max_depth for s in shapes]
        chosen.append(ks)
        report = StepReport(step=step, started_at=float(step))
        contexts = [r.num_tokens for r in batch]
        verify = truth.step([0] * len(ks), contexts) + sum(k * truth.gamma_t for k in ks)
        times = PhaseTimes(verify=verify + (truth.call_t if any(ks) else 0.0))  # the verify mode's own cost
        times.speculate = truth.step(ks, contexts) - times.verify
        report.times = times
        for r, shape, k, a in zip(batch, shapes, ks, alphas):
            acc = 0
            while acc < k and rng.random() < a:
                acc += 1
            if k:
                r.position_drafted.extend([0] * (k - len(r.position_drafted)))
                r.position_accepted.extend([0] * (k - len(r.position_accepted)))
                for d in range(k):
                    r.position_drafted[d] += 1
                for d in range(acc):
                    r.position_accepted[d] += 1
                r.num_drafted_tokens += k
                r.num_accepted_tokens += acc
            report.outcomes.append(RequestOutcome(r.id, shape, k, acc, acc + 1))
        report.batch_size = len(batch)
        policy.observe(report)
    return chosen
