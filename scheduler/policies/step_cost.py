"""What one speculative step costs: T_batch = T_draft + T_target (SmartSpec §4.3, eq. 4-7).

Every forward costs (eq. 7)::

    T_fwd(M) = alpha_M * N_context + gamma_M * N_batched + delta_M

For a step where request i (context c_i tokens) drafts a chain of k_i tokens:

    T_target = alpha_t * sum(c_i) + gamma_t * sum(k_i + 1) + delta_t              (eq. 6)
               + [max k > 0] * c_t + gamma_r * n        (gamma_r: per request, an extension)
    T_draft  = sum_{j=1..max k} T_fwd(draft; requests still drafting at j)      (eq. 5)
             = [max k > 0] * c_d + max_k * delta_d + sum_i k_i * (gamma_d + alpha_d * c_i)

(c_d: the speculate call's own overhead, an RPC here; c_t: what a verify pass
costs beyond a plain decode of as many tokens, the tree mask and acceptance:
with the float32 demo pair a verify of 5 tokens took 1.28x a decode step where
the per-token slope predicts 1.13x, engine_cpu.json, c_t about 10 ms; with the
bf16 feature-draft pair a batch-1 verify costs what a decode does, c_t ~0). Regrouped, the step is separable except for the max::

    T(k) = T0 + sum_i k_i * u_i + max_k * delta_d + [max_k > 0] * (c_d + c_t)
    T0   = delta_t + (gamma_t + gamma_r) * n + alpha_t * sum(c_i)    u_i = gamma_t + gamma_d + alpha_d * c_i

which is what lets the policies optimise goodput exactly (smartspec.py).

The feed (c_f per token fed): a speculate call first runs the tokens the
target committed since the request's last draft call through the draft (a
feature draft's catch-up on the target's features, a model draft's KV), so a
request that speculates every step pays c_f x the tokens it generated last
step, l_i(k_i) in steady state. SmartSpec charges that to the k > 0 choice
(``feed``; smartspec.py): the stationary comparison is "speculate every step"
against "decode plainly", and plain decoding feeds nothing. Measured on the
feature draft through the stack it is the batch-size slope of a speculate
call that the depth terms miss: replaying the adaptive-eagle traces, the
call at k = 1 took 10.3-12.4 ms at batch 8-11 where T(k) without the feed
predicted 5.0-5.8 and with it 9.7-10.1 (5.5 ms measured at batch 1, 4.3-4.7
predicted either way): k = 1 looked as cheap at batch 5-8 as at batch 1,
and SmartSpec drafted there although a plain step generated 8-18 % more
tokens per second (docs/bench/policies-grounded.md).

Where the coefficients come from: the profiler's fit of the target
(``SpecContext.cost_model``) and of the draft where one was profiled
(``SpecContext.draft_cost_model``) are the prior (c_t too: the profiler times
plain decodes beside verifies of the same sequences); every step then refines
them by least squares with forgetting (``OnlineFit``) on the measured verify
and speculate times, so RPC overhead and whatever the profile missed are
learned. Without a profile the prior is a weak generic one. The fits are
JSON state, merged across replicas like any learned state (shared_state.py).

Measured times enter the fits held within +-50 % of the current prediction
(``outlier_clip``): on a shared CPU one call now and then stalls for ten
times its cost (a 258 ms verify among 25 ms ones), and least squares would
spread that over every coefficient for the next ~50 steps (γ_t rose from
0.85 to 1.29 ms per token after one such step, and k = 1 looked dear at
every batch size). A real change of speed still moves the fit, by up to
half the prediction per step.

What the draft fit sees is the speculate call alone: a step that first
re-prefilled requests on the draft (``PhaseTimes.draft_sync``: a request the
draft never held, or a feature draft's resync through the target) is charged
without it, and the tokens the call fed the draft before drafting enter as a
feature of their own (c_f per token, ``StepReport.num_catchup_tokens``), so a
probe after plain decoding does not teach the fit that drafting is dear. And
while the policy does not speculate, the draft fit fades toward its prior at
the forgetting rate, as SmartSpec's alpha does: one slow call (a cold start,
a resync the loop could not separate) cannot switch speculation off for good
(seen: one 60 ms first call lifted c_d from 2 to 17 ms, and the policy never
drafted again, since only drafting refreshes the fit).

Pure: numpy, no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from pydantic import BaseModel, Field

from scheduler.report import StepReport
from shared.profiling.cost_model import CostModel

# Feature scales: coefficients are fitted on features divided by these, and the ridge prior holds each scaled
# coefficient with the same weight, so a scale is how firmly the prior holds its coefficient (weight ~ scale^2).
# Target: the profile times the bare engine and knows the shape (per token, per context token, verify vs
# decode); the stack adds a per-step constant it cannot see (RPC, sampling, the feature relay: 22.5 ms a step
# where the engine's forward takes 14.7), so delta_t is held loosely (0.25, 1/16 of the others' weight). Held
# like c_t, the fit split that unseen constant between delta_t and c_t whenever most steps verified (~4 plain
# decodes among the window's ~50 cannot outvote the prior): c_t came out 2.3-3.1 ms where the stack's batch-1
# verify costs what a decode does, k = 0 looked ~2.5 ms cheaper than it is, and SmartSpec tied k = 0 with
# k = 1 at alpha ~0.4 (replayed from the adaptive-eagle traces: k = 0 modelled 20.5 ms, measured 22.5; now
# 22.3). A policy that never decodes plainly leaves c_t unidentified either way: SmartSpec's cost probes.
# Draft: the prior is generic unless the draft was profiled; drafting k = 1 most of the time leaves the split of
# a call between c_d and the per-depth delta_d to the prior, which (4 ms per depth against the feature draft's
# 1.6) made k = 2-3 look dear and kept the policy at k = 1. Scaled small, the data decides both once a few
# deeper chains have been drafted (modelled k = 2: 7.4 -> 6.8 ms; measured mean 8.2, median 6.3).
TARGET_SCALES = (0.25, 4.0, 4096.0, 1.0, 4.0)  # 1, N_batched, N_context, [verifying drafted tokens], requests
# The last (gamma_r, an extension of eq. 4-7's T = alpha N_context + gamma N_batched + delta): what a request
# costs beyond its tokens (sampling, acceptance, a sequence's share of the per-row attention and of the batch's
# bookkeeping). Plain steps cannot tell it from gamma_t (one token per request); verify steps can. Without it,
# gamma_t fitted the plain decode's per-request slope (1.0-1.2 ms on the feature-draft stack) where a verified
# extra token cost ~0.8: a k = 1 step at batch 8 was modelled 81 ms, measured 72, and SmartSpec decoded plainly
# at batch 7-10 where k = 1 served 15-20 % more tokens per second (bench/results/diag-smartspec-4x-costs).
# Off by default (StepCostConfig.per_request): beside the per-token model it measured no better.
DRAFT_SCALES = (0.5, 0.5, 2.0, 16384.0, 16.0)  # [speculating], max k, sum k, sum k * context, tokens fed

DEFAULT_TARGET = CostModel(alpha_s=0.0, gamma_s=1e-3, delta_s=20e-3)
DEFAULT_DRAFT = CostModel(alpha_s=0.0, gamma_s=2e-4, delta_s=4e-3)  # per draft forward


class StepCostConfig(BaseModel):
    forgetting: float = Field(
        0.98, gt=0.0, le=1.0, description="Weight left to past steps per new step (0.98: about the last 50 count)."
    )
    prior_steps: float = Field(2.0, gt=0.0, description="Weight of the generic prior, in steps.")
    profiled_prior_steps: float = Field(8.0, gt=0.0, description="Weight of a profiled prior, in steps.")
    draft_call_s: float = Field(2e-3, ge=0.0, description="Prior of c_d, the speculate call's own cost.")
    per_request: bool = Field(
        False, description="The target fit's per-request term gamma_r (an extension; TARGET_SCALES; "
        "`smartspec-reqcost`); False: eq. 4-7's per-token cost alone (the default: measured no better, "
        "docs/policies/adaptive-length.md).",
    )  # fmt: skip
    outlier_clip: float | None = Field(
        0.5, gt=0.0, description="A measured time enters the fit held within (1 +- this) x the fit's prediction: "
        "a stalled call (a 258 ms verify among 25 ms ones, seen) cannot lift every coefficient; None: as measured.",
    )  # fmt: skip


@dataclass(frozen=True)
class StepCost:
    """Coefficients of T(k) above, in seconds."""

    delta_t: float
    gamma_t: float
    alpha_t: float
    call_d: float
    delta_d: float
    gamma_d: float
    alpha_d: float
    call_t: float = 0.0  # c_t: a verify pass's cost beyond a plain decode step
    feed_d: float = 0.0  # c_f: per token the speculate call feeds the draft before drafting (``feed``)
    gamma_r: float = 0.0  # per request in the batch, beyond its tokens' gamma_t (TARGET_SCALES above)

    def spec_overhead(self) -> float:
        """What speculating at all adds to a step, whatever k: the draft call and the verify mode."""
        return self.call_d + self.call_t

    def base(self, contexts: np.ndarray) -> float:
        """T0: the step without speculation (plain decoding of the batch)."""
        return self.delta_t + (self.gamma_t + self.gamma_r) * len(contexts) + self.alpha_t * float(contexts.sum())

    def per_token(self, contexts: np.ndarray) -> np.ndarray:
        """u_i: what one more drafted token of request i costs, beyond the draft's per-depth term."""
        return self.gamma_t + self.gamma_d + self.alpha_d * contexts

    def step(self, ks: Sequence[int] | np.ndarray, contexts: Sequence[int] | np.ndarray) -> float:
        """T_batch for chain lengths ``ks`` (eq. 4-7)."""
        return float(self.steps(np.asarray(ks, dtype=float)[None, :], contexts)[0])

    def steps(self, ks: np.ndarray, contexts: np.ndarray) -> np.ndarray:
        """``step`` for each row of ``ks`` [m, n] at once (the candidates of one decision)."""
        ks = np.asarray(ks, dtype=float)
        ctx = np.asarray(contexts, dtype=float)
        k_max = ks.max(axis=1) if ks.shape[1] else np.zeros(len(ks))
        draft = np.where(k_max > 0, self.spec_overhead() + k_max * self.delta_d, 0.0)
        return self.base(ctx) + ks @ self.per_token(ctx) + draft

    def feed(self, ks: np.ndarray, tokens: np.ndarray) -> np.ndarray:
        """[M]: c_f x the tokens the speculating requests of each row of ``ks`` [M, n] generate, ``tokens``
        [M, n] (bonus included): what the next speculate call feeds the draft for them, the steady-state feed
        of speculating every step (above)."""
        return self.feed_d * np.where(np.asarray(ks) > 0, tokens, 0.0).sum(axis=1)

    def uniform(self, k: float, batch_size: int, context_sum: float) -> float:
        """T_batch when all ``batch_size`` requests draft ``k`` (a mean is fine: FASER's GP prior mean)."""
        return float(self.uniforms(np.array([k]), np.array([batch_size]), np.array([context_sum]))[0])

    def uniforms(self, k: np.ndarray, batch_size: np.ndarray, context_sum: np.ndarray) -> np.ndarray:
        """``uniform`` elementwise over arrays of one shape (FASER's prior at every window point at once)."""
        k, b, c = (np.asarray(v, dtype=float) for v in (k, batch_size, context_sum))
        t = self.delta_t + self.gamma_t * b * (k + 1) + self.gamma_r * b + self.alpha_t * c
        draft = self.spec_overhead() + k * self.delta_d + k * (self.gamma_d * b + self.alpha_d * c)
        return np.where(b > 0, t + np.where(k > 0, draft, 0.0), 0.0)


