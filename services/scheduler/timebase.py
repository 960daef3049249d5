"""Scheduler clock seconds -> Unix nanoseconds, for timestamps on the wire, in Redis and in traces.

The scheduler times everything on its monotonic ``Clock``; clients, Redis
records and trace backends want wall-clock instants. The offset between the
two is taken once, so a wall-clock step (NTP) never reorders a request's
token timestamps.
"""

from __future__ import annotations

import time

from scheduler.workers import Clock


class Timebase:
    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self._origin_s = clock.now()
        self._origin_unix_ns = time.time_ns()

    def unix_ns(self, t: float | None = None) -> int:
        """Unix ns of scheduler time ``t`` (now when None)."""
        t = self.clock.now() if t is None else t
        return self._origin_unix_ns + round((t - self._origin_s) * 1e9)
