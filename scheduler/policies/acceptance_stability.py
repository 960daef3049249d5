"""When a request's acceptance rate has become predictable (LAPS-SD §4.3, Algorithm 1 lines 11-13).

The loop records, per speculative round, the accepted draft tokens and the
depth drafted; ``Request.acceptance_rates()`` turns them into the cumulative
acceptance rate after each round (accepted / drafted so far). LAPS-SD
observes that this rate wanders early in decoding and then settles (its
Figure 3). A request is *stable* (perceptible) at the first run of γ
consecutive rounds whose rates differ by less than δ (max − min < δ); the
mean of those γ rates is its predicted acceptance rate A_i.

The first such window is used, and the history only grows, so once a request
is perceptible it stays so, with the same A_i: a pure function of the history.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Stability:
    rounds: int = 4  # γ
    tolerance: float = 0.05  # δ

    def __post_init__(self) -> None:
        if self.rounds < 1 or self.tolerance <= 0:
            raise ValueError(f"stability needs gamma >= 1 and delta > 0, got {self}")

    def predicted_acceptance(self, rates: Sequence[float]) -> float | None:
        """A_i: mean of the first γ consecutive rates spanning less than δ; None while not yet stable."""
        g = self.rounds
        for end in range(g, len(rates) + 1):
            window = rates[end - g : end]
            if max(window) - min(window) < self.tolerance:
                return sum(window) / g
        return None
