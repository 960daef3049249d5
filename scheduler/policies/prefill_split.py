"""How one step splits its token budget between prefill chunks and speculation (chunked prefill).

A step is one target forward over  verify trees of the decoding requests  +  prefill chunks  +  releases,
under one token budget B (AdaServe §4.1: the verify tokens a forward takes before it turns compute-bound;
here every token the forward runs counts, so B keeps its meaning with prefills in the batch)::

    B  =  D (one fed token per decoding request)  +  S (speculation: tree nodes)  +  P (prefill chunk tokens)

The rule, per step:

1. Room for prefill: R = B - D (no budget known: R = C, the chunk size ``TANDEM_PREFILL_CHUNK``), and the
   step's prefill costs at most what min(C, R) tokens cost at offset 0 (below): a decoding request never
   stalls for more than one chunk, and every chunk of a prompt stalls it alike, the last as the first.
2. Requests behind their TPOT SLO are served first (AdaServe's urgency): while any decoding request's TPOT
   so far exceeds its objective, the prefill share halves, to the cost of min(C, R) / 2 tokens at offset 0,
   so speculation gets the rest.
3. New requests' TTFT SLOs decide how much prefill to admit: a prefilling request whose TTFT deadline is at
   risk (its remaining uncached tokens at the profiled prefill rate take at least ``ttft_risk`` of the time it
   has left; ``laps-sd``-style estimate, uncached tokens only) is granted a full chunk (the cost of C tokens
   at offset 0) regardless of 2. and 1.
4. Prefilling requests are served earliest TTFT deadline first (none: arrival order), each getting the most
   tokens (up to what remains) that what is left of the step's prefill cost pays for at its offset; the first
   always gets at least min(``min_chunk``, C) tokens (progress).
5. Nothing decodes: no TPOT to protect, so every prefilling request gets its own chunk of C tokens.

What a chunk costs (SmartSpec eq. 7, T_fwd = alpha N_context + gamma N_batched + delta, for a chunk): its t
tokens at offset o (prompt tokens already in the target's KV, a cached prefix included: they are attended
too) pass the layers, gamma each, and attend t o + t^2 / 2 (query, key) pairs, alpha each::

    T_chunk(t, o) = alpha (t o + t^2 / 2) + gamma t             in token units, r = alpha / gamma:
    cost(t, o)    = t + r (t o + t^2 / 2)

The chunk granted at o is the largest t with cost(t, o) <= K, K = cost(C, 0) = C + r C^2 / 2 (rule 1), the
positive root of (r / 2) t^2 + (1 + r o) t - K = 0 (``tokens_within``; r = 0: t = K = C, chunks of C tokens).
The p99 of a decoding request's inter-token gap is set by the dearest chunk; with chunks of C tokens that was
the prompt's last (the demo target's 512-token chunk at offset 1536 cost 1.4-1.8x the one at 0,
docs/policies/prefill-split.md). r comes from the target's shape (``pair_cost``), not from the profiled
alpha: that one is fitted per KV entry per sequence on decodes and verifies of a few rows, the reading of
the KV, not the compute a prefill row spends on a key.

Speculation's budget is then B - P (the speculation policy's ``token_budget`` for this step), never below D.
Pure code: the loop's side (scheduler/prefill_chunks.py) gathers the inputs and applies the outcome.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class PrefillNeed:
    """A request in the middle of its chunked prefill."""

    request_id: str
    remaining: int  # prompt tokens not yet in the target's KV cache
    waited_s: float  # since arrival
    ttft_slo_s: float | None = None
    offset: int = 0  # prompt tokens already in the target's KV (the next chunk attends them), cached prefix too


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
    pair_cost: float = 0.0,
) -> Split:
    """The step's prefill chunks and speculation budget (the module docstring's rule 1-5); ``pair_cost``: r, what
    one attended (query, key) pair costs per token's pass through the layers (0: chunks capped in tokens)."""
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
    left = chunk_cost(cap, 0, pair_cost)  # the step's prefill cost, in token units
    for i, n in enumerate(order):
        grant = min(n.remaining, tokens_within(left, n.offset, pair_cost))
        if _at_risk(n, prefill_token_s, ttft_risk):  # rule 3
            grant = min(n.remaining, tokens_within(chunk_cost(chunk, 0, pair_cost), n.offset, pair_cost))
        if i == 0:
            grant = max(grant, min(n.remaining, min_chunk, chunk))
        if grant > 0:
            chunks[n.request_id] = grant
            left = max(0.0, left - chunk_cost(grant, n.offset, pair_cost))
    spent = sum(chunks.values())
    return Split(chunks, None if budget is None else max(floor, budget - spent))


def chunk_cost(tokens: int, offset: int, pair_cost: float) -> float:
    """cost(t, o) = t + r (t o + t^2 / 2): eq. 7 for a chunk of t tokens at offset o, over gamma (module docstring)."""
    return tokens + pair_cost * (tokens * offset + tokens * tokens / 2)


def tokens_within(cost: float, offset: int, pair_cost: float) -> int:
    """The largest t with cost(t, offset) <= ``cost``: the root of (r / 2) t^2 + (1 + r o) t - cost = 0, written
    t = 2 cost / ((1 + r o) + sqrt((1 + r o)^2 + 2 r cost)) (no cancellation for small r; r = 0: t = cost)."""
    if cost <= 0:
        return 0
    b = 1.0 + pair_cost * offset
    return int(2.0 * cost / (b + math.sqrt(b * b + 2.0 * pair_cost * cost)) + 1e-6)  # + 1e-6: rounding at C


def pair_cost(attention_width: int, num_layers: int, layer_params: int) -> float:
    """r = alpha / gamma from the model's shape, in FLOPs: a token's pass through the layers multiplies every
    decoder weight once (2 layer_params FLOPs); one (query, key) pair costs q.k plus the weighted sum of v,
    2 + 2 FLOPs per query head dimension per layer (4 attention_width num_layers; attention_width = query heads x
    head dim). The demo target (SmolLM2-135M: 576 x 30 layers, 106 M layer weights): r = 3.3e-4, so a token at
    offset 3,000 spends as much on attention as on its layers' weights. 0 when the shape is unknown."""
    return 2.0 * attention_width * num_layers / layer_params if layer_params > 0 else 0.0


def _deadline(n: PrefillNeed) -> float:
    return float("inf") if n.ttft_slo_s is None else n.ttft_slo_s - n.waited_s


def _at_risk(n: PrefillNeed, prefill_token_s: float | None, ttft_risk: float) -> bool:
    """Rule 3: its remaining uncached prefill takes at least ``ttft_risk`` of the time left to its TTFT deadline."""
    if n.ttft_slo_s is None or prefill_token_s is None:
        return False
    left = n.ttft_slo_s - n.waited_s
    return left <= 0 or n.remaining * prefill_token_s >= ttft_risk * left
