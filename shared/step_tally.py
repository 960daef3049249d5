"""Verify steps summed between two flushes to the metrics (shared/metric_flush.py, TandemMetrics.apply).

    tally = StepTally(max_positions=16)
    tally.add_steps([(4, 3, 4, 0)])          # (num_proposed, num_accepted, depth, num_pruned) per request
    tally.add_plain(7)                       # requests that decoded without a draft
    tally.add_speculation([4, 0, 0])         # the k chosen per request of one step
    metrics.apply(tally)                     # one update per series
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence


class StepTally:
    def __init__(self, max_positions: int = 16) -> None:
        self.max_positions = max_positions
        self.proposed = self.accepted = self.pruned = 0
        # counts in plain dicts: a collections.Counter costs more to make than to fill
        self.lengths: dict[int, int] = {}  # committed tokens per request step (accepted + bonus) -> steps
        self.depths: dict[int, int] = {}  # min(depth, max_positions) -> steps
        self.reached: dict[int, int] = {}  # accepted positions, min(accepted, depth, max_positions) -> steps
        self.ks: dict[int, int] = {}  # speculation length chosen -> request steps
        self.last_mean_k: float | None = None  # the mean k of the last step added
        self.preempted = self.resumed = self.evicted = 0

    def add_steps(self, steps: Sequence[tuple[int, int, int, int]]) -> None:
        self.add_counted(Counter(steps).items())

    def add_counted(self, counted: Iterable[tuple[tuple[int, int, int, int], int]]) -> None:
        """Request steps with how many times each: a batch's requests mostly share one outcome (a chain accepted
        whole), so each distinct one is added once."""
        lengths, depths, reached, cap = self.lengths, self.depths, self.reached, self.max_positions
        for (num_proposed, num_accepted, depth, num_pruned), n in counted:
            self.proposed += num_proposed * n
            self.accepted += num_accepted * n
            self.pruned += num_pruned * n
            lengths[num_accepted + 1] = lengths.get(num_accepted + 1, 0) + n
            key = min(depth, cap)
            depths[key] = depths.get(key, 0) + n
            key = min(num_accepted, depth, cap)
            reached[key] = reached.get(key, 0) + n

    def add_plain(self, n: int) -> None:
        """``n`` request steps without a draft: accepted length 1, nothing proposed."""
        if n:
            self.lengths[1] = self.lengths.get(1, 0) + n

    def add_speculation(self, ks: Sequence[int]) -> None:
        counts = self.ks
        for k, n in Counter(ks).items():
            counts[k] = counts.get(k, 0) + n
        if ks:
            self.last_mean_k = sum(ks) / len(ks)
