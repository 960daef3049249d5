"""What an order could reach on the sample a run drew: FCFS's requests replayed under other orders.

    replay(durations, slots)        mean completion time of jobs started in the given order on ``slots`` servers
    LoopCosts.of(overhead, rows)    the engine loop's costs as the run measured them (FCFS's spans)
    loop_replay(jobs, slots, costs) mean completion under the engine loop: admit, prefill, one round for all
    order_bounds(rows, slots, overhead)
                                    {"sjf_bound": r, "sjf_tokens": r, "sjf_steps": r, "model": ...}: mean
                                    latency vs FCFS's order
    replayed_order(rows, fcfs_rows, slots, overhead)
                                    per repeat: a policy's own admission order on FCFS's work and costs

bench-order sends N requests at once to a scheduler with ``slots`` batch slots. Every order policy
draws from the same sample, and with all requests present at t = 0 no preemption helps a
clairvoyant order. Replaying FCFS's requests (each one's rounds, in FCFS's arrival order = its TTFT
order) under shortest-first by ``max_new_tokens`` (what LP-SJF knows before a request runs), by its
actual output length and by its actual rounds (an oracle) tells how much of a goal such as "25 %
below FCFS" the sample leaves to any order policy.

Two models of the machine. ``replay`` (``"model": "slots"``) gives each request a server for its rounds
and ignores prefills and the batch: right on chat prompts (~40 tokens), where LP-SJF measured within
3-4 points of it. ``loop_replay`` (``"model": "loop"``, whenever the run has FCFS's spans) is the
scheduler's loop: free slots are filled in order, each admission's prefill stalls the whole batch
(seconds per prompt token as FCFS measured), then one round of every running request at the round time
FCFS measured for that batch size. It reproduces FCFS's measured mean within 12 % per sample on grounded
prompts of 1,000-1,500 tokens (a second of prefill each), where the slots model overstated what order can
gain by 5-10 points (2026-11-27). Under the loop shortest-rounds-first is no longer optimal (a long prefill
stalls everyone), so ``sjf_steps`` is the better of two clairvoyant orders: by rounds, and by the request's
cost to the others, its prefill plus its rounds at a full batch's per-request share.
"""

from __future__ import annotations

import heapq
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from bench.report import repeat_of


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


ORDERS: dict[str, Callable[[dict], float]] = {
    "sjf_bound": lambda r: r["max_new_tokens"],  # LP-SJF's knowledge before a request runs
    "sjf_tokens": lambda r: r["tokens"],  # the actual output length (an oracle)
    "sjf_steps": lambda r: r["steps"],  # the actual rounds: length and acceptance (an oracle)
}


@dataclass(frozen=True)
class LoopCosts:
    """What the engine loop spends: a round of ``b`` running requests, a prefill per prompt token."""

    round_s: Mapping[int, float]  # batch size -> one round's seconds
    prefill_s_per_token: float

    def round(self, batch: int) -> float:
        """The measured round of this batch size, else of the nearest smaller one measured, else the smallest."""
        if batch in self.round_s:
            return self.round_s[batch]
        below = [b for b in self.round_s if b < batch]
        return self.round_s[max(below) if below else min(self.round_s)]

    @classmethod
    def of(cls, overhead: Mapping | None, rows: Sequence[dict]) -> LoopCosts | None:
        """From a configuration's overhead breakdown (``step_ms_by_batch_k``: median step ms per shape, weighted
        by steps over the chain lengths; ``phase_s.prefill`` over its rows' prompt tokens); None without spans or
        without every row's prompt length."""
        steps = (overhead or {}).get("step_ms_by_batch_k") or {}
        prefill = ((overhead or {}).get("phase_s") or {}).get("prefill")
        if not rows or not all(r.get("prompt_tokens") for r in rows):
            return None  # a row without its prompt length cannot be replayed on the loop
        tokens = sum(r["prompt_tokens"] for r in rows)
        by_batch: dict[int, list[tuple[float, float]]] = {}
        for shape, row in steps.items():
            b = int(shape.split(",")[0].removeprefix("b="))
            by_batch.setdefault(b, []).append((row["n"], row["total"]))
        if not by_batch or prefill is None or tokens <= 0:
            return None
        rounds = {b: sum(n * ms for n, ms in v) / sum(n for n, _ in v) / 1e3 for b, v in by_batch.items()}
        return cls(rounds, prefill / tokens)


