"""Learned policy state that survives restarts and is shared by scheduler replicas (architecture.md §6).

A learning policy keeps what it learned as one JSON-able dict and changes it
only through *events* (JSON-able too) and a pure ``apply(state, event)``::

    policy.observe(report) ──record(event)──▶ state = apply(state, event)   (local, at once)
                                               pending += [event]
    sync (services.scheduler.observers.policy_state, every few steps, off the loop):
        events = take()                                      pending -> in flight
        stored = update_json(name, lambda s: merge(s, events))   # Redis WATCH/MULTI: atomic per blob
        adopt(stored)                    state = merge(stored, pending)  (events recorded meanwhile)

So one replica alone ends with exactly the state it would have had without
Redis, a restarted scheduler starts from the stored state, and two replicas
each fold the other's events in at their next sync (in the order Redis saw
the merges). The stored blob carries ``version``: a state of another
version (an older layout) is dropped and learning restarts, rather than
read wrongly; bump the policy's version when its state layout changes.

Pure: no I/O here; the sync observer owns the Redis side.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

State = dict[str, Any]
Event = dict[str, Any]


class SharedState:
    """One policy's learned state: local copy, events not yet stored, and the merge rule."""

    def __init__(self, name: str, version: int, empty: Callable[[], State], apply: Callable[[State, Event], State]):
        self.name = name  # the Redis blob (StateStore.put_json name), e.g. "policy:smartspec"
        self.version = version
        self._empty = empty
        self._apply = apply
        self.state: State = self._fresh()
        self.pending: list[Event] = []
        self.num_adopted = 0  # how many stored states were adopted (tests, logs)

    def _fresh(self) -> State:
        return {**self._empty(), "version": self.version}

    def record(self, event: Event) -> None:
        """Learn from ``event`` now; it is stored at the next sync."""
        self.state = self._apply(self.state, event)
        self.pending.append(event)

    def take(self) -> list[Event]:
        """The events to store now (handed back with ``restore`` if storing fails)."""
        events, self.pending = self.pending, []
        return events

    def restore(self, events: list[Event]) -> None:
        """Storing ``events`` failed: keep them, before anything recorded since, for the next sync."""
        self.pending = events + self.pending

    def merge(self, stored: State | None, events: list[Event]) -> State:
        """``events`` applied to ``stored`` (a fresh state when there is none, or of another version)."""
        state = copy.deepcopy(stored) if _usable(stored, self.version) else self._fresh()
        for event in events:
            state = self._apply(state, event)
        state["version"] = self.version
        return state

    def adopt(self, stored: State | None) -> None:
        """Take the stored state as ours, plus whatever was recorded since the events it includes."""
        if not _usable(stored, self.version):
            return
        self.state = self.merge(stored, self.pending)
        self.num_adopted += 1


def _usable(stored: Any, version: int) -> bool:
    return isinstance(stored, dict) and stored.get("version") == version


def push_window(items: list, item: Any, size: int) -> list:
    """``items`` + [item], keeping the last ``size`` (a sliding window, in place)."""
    items.append(item)
    del items[: max(0, len(items) - size)]
    return items
