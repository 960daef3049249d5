"""Policies by name, as the scheduler's configuration spells them (TANDEM_SPECULATION_POLICY, ...).

The speculation policy decides for requests in mode AUTO; requests that ask
for OFF or FIXED k override it per request (scheduler.policies.speculation).

    speculation   fixed (default): every AUTO request drafts a chain of k     FixedChain(k)
                  off:             plain decoding unless a request asks        NoSpeculation
    queue         fcfs (default):  first come first served, priority first     FCFS

Later policies (smartspec, nightjar, faser, adaserve, laps-sd) register here
under the names DESIGN §5 gives them.
"""

from __future__ import annotations

from collections.abc import Callable

from scheduler.policies.queue import FCFS, QueuePolicy
from scheduler.policies.speculation import FixedChain, NoSpeculation, SpeculationPolicy

SPECULATION_POLICIES: dict[str, Callable[[int], SpeculationPolicy]] = {
    "fixed": lambda k: FixedChain(k) if k > 0 else NoSpeculation(),
    "off": lambda k: NoSpeculation(),
}
QUEUE_POLICIES: dict[str, Callable[[], QueuePolicy]] = {
    "fcfs": FCFS,
}


def speculation_policy(name: str, k: int = 4) -> SpeculationPolicy:
    """The policy called ``name``; ``k`` is the chain length of ``fixed``."""
    try:
        return SPECULATION_POLICIES[name.lower()](k)
    except KeyError:
        raise ValueError(f"unknown speculation policy {name!r}; available: {', '.join(SPECULATION_POLICIES)}") from None


def queue_policy(name: str) -> QueuePolicy:
    try:
        return QUEUE_POLICIES[name.lower()]()
    except KeyError:
        raise ValueError(f"unknown queue policy {name!r}; available: {', '.join(QUEUE_POLICIES)}") from None
