"""SLO classes (AdaServe §6.1, Table 2), scaled to the machine by the measured baseline.

AdaServe sets the stringent class to the *baseline latency* (the per-token time
of plain decoding at a small batch), the moderate class to 30 ms and the relaxed
class to 100 ms for a 12.5 ms baseline (Llama-2-7b). Tandem keeps those ratios
relative to the baseline measured on the machine at hand, so a CPU run and a
GPU run stress the policies the same way.
"""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class SloClass:
    name: str
    tpot_factor: float  # TPOT SLO = factor x baseline per-token latency

    def tpot_ms(self, baseline_ms: float) -> float:
        return self.tpot_factor * baseline_ms


STRINGENT = SloClass("stringent", 1.0)
MODERATE = SloClass("moderate", 30.0 / 12.5)
RELAXED = SloClass("relaxed", 100.0 / 12.5)
CLASSES = {c.name: c for c in (STRINGENT, MODERATE, RELAXED)}

# AdaServe §6.2: 60 % stringent, 20 % moderate, 20 % relaxed.
ADASERVE_MIX = {"stringent": 0.6, "moderate": 0.2, "relaxed": 0.2}


def assign_classes(n: int, mix: dict[str, float], seed: int = 0) -> list[SloClass]:
    """Draw a class per request with probabilities ``mix`` (normalised), deterministic by seed."""
    unknown = set(mix) - set(CLASSES)
    if unknown or not mix or min(mix.values()) < 0 or sum(mix.values()) <= 0:
        raise ValueError(f"mix must give non-negative weights to known classes {sorted(CLASSES)}")
    rng = random.Random(seed)
    names = list(mix)
    weights = [mix[k] for k in names]
    return [CLASSES[name] for name in rng.choices(names, weights=weights, k=n)]
