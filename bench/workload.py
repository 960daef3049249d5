"""A benchmark workload: who arrives when, with which prompt, SLO and output length.

Deterministic by seed, so every configuration of one run (and every rerun)
serves exactly the same requests.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from bench import prompts as prompt_sets
from bench.slo import SloClass, assign_classes


@dataclass(frozen=True)
class WorkItem:
    index: int
    arrival_s: float | None  # offset from the start; None under closed-loop load
    prompt: prompt_sets.Prompt
    slo: SloClass
    max_new_tokens: int


def build(
    n: int,
    *,
    arrivals: list[float] | None,
    prompt_mix: dict[str, float],
    slo_mix: dict[str, float],
    max_new_tokens: int | tuple[int, int],
    seed: int = 0,
    length_dist: str = "uniform",
) -> list[WorkItem]:
    """``n`` items; ``max_new_tokens`` is fixed or drawn from an inclusive range.

    ``length_dist``: ``uniform`` over the range, or ``log-uniform`` (uniform in log: as many requests
    in 8..16 as in 128..256, the heavy tail of chat output lengths; LAPS-SD's datasets are skewed so).
    """
    if length_dist not in LENGTH_DISTS:
        raise ValueError(f"length_dist is one of {', '.join(LENGTH_DISTS)}, got {length_dist!r}")
    if arrivals is not None and len(arrivals) != n:
        raise ValueError(f"{len(arrivals)} arrival times for {n} requests")
    rng = random.Random(seed)
    texts = prompt_sets.mixed(n, prompt_mix, seed)
    classes = assign_classes(n, slo_mix, seed + 1)
    lo, hi = (max_new_tokens, max_new_tokens) if isinstance(max_new_tokens, int) else max_new_tokens
    if not 1 <= lo <= hi:
        raise ValueError("max_new_tokens must be >= 1 (and a range lo <= hi)")
    return [
        WorkItem(
            index=i,
            arrival_s=None if arrivals is None else arrivals[i],
            prompt=texts[i],
            slo=classes[i],
            max_new_tokens=_draw(rng, lo, hi, length_dist),
        )
        for i in range(n)
    ]


LENGTH_DISTS = ("uniform", "log-uniform")


def _draw(rng: random.Random, lo: int, hi: int, dist: str) -> int:
    if dist == "uniform" or lo == hi:
        return rng.randint(lo, hi)
    return min(hi, max(lo, round(math.exp(rng.uniform(math.log(lo), math.log(hi + 1))) - 0.5)))
