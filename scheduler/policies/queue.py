"""Who runs: admission and order (architecture.md §2 step 1).

Capacity is a worst-case reservation: a running request holds
``len(prompt_ids) + max_new_tokens`` tokens of the budget from admission to
its end, so the KV cache never runs out mid-generation and nobody has to be
preempted for space.

``QueuePolicy.schedule`` may also name running requests to preempt (LAPS-SD's
non-perceptible requests, §5.5): the loop puts them back in the queue. They keep
their KV on both workers (``Request.resident``) while the token budget allows
and resume without a prefill; under KV pressure the loop evicts them (released
on both workers) and later re-prefills prompt + output generated so far. See
scheduler/engine_loop.py. FCFS never preempts; the preemptive policies
(``las``, ``laps-sd``) build on ``preemptive.py``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from scheduler.policies.shared_state import SharedState
from scheduler.request import Request


@dataclass(frozen=True)
class Capacity:
    max_batch_size: int  # running requests
    max_tokens_in_flight: int  # sum of reserved_tokens over running requests


def reserved_tokens(req: Request) -> int:
    return len(req.prompt_ids) + req.max_new_tokens


@dataclass
class Admission:
    admit: list[Request] = field(default_factory=list)  # from waiting, in prefill order
    preempt: list[Request] = field(default_factory=list)  # from running, back to waiting


class QueuePolicy:
    """Base class: ``order`` the queue; the default ``schedule`` admits in that order while capacity lasts.

    Admission stops at the first request that does not fit (no skipping
    ahead): the head of the queue cannot be starved by smaller requests behind it.
    """

    name = "base"

    def order(self, waiting: Sequence[Request], now: float) -> list[Request]:
        raise NotImplementedError

    def on_finish(self, req: Request) -> None:
        """Called once per request that ended (any state), after the step; e.g. to learn output lengths."""

    def shared_state(self) -> SharedState | None:
        """What the policy learns (e.g. output-length history), kept in Redis by the scheduler; None: nothing."""
        return None

    def schedule(
        self, waiting: Sequence[Request], running: Sequence[Request], capacity: Capacity, now: float
    ) -> Admission:
        ordered = self.order(waiting, now)
        if not ordered:  # nothing waits (most steps): no need to sum the running requests' reservations
            return Admission(admit=[])
        num_running = len(running)
        tokens = sum(reserved_tokens(r) for r in running)
        admit = []
        for req in ordered:
            need = reserved_tokens(req)
            if num_running >= capacity.max_batch_size or tokens + need > capacity.max_tokens_in_flight:
                break
            admit.append(req)
            num_running += 1
            tokens += need
        return Admission(admit=admit)


class FCFS(QueuePolicy):
    """First come, first served, non-preemptive.

    With ``use_priority`` (default) priority is *strict*: a request with a
    lower ``priority`` value is always admitted before any with a higher one,
    FCFS among equals (arrival time, then submission order). Running requests
    are never displaced. With ``use_priority=False`` the field is ignored.
    """

    name = "fcfs"

    def __init__(self, use_priority: bool = True) -> None:
        self.use_priority = use_priority

    def order(self, waiting: Sequence[Request], now: float) -> list[Request]:
        # sorted() is stable, so equal keys keep submission order
        if self.use_priority:
            return sorted(waiting, key=lambda r: (r.priority, _arrival(r)))
        return sorted(waiting, key=_arrival)


def _arrival(req: Request) -> float:
    return req.arrival_time if req.arrival_time is not None else float("inf")
