"""When drafting ahead stops paying: a gate over the last ``window`` guesses of the next plan's shape.

Draft run-ahead (scheduler/draft_ahead.py), the draft relay (scheduler/draft_relay.py) and its lookahead
(services/target/draft_relay.py) all draft a request's next tree
before its plan is known, on the guess that the plan keeps the shape; a guess that misses costs draft
work (run-ahead) or the step's speculation (relay). Over the last ``window`` guesses, more than
``max_miss`` missed -> no guesses for ``pause_steps`` steps, then it tries again; each window missed
again in a row doubles the pause (up to ``max_pause_steps``), and a window that hits sets it back.
"""

from __future__ import annotations

from collections import deque


class MissGate:
    def __init__(self, window: int = 64, max_miss: float = 0.25, pause_steps: int = 64,
                 max_pause_steps: int = 4096) -> None:  # fmt: skip
        self.window, self.max_miss, self.pause_steps, self.max_pause_steps = window, max_miss, pause_steps, max_pause_steps
        self._next_pause = pause_steps
        self._recent: deque[bool] = deque(maxlen=window)  # per guess checked against its plan: a hit?
        self.paused = 0  # steps left without guesses
        self.num_hits = 0
        self.num_misses = 0

    def open(self) -> bool:
        """Once per step: whether to guess this step (a paused gate counts down)."""
        if self.paused:
            self.paused -= 1
            return False
        return True

    def record(self, hit: bool) -> None:
        if hit:
            self.num_hits += 1
        else:
            self.num_misses += 1
        self._recent.append(hit)
        if len(self._recent) < self.window:
            return
        if self._recent.count(False) > self.max_miss * self.window:
            self.paused, self._next_pause = self._next_pause, min(2 * self._next_pause, self.max_pause_steps)
        else:
            self._next_pause = self.pause_steps
        self._recent.clear()
