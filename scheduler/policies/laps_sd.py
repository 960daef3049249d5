"""LAPS-SD: least-attained/perceived-service order for speculative decoding (LAPS-SD §4, Algorithm 1).

    arrival ─▶ Q1, non-perceptible                      (Alg. 1 lines 1-3)
    each round: E_i += 1 round (or its time), demote to Q_level(E_i)   (§4.2, priority_queues.py)
                acceptance stable over γ rounds ─▶ perceptible (lines 11-13, acceptance_stability.py)
                  T̃_i by eq. 6 from A_i, predicted remaining length and profiled costs
    order:  inter-queue   Q1 before Q2 ... before QK                 (InterQueueSchedule, lines 5-9)
            intra-queue   perceptible first, shortest T̃_i first (SJF);
                          then non-perceptible, first come first served (line 16)
    preemption: running non-perceptible requests may lose their slot to
            better-ranked requests (preemptive.py); perceptible ones never do,
            so their growing KV is never switched out.

Requests not yet perceptible: the paper runs them FCFS within their queue
(``unstable="fcfs"``, the default). ``unstable="estimate"`` (``laps-sd:est=1``)
is this project's extension for batch arrivals: they are ranked by the same
eq. 6 estimate, with the acceptance seen so far shrunk toward the prompt
class's mean from the length predictor's history (``prior_tokens`` drafted
tokens of weight; before its first round the class's mean, else 0) and the
depth drafted so far (else ``prior_depth``), still behind the perceptible
ones. Why: when more requests arrive than the batch holds, the waiting ones
never run, so never become perceptible, and FCFS among them is the whole
order (bench-order's finding; see the README).

T̃ also carries the prefill a request not holding its KV must pay first
(remaining_time.py), and with ``est=1`` a running request ranks by T̃ less its
own re-prefill (``preemption_cost_s``): it is preempted only for a job shorter
by more than the switch costs.

``share=1`` (with ``est=1``): eq. 6's rounds at the request's share of a
batched forward, T(b)/b with b = the batch the admission fills (min of its
slots and the requests in play), not its cost alone (remaining_time.py).

Requests with speculation OFF have nothing to learn (each round emits one
token): they are perceptible from the start with A_i = 0. ``priority``, when
set, ranks before everything (as in FCFS).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from scheduler.policies.acceptance_stability import Stability
from scheduler.policies.length_predictor import ClassHistoryPredictor, LengthPredictor
from scheduler.policies.preemptive import ranked_admission
from scheduler.policies.priority_queues import QueueLevels
from scheduler.policies.queue import Admission, Capacity, QueuePolicy
from scheduler.policies.shared_state import SharedState
from scheduler.policies.remaining_time import SDCosts, remaining_time
from scheduler.request import Request, RequestState, SpecMode


@dataclass(frozen=True)
class LapsConfig:
    levels: QueueLevels = field(default_factory=QueueLevels)
    stability: Stability = field(default_factory=Stability)
    costs: SDCosts = field(default_factory=SDCosts)
    unstable: Literal["fcfs", "estimate"] = "fcfs"  # order of non-perceptible requests within a queue
    prior_depth: float = 3.0  # n of eq. 6 for a request that has not drafted yet ("estimate")
    prior_tokens: float = 16.0  # "estimate": the class prior's weight in drafted tokens (0 = own rate alone)
    share_rounds: bool = False  # eq. 6's rounds at the request's share of a batched forward (remaining_time.py)

    def __post_init__(self) -> None:
        if self.prior_tokens < 0:
            raise ValueError(f"prior_tokens must be >= 0, got {self.prior_tokens}")


class LapsSD(QueuePolicy):
    name = "laps-sd"

    def __init__(self, config: LapsConfig | None = None, predictor: LengthPredictor | None = None) -> None:
        self.config = config or LapsConfig()
        self.predictor = predictor or ClassHistoryPredictor()

    # ------------------------------------------------------------------ per request
    def perceived_acceptance(self, req: Request) -> float | None:
        """A_i once the request is perceptible, else None."""
        if req.speculation.mode is SpecMode.OFF:
            return 0.0
        return self.config.stability.predicted_acceptance(req.acceptance_rates())

    def estimated_remaining_s(self, req: Request, acceptance: float, default_depth: float = 0.0,
                              batch: int = 1) -> float:  # fmt: skip
        """Eq. 6 with L_i = predicted remaining tokens and n = the request's mean drafted depth; ``batch``: how many
        requests share a round (used with ``share_rounds``)."""
        depths = req.drafted_depths
        n = sum(depths) / len(depths) if depths else default_depth
        # a request that does not speculate drafts nothing and verifies one token per round; one that speculates
        # pays eq. 6's draft and verify of n tokens even at A = 0 (then each round emits its bonus token alone)
        n = 0.0 if req.speculation.mode is SpecMode.OFF else n
        remaining = max(1.0, self.predictor.predict(req) - req.num_generated)
        costs = self.config.costs
        ctx = req.num_tokens
        b = batch if self.config.share_rounds else 1
        return remaining_time(remaining, acceptance, n, costs.draft_token_s(ctx, b), costs.verify_s(ctx, n, b),
                              costs.prefill_s(self.tokens_to_prefill(req)))  # fmt: skip

    @staticmethod
    def tokens_to_prefill(req: Request) -> int:
        """What the target must (re)compute before ``req`` decodes again: nothing while it runs or stays resident."""
        if req.state is RequestState.RUNNING or req.resident:
            return 0
        return max(0, req.num_tokens - req.num_cached_estimate)  # the prefix cache's blocks cost no prefill

    def rank(self, req: Request, batch: int = 1) -> tuple:
        """(priority, queue, 0 perceptible | 1 not, T̃ | arrival, arrival): lower runs first; ``batch``: the requests
        sharing a round (``share_rounds``)."""
        levels = self.config.levels
        level = levels.level(levels.attained(req))
        arrival = req.arrival_time if req.arrival_time is not None else float("inf")
        a = self.perceived_acceptance(req)
        if a is not None:
            return (req.priority, level, 0, self.estimated_remaining_s(req, a, batch=batch), arrival)
        if self.config.unstable == "fcfs":
            return (req.priority, level, 1, arrival, arrival)
        t = self.estimated_remaining_s(req, self.acceptance_so_far(req), self.config.prior_depth, batch)
        return (req.priority, level, 1, t - self.preemption_cost_s(req), arrival)

    def preemption_cost_s(self, req: Request) -> float:
        """What preempting a running request costs it: its prompt + output re-prefilled (its KV is kept only while
        the budget allows). Ranking a running request by T̃ less this preempts it for a waiting one W only when
        T̃_W (W's own prefill included) + this < T̃_running: the order then saves more than the switch costs
        (two jobs, mean completion: W first = 2 T̃_W + T̃_R + P_R, R first = 2 T̃_R + T̃_W)."""
        if req.state is not RequestState.RUNNING:
            return 0.0
        return self.config.costs.prefill_s(req.num_tokens)

    def acceptance_so_far(self, req: Request) -> float:
        """A for eq. 6 before the rate is stable: the request's own rate shrunk toward its class's mean.

        A = (accepted + w·prior) / (drafted + w), w = ``prior_tokens``: the class's mean counts as w drafted
        tokens of evidence (the posterior mean of a beta prior of that weight). Before a request drafts, A is
        the prior; after many tokens, its own rate. Without shrinkage, a running request whose first rounds
        accepted little gets an eq. 6 estimate several times too long and is preempted for a waiting one,
        only to prove average later: the early rate is exactly what LAPS-SD's perceptibility test (§4.3)
        refuses to trust. Without a class prior: its own rate, else 0."""
        prior = getattr(self.predictor, "prior_acceptance", lambda r: None)(req)
        drafted, accepted = req.num_drafted_tokens, req.num_accepted_tokens
        if prior is None:
            return accepted / drafted if drafted else 0.0
        w = self.config.prior_tokens
        return (accepted + w * prior) / (drafted + w) if drafted + w > 0 else prior

    # ------------------------------------------------------------------ QueuePolicy
    def order(self, waiting: Sequence[Request], now: float) -> list[Request]:
        return sorted(waiting, key=self.rank)

    def schedule(
        self, waiting: Sequence[Request], running: Sequence[Request], capacity: Capacity, now: float
    ) -> Admission:
        batch = max(1, min(capacity.max_batch_size, len(waiting) + len(running)))  # the batch this admission fills
        ranks = {r.id: self.rank(r, batch) for r in [*waiting, *running]}  # once per request per step
        return ranked_admission(
            waiting, running, capacity, key=lambda r: ranks[r.id], pinned=lambda r: ranks[r.id][2] == 0
        )

    def on_finish(self, req: Request) -> None:
        self.predictor.observe(req)

    def shared_state(self) -> SharedState | None:
        return getattr(self.predictor, "shared_state", lambda: None)()
