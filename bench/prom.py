"""The scheduler's Prometheus counters, scraped around a configuration's run and differenced.

    before = scrape(url); ...run...; delta = scrape(url) - before
    per_position_acceptance(delta)   # [(position, proposed, accepted, rate, rate given the previous accepted)]
    speculation_lengths(delta)       # {k: request-steps}: what a length policy chose

Configurations run one after another on a shared stack, so the difference of
two scrapes is exactly that configuration's share of the counters.
"""

from __future__ import annotations

import urllib.request
from collections import Counter

from prometheus_client.parser import text_string_to_metric_families

Key = tuple[str, tuple[tuple[str, str], ...]]


class Scrape(Counter):
    """(sample name, sorted labels) -> value; subtraction keeps negative-free differences of counters."""

    def __sub__(self, other: Scrape) -> Scrape:
        return Scrape({k: v - other.get(k, 0.0) for k, v in self.items()})

    def __add__(self, other: Scrape) -> Scrape:
        out = Scrape(self)
        for k, v in other.items():
            out[k] = out.get(k, 0.0) + v
        return out

    def by_label(self, sample: str, label: str) -> dict[str, float]:
        return {dict(labels)[label]: v for (name, labels), v in self.items() if name == sample and label in dict(labels)}


def parse(text: str) -> Scrape:
    out = Scrape()
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = float(s.value)
    return out


def scrape(url: str | None, timeout_s: float = 5.0) -> Scrape:
    if not url:
        return Scrape()
    with urllib.request.urlopen(url, timeout=timeout_s) as resp:
        return parse(resp.read().decode())


def memory_events(delta: Scrape, namespace: str = "tandem") -> dict[str, int]:
    """Draft offloads / reloads and target KV pool resizes (grow, shrink, ...) in the delta; nonzero only."""
    events = delta.by_label(f"{namespace}_draft_memory_events_total", "event")
    events.update(delta.by_label(f"{namespace}_kv_pool_events_total", "event"))
    return {k: int(v) for k, v in events.items() if v > 0}


def admission_events(delta: Scrape, namespace: str = "tandem") -> dict[str, int]:
    """Preemptions, resumptions (KV kept) and evictions (KV released, re-prefilled) in the delta; nonzero only."""
    events = delta.by_label(f"{namespace}_admission_events_total", "event")
    return {k: int(v) for k, v in events.items() if v > 0}


def per_position_acceptance(delta: Scrape, namespace: str = "tandem") -> list[dict]:
    """Per draft position: how often it was proposed and accepted (shared.metrics position_* counters)."""
    proposed = delta.by_label(f"{namespace}_position_proposed_total", "position")
    accepted = delta.by_label(f"{namespace}_position_accepted_total", "position")
    rows = []
    prev_accepted = None
    for pos in sorted((int(p) for p, n in proposed.items() if n > 0)):
        n, a = proposed[str(pos)], accepted.get(str(pos), 0.0)
        rows.append(
            {
                "position": pos,
                "proposed": int(n),
                "accepted": int(a),
                "rate": a / n,
                # P(accept position i | position i-1 accepted and i proposed): the per-token acceptance
                "conditional_rate": (a / prev_accepted) if prev_accepted else (a / n if pos == 0 else None),
            }
        )
        prev_accepted = a
    return rows


def early_exit(delta: Scrape, namespace: str = "tandem") -> dict | None:
    """Drafted tokens the target's early exit stopped (FASER §4.2), of those proposed; None when none were proposed."""
    proposed = delta.get((f"{namespace}_draft_tokens_proposed_total", ()), 0.0)
    pruned = delta.get((f"{namespace}_draft_tokens_pruned_total", ()), 0.0)
    if proposed <= 0:
        return None
    return {"proposed": int(proposed), "pruned": int(pruned), "pruned_share": pruned / proposed}


def speculation_lengths(delta: Scrape, namespace: str = "tandem") -> dict[int, int]:
    """Request-steps per chosen speculation length k (the scheduler's histogram, one bucket per integer k)."""
    cumulative = {float(le): v for le, v in delta.by_label(f"{namespace}_speculation_length_tokens_bucket", "le").items()
                  if le != "+Inf"}  # fmt: skip
    out, below = {}, 0.0
    for le in sorted(cumulative):
        n = cumulative[le] - below
        below = cumulative[le]
        if n > 0 and le.is_integer():
            out[int(le)] = int(n)
    return out


def prefill_chunks(delta: Scrape, namespace: str = "tandem") -> int:
    """Chunks of chunked prefills the scheduler ran in the delta (0: every prompt prefilled in one piece)."""
    return int(delta.get((f"{namespace}_prefill_chunks_total", ()), 0.0))


def prefix_cache_hit_tokens(delta: Scrape, namespace: str = "tandem") -> int:
    """Prompt tokens of chunked prefills the target's prefix cache served in the delta."""
    return int(delta.get((f"{namespace}_prefix_cache_hit_tokens_total", ()), 0.0))
