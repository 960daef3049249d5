"""How one step splits its token budget between prefill chunks and speculation (chunked prefill).

A step is one target forward over  verify trees of the decoding requests  +  prefill chunks  +  releases,
under one token budget B (AdaServe §4.1: the verify tokens a forward takes before it turns compute-bound;
here every token the forward runs counts, so B keeps its meaning with prefills in the batch)::

    B  =  D (one fed token per decoding request)  +  S (speculation: tree nodes)  +  P (prefill chunk tokens)

The rule, per step:

1. Room for prefill: R = B - D (no budget known: R = C, the chunk size ``TANDEM_PREFILL_CHUNK``), and
   P <= min(C, R): a decoding request never stalls for more than one chunk.
2. Requests behind their TPOT SLO are served first (AdaServe's urgency): while any decoding request's TPOT
   so far exceeds its objective, the prefill share halves, P <= min(C, R) / 2, so speculation gets the rest.
3. New requests' TTFT SLOs decide how much prefill to admit: a prefilling request whose TTFT deadline is at
   risk (its remaining uncached tokens at the profiled prefill rate take at least ``ttft_risk`` of the time it
   has left; ``laps-sd``-style estimate, uncached tokens only) is granted a full chunk C regardless of 2. and 1.
4. Prefilling requests are served earliest TTFT deadline first (none: arrival order), each getting
   min(remaining, what is left of P); the first always gets at least min(``min_chunk``, C) (progress).
5. Nothing decodes: no TPOT to protect, so every prefilling request gets its own chunk of C.

Speculation's budget is then B - P (the speculation policy's ``token_budget`` for this step), never below D.
Pure code: the loop's side (scheduler/prefill_chunks.py) gathers the inputs and applies the outcome.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class PrefillNeed:
    """A request in the middle of its chunked prefill."""

    request_id: str
    remaining: int  # prompt tokens not yet in the target's KV cache
    waited_s: float  # since arrival
    ttft_slo_s: float | None = None


@dataclass(frozen=True)
class Decoding:
    """A request that decodes this step (verified)."""

    tpot_s: float | None = None  # its time per output token so far
    tpot_slo_s: float | None = None

    @property
    def behind(self) -> bool:
        return self.tpot_s is not None and self.tpot_slo_s is not None and self.tpot_s > self.tpot_slo_s


@dataclass(frozen=True)
class Split:
    chunks: dict[str, int] = field(default_factory=dict)  # request id -> prefill tokens this step
    spec_budget: int | None = None  # token budget left to speculation (None: no budget known)

    @property
    def prefill_tokens(self) -> int:
        return sum(self.chunks.values())


def split_budget(
    needs: Sequence[PrefillNeed],
    decoding: Sequence[Decoding],
    *,
    chunk: int,
    budget: int | None = None,
    prefill_token_s: float | None = None,
    ttft_risk: float = 0.8,
    min_chunk: int = 16,
) -> Split:
    """The step's prefill chunks and speculation budget (the module docstring's rule 1-5)."""
    floor = len(decoding)
    if not needs:
        return Split(spec_budget=budget)
    order = sorted(needs, key=lambda n: (_deadline(n), -n.waited_s))  # rule 4: EDF, then arrival order
    if not decoding:  # rule 5
        chunks = {n.request_id: min(n.remaining, chunk) for n in order}
        return Split(chunks, None if budget is None else max(floor, budget - sum(chunks.values())))
    room = chunk if budget is None else max(0, budget - floor)  # rule 1
    cap = min(chunk, room)
    if any(d.behind for d in decoding):  # rule 2
        cap //= 2
    chunks: dict[str, int] = {}
    left = cap
    for i, n in enumerate(order):
        grant = min(n.remaining, left)
        if _at_risk(n, prefill_token_s, ttft_risk):  # rule 3
            grant = min(n.remaining, chunk)
        if i == 0:
            grant = max(grant, min(n.remaining, min_chunk, chunk))
        if grant > 0:
            chunks[n.request_id] = grant
            left = max(0, left - grant)
    spent = sum(chunks.values())
    return Split(chunks, None if budget is None else max(floor, budget - spent))


def _deadline(n: PrefillNeed) -> float:
    return float("inf") if n.ttft_slo_s is None else n.ttft_slo_s - n.waited_s


def _at_risk(n: PrefillNeed, prefill_token_s: float | None, ttft_risk: float) -> bool:
    """Rule 3: its remaining uncached prefill takes at least ``ttft_risk`` of the time left to its TTFT deadline."""
    if n.ttft_slo_s is None or prefill_token_s is None:
        return False
    left = n.ttft_slo_s - n.waited_s
    return left <= 0 or n.remaining * prefill_token_s >= ttft_risk * left
