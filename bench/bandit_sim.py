"""Nightjar's variants against the best fixed k on synthetic stacks: ``python -m bench.bandit_sim``.

Each case draws a batch size (1-4), a truth for the step cost (``tests.scheduler.sim_reports``: a cheap
or a compute-bound verify, a draft of 2-6 ms a step) and per-request geometric acceptance around a common
level; every variant runs ``--steps`` steps in each of ``--seeds`` seeds, and its expected goodput (the
decisions' expected tokens over the truth's seconds) is divided by that of the best fixed chain of 0..8.
No clock, no stack: what the bandit's exploration and estimates cost, apart from any machine's noise.
"""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import typer

from scheduler.policies.nightjar import Nightjar, NightjarConfig
from tests.scheduler.sim_reports import CHEAP_DRAFT, EXPENSIVE_VERIFY, requests, run_steps

VARIANTS = {
    "nightjar (Alg. 1)": {},
    "nightjar-global": {"exploration": "global"},
    "nightjar-elim": {"eliminate": 2.0},
    "global + elim": {"exploration": "global", "eliminate": 2.0},
    "global + chain": {"exploration": "global", "estimate": "chain"},
    "nightjar-lean (all three)": {"exploration": "global", "eliminate": 2.0, "estimate": "chain"},
}


def goodput(rows: list[list[int]], alphas: list[float], truth, contexts: list[int]) -> float:
    tokens = sum(sum(a ** (d + 1) for d in range(k)) + 1.0 for ks in rows for k, a in zip(ks, alphas))
    return tokens / sum(truth.step(ks, contexts) for ks in rows)


def main(cases: int = 24, steps: int = 400, seeds: int = 3, seed: int = 3) -> None:
    rng = random.Random(seed)
    ratios: dict[str, list[float]] = {name: [] for name in VARIANTS}
    best_ks: list[int] = []
    for case in range(cases):
        b = rng.choice([1, 2, 3, 4])
        delta_d = rng.choice([0.002, 0.004, 0.006])
        truth = dataclasses.replace(rng.choice([CHEAP_DRAFT, EXPENSIVE_VERIFY]), delta_d=delta_d)
        level = rng.choice([0.35, 0.5, 0.65, 0.8])
        alphas = [min(0.95, max(0.1, level + rng.uniform(-0.2, 0.2))) for _ in range(b)]
        contexts = [20] * b
        fixed = [goodput([[k] * b], alphas, truth, contexts) for k in range(9)]
        best = max(fixed)
        best_ks.append(int(np.argmax(fixed)))
        for name, kw in VARIANTS.items():
            got = []
            for s in range(seeds):
                policy = Nightjar(NightjarConfig(seed=s, **kw))
                rows = run_steps(policy, requests(b), alphas, truth, steps=steps, seed=case * 10 + s)
                got.append(goodput(rows, alphas, truth, contexts) / best)
            ratios[name].append(float(np.mean(got)))
    print(f"{cases} cases x {seeds} seeds, {steps} steps each: goodput against the best fixed k "
          f"(best k per case: {sorted(best_ks)})")
    print(f"{'variant':28s} {'mean':>6s} {'worst':>6s} {'within 5 %':>11s}")
    for name, values in ratios.items():
        v = np.array(values)
        print(f"{name:28s} {v.mean():6.3f} {v.min():6.3f} {int((v >= 0.95).sum()):>5d} of {len(v)}")


if __name__ == "__main__":
    typer.run(main)
