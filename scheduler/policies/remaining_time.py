"""Remaining execution time of a perceptible request (LAPS-SD §4.3, eq. 6).

    T̃_i = n·L_i·T_SSM / (n·A_i + 1)  +  L_i·T_LLM / (n·A_i + 1)          (6)
          └── speculation ─────────┘    └── verification ──────┘

n: draft tokens per round (the request's mean drafted depth), A_i: its
predicted acceptance rate (acceptance_stability.py), so n·A_i + 1 tokens are
expected per round (accepted drafts + the target's bonus token) and
L_i / (n·A_i + 1) rounds remain; T_SSM: one draft forward (one drafted token),
T_LLM: one verification forward. (The paper's prose swaps the two names; the
equation, followed here, charges T_SSM per drafted token.) L_i here is the
*remaining* predicted length (length_predictor.py), since a request in
progress has only that much left to run.

A request that does not hold its KV (waiting for its first prefill, or preempted
and evicted) must also be prefilled again before it decodes: T_prefill of its
prompt + output so far is added to its T̃ (``t_prefill``). The paper's
perceptible requests are never preempted, so eq. 6 needs no such term there;
this project ranks waiting requests by eq. 6 too (``laps-sd:est=1``), and on
prompts of a thousand tokens a re-prefill costs as much as a hundred decode
rounds: without the term, a running request is preempted for a waiting one
whose remaining decode is a little shorter, and both pay a prefill.

**A round's share of a batched forward** (``laps-sd:est=1+share=1``, this
project's): eq. 6 charges a round at the cost of the request's own forward,
as if it ran alone; the (re)prefill term stalls every request in the batch.
With ``batch`` = b requests decoding together, a request's round costs its
own context and tokens plus 1/b of the per-forward cost (δ, c_t): its share
of T(b), so T(b)/b instead of T(1). Ranked this way, shortest-first weighs a
prefill as what it costs the batch (b·P + rounds·T(b), scaled by 1/b) rather
than as b times too cheap against the request's own rounds. Why: on the
grounded bench (2026-11-27 06:04 run) a round at batch 4 cost 99 ms, 25 ms
a request, against 54 ms alone; replayed on the engine loop with measured costs (bench/
order_replay.py) with every request's rounds known, shortest-first by
P + rounds·w did best near w = T(4)/4 and 1-1.5 points worse at w = T(1)
(docs/bench/policies-grounded.md).

Costs come from the profiled cost models, T_fwd = α·N_context + γ·N_batched + δ
(shared/profiling/cost_model.py), for this request alone at its context: its
verification forward batches n + 1 tokens, a draft forward one. Without a
draft profile T_SSM is ``draft_cost_ratio`` of a target decode; without any
profile both are in units of one target decode (T_LLM = 1), which still ranks
requests correctly when every request speculates alike.
"""

from __future__ import annotations

from dataclasses import dataclass

from shared.profiling.cost_model import CostModel


@dataclass(frozen=True)
class SDCosts:
    """Where eq. 6's T_SSM and T_LLM come from."""

    target: CostModel | None = None  # the target's fitted T_fwd (profiler)
    draft: CostModel | None = None  # the draft's, when profiled
    draft_cost_ratio: float = 0.1  # T_SSM / (target decode) when the draft has no profile

    def verify_s(self, context: int, depth: float, batch: int = 1) -> float:
        """T_LLM: one verification forward of ``depth`` drafted tokens + the bonus position; with ``batch`` = b > 1
        the request's share of a forward b requests run together (its context and tokens, 1/b of δ and c_t)."""
        if self.target is None:
            return 1.0 - _others_share(batch)
        verify = depth > 0
        per_forward = self.target.delta_s + (self.target.verify_s if verify else 0.0)
        alone = self.target.predict(context, depth + 1, verify=verify)
        return max(alone - per_forward * _others_share(batch), 1e-9)

    def prefill_s(self, tokens: int) -> float:
        """T_prefill: one target forward over ``tokens`` uncached tokens (a new request's prompt, or a preempted
        request's prompt + output once its KV is gone); 0 without a target profile (nothing to charge it in)."""
        if self.target is None or tokens <= 0:
            return 0.0
        return max(self.target.predict(tokens, tokens), 0.0)

    def draft_token_s(self, context: int, batch: int = 1) -> float:
        """T_SSM: one draft forward (one drafted token); with ``batch`` = b > 1 the request's share (1/b of δ)."""
        others = _others_share(batch)
        if self.draft is not None:
            return max(self.draft.predict(context, 1) - self.draft.delta_s * others, 1e-9)
        if self.target is None:
            return self.draft_cost_ratio * (1.0 - others)
        return self.draft_cost_ratio * max(self.target.predict(context, 1) - self.target.delta_s * others, 1e-9)


def _others_share(batch: int) -> float:
    """The part of a per-forward cost the other requests of a batch of ``batch`` pay: 1 - 1/b (0 alone)."""
    return 1.0 - 1.0 / max(batch, 1)


def remaining_time(remaining_tokens: float, acceptance: float, depth: float, t_ssm: float, t_llm: float,
                   t_prefill: float = 0.0) -> float:  # fmt: skip
    """Eq. 6: rounds still needed, L/(n·A + 1), times the cost of a round, n·T_SSM + T_LLM; plus ``t_prefill``,
    the (re)prefill a request not holding its KV must pay before it decodes again (this project's switching
    cost, LAPS-SD §3 Figure 2: a running request does not pay it, so it is preempted only for a shorter job)."""
    rounds = max(remaining_tokens, 0.0) / (depth * acceptance + 1.0)
    return t_prefill + rounds * (depth * t_ssm + t_llm)
