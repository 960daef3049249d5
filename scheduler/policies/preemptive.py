"""Continuous batching from the top of a ranking, with preemption (shared by LAS and LAPS-SD).

    running (pinned)  keep their slots: not preemptible (LAPS-SD: perceptible requests)
    everything else   running or waiting, sorted by ``key``; slots go down the list:

        rank  1    2    3    4    5    6
              W    R    W    R    R    W        batch cap = 4 (2 pinned elsewhere -> 2 left)
              ✓    ✓    ✗ stop admitting waiting ones: nothing overtakes the head
                             R: keeps running if it still fits (preempting it would admit nobody)
                                  -> preempt the running requests that no longer fit

Preempting frees a slot; what happens to the KV is the loop's business
(kept while the budget allows, else recomputed; scheduler/engine_loop.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from scheduler.policies.queue import Admission, Capacity, reserved_tokens
from scheduler.request import Request


def ranked_admission(
    waiting: Sequence[Request],
    running: Sequence[Request],
    capacity: Capacity,
    key: Callable[[Request], Any],
    pinned: Callable[[Request], bool] = lambda r: False,
) -> Admission:
    held = [r for r in running if pinned(r)]
    num = len(held)
    tokens = sum(reserved_tokens(r) for r in held)
    running_ids = {r.id for r in running}
    candidates = sorted([r for r in running if not pinned(r)] + list(waiting), key=key)
    admit, keep, blocked = [], set(), False
    for req in candidates:
        need = reserved_tokens(req)
        fits = num < capacity.max_batch_size and tokens + need <= capacity.max_tokens_in_flight
        is_running = req.id in running_ids
        if fits and (is_running or not blocked):
            num, tokens = num + 1, tokens + need
            if is_running:
                keep.add(req.id)
            else:
                admit.append(req)
        elif not is_running:
            blocked = True
    preempt = [r for r in running if not pinned(r) and r.id not in keep]
    return Admission(admit=admit, preempt=preempt)
