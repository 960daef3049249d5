"""Goodput-optimal speculation length (SmartSpec §4-5, Algorithms 1-3 / App. A).

Goodput is generated tokens per second of a step (eq. 3). For a batch where
request i (token acceptance alpha_i) drafts a chain of k_i tokens::

    l(alpha, k) = (1 - alpha^(k+1)) / (1 - alpha)        tokens it generates, bonus included   (eq. 8)
    goodput(k)  = sum_i l(alpha_i, k_i) / T_batch(k)                                           (eq. 3, 9)
    T_batch     = T_draft + T_target                     the step cost model (step_cost.py)    (eq. 4-7)
                  + c_f * sum_{i: k_i > 0} l(alpha_i, k_i)  the draft's feed of what a speculating
                                                         request generates (an extension; step_cost.py)
                  + c_f * sum_{i: k_i > 0} s_i           the switch: the catch-up on tokens decoded
                                                         plainly, spread over a few steps (an extension)

and every k_i in {0 .. K_max}; k = 0 is plain decoding (l = 1, no draft call).

Two granularities (§4.4):

- ``batch`` (Algorithm 1-2, the paper's default): one global alpha, one k
  for the whole batch, argmax over k = 0..K_max.
- ``request``: alpha per request, k per request. T(k) is separable but for
  the draft's max-depth term, so for each depth m = 0..K_max the optimum is
  found exactly by Dinkelbach's method: with lambda the goodput so far,
  request i takes its j-th token while its gain alpha_i^j beats lambda
  times its cost u_i; lambda <- G/T; repeat until it stops moving. The best
  m wins.

Alpha is a moving average (Alg. 1 line 3) over the last ``alpha_window``
steps, those that drafted nothing included, each step's observation
weighing ``alpha_decay`` per step since: while the policy does not
speculate, what it saw fades and the estimate drifts back toward the prior,
so the policy tries again (a low streak early on, or a past burst of load,
cannot switch speculation off for good). Drifting, not jumping: the first
probe comes when the estimate crosses the break-even of the shortest chain,
so it is one cheap k = 1 step, not the prior's long chain (with a 32-step
window that emptied at once, SmartSpec probed with k = 4 every 32 steps).
What a chain of k tells about alpha: each accepted token is an
acceptance, and a chain that stopped short adds one rejection; so alpha =
accepted / (accepted + rejections) summed over the window (the maximum
likelihood estimate for a geometric acceptance, which a plain
accepted / proposed underestimates). Per request it is the same count with
a decay, shrunk toward the global alpha while the request is young.

Alpha per depth (``per_depth``, batch granularity; an extension, off by
default, which is the paper's eq. 8): drafts accept a second token after an accepted first more
often than a first one (the EAGLE head on chat: 0.56 against 0.44), and an
alpha estimated while running k = 1 sees first tokens only, which underrates
k = 2 and keeps the policy at k = 1 (bench/results/diag-burst). With it the
expected length uses alpha_j per depth: the pooled alpha's level, the
counts' shape over depth (depth_acceptance.py). Off by default: the one
run with it on (feature draft, open chat) came out 4-12 % behind the best
fixed k where the run after it, off, was within 3 % at every load; an
unchanged policy moved as much between those two runs, so the run says
little either way, and the paper's eq. 8 stays the default until repeated
runs show the extension helps.

The switch (``charge_switch``; an extension after Nightjar's eq. 3, which
charges c_prefill to a 0 -> k > 0 transition): the feed term prices the
steady state, speculating every step, where each call feeds what the last
step generated. A request that decoded plainly for a while has a lag of
tokens nobody charged, and the speculate call that resumes it feeds them all
(a feature draft's catch-up on the target's features). So a request that did
not speculate in the last step is charged c_f x s_i, s_i = its lag spread
over ``switch_horizon`` steps (fewer when fewer tokens remain: the switch
must pay for itself while the request lasts). Without it the model saw
switching on and off as free, and at 4x the policies that mostly decoded
plainly ran a TPOT 2.5-4.4 ms above target-only's: their occasional
speculating steps paid every request's catch-up (bench/results/adaptive-eagle).
Measured beside its ablation (adaptive-eagle-switch, -switch2: 2x, 4x, burst):
ahead in 8 of 12 pairs by 0.8 points on average, within a 10-30 point
per-repeat spread; a lean, kept on as the accounting of a cost steps pay.
Only requests the draft holds: one it does not hold is resynced by a draft
prefill (``PhaseTimes.draft_sync``), which the draft fit does not see.

Prefill disabling (§5): at admission, when more than
``prefill_disable_threshold`` of the recent decisions were k = 0, the
request is not prefilled on the draft and does not speculate. A decision is
one request's k in batch granularity (all alike); in request granularity it
is the step's (its longest chain, as the paper records "the proposed length"
per step): requests given k = 0 for their own low alpha while others draft
are not a sign of load. Counted one by one they could bar new requests at a
load where the step still speculates; measured, the effect was small (at 4x
the lone-request rate 2 % of request-steps were held off the draft, 0 since;
the 44-54 % of request-steps at k = 0 there are the model's own choices,
bench/results/adaptive-eagle-smartspec). Requests
kept off the draft still count in the decisions with the k they would get,
so the rule lifts when the load drops, for new requests and (an extension:
``prefill_lift_threshold``; None is the paper's "for good") for the ones it
took off, which the loop resyncs onto the draft at their next speculation. The
lift reads the last ``prefill_lift_steps`` steps, not the whole window: a
burst's many-request steps would otherwise outweigh the lull after it until
they left the window, and every request of the lull decoded plainly meanwhile.

Cost probes (``cost_probe_steps``; an extension): after 32 speculating steps
in a row, one step decodes plainly, so the step-cost fit keeps seeing both
modes and can tell a verify pass's own cost c_t from the per-step constant
(step_cost.py); the probe is not a decision the §5 rule or the deferral read.

Confidence variant (App. A, Algorithm 3): the draft drafts up to K_max while
the newest token's confidence (draft probability) is above the threshold T;
the token that falls to T or below is kept and the chain stops after it
(lines 7-12; drafting.py). Then, for greedy requests, the verify length of
each chain is chosen by goodput with each drafted token's path probability
as its expected acceptance (``select``, line 13), the draft time being
already spent. Sampled requests verify the chain as drafted: a cut chosen
from the drafted tokens' own probabilities would keep or drop a token by its
own q and bias acceptance (a departure from line 13, which the paper states
without sampling in view); the stopping rule alone is lossless. Whether to
draft at all is still the alpha-based decision above.

Learned state (alpha window, decision window, step-cost fits) is a
``SharedState`` kept in Redis by the scheduler process; per-request alphas
live with the requests on their replica.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, Field

from scheduler.policies.depth_acceptance import (
    add_counts,
    chain_depth_counts,
    conditional_rates,
    decay_into,
    depth_gains,
)
from scheduler.policies.draft_admission import DraftAdmission
from scheduler.policies.selection import subtree
from scheduler.policies.shared_state import SharedState, push_window
from scheduler.policies.speculation import SpecContext, SpecShape, SpeculationPolicy
from scheduler.policies.length_solver import best_request_ks, best_uniform_k, uniform_goodputs
from scheduler.policies.step_cost import StepCost, StepCostConfig, StepCostModel
from scheduler.report import StepReport
from scheduler.request import Request, SpecMode
from shared.engine.types import TokenTree

STATE_VERSION = 7  # 7: the target fit's per-request term (step_cost.py gamma_r)
# 2: the target fit has a verify-mode term (step_cost.py c_t); 3: the draft fit a fed-tokens term;
# 4: acceptance counts per draft depth; 5: the fits' feature scales (how firmly the prior holds each coefficient);
# 6: request granularity records one §5 decision per step


class SmartSpecConfig(BaseModel):
    """Knobs of SmartSpec; every field has a default."""

    max_k: int = Field(8, ge=1, le=32, description="K_max (the paper's V): longest chain proposed.")
    granularity: Literal["batch", "request"] = Field(
        "batch", description="One alpha and one k for the batch (Alg. 2), or per request (§4.4)."
    )
    alpha_window: int = Field(256, ge=1, description="Steps in the moving average of alpha (Alg. 1 line 3).")
    alpha_decay: float = Field(
        0.98, gt=0.0, le=1.0,
        description="Weight an observation keeps per step in that average (0.98: about the last 50 steps count).",
    )  # fmt: skip
    prior_alpha: float = Field(0.6, gt=0.0, lt=1.0, description="Alpha before anything was observed.")
    charge_feed: bool = Field(
        True, description="T(k) charges a speculating request c_f per token it generates (the draft feed, "
        "step_cost.py); False: T(k) as before it did (the ablation `smartspec-nofeed`).",
    )  # fmt: skip
    charge_switch: bool = Field(
        True, description="T(k) charges a request that resumes speculating the draft's catch-up on the tokens it "
        "decoded plainly (c_f x its lag / switch_horizon; an extension after Nightjar eq. 3); False: the ablation "
        "`smartspec-noswitch` (`smartspec-request-noswitch`).",
    )  # fmt: skip
    switch_horizon: int = Field(
        4, ge=1, description="Steps over which a resumed request's catch-up is spread (fewer if fewer tokens remain)."
    )
    per_depth: bool = Field(
        False, description="Batch granularity: a conditional acceptance per draft depth in eq. 8 "
        "(depth_acceptance.py); False: one alpha for every depth, as in the paper (the default: one run "
        "with it on showed no gain; docs/policies/adaptive-length.md).",
    )  # fmt: skip
    prior_trials: float = Field(4.0, ge=0.0, description="Weight of prior_alpha, in observed tokens.")
    request_decay: float = Field(0.9, gt=0.0, le=1.0, description="Per-request alpha: weight kept per step.")
    request_prior_trials: float = Field(
        4.0, ge=0.0, description="Per-request alpha is shrunk toward the global one with this weight (tokens)."
    )
    prefill_disable_threshold: float = Field(
        0.7, ge=0.0, le=1.0, description="Share of k = 0 decisions above which new requests skip the draft (§5)."
    )
    prefill_window: int = Field(64, ge=1, description="Steps whose decisions the prefill rule looks at.")
    prefill_lift_threshold: float | None = Field(
        0.5, ge=0.0, le=1.0,
        description="Share of k = 0 decisions at or below which requests the rule took off the draft come back "
        "to it (resynced at their next speculation); None: off for good, as in the paper (§5).",
    )  # fmt: skip
    prefill_lift_steps: int = Field(
        8, ge=1, description="Steps whose decisions the lift reads: the rule lifts (and new requests draft again) "
        "once their k = 0 share is at most prefill_lift_threshold.",
    )  # fmt: skip
    prefill_min_decisions: int = Field(16, ge=1, description="Decisions needed before the prefill rule applies.")
    confidence_threshold: float = Field(
        0.0, ge=0.0, le=1.0, description="App. A: draft chains stop below this confidence; 0 = alpha variant."
    )
    batch_search: bool = Field(
        False, description="Algorithm 2 lines 2-11: each step runs the first-come-first-served prefix of the running "
        "requests (1..n of them, each with its goodput-optimal k, each fitting the KV budget) of best goodput; "
        "False: every running request runs, k chosen for that batch (``smartspec-prefix`` turns it on).",
    )  # fmt: skip
    max_hold_steps: int = Field(
        8, ge=1, description="batch_search: a request left out of this many steps in a row is in every candidate "
        "prefix (the paper has no such bound; without one a long-context request could wait for good).",
    )  # fmt: skip
    cost: StepCostConfig = Field(default_factory=StepCostConfig)
    cost_probe_steps: int | None = Field(
        32, ge=1, description="A step decodes plainly (k = 0) after this many speculating steps in a row, so the "
        "cost fit keeps seeing both modes and the verify-mode cost c_t stays identified; None: never.",
    )  # fmt: skip


def expected_length(alpha: np.ndarray | float, k: np.ndarray | int) -> np.ndarray:
    """l(alpha, k) = (1 - alpha^(k+1)) / (1 - alpha): generated tokens, bonus included (eq. 8)."""
    alpha = np.clip(np.asarray(alpha, dtype=float), 0.0, 1.0 - 1e-9)
    return (1.0 - alpha ** (np.asarray(k, dtype=float) + 1.0)) / (1.0 - alpha)


def chain_alpha_counts(num_drafted: int, num_accepted: int) -> tuple[int, int]:
    """(acceptances, trials) a verified chain tells about alpha: a chain that stopped short adds a rejection."""
    return num_accepted, num_accepted + (1 if num_accepted < num_drafted else 0)


class SmartSpec(SpeculationPolicy):
    name = "smartspec"

    def __init__(self, config: SmartSpecConfig | None = None) -> None:
        self.config = cfg = config or SmartSpecConfig()
        if cfg.granularity == "request" and type(self) is SmartSpec:
            self.name = "smartspec-request"
        elif cfg.per_depth and type(self) is SmartSpec:
            self.name = "smartspec-depth"  # its own learned state: the two estimates do not pool
        elif not cfg.charge_feed and type(self) is SmartSpec:
            self.name = "smartspec-nofeed"
        if cfg.cost.per_request and type(self) is SmartSpec and self.name == "smartspec":
            self.name = "smartspec-reqcost"  # the per-request step cost (an extension): its own learned state
        if not cfg.charge_switch and type(self) is SmartSpec and self.name in ("smartspec", "smartspec-request"):
            self.name += "-noswitch"  # the ablation: its own learned state
        if cfg.batch_search and type(self) is SmartSpec:
            self.name += "-prefix"  # Algorithm 2's batch-prefix search: its own learned state (another batch mix)
        self._costs = StepCostModel(config=cfg.cost)
        self._cost_priors: tuple[Any, Any] = (None, None)
        self.state = SharedState(f"policy:{self.name}", STATE_VERSION, self._empty, self._apply)
        self._request_alpha: dict[str, list[float]] = {}  # id -> [acceptances, trials], decayed
        self._no_draft: dict[str, None] = {}  # ids the prefill rule took off the draft (ordered: oldest first)
        self._last: tuple[int, dict[str, tuple[int, int, bool]]] | None = None  # step, id -> (k, context, free)
        self._admission = DraftAdmission()
        self._last_decisions: list[int] = []  # the last step's k per AUTO request (kept off the draft: would-be k)
        self.last_goodput: float | None = None  # the estimate behind the last decision (traces, tests)
        self._explain_inputs: tuple | None = None  # alpha, contexts, step cost, free requests, k, a cost probe?, switch
        self._speculating_steps = 0  # speculating steps in a row (cost probes)
        self._alpha_of: tuple[list, float] | None = None  # the alpha window last read and its estimate
        self._held: dict[str, int] = {}  # batch_search: steps in a row a running request was left out

    # ------------------------------------------------------------------ learned state
    def shared_state(self) -> SharedState:
        return self.state

    def _empty(self) -> dict[str, Any]:
        return {"alpha": [], "decisions": [], "costs": self._costs.empty(), "depth": []}

    def _apply(self, state: dict[str, Any], event: dict[str, Any]) -> dict[str, Any]:
        state = dict(state)
        if event.get("alpha") is not None:
            state["alpha"] = push_window(list(state["alpha"]), event["alpha"], self.config.alpha_window)
        if event.get("decisions") is not None:
            state["decisions"] = push_window(list(state["decisions"]), event["decisions"], self.config.prefill_window)
        if event.get("cost") is not None:
            state["costs"] = self._costs.apply(state["costs"], event["cost"])
        if event.get("depth"):
            state["depth"] = decay_into(state.get("depth", []), event["depth"], self.config.alpha_decay, self.config.max_k)
        return state

    def alpha(self) -> float:
        """Global alpha: the moving average over the window, with the prior's weight (Alg. 1 line 3);
        a step's observation weighs alpha_decay^(steps since)."""
        cfg = self.config
        window = self.state.state["alpha"]
        if not window:
            return cfg.prior_alpha
        if self._alpha_of is not None and self._alpha_of[0] is window:  # windows are replaced, not changed
            return self._alpha_of[1]
        counts = np.asarray(window, dtype=float).reshape(-1, 2)  # [steps, (acceptances, trials)], oldest first
        weights = cfg.alpha_decay ** np.arange(len(counts) - 1, -1, -1, dtype=float)
        acc, trials = weights @ counts
        alpha = (acc + cfg.prior_alpha * cfg.prior_trials) / (trials + cfg.prior_trials) if trials else cfg.prior_alpha
        self._alpha_of = (window, float(alpha))
        return float(alpha)

    def request_alpha(self, request_id: str, global_alpha: float) -> float:
        cfg = self.config
        acc, trials = self._request_alpha.get(request_id, (0.0, 0.0))
        if trials + cfg.request_prior_trials <= 0:
            return global_alpha
        return (acc + global_alpha * cfg.request_prior_trials) / (trials + cfg.request_prior_trials)

    def step_cost(self, ctx: SpecContext) -> StepCost:
        priors = (ctx.cost_model, ctx.draft_cost_model)
        if priors != self._cost_priors:
            self._costs = StepCostModel(ctx.cost_model, ctx.draft_cost_model, self.config.cost)
            self._cost_priors = priors
        cost = self._costs.current(self.state.state["costs"])
        return cost if self.config.charge_feed else dataclasses.replace(cost, feed_d=0.0)

    # ------------------------------------------------------------------ decisions
    def _zero_share(self) -> float | None:
        """Share of k = 0 among the window's decisions (§5); None before ``prefill_min_decisions``."""
        zero = sum(z for z, _ in self.state.state["decisions"])
        total = sum(n for _, n in self.state.state["decisions"])
        return zero / total if total >= self.config.prefill_min_decisions else None

    def _lifted(self) -> bool:
        """Has the load dropped: k = 0 at most ``prefill_lift_threshold`` of the last ``prefill_lift_steps``
        steps' decisions? Those steps alone: in the whole window a burst's steps, ten decisions each, outweigh
        the lull's one-decision steps until they leave it (64 steps, 1.5 s here, for every request of the lull)."""
        lift, n = self.config.prefill_lift_threshold, self.config.prefill_lift_steps
        recent = self.state.state["decisions"][-n:]
        if lift is None or len(recent) < n:
            return False
        total = sum(t for _, t in recent)
        return total > 0 and sum(z for z, _ in recent) / total <= lift

    def wants_draft(self, req: Request) -> bool:
        """§5 prefill disabling: skip the draft when most recent decisions were k = 0 (the request
        does not speculate while that lasts); else defer its draft prefill while the last few steps decided
        k = 0 (draft_admission.py: the first step that speculates for it prefills it on the draft)."""
        cfg = self.config
        share = self._zero_share()
        if share is not None and share > cfg.prefill_disable_threshold and not self._lifted():
            self._no_draft[req.id] = None
            while len(self._no_draft) > 100_000:
                del self._no_draft[next(iter(self._no_draft))]
            return False
        return self._admission.wants_draft()

    def _inputs(self, batch: Sequence[Request], ctx: SpecContext) -> tuple:
        """What ``_optimise`` reads of a batch: alpha, alphas, free, caps, fixed, contexts, cost, switch."""
        cfg = self.config
        contexts = np.array([r.num_tokens for r in batch], dtype=float)
        free = np.array([r.speculation.mode is SpecMode.AUTO and r.id not in self._no_draft for r in batch], bool)
        fixed = np.array(
            [min(r.speculation.k, max(0, r.num_remaining - 1)) if r.speculation.mode is SpecMode.FIXED else 0
             for r in batch], dtype=int,
        )  # fmt: skip
        caps = np.array([min(cfg.max_k, max(0, r.num_remaining - 1)) for r in batch], dtype=int)
        cost = self.step_cost(ctx)
        alpha = self.alpha()
        alphas = np.array([self.request_alpha(r.id, alpha) for r in batch]) if cfg.granularity == "request" else None
        switch = self._switch(batch) if cfg.charge_switch else None
        return alpha, alphas, free, caps, fixed, contexts, cost, switch

    def step_batch(self, batch: Sequence[Request], ctx: SpecContext) -> Sequence[Request]:
        """Algorithm 2 lines 2-11 (``batch_search``): of the first-come-first-served prefixes of the running
        requests, the one whose goodput-optimal k gives the best goodput and that has the slots (HasSlot: its
        tokens and drafted tokens within the KV budget admission fills); ties go to the longer prefix. A request
        left out ``max_hold_steps`` steps in a row is in every candidate (an extension: no request waits for good).
        Without ``batch_search``: the whole batch, as admission formed it."""
        cfg = self.config
        if not cfg.batch_search or len(batch) <= 1:
            return batch
        order = sorted(batch, key=lambda r: (r.arrival_time if r.arrival_time is not None else float("inf")))
        self._lift_prefill_rule(order)
        alpha, alphas, free, caps, fixed, contexts, cost, switch = self._inputs(order, ctx)
        shortest = 1 + max((i for i, r in enumerate(order) if self._held.get(r.id, 0) >= cfg.max_hold_steps),
                           default=0)  # fmt: skip
        budget = ctx.max_tokens_in_flight
        best, best_g = len(order), -1.0
        for m in range(shortest, len(order) + 1):
            part = slice(0, m)
            ks, g = self._optimise(alpha, None if alphas is None else alphas[part], free[part], caps[part],
                                   fixed[part], contexts[part], cost, None if switch is None else switch[part])  # fmt: skip
            if budget is not None and float((contexts[part] + ks + 1).sum()) > budget:
                continue  # lines 5-7: no slot for this batch
            if g >= best_g:
                best, best_g = m, g
        chosen = order[:best]
        for r in order[best:]:
            self._held[r.id] = self._held.get(r.id, 0) + 1
        for r in chosen:
            self._held.pop(r.id, None)
        return chosen

    def decide(self, batch: Sequence[Request], ctx: SpecContext) -> list[SpecShape]:
        cfg = self.config
        n = len(batch)
        self._lift_prefill_rule(batch)
        alpha, alphas, free, caps, fixed, contexts, cost, switch = self._inputs(batch, ctx)
        ks, g = self._optimise(alpha, alphas, free, caps, fixed, contexts, cost, switch)
        self.last_goodput = g
        # the prefill rule's decisions count requests kept off the draft too, by what they *would* get:
        # otherwise, once the rule fires, no decision is recorded again and it can never lift (§5)
        off = np.array([r.speculation.mode is SpecMode.AUTO and r.id in self._no_draft for r in batch])
        would = self._optimise(alpha, alphas, free | off, caps, fixed, contexts, cost, switch)[0] if off.any() else ks
        ks, probe = self._cost_probe(ks, fixed)
        self._explain_inputs = (alpha, contexts, cost, int(free.sum()), int(ks.max()) if n else 0, probe,
                                np.zeros(n) if switch is None else switch * free)  # fmt: skip
        self._last = (ctx.step, {r.id: (int(k), int(c), bool(f)) for r, k, c, f in zip(batch, ks, contexts, free)})
        counted = [int(k) for k, c in zip(would, free | off) if c]
        # §5 records "the proposed length" of each step: with a k per request, a step that drafts for any of
        # them proposed tokens, and its low-acceptance requests at k = 0 say nothing about the load
        self._last_decisions = [max(counted)] if cfg.granularity == "request" and counted else counted
        self._admission.record(self._last_decisions)  # would-be k too: the deferral lifts with the load
        return [self._shape(int(k), r, caps[i]) if free[i] else SpecShape.none() for i, (r, k) in enumerate(zip(batch, ks))]

    def explain(self) -> dict[str, float]:
        """The last decision's alpha, chosen k, the fitted step costs (ms), and the modelled goodput (tokens/s)
        of the whole batch drafting k = 0..3 (eq. 3, 8-9): where the model and the measured steps part."""
        if self._explain_inputs is None:
            return {}
        alpha, contexts, cost, num_free, k, probe, switch = self._explain_inputs
        n = len(contexts)
        _, goodput = uniform_goodputs(np.full(n, alpha), np.ones(n, bool), np.full(n, 3), np.zeros(n, int),
                                      contexts, cost, 3)  # fmt: skip
        out = {"alpha": alpha, "k": float(k), "num_free": float(num_free), "goodput": self.last_goodput or 0.0,
               "cost_probe": float(probe), "switch_tokens": float(switch.sum()),
               "switch_requests": float((switch > 0).sum())}
        out.update({f"goodput_k{j}": float(g) for j, g in enumerate(goodput)})
        for name in ("delta_t", "gamma_t", "gamma_r", "alpha_t", "call_t", "call_d", "delta_d", "gamma_d", "alpha_d",
                     "feed_d"):  # fmt: skip
            out[f"{name}_ms"] = getattr(cost, name) * 1e3
        return out

    def _cost_probe(self, ks: np.ndarray, fixed: np.ndarray) -> tuple[np.ndarray, bool]:
        """``ks``, or a plain-decode step in their place when the last ``cost_probe_steps`` steps all speculated.

        The cost fit tells a verify pass's own cost c_t from the per-step constant only by steps without
        drafting; a policy that always speculates never shows it one, and the fit cannot see a verify-mode cost
        that should stop it (step_cost.py). One plain step in 32 keeps both modes in the fit's window (~50
        steps) at a price of 1/32 of one step's speculative gain (~0.5 % of goodput at batch 1 here). Decisions
        (§5, deferral) record what the policy chose, not the probe."""
        every = self.config.cost_probe_steps
        speculating = bool(len(ks)) and int(ks.max()) > 0
        probe = every is not None and speculating and self._speculating_steps >= every and not fixed.any()
        self._speculating_steps = self._speculating_steps + 1 if speculating and not probe else 0
        return (np.zeros_like(ks) if probe else ks), probe

    def _lift_prefill_rule(self, batch: Sequence[Request]) -> None:
        """Requests §5 took off the draft come back once the window's k = 0 share fell to the lift threshold.

        The paper keeps them off for good: a request admitted at a burst's peak then decodes plainly through
        the lull after it, where speculation pays most (bench/results/adaptive-eagle, bursty trace). Here the
        loop resyncs a request the draft lacks at its next speculation (a draft prefill of its tokens), so the
        classification can end; a lower lift threshold than the one that sets it keeps it from flapping. The lift
        reads the last few steps (``_lifted``), not the whole window: it is the load now that decides."""
        if self._no_draft and self._lifted():
            for r in batch:
                self._no_draft.pop(r.id, None)

    def _switch(self, batch: Sequence[Request]) -> np.ndarray:
        """s_i [n]: the catch-up tokens a request that did not speculate in the last step would add to this step's
        feed, spread over ``switch_horizon`` steps or the tokens it has left, whichever is fewer (module docstring).
        A request that speculated last step is in the steady state the feed term prices: 0."""
        last = self._last[1] if self._last is not None else {}
        horizon = self.config.switch_horizon
        out = np.zeros(len(batch))
        for i, r in enumerate(batch):
            if r.on_draft and last.get(r.id, (0,))[0] == 0:  # the next speculate call feeds its lag first
                out[i] = r.draft_lag / max(1, min(horizon, r.num_remaining))
        return out

    def _optimise(self, alpha: float, alphas: np.ndarray | None, free: np.ndarray, caps: np.ndarray,
                  fixed: np.ndarray, contexts: np.ndarray, cost: StepCost,
                  switch: np.ndarray | None = None) -> tuple[np.ndarray, float]:  # fmt: skip
        """k per request maximising the step's goodput: Algorithm 2 (one k), or per request (§4.4)."""
        max_k = self.config.max_k
        if alphas is None:
            if self.config.per_depth:  # alpha per depth, shrunk toward the pooled one (depth_acceptance.py)
                rates = conditional_rates(self.state.state.get("depth", []), alpha, self.config.prior_trials, max_k)
                gains = np.tile(depth_gains(rates), (len(free), 1))  # [n, max_k]
                return best_uniform_k(gains, free, caps, fixed, contexts, cost, max_k, switch)
            return best_uniform_k(np.full(len(free), alpha), free, caps, fixed, contexts, cost, max_k, switch)
        gains = alphas[:, None] ** np.arange(1, max_k + 1)[None, :]  # token j adds alpha^j (eq. 8)
        return best_request_ks(gains, free, caps, fixed, contexts, cost, max_k, switch=switch)

    def _shape(self, k: int, req: Request, cap: int) -> SpecShape:
        return SpecShape.chain(k)

    # ------------------------------------------------------------------ learning
    def observe(self, report: StepReport) -> None:
        planned = self._last[1] if self._last is not None and self._last[0] == report.step else {}
        acc = trials = 0
        depth: list[list[float]] = []
        ks, contexts = [], []
        decay = self.config.request_decay
        for o in report.outcomes:
            a, t = chain_alpha_counts(o.num_drafted, o.num_accepted) if o.num_drafted else (0, 0)
            acc, trials = acc + a, trials + t
            if o.num_drafted and self.config.per_depth:  # counts only where they are read
                depth = add_counts(depth, chain_depth_counts(o.num_drafted, o.num_accepted))
            if o.num_drafted:
                old = self._request_alpha.get(o.request_id, [0.0, 0.0])
                self._request_alpha[o.request_id] = [decay * old[0] + a, decay * old[1] + t]
            if o.request_id in planned:
                ks.append(o.num_drafted)
                contexts.append(planned[o.request_id][1])
            if o.finish_reason is not None:
                self._forget(o.request_id)
        for request_id in report.failed_ids + report.preempted_ids:
            self._forget(request_id)
        decisions = self._last_decisions if planned else []
        event: dict[str, Any] = {
            # every step enters the window, observed or not: after alpha_window steps without speculation
            # the estimate is the prior again, so a low streak cannot switch speculation off for good
            "alpha": [acc, trials] if planned or trials else None,
            "decisions": [sum(1 for k in decisions if k == 0), len(decisions)] if decisions else None,
            "depth": depth or None,
        }
        if ks and report.times.verify > 0:
            event["cost"] = StepCostModel.observed(ks, contexts, report)
        if any(v is not None for v in event.values()):
            self.state.record(event)

    def _forget(self, request_id: str) -> None:
        self._request_alpha.pop(request_id, None)
        self._no_draft.pop(request_id, None)
        self._held.pop(request_id, None)