class OnlineFit:
    """Least squares y ~ theta . x with exponential forgetting and a ridge prior; state is JSON."""

    def __init__(self, scales: Sequence[float], prior: Sequence[float], prior_steps: float, forgetting: float):
        self.scales = np.asarray(scales, dtype=float)
        self.prior = np.asarray(prior, dtype=float) * self.scales  # in scaled units
        self.prior_steps = prior_steps
        self.forgetting = forgetting
        self._solved: tuple[dict[str, Any], np.ndarray] | None = None  # the last state solved, its theta

    def empty(self) -> dict[str, Any]:
        d = len(self.scales)
        return {"xtx": [[0.0] * d for _ in range(d)], "xty": [0.0] * d, "n": 0.0}

    def update(self, state: dict[str, Any], x: Sequence[float], y: float, clip: float | None = None) -> dict[str, Any]:
        """Fold in observation ``y`` at features ``x``; with ``clip``, y is first held within (1 +- clip) x the
        current prediction (a Huber-like bound: one stalled call, 10x a normal one, cannot drag every
        coefficient; a real change still moves the fit, by up to ``clip`` per step)."""
        if clip is not None:
            predicted = float(np.dot(self.solve(state), np.asarray(x, dtype=float)))
            if predicted > 0:
                y = min(max(y, predicted * (1.0 - clip)), predicted * (1.0 + clip))
        z = np.asarray(x, dtype=float) / self.scales
        rho = self.forgetting
        xtx = rho * np.asarray(state["xtx"]) + np.outer(z, z)
        xty = rho * np.asarray(state["xty"]) + z * y
        return {"xtx": xtx.tolist(), "xty": xty.tolist(), "n": rho * state["n"] + 1.0}

    def fade(self, state: dict[str, Any]) -> dict[str, Any]:
        """One step's forgetting without an observation: the data's weight shrinks, the prior's stays."""
        rho = self.forgetting
        return {"xtx": (rho * np.asarray(state["xtx"])).tolist(), "xty": (rho * np.asarray(state["xty"])).tolist(),
                "n": rho * state["n"]}  # fmt: skip

    def solve(self, state: dict[str, Any]) -> np.ndarray:
        """Coefficients in real units, clipped at 0 (no cost is negative). A state is never changed in place
        (``update`` and ``fade`` return new ones), so the last state's solution is kept by identity: a step's
        decision and the update after it solve the same state once, not three times."""
        if self._solved is not None and self._solved[0] is state:
            return self._solved[1]
        lam = self.prior_steps
        a = np.asarray(state["xtx"]) + lam * np.eye(len(self.scales))
        b = np.asarray(state["xty"]) + lam * self.prior
        theta = np.maximum(np.linalg.solve(a, b), 0.0) / self.scales
        theta.flags.writeable = False
        self._solved = (state, theta)
        return theta


