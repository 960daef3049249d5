"""Nightjar's variants against the best fixed k on synthetic stacks: ``python -m bench.diagnostics.bandit_sim``.

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
    "lean, pooled time": {"exploration": "global", "eliminate": 2.0, "estimate": "chain", "chain_time": "pooled"},
    "global + chain, pooled time": {"exploration": "global", "estimate": "chain", "chain_time": "pooled"},
    "lean, drift": {"exploration": "global", "eliminate": 2.0, "estimate": "chain", "drift": True},
    "lean, drift, local 1": {"exploration": "global", "eliminate": 2.0, "estimate": "chain", "drift": True,
                             "neighbors": 1},
    "lean, drift, local 2": {"exploration": "global", "eliminate": 2.0, "estimate": "chain", "drift": True,
                             "neighbors": 2},
    "lean, drift, bounds on the estimate": {"exploration": "global", "eliminate": 2.0, "estimate": "chain",
                                            "drift": True, "eliminate_on": "estimate"},
    "lean, bounds, weighted draw": {"exploration": "global", "eliminate": 2.0, "estimate": "chain", "drift": True,
                                    "eliminate_on": "estimate", "draw": "weighted"},
    "lean, pooled time, drift": {"exploration": "global", "eliminate": 2.0, "estimate": "chain",
                                 "chain_time": "pooled", "drift": True},
}


class NoisyTruth:
    """The truth's step times as a shared CPU shows them: each step scaled by one lognormal factor (sd ``noise``)
    and, with probability ``stall``, by ``stall_factor`` more; and the machine's speed drifting, one lognormal
    level (sd ``drift``) per ``drift_every`` steps (a shared host's neighbours: in adaptive-eagle-nightjar-5rep
    the same verify at batch 1 took 42 ms in one repeat, 78 ms in another). ``run_steps`` asks for a step's
    plain part first, then its whole; both get the same factor. What the policy learns from is noisy; its
    goodput is scored on the truth."""

    def __init__(self, truth, noise: float, stall: float, stall_factor: float, seed: int, drift: float = 0.0,
                 drift_every: int = 100) -> None:  # fmt: skip
        self.truth, self.noise, self.stall, self.stall_factor = truth, noise, stall, stall_factor
        self.drift, self.drift_every = drift, drift_every
        self.rng = random.Random(seed)
        self.calls, self.factor, self.level = 0, 1.0, 1.0

    def __getattr__(self, name: str):
        return getattr(self.truth, name)

    def step(self, ks, contexts) -> float:
        if self.calls % 2 == 0:
            if self.drift > 0 and self.calls // 2 % self.drift_every == 0:
                self.level = self.rng.lognormvariate(0.0, self.drift)
            self.factor = self.level * (self.rng.lognormvariate(0.0, self.noise) if self.noise > 0 else 1.0)
            if self.rng.random() < self.stall:
                self.factor *= self.stall_factor
        self.calls += 1
        return self.truth.step(ks, contexts) * self.factor


def goodput(rows: list[list[int]], alphas: list[float], truth, contexts: list[int]) -> float:
    tokens = sum(sum(a ** (d + 1) for d in range(k)) + 1.0 for ks in rows for k, a in zip(ks, alphas))
    return tokens / sum(truth.step(ks, contexts) for ks in rows)


def compare(variants: dict[str, dict], cases: int = 24, steps: int = 400, seeds: int = 3, seed: int = 3,
            noise: float = 0.0, stall: float = 0.0, stall_factor: float = 10.0, drift: float = 0.0,
            drift_every: int = 100) -> tuple[dict[str, list[float]], list[int]]:
    """Each variant's goodput against the best fixed k per case (mean over seeds), and the best k per case."""
    rng = random.Random(seed)
    ratios: dict[str, list[float]] = {name: [] for name in variants}
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
        for name, kw in variants.items():
            got = []
            for s in range(seeds):
                policy = Nightjar(NightjarConfig(seed=s, **kw))
                seen = (NoisyTruth(truth, noise, stall, stall_factor, seed=case * 10 + s, drift=drift,
                                   drift_every=drift_every) if noise or stall or drift else truth)
                rows = run_steps(policy, requests(b), alphas, seen, steps=steps, seed=case * 10 + s)
                got.append(goodput(rows, alphas, truth, contexts) / best)
            ratios[name].append(float(np.mean(got)))
    return ratios, best_ks


def main(cases: int = 24, steps: int = 400, seeds: int = 3, seed: int = 3,
         noise: float = typer.Option(0.0, help="Lognormal sd of the step times the policy sees (0: exact)."),
         stall: float = typer.Option(0.0, help="Chance that a step stalls (its time x --stall-factor)."),
         stall_factor: float = 10.0,
         drift: float = typer.Option(0.0, help="Lognormal sd of the machine's speed, redrawn every --drift-every "
                                     "steps (0: steady)."),
         drift_every: int = 100) -> None:
    ratios, best_ks = compare(VARIANTS, cases, steps, seeds, seed, noise, stall, stall_factor, drift, drift_every)
    print(f"{cases} cases x {seeds} seeds, {steps} steps each, step-time noise {noise}, stalls {stall} "
          f"(x{stall_factor}), drift {drift} per {drift_every} steps: goodput against the best fixed k (best k per case: {sorted(best_ks)})")
    print(f"{'variant':28s} {'mean':>6s} {'worst':>6s} {'within 5 %':>11s}")
    for name, values in ratios.items():
        v = np.array(values)
        print(f"{name:28s} {v.mean():6.3f} {v.min():6.3f} {int((v >= 0.95).sum()):>5d} of {len(v)}")


if __name__ == "__main__":
    typer.run(main)
