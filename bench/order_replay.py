"""What an order could reach on the sample a run drew: FCFS's requests replayed under other orders.

    replay(durations, slots)        mean completion time of jobs started in the given order on ``slots`` servers
    order_bounds(rows, slots)       {"sjf_bound": r, "sjf_tokens": r, "sjf_steps": r}: mean latency vs FCFS's order

bench-order sends N requests at once to a scheduler with ``slots`` batch slots. Every order policy
draws from the same sample, and with all requests present at t = 0 no preemption helps a
clairvoyant order: shortest job first (SJF) is optimal for the mean. Replaying FCFS's requests
(each one's duration = the rounds it ran, in FCFS's arrival order = its TTFT order) under SJF by
``max_new_tokens`` (what LP-SJF knows before a request runs), by its actual output length and by
its actual rounds (an oracle) tells how much of a goal such as "25 % below FCFS" the sample leaves
to any order policy. The replay ignores prefills and batch-size effects on the round time: on
bench-order's chat prompts (~40 tokens) both are small and LP-SJF measured within 3-4 points of its
replay (order-eagle, 2026-11-27); on grounded prompts (1,000-1,500 tokens, a second of prefill each)
LP-SJF beat its replay by 9 points, so there the replay is a rough guide
(docs/bench/policies-grounded.md).
"""

from __future__ import annotations

import heapq
import re
import statistics
from collections.abc import Callable, Sequence


def replay(durations: Sequence[float], slots: int) -> float:
    """Mean completion time when jobs start in this order, each on the first free of ``slots`` servers."""
    if not durations:
        return 0.0
    free = [0.0] * max(1, slots)
    ends = []
    for d in durations:
        t = heapq.heappop(free) + d
        ends.append(t)
        heapq.heappush(free, t)
    return statistics.fmean(ends)


_REPEAT = re.compile(r"-r(\d+)-")

ORDERS: dict[str, Callable[[dict], float]] = {
    "sjf_bound": lambda r: r["max_new_tokens"],  # LP-SJF's knowledge before a request runs
    "sjf_tokens": lambda r: r["tokens"],  # the actual output length (an oracle)
    "sjf_steps": lambda r: r["steps"],  # the actual rounds: length and acceptance (an oracle)
}


def order_bounds(rows: Sequence[dict], slots: int) -> dict[str, float] | None:
    """Each order's replayed mean latency relative to FCFS's replay (0.75 = 25 % lower), from FCFS's request
    rows; each repeat (``-r<rep>-`` in the ids: a batch sent at once) replayed alone, the ratios averaged."""
    groups: dict[str, list[dict]] = {}
    for r in rows:
        if r.get("ttft_s") is not None and r.get("steps"):
            m = _REPEAT.search(r["id"])
            groups.setdefault(m.group(1) if m else "0", []).append(r)
    ratios: dict[str, list[float]] = {name: [] for name in ORDERS}
    for group in groups.values():
        if len(group) < 2:
            continue
        fcfs = replay([r["steps"] for r in sorted(group, key=lambda r: r["ttft_s"])], slots)
        for name, key in ORDERS.items():
            ratios[name].append(replay([r["steps"] for r in sorted(group, key=key)], slots) / fcfs)
    if not ratios["sjf_steps"]:
        return None
    return {name: statistics.fmean(v) for name, v in ratios.items()}


def distinct_samples(rows: Sequence[dict]) -> bool:
    """Whether the repeats drew different requests (bench runs before 2026-11-27 repeated one sample)."""
    groups: dict[str, list[tuple]] = {}
    for r in rows:
        m = _REPEAT.search(r["id"])
        groups.setdefault(m.group(1) if m else "0", []).append((r.get("prompt_tokens"), r.get("max_new_tokens")))
    return len({tuple(sorted(g)) for g in groups.values()}) > 1