class StepCostModel:
    """The target and draft fits: their JSON state, how a step updates it, and the current ``StepCost``."""

    def __init__(
        self,
        target: CostModel | None = None,
        draft: CostModel | None = None,
        config: StepCostConfig | None = None,
    ) -> None:
        cfg = self.config = config or StepCostConfig()
        t, d = target or DEFAULT_TARGET, draft or DEFAULT_DRAFT
        self.target = OnlineFit(
            TARGET_SCALES, (t.delta_s, t.gamma_s, t.alpha_s, t.verify_s, 0.0),  # c_t: the profile's, else 0
            cfg.profiled_prior_steps if target else cfg.prior_steps, cfg.forgetting,
        )  # fmt: skip
        self.draft = OnlineFit(
            DRAFT_SCALES, (cfg.draft_call_s, d.delta_s, d.gamma_s, d.alpha_s, d.gamma_s),
            cfg.profiled_prior_steps if draft else cfg.prior_steps, cfg.forgetting,
        )  # fmt: skip

    def empty(self) -> dict[str, Any]:
        return {"target": self.target.empty(), "draft": self.draft.empty()}

    def apply(self, state: dict[str, Any], event: dict[str, Any]) -> dict[str, Any]:
        """Fold one step's measurement (``event`` from ``measurement``) into ``state``."""
        state = dict(state)
        clip = self.config.outlier_clip
        if event.get("verify_s") is not None:
            x = event["x_target"] if self.config.per_request else [*event["x_target"][:4], 0.0]  # gamma_r stays 0
            state["target"] = self.target.update(state["target"], x, event["verify_s"], clip)
        if event.get("speculate_s") is not None:
            state["draft"] = self.draft.update(state["draft"], event["x_draft"], event["speculate_s"], clip)
        elif event.get("verify_s") is not None:  # a step without drafting: what the draft fit saw fades
            state["draft"] = self.draft.fade(state["draft"])
        return state

    def current(self, state: dict[str, Any]) -> StepCost:
        dt, gt, at, ct, gr = self.target.solve(state["target"])
        cd, dd, gd, ad, fd = self.draft.solve(state["draft"])
        return StepCost(dt, gt, at, cd, dd, gd, ad, ct, fd, gr)

    @classmethod
    def observed(cls, ks: Sequence[int], contexts: Sequence[int], report: StepReport) -> dict[str, Any]:
        """``measurement`` of what a step report says: speculate less the draft's resync, the tokens fed."""
        times = report.times
        spec_s = times.drafting if any(ks) else None
        event = cls.measurement(ks, contexts, times.verify, spec_s, report.num_catchup_tokens)
        x = event["x_target"]  # prefill chunks in the verify forward: their uncached tokens and context count too
        x[1], x[2] = x[1] + report.num_chunk_tokens, x[2] + report.num_chunk_context
        return event

    @staticmethod
    def measurement(
        ks: Sequence[int], contexts: Sequence[int], verify_s: float, speculate_s: float | None, fed_tokens: int = 0
    ) -> dict[str, Any]:
        """The event of one step: chain lengths and contexts verified, the times the loop measured (speculate
        without the draft's resync), and the tokens the speculate call fed the draft before drafting."""
        ks = [int(k) for k in ks]
        n_batched = sum(k + 1 for k in ks)
        x_target = [1.0, n_batched, float(sum(contexts)), 1.0 if any(ks) else 0.0, float(len(ks))]
        event: dict[str, Any] = {"verify_s": verify_s, "x_target": x_target}
        if speculate_s is not None and any(ks):
            event["speculate_s"] = speculate_s
            event["x_draft"] = [1.0, max(ks), sum(ks), float(sum(k * c for k, c in zip(ks, contexts))), float(fed_tokens)]
        return event