def loop_replay(jobs: Sequence[tuple[int, int]], slots: int, costs: LoopCosts) -> float:
    """Mean completion of (rounds, prompt tokens) jobs admitted in this order by the engine loop: each step fills
    the free slots (each admission's prefill stalls the batch), then runs one round of every running job."""
    if not jobs:
        return 0.0
    t, queue, running, ends = 0.0, list(jobs), [], []
    queue.reverse()  # pop() from the end: the first job first
    while queue or running:
        while queue and len(running) < max(1, slots):
            rounds, prompt = queue.pop()
            t += costs.prefill_s_per_token * prompt
            running.append(max(1, rounds))
        t += costs.round(len(running))
        running = [r - 1 for r in running]
        ends += [t] * sum(r <= 0 for r in running)
        running = [r for r in running if r > 0]
    return statistics.fmean(ends)


def order_bounds(rows: Sequence[dict], slots: int, overhead: Mapping | None = None) -> dict | None:
    """Each order's replayed mean latency relative to FCFS's replay (0.75 = 25 % lower), from FCFS's request
    rows; each repeat (``-r<rep>-`` in the ids: a batch sent at once) replayed alone, the ratios averaged. With
    FCFS's ``overhead`` (its spans) and the rows' prompt lengths, under the loop model; else the slots model."""
    groups = _by_repeat(_served(rows))
    loop = LoopCosts.of(overhead, rows)
    if loop is not None:
        share = loop.round(slots) / max(1, slots)  # a round's cost to each of a full batch
        mean = lambda group: loop_replay([(r["steps"], r["prompt_tokens"]) for r in group], slots, loop)  # noqa: E731
        cost = lambda r: loop.prefill_s_per_token * r["prompt_tokens"] + r["steps"] * share  # noqa: E731
    else:
        mean = lambda group: replay([r["steps"] for r in group], slots)  # noqa: E731
    ratios: dict[str, list[float]] = {name: [] for name in ORDERS}
    for group in groups.values():
        if len(group) < 2:
            continue
        fcfs = mean(sorted(group, key=lambda r: r["ttft_s"]))
        for name, key in ORDERS.items():
            ratios[name].append(mean(sorted(group, key=key)) / fcfs)
        if loop is not None:  # the better of the two clairvoyant orders
            ratios["sjf_steps"][-1] = min(ratios["sjf_steps"][-1], mean(sorted(group, key=cost)) / fcfs)
    if not ratios["sjf_steps"]:
        return None
    return {**{name: statistics.fmean(v) for name, v in ratios.items()}, "model": "loop" if loop else "slots"}


def replayed_order(rows: Sequence[dict], fcfs_rows: Sequence[dict], slots: int, overhead: Mapping | None) -> list[float] | None:
    """Per repeat: a policy's own admission order (its requests by TTFT) replayed on the loop with FCFS's rounds
    and costs, relative to FCFS's order. The same work and the same machine for every policy, so what is left is
    the order it chose: drift between the runs and what preemption changed are out. A policy that admits in
    FCFS's order replays to exactly 1.0, and its measured ratio is then the bench's noise. None without the
    loop model's inputs (FCFS's spans, prompt lengths)."""
    loop = LoopCosts.of(overhead, fcfs_rows)
    if loop is None:
        return None
    item = lambda r: r["id"].rsplit("/", 1)[-1]  # noqa: E731 - "closed0-r1-i7": the same request in every policy
    fcfs_groups, out = _by_repeat(_served(fcfs_rows)), []
    for rep, group in sorted(_by_repeat(r for r in rows if r.get("ttft_s") is not None).items()):
        work = {item(r): (r["steps"], r["prompt_tokens"]) for r in fcfs_groups.get(rep, [])}
        if len(work) < 2 or any(item(r) not in work for r in group):
            continue
        fcfs = loop_replay([work[item(r)] for r in sorted(fcfs_groups[rep], key=lambda r: r["ttft_s"])], slots, loop)
        out.append(loop_replay([work[item(r)] for r in sorted(group, key=lambda r: r["ttft_s"])], slots, loop) / fcfs)
    return out or None


def distinct_samples(rows: Sequence[dict]) -> bool:
    """Whether the repeats drew different requests (bench runs before 2026-11-27 repeated one sample)."""
    samples = {tuple(sorted((r.get("prompt_tokens"), r.get("max_new_tokens")) for r in g))
               for g in _by_repeat(rows).values()}  # fmt: skip
    return len(samples) > 1


def _served(rows: Iterable[dict]) -> list[dict]:
    """The rows of requests that were answered (a TTFT and at least one round): what a replay can place."""
    return [r for r in rows if r.get("ttft_s") is not None and r.get("steps")]


def _by_repeat(rows: Iterable[dict]) -> dict[int, list[dict]]:
    """Request rows by the repeat they were sent in (each repeat of bench-order: one batch sent at once)."""
    groups: dict[int, list[dict]] = {}
    for r in rows:
        groups.setdefault(repeat_of(r["id"]), []).append(r)
    return groups
