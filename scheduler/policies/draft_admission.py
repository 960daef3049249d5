"""Whether a new request goes onto the draft at admission, from what the policy has lately decided.

A draft prefill at admission runs beside the target's prefill. Where the two
models have hardware of their own that is free; where they share it (two
processes on one CPU, one GPU without a partition) it slows the target's
prefill, and once a length policy has switched speculation off (high load)
it is pure cost: on this project's CPU, SmartSpec at 4x the lone-request rate
speculated in 1 % of its steps and still spent 17 % more time prefilling than
target-only, all of it the draft's prefills (bench/results/adaptive-demo).

SmartSpec §5 answers with its prefill-disabling rule, which keeps such a
request off the draft for good (smartspec.py). ``DraftAdmission`` is the
same test for the other learning policies, but it only *defers*: when the
policy later chooses k > 0 for a deferred request, the scheduler prefills it
on the draft first (engine_loop's resync path), so nothing is barred from
speculation; the draft's prefill just moves from admission to the first step
that needs it.

    admission = DraftAdmission()
    admission.record(ks)            # per step: the k chosen for each AUTO request
    admission.wants_draft()         # False while more than `threshold` of the recent decisions were k = 0

A short window (16 steps) and a low bar (half the decisions): deferring costs
little when it is wrong (the draft's prefill of that one request, later and
in the step's critical path instead of beside the target's prefill), so the
test follows what the policy does now rather than over the last minute.

Pure: no I/O; per-replica memory (a restarted scheduler starts by prefilling).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence


class DraftAdmission:
    def __init__(self, window: int = 16, threshold: float = 0.5, min_decisions: int = 4) -> None:
        if not 0.0 <= threshold <= 1.0:
            raise ValueError(f"threshold is a share in [0, 1], got {threshold}")
        self.threshold = threshold
        self.min_decisions = min_decisions
        self._steps: deque[tuple[int, int]] = deque(maxlen=window)  # (decisions with k = 0, decisions) per step

    def record(self, ks: Sequence[int]) -> None:
        """One step's decisions (the k of each request the policy decided for); an empty step is skipped."""
        if ks:
            self._steps.append((sum(1 for k in ks if k == 0), len(ks)))

    def zero_share(self) -> float | None:
        """Share of k = 0 among the window's decisions; None before ``min_decisions``."""
        total = sum(n for _, n in self._steps)
        if total < self.min_decisions:
            return None
        return sum(z for z, _ in self._steps) / total

    def wants_draft(self) -> bool:
        share = self.zero_share()
        return share is None or share <= self.threshold
