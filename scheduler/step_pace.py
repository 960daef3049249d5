"""Continuation steps per plan, from the measured step time: many while steps are short, one when they are long.

A plan that asks for R continuation steps (TargetPlan.repeat, services/target/repeat_plan.py) saves plan
messages and round trips, and R >= 3 lets the target send two outcomes in one message
(services/target/outcome_hold.py). Its price is an arrival's wait: the steps already owed run first, up to
2R + 1 of them (R owed, and R + 1 more asked for as the last one is read). So R follows the step time::

    R = the largest r <= most with (2r + 1) * step <= wait,  but at least 1 (and at most most)

On a 2-core CPU host a small batch's step takes ~0.5 ms: R = 3 with the default 4 ms, so an arrival waits at
most ~3.5 ms more. A GPU step of an 8B model takes 5-10 ms: R = 1, as with a fixed repeat of 1 (the target
still never waits for a plan between steps).

The step time is an exponential average of the intervals between ticks (one per loop step); a pause longer
than ``idle_s`` (the server was idle) is not a step and is not counted. Until ``warm`` intervals are in, R is 1.
"""

from __future__ import annotations

IDLE_S = 0.5  # a longer interval between two steps is idleness, not a step
WARM = 2  # intervals measured before R may grow past 1
DECAY = 0.9  # weight of the old average at each interval


def repeat_for(most: int, step_s: float, wait_s: float) -> int:
    """The largest R <= ``most`` with (2R + 1) * ``step_s`` <= ``wait_s``; at least 1 where ``most`` >= 1."""
    if most <= 1:
        return max(most, 0)
    if step_s <= 0:
        return 1
    fit = int((wait_s / step_s - 1) // 2)
    return max(1, min(most, fit))


class StepPace:
    def __init__(self, most: int, wait_s: float, idle_s: float = IDLE_S, warm: int = WARM) -> None:
        self.most = most  # the configured repeat: the most R may be
        self.wait_s = wait_s  # the most an arrival should wait for steps run ahead
        self.idle_s = idle_s
        self.warm = warm
        self.step_s = 0.0  # the average step time, once measured
        self._last: float | None = None
        self._count = 0

    def tick(self, now: float) -> None:
        """A loop step began at ``now`` (seconds, any monotonic clock)."""
        last, self._last = self._last, now
        if last is None or not 0 < now - last < self.idle_s:
            return
        dt = now - last
        self.step_s = dt if not self._count else DECAY * self.step_s + (1 - DECAY) * dt
        self._count += 1

    @property
    def repeat(self) -> int:
        """Continuation steps the next plan asks for."""
        if self._count < self.warm:
            return min(self.most, 1)
        return repeat_for(self.most, self.step_s, self.wait_s)
