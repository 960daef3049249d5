"""Per-step metrics summed in plain Python and handed to prometheus_client in batches.

    registry = FlushingRegistry()            # what TandemMetrics makes by default
    registry.on_collect(observer.flush)      # a scrape (or get_sample_value) sees every step so far
    batch = StepBatch(period_s=0.25)         # an observer's: due() says when to flush in between

A prometheus_client counter's ``inc`` takes a lock and walks a few Python frames (1-2 µs), and a
verify step of one request touches some twenty series (counts, histogram buckets, one series per
draft position): per step that was a tenth of the scheduler's own work at batch 1. Summed into ints
and dicts and flushed every ``period_s`` and before every collection, each series is touched once per
flush, and what a scrape reads is what it read before: every step up to that moment.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric

FLUSH_S = 0.25  # the longest a step's counts wait in an observer before they reach the series


class FlushingRegistry(CollectorRegistry):
    """A CollectorRegistry that runs its flush hooks before each collection."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._flushes: list[Callable[[], None]] = []

    def on_collect(self, flush: Callable[[], None]) -> None:
        self._flushes.append(flush)

    def collect(self) -> Iterable[Metric]:
        for flush in tuple(self._flushes):
            flush()
        yield from super().collect()


class StepBatch:
    """When an observer's summed counts are due (every ``period_s``), and the lock between the loop, which adds to
    them, and a scrape's thread, which flushes them."""

    def __init__(self, registry: CollectorRegistry, flush: Callable[[], None], period_s: float = FLUSH_S) -> None:
        self.lock = threading.Lock()
        self.period_s = period_s
        self._last = time.monotonic()
        if isinstance(registry, FlushingRegistry):
            registry.on_collect(flush)
        else:  # a plain registry's collections cannot be hooked: every step flushes
            self.period_s = 0.0

    def due(self) -> bool:
        now = time.monotonic()
        if now - self._last < self.period_s:
            return False
        self._last = now
        return True
