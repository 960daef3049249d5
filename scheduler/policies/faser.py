"""FASER's Adaptive Drafter: a speculation length per request by GP-LCB (FASER §4.1, eq. 1-4).

For request i and candidate length s in S = {0 .. K_max} under the current
batch size b, the cost per committed token is (eq. 1)::

    J_i(s; b) = T^(s; b) / (s * a^_i(s; b) + eps)

and request i drafts s_i* = argmin_s J_i(s; b) (eq. 2). Tandem counts the
target's bonus token among the committed tokens, so the denominator here is
s * a^_i(s) + 1 (+ eps): s = 0, plain decoding, is then a candidate like any
other (J = T(0; b)), where the paper's form would divide by eps.

The two factors, as the paper splits them (§4.1.1: latency is observed per
batch and shared, acceptance is request-specific):

- T^(s; b), the step latency, is a GP over (s, b) fitted to a sliding
  window of the last ``window`` observed steps (shared by all requests, and
  by scheduler replicas through Redis). Its prior mean is the step cost
  model (step_cost.py: profiled T_fwd, refined online), so the GP learns
  what that model misses. Selection is GP-LCB (eq. 3): the lower bound
  mu - sqrt(beta) * sigma of T^ enters J, so lengths the window knows little
  about at this batch size look cheap until tried.
- s * a^_i(s), the expected accepted tokens of a chain of s, is
  sum_{d < s} P_i(d), with P_i(d) the request's own acceptance rate at
  depth d (Request.position_accepted / position_drafted), shrunk toward the
  global rate at that depth while the request has few observations (the
  global rate's own prior falls with depth: P(d - 1) times the prior rate,
  ``global_position_rates``). While a
  request does not draft, its own counts weigh ``request_idle_decay`` less per
  step: with s = 0 nothing new is seen, so without it an unlucky start (no
  token of its first chains accepted) kept a request at s = 0 to its end,
  which a third of the requests on the feature draft suffered (adaptive-eagle:
  1.55 tokens/step against k = 2's 1.71). Its estimate drifts back toward the
  global rate, and the request drafts again once that pays.
  With ``request_decay`` < 1 (``faser-joint-recent``) the request's counts
  weigh that much less per step, drafting or not: §4.1 keeps a^_i "from recent
  batches", and how predictable a request's text is changes within it (a
  quoted span, then free prose), so a request that missed early is not held
  at a short s after its text turned predictable (without it, faser-joint
  drafted s = 1 in 20-38 % of its batch-1 steps on the feature draft, for
  1.56 tokens/step against k = 3's 1.67; adaptive-eagle-joint-drift).
  Measured no better than faser-joint (bench/results/diag-faser-recent).

The GP's signal amplitude (``signal="empirical"``, the default; an
empirical-Bayes choice where the paper leaves the hyperparameters open) is
what the window's residuals against the cost model leave beyond the noise,
between 2 % and 30 % of the mean step: the LCB's optimism about a length it
has not tried at this batch size is then as large as the cost model's
measured error, not a fixed 30 % of a step, which made untried long chains
look cheap at every new batch size (at 2x-4x on the feature draft FASER-AD's
steps ran 55 ms against k = 2's 47). ``faser-fixedgp`` keeps the fixed 30 %.

The joint choice (``joint``, ``faser-joint``; §4.1 asks for lengths "chosen
jointly", since all requests "remain coupled through the current batch"):
eq. 1-2 as printed price each request's s by T^ of the whole batch at a
uniform s, but a batch's lengths are mixed, and what a step costs depends on
them unevenly: the draft runs max_i s_i forwards for every request, the
target verifies sum_i s_i tokens. So a predictable request at 2x-4x went to
s = 4-6 (charged as if the batch drafted with it, which its acceptance
alone then paid for) while the unpredictable ones sat at s = 0 (charged a
whole batch's verify for one token's chance), and the step drafted to depth
4-6 for 1.51 tokens per request against k = 2's 1.63 (adaptive-eagle, 2x-4x:
steps of 74-82 ms against k = 2's 58-65). Joint, eq. 1 is the batch's::

    J(s_1..s_n; b) = T^(s_1..s_n; b) / sum_i (s_i a^_i(s_i) + 1)

with T^ the step cost model at the actual lengths (step_cost.py: the draft's
depth max_i s_i, the verify's sum, the feed) plus the GP's LCB residual at
their mean. For each max depth m the lengths minimising the model's part are
exact (Dinkelbach, length_solver.request_ks_by_depth: a request's d-th token is
drafted while P_i(d) is worth its own verify and draft cost at the batch's
rate); the GP's residual then corrects each m's step, and the m of least J
wins. The GP window records the residual against that mixed-step model.
With ``charge_switch`` (``faser-joint-switch``) a request the draft holds
that decoded plainly last step is also charged the catch-up its next
speculate call feeds (c_f x its lag, spread over ``switch_horizon`` steps,
as SmartSpec's switch), and the residual is taken against what each step's
call actually fed.

After each step the observed cost (eq. 4) J~ = T_obs / (s * a_obs + 1) is
what the step cost; the GP window records (s, b, context, T_obs). The
inputs are scaled to unit ranges (s / K_max, log2 b / log2 max_batch) and
the kernel hyperparameters are fixed (gp.py), so one iteration is one
Cholesky of a window x window matrix: ``last_decide_s`` measures it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, Field

from scheduler.policies.draft_admission import DraftAdmission
from scheduler.policies.gp import ExactGP
from scheduler.policies.shared_state import SharedState, push_window
from scheduler.policies.length_solver import request_ks_by_depth
from scheduler.policies.speculation import SpecContext, SpecShape, SpeculationPolicy
from scheduler.policies.step_cost import StepCost, StepCostConfig, StepCostModel
from scheduler.report import StepReport
from scheduler.request import Request, SpecMode

STATE_VERSION = 6  # 6: window rows carry the mixed step's model gap (joint)
# 5: the target fit's per-request term (step_cost.py gamma_r)
# 2: the target fit has a verify-mode term (step_cost.py c_t); 3: the draft fit a fed-tokens term
# 4: the fits' feature scales (step_cost.py)


class FaserConfig(BaseModel):
    """Knobs of the Adaptive Drafter; every field has a default."""

    max_k: int = Field(8, ge=1, le=32, description="Largest length in the candidate set S = {0 .. max_k}.")
    window: int = Field(64, ge=1, le=1024, description="Observed steps the GP is fitted to (sliding window).")
    beta: float = Field(1.0, ge=0.0, description="beta_n of eq. 3 (exploration weight of sigma).")
    epsilon: float = Field(1e-6, gt=0.0, description="eps of eq. 1 (numerical guard).")
    lengthscale_s: float = Field(0.35, gt=0.0, description="RBF lengthscale over s / max_k.")
    lengthscale_b: float = Field(0.35, gt=0.0, description="RBF lengthscale over log2(b) / log2(max_batch).")
    max_batch: int = Field(64, ge=2, description="Batch size that maps to 1 on the b axis.")
    signal_rel: float = Field(0.3, gt=0.0, description="GP signal sd, relative to the mean observed latency (with "
                              "signal 'empirical': its ceiling, and the sd while the window is empty).")
    signal: Literal["fixed", "empirical"] = Field(
        "empirical", description="GP signal sd: signal_rel x the mean latency, or what the window's residuals "
        "against the cost model leave beyond the noise (an empirical-Bayes amplitude), within "
        "[signal_floor_rel, signal_rel] x the mean latency.")
    signal_floor_rel: float = Field(0.02, gt=0.0, description="Least GP signal sd (signal 'empirical'), relative.")
    noise_rel: float = Field(0.1, gt=0.0, description="Observation noise sd, relative to the mean observed latency.")
    prior_position_rate: float = Field(0.6, gt=0.0, lt=1.0, description="Acceptance of a drafted token given its parent's, before any data (the prior of P(d) is its d+1-th power).")
    position_prior_trials: float = Field(4.0, ge=0.0, description="Weight of the global rate in P_i(d).")
    position_decay: float = Field(0.995, gt=0.0, le=1.0, description="Global depth counts: weight kept per step.")
    request_idle_decay: float = Field(
        0.9, gt=0.0, le=1.0, description="A request's own depth counts: weight kept per step it does not draft.")
    request_decay: float = Field(
        1.0, gt=0.0, le=1.0, description="A request's own depth counts: weight kept per step, drafting or not "
        "(1: every count since it began; below 1 its recent steps, and request_idle_decay is then unused; "
        "`faser-joint-recent`).")
    joint: bool = Field(
        False, description="Choose the batch's lengths together (the module docstring's joint choice; "
        "`faser-joint`): eq. 1 for the batch with the step's cost at its actual mixed lengths; False: each "
        "request by its own J_i under T^ of a uniform s, as eq. 1-2 print it.")
    charge_switch: bool = Field(
        False, description="Joint only: a request that did not draft last step is charged the draft's catch-up on "
        "the tokens it decoded plainly (c_f x its lag / switch_horizon, as SmartSpec charges it; "
        "`faser-joint-switch`), and the GP's residual is taken against the tokens each step actually fed.")
    switch_horizon: int = Field(4, ge=1, description="Steps over which a resumed request's catch-up is spread.")
    cost: StepCostConfig = Field(default_factory=StepCostConfig)


def path_rates(drafted: np.ndarray, accepted: np.ndarray, conditional: np.ndarray, prior_trials: float) -> np.ndarray:
    """P(d) per depth from decayed counts: (accepted[d] + m * P(d - 1) * conditional[d]) / (drafted[d] + m).

    P(d), the chance that tokens 0..d of a chain are all accepted, is shrunk toward one more token past
    P(d - 1) at the ``conditional`` rate (P(-1) = 1), and kept non-increasing in d, as a path probability is."""
    rates = np.zeros(len(drafted))
    above = 1.0
    for d in range(len(drafted)):
        prior = above * float(conditional[d])
        rate = (accepted[d] + prior_trials * prior) / (drafted[d] + prior_trials) if drafted[d] + prior_trials > 0 else prior
        rates[d] = above = min(rate, above)
    return rates


class Faser(SpeculationPolicy):
    name = "faser"

    def __init__(self, config: FaserConfig | None = None) -> None:
        self.config = cfg = config or FaserConfig()
        if cfg.signal == "fixed" and type(self) is Faser:
            self.name = "faser-fixedgp"  # its own learned state (the ablation of the empirical amplitude)
        if cfg.joint:
            self.name = "faser-joint-switch" if cfg.charge_switch else "faser-joint"  # its own learned state
            if cfg.request_decay < 1.0:
                self.name = "faser-joint-recent"
        self._prev_ks: dict[str, int] = {}  # request id -> the length it was given last step (the switch)
        self._costs = StepCostModel(config=cfg.cost)
        self._cost_priors: tuple[Any, Any] = (None, None)
        self.state = SharedState(f"policy:{self.name}", STATE_VERSION, self._empty, self._apply)
        self._last: tuple[int, dict[str, int]] | None = None  # step, id -> context tokens
        self._idle: dict[str, int] = {}  # request id -> steps since it last drafted (its counts fade meanwhile)
        self._recent: dict[str, np.ndarray] = {}  # request id -> [2, max_k] decayed (drafted, accepted) per depth
        self.last_decide_s: float | None = None  # wall time of the last decide (the GP's per-iteration cost)
        self.last_lcb: np.ndarray | None = None  # LCB of T^(s; b) per s at the last decision
        self.last_signal_sd: float | None = None  # the GP's signal sd at the last decision, seconds
        self.last_observed_cost: dict[str, float] = {}  # eq. 4 per request of the last observed step
        self._admission = DraftAdmission()

    def wants_draft(self, req: Request) -> bool:
        """Defer the draft's prefill while most recent choices were s = 0 (draft_admission.py)."""
        return self._admission.wants_draft()

    # ------------------------------------------------------------------ learned state
    def shared_state(self) -> SharedState:
        return self.state

    def _empty(self) -> dict[str, Any]:
        return {"window": [], "drafted": [], "accepted": [], "costs": self._costs.empty()}

    def _apply(self, state: dict[str, Any], event: dict[str, Any]) -> dict[str, Any]:
        state = dict(state)
        if event.get("obs") is not None:
            state["window"] = push_window(list(state["window"]), event["obs"], self.config.window)
        if event.get("drafted") is not None:
            decay = self.config.position_decay
            for key in ("drafted", "accepted"):
                old, new = list(state[key]), event[key]
                width = max(len(old), len(new))
                old += [0.0] * (width - len(old))
                state[key] = [decay * o + (new[d] if d < len(new) else 0) for d, o in enumerate(old)]
        if event.get("cost") is not None:
            state["costs"] = self._costs.apply(state["costs"], event["cost"])
        return state

    def step_cost(self, ctx: SpecContext) -> StepCost:
        priors = (ctx.cost_model, ctx.draft_cost_model)
        if priors != self._cost_priors:
            self._costs = StepCostModel(ctx.cost_model, ctx.draft_cost_model, self.config.cost)
            self._cost_priors = priors
        return self._costs.current(self.state.state["costs"])

    def global_position_rates(self) -> np.ndarray:
        """P(d): acceptance at depth d over all requests (decayed counts), shrunk toward a chain's prior.

        P(d) is the share of chains reaching depth d whose tokens 0..d were all accepted, so it falls
        with d. Its prior is therefore P(d - 1) * prior_position_rate (one more token accepted at the
        prior's rate), not prior_position_rate at every depth: with a flat prior the depths rarely drafted
        looked as good as the first, so s = K_max seemed to pay and was drafted again whenever the decayed
        counts had faded (adaptive-eagle: 47 of 431 steps at s = 8 at the lowest load, where k = 7 is 18 %
        slower than k = 3). Non-increasing in d, as the quantity is."""
        cfg = self.config
        drafted = np.zeros(cfg.max_k)
        accepted = np.zeros(cfg.max_k)
        d_state, a_state = self.state.state["drafted"][: cfg.max_k], self.state.state["accepted"][: cfg.max_k]
        drafted[: len(d_state)], accepted[: len(a_state)] = d_state, a_state
        conditional = np.full(cfg.max_k, cfg.prior_position_rate)
        return path_rates(drafted, accepted, conditional, cfg.position_prior_trials)

    def expected_accepted(self, req: Request, global_rates: np.ndarray) -> np.ndarray:
        """s * a^_i(s) for s = 0..max_k: sum over depths d < s of the request's P_i(d)."""
        m = self.config.position_prior_trials
        k = len(global_rates)
        drafted = np.zeros(k)
        accepted = np.zeros(k)
        if self.config.request_decay < 1.0:  # its recent steps only (module docstring)
            recent = self._recent.get(req.id)
            if recent is not None:
                n = min(k, recent.shape[1])
                drafted[:n], accepted[:n] = recent[0, :n], recent[1, :n]
        else:
            n = min(k, len(req.position_drafted))
            weight = self.config.request_idle_decay ** self._idle.get(req.id, 0)  # its evidence fades while idle
            drafted[:n] = np.asarray(req.position_drafted[:n], dtype=float) * weight
            accepted[:n] = np.asarray(req.position_accepted[:n], dtype=float) * weight
        # the prior of the request's P_i(d): its own P_i(d - 1) times the global chance of one more token
        conditional = global_rates / np.maximum(np.concatenate([[1.0], global_rates[:-1]]), 1e-12)
        rates = path_rates(drafted, accepted, conditional, m)
        return np.concatenate([[0.0], np.cumsum(rates)])

    # ------------------------------------------------------------------ the GP over T^(s; b)
    def _inputs(self, s: np.ndarray, b: np.ndarray) -> np.ndarray:
        cfg = self.config
        return np.stack([s / cfg.max_k, np.log2(np.maximum(b, 1.0)) / math.log2(cfg.max_batch)], axis=-1)

    def latency_bounds(self, batch_size: int, context_sum: float, cost: StepCost) -> tuple[np.ndarray, np.ndarray]:
        """(mu, sigma) of T^(s; b) for s = 0..max_k at this batch: cost-model mean + GP on the residuals."""
        cfg = self.config
        window = np.asarray(self.state.state["window"], dtype=float).reshape(-1, 5)  # [n, (s, b, ctx, T, gap)]
        s_all = np.arange(cfg.max_k + 1, dtype=float)
        prior_now = cost.uniforms(s_all, np.full_like(s_all, batch_size), np.full_like(s_all, context_sum))
        scale = float(window[:, 3].mean()) if len(window) else float(prior_now[0])
        scale = max(scale, 1e-6)
        residuals = window[:, 3] - cost.uniforms(window[:, 0], window[:, 1].astype(int), window[:, 2])
        if cfg.joint:  # against the model of the step's actual lengths, not of a uniform s at their mean
            residuals = residuals - window[:, 4]
        signal_var = (cfg.signal_rel * scale) ** 2
        if cfg.signal == "empirical" and len(window):
            # the residuals' variance is the signal's plus the noise's: what is left beyond the noise is how far
            # the cost model is off, so that, not a fixed 30 % of a step, is how much cheaper an untried length
            # may turn out (the LCB's optimism); floored, and capped at the fixed amplitude
            excess = float(np.mean(residuals**2)) - (cfg.noise_rel * scale) ** 2
            signal_var = float(np.clip(excess, (cfg.signal_floor_rel * scale) ** 2, signal_var))
        self.last_signal_sd = math.sqrt(signal_var)
        gp = ExactGP((cfg.lengthscale_s, cfg.lengthscale_b), signal_var, (cfg.noise_rel * scale) ** 2)
        if len(window):
            gp.fit(self._inputs(window[:, 0], window[:, 1]), residuals)
        mean, sd = gp.predict(self._inputs(s_all, np.full_like(s_all, batch_size)))
        return prior_now + mean, sd

    # ------------------------------------------------------------------ decisions
    def decide(self, batch: Sequence[Request], ctx: SpecContext) -> list[SpecShape]:
        t0 = time.perf_counter()
        cfg = self.config
        contexts = [r.num_tokens for r in batch]
        cost = self.step_cost(ctx)
        mu, sd = self.latency_bounds(len(batch), float(sum(contexts)), cost)
        lcb = np.maximum(mu - math.sqrt(cfg.beta) * sd, 1e-9)  # eq. 3 (LCB of the shared factor of J)
        rates = self.global_position_rates()
        if cfg.joint:
            shapes = self._joint(batch, contexts, cost, lcb, rates)
        else:
            shapes = self._each(batch, lcb, rates)
        self._admission.record([s.k for s, r in zip(shapes, batch) if r.speculation.mode is SpecMode.AUTO])
        self._last = (ctx.step, dict(zip((r.id for r in batch), contexts)))
        self.last_lcb = lcb
        self.last_decide_s = time.perf_counter() - t0
        return shapes

    def _each(self, batch: Sequence[Request], lcb: np.ndarray, rates: np.ndarray) -> list[SpecShape]:
        """Eq. 1-2 as printed: each request's own argmin of J_i under T^ of a uniform s."""
        cfg = self.config
        shapes = []
        for r in batch:
            if r.speculation.mode is not SpecMode.AUTO:
                shapes.append(SpecShape.none())  # overridden by the request's own setting
                continue
            cap = min(cfg.max_k, max(0, r.num_remaining - 1))
            j = lcb[: cap + 1] / (self.expected_accepted(r, rates)[: cap + 1] + 1.0 + cfg.epsilon)  # eq. 1
            shapes.append(SpecShape.chain(int(np.argmin(j))))  # eq. 2 (ties: the shortest)
        return shapes

    def _joint(self, batch: Sequence[Request], contexts: list[int], cost: StepCost, lcb: np.ndarray,
               rates: np.ndarray) -> list[SpecShape]:  # fmt: skip
        """The batch's lengths together (module docstring): per max depth m the lengths that minimise eq. 1 for
        the batch under the cost model of mixed lengths, each m's step then corrected by the GP's LCB residual at
        the lengths' mean; the m of least cost per committed token wins."""
        cfg = self.config
        n = len(batch)
        auto = np.array([r.speculation.mode is SpecMode.AUTO for r in batch])
        caps = np.array([min(cfg.max_k, max(0, r.num_remaining - 1)) for r in batch])
        gains = np.zeros((n, cfg.max_k))  # P_i(d): what request i's (d+1)-th drafted token adds
        for i, r in enumerate(batch):
            if auto[i]:
                gains[i] = np.diff(self.expected_accepted(r, rates))
        ctx = np.asarray(contexts, dtype=float)
        switch = None
        if cfg.charge_switch:  # what a resumed request's first speculate feeds the draft, spread (SmartSpec's s_i)
            switch = np.array([r.draft_lag / max(1, min(cfg.switch_horizon, r.num_remaining))
                               if r.on_draft and self._prev_ks.get(r.id, 0) == 0 else 0.0 for r in batch])
        ks, goodput = request_ks_by_depth(gains, auto, caps, np.zeros(n, dtype=int), ctx, cost, cfg.max_k,
                                          switch=switch)
        cum = np.concatenate([np.zeros((n, 1)), np.cumsum(gains, axis=1)], axis=1)
        tokens = (1.0 + cum[np.arange(n)[None, :], ks]).sum(axis=1)  # committed tokens per candidate row
        s_all = np.arange(cfg.max_k + 1, dtype=float)
        prior = cost.uniforms(s_all, np.full_like(s_all, n), np.full_like(s_all, ctx.sum()))
        residual = np.interp(ks.mean(axis=1), s_all, lcb - prior)  # the GP's LCB of what the model misses
        j = np.maximum(tokens / np.maximum(goodput, 1e-12) + residual, 1e-9) / (tokens + cfg.epsilon)  # eq. 1
        best = int(np.argmin(j))
        self._prev_ks = {r.id: int(k) if a else 0 for r, k, a in zip(batch, ks[best], auto)}
        return [SpecShape.chain(int(k)) if a else SpecShape.none() for k, a in zip(ks[best], auto)]

    def explain(self) -> dict[str, float]:
        """The last decision's LCB of T^(s; b) for s = 0..3 and the GP's signal sd (ms)."""
        if self.last_lcb is None or self.last_signal_sd is None:
            return {}
        out = {f"lcb_s{s}_ms": float(v) * 1e3 for s, v in enumerate(self.last_lcb[:4])}
        return {**out, "signal_sd_ms": self.last_signal_sd * 1e3}

    # ------------------------------------------------------------------ learning
    def _mixed_gap(self, ks: list[int], contexts: list[int], outcomes: list, report: StepReport) -> float:
        """What the step cost model says this step's actual (mixed) lengths cost beyond a uniform s at their mean:
        the joint variant's GP learns its residual against the mixed model (module docstring)."""
        cost = self._costs.current(self.state.state["costs"])
        if self.config.charge_switch:  # what this step's call actually fed: the catch-ups and each newest token
            mixed = cost.step(ks, contexts) + cost.feed_d * (report.num_catchup_tokens + sum(1 for k in ks if k > 0))
        else:  # the steady state: what a speculating request generates is what the next call feeds
            tokens = np.array([[o.num_accepted + 1.0 for o in outcomes]])
            mixed = cost.step(ks, contexts) + float(cost.feed(np.array([ks]), tokens)[0])
        return mixed - cost.uniform(float(np.mean(ks)), len(report.outcomes), float(sum(contexts)))

    def _remember(self, outcome) -> None:
        """Decay a request's recent depth counts by request_decay and add this step's chain (drafted or not)."""
        recent = self._recent.get(outcome.request_id)
        if recent is None:
            recent = np.zeros((2, self.config.max_k))
        recent *= self.config.request_decay
        if outcome.shape.kind == "chain":
            recent[0, : min(outcome.num_drafted, self.config.max_k)] += 1.0
            recent[1, : min(outcome.num_accepted, self.config.max_k)] += 1.0
        self._recent[outcome.request_id] = recent

    def observe(self, report: StepReport) -> None:
        planned = self._last[1] if self._last is not None and self._last[0] == report.step else {}
        outcomes = [o for o in report.outcomes if o.request_id in planned]
        for o in report.outcomes:
            if o.finish_reason is not None:
                self._idle.pop(o.request_id, None)
                self._recent.pop(o.request_id, None)
            elif o.request_id in planned:
                self._idle[o.request_id] = 0 if o.num_drafted else self._idle.get(o.request_id, 0) + 1
                if self.config.request_decay < 1.0:
                    self._remember(o)
        for table in (self._idle, self._recent):
            while len(table) > 100_000:  # requests that ended without an outcome saying so (aborts)
                del table[next(iter(table))]
        for request_id in report.failed_ids + report.preempted_ids:
            self._idle.pop(request_id, None)
            self._recent.pop(request_id, None)
        if not outcomes:
            return
        cfg = self.config
        ks = [o.num_drafted for o in outcomes]
        contexts = [planned[o.request_id] for o in outcomes]
        t_obs = report.times.drafting + report.times.verify  # a resync is no cost of s
        drafted = [0] * cfg.max_k
        accepted = [0] * cfg.max_k
        for o in outcomes:
            if o.shape.kind == "chain":
                for d in range(min(o.num_drafted, cfg.max_k)):
                    drafted[d] += 1
                for d in range(min(o.num_accepted, cfg.max_k)):
                    accepted[d] += 1
        self.last_observed_cost = {
            o.request_id: t_obs / (o.num_accepted + 1.0 + cfg.epsilon) for o in outcomes  # eq. 4
        }
        b = len(report.outcomes)
        gap = self._mixed_gap(ks, contexts, outcomes, report) if cfg.joint else 0.0  # as-printed FASER: unused
        event: dict[str, Any] = {
            "obs": [float(np.mean(ks)), b, float(sum(contexts)), t_obs, gap] if t_obs > 0 else None,
        }
        if any(drafted):
            event["drafted"], event["accepted"] = drafted, accepted
        if report.times.verify > 0:
            event["cost"] = StepCostModel.observed(ks, contexts, report)
        self.state.record(event)