class SmartSpecConfidence(SmartSpec):
    """App. A: draft until confidence < T (at most K_max), then verify the goodput-optimal prefix."""

    name = "smartspec-conf"

    def __init__(self, config: SmartSpecConfig | None = None) -> None:
        cfg = config or SmartSpecConfig(confidence_threshold=0.5)
        if cfg.confidence_threshold <= 0:
            raise ValueError("smartspec-conf needs a confidence threshold in (0, 1]")
        super().__init__(cfg)

    def _shape(self, k: int, req: Request, cap: int) -> SpecShape:
        # the alpha model says whether to speculate at all; how far is the draft's confidence's call
        return SpecShape.chain(int(cap), self.config.confidence_threshold) if k > 0 else SpecShape.none()

    def tree_selector(self) -> SmartSpecConfidence:
        return self

    def select(self, batch: Sequence[Request], trees: list[TokenTree], ctx: SpecContext) -> list[TokenTree]:
        """Algorithm 3 line 13 (ArgmaxGoodput): per greedy chain, the verify length maximising the step's goodput.

        Sampled chains are verified whole: choosing their verify length from their own tokens' probabilities
        biases acceptance (a token is kept or cut by its own q), so for them the paper's line 13 is not used."""
        n = len(batch)
        lengths = np.array([len(t) for t in trees])
        width = int(lengths.max()) if n else 0
        if width == 0:
            return trees
        contexts = np.array([r.num_tokens for r in batch], dtype=float)
        # greedy requests only: a sampled chain's cut would read the probabilities of the very tokens it keeps or
        # drops, and acceptance would then test tokens no longer drawn from the q it reports (not lossless); a
        # sampled chain is verified as drafted, its length set by Algorithm 3's stopping rule alone
        free = np.array([r.speculation.mode is SpecMode.AUTO and r.sampling.greedy and _is_chain(t)
                         for r, t in zip(batch, trees)])  # fmt: skip
        gains = np.zeros((n, width))  # expected acceptance of each drafted token: its path probability
        for i, tree in enumerate(trees):
            if free[i] and len(tree):
                probs = np.asarray(tree.draft_probs or [1.0] * len(tree), dtype=float)
                gains[i, : len(tree)] = np.minimum.accumulate(np.cumprod(probs))
        cost = self.step_cost(ctx)
        sunk = cost.call_d + cost.delta_d * width + float((lengths * (cost.gamma_d + cost.alpha_d * contexts)).sum())
        fixed = np.where(free, 0, lengths)
        ks, _ = best_request_ks(gains, free, lengths, fixed, contexts, cost, width, sunk_s=sunk, draft_terms=False)
        return [subtree(t, range(k)) if free[i] and k < len(t) else t for i, (t, k) in enumerate(zip(trees, ks))]


def _is_chain(tree: TokenTree) -> bool:
    return all(p == i - 1 for i, p in enumerate(tree.parent_ids))
