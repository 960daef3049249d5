"""Admission control at the public endpoint: a bounded queue, and a retry hint for those turned away.

    submit ─▶ gate.check(num_waiting) ─▶ queued             (num_waiting < max_queue)
                         └─▶ QueueFullError(retry_after_ms)  (RESOURCE_EXHAUSTED)

The hint is how long the queue takes to drain by one request's worth past the
bound at the recent finishing rate: (num_waiting - max_queue + 1) x the
exponentially weighted mean gap between finishes, clamped to [MIN, MAX]. With
no finishes yet it is DEFAULT_RETRY_MS. Nothing already queued is touched.
"""

from __future__ import annotations

from services.scheduler.errors import QueueFullError

MIN_RETRY_MS, MAX_RETRY_MS, DEFAULT_RETRY_MS = 50, 60_000, 1_000
EWMA_WEIGHT = 0.2  # of the newest finish gap


class QueueGate:
    def __init__(self, max_queue: int) -> None:
        if max_queue < 1:
            raise ValueError(f"max_queue must be >= 1, got {max_queue}")
        self.max_queue = max_queue
        self.num_refused = 0
        self._last_finish: float | None = None
        self._gap_s: float | None = None

    def on_finish(self, now: float) -> None:
        """A request left the system at ``now`` (seconds, the scheduler's clock)."""
        if self._last_finish is not None:
            gap = max(0.0, now - self._last_finish)
            self._gap_s = gap if self._gap_s is None else (1 - EWMA_WEIGHT) * self._gap_s + EWMA_WEIGHT * gap
        self._last_finish = now

    def retry_after_ms(self, num_waiting: int) -> int:
        if self._gap_s is None:
            return DEFAULT_RETRY_MS
        over = max(1, num_waiting - self.max_queue + 1)
        return int(min(MAX_RETRY_MS, max(MIN_RETRY_MS, over * self._gap_s * 1000)))

    def check(self, num_waiting: int) -> None:
        """Raises QueueFullError when one more request would exceed the bound."""
        if num_waiting < self.max_queue:
            return
        self.num_refused += 1
        hint = self.retry_after_ms(num_waiting)
        raise QueueFullError(
            f"the queue is full ({num_waiting} requests waiting, TANDEM_MAX_QUEUE={self.max_queue}); "
            f"retry in about {hint} ms",
            hint,
        )
