"""Bandit speculation length per batch size (Nightjar §4, Algorithm 1: ADA-BINGREEDY).

One chain length γ ∈ {0 .. Γ_max} for the whole batch, learned online from
the goodput each step actually achieved. Every batch-size bucket B runs its
own bandit, because the best γ changes with B (§4.1, eq. 1)::

    γ*(B) = argmax_γ g_{B,γ}                                            (eq. 1)

Time per bucket is cut into blocks and bins (Alg. 1, Figure 5)::

    block j (H = 2^(j-1), grows)   ┌ bin ┬ bin ┬ ... ┐   ⌊√H⌋ bins of ⌊√H⌋ rounds (one round = one step;
                                                          a bin ends once τ > √H, a block once b > √H)
                                          explore?  with probability 1/√b at the bin's first round (line 8)

    exploration bin    γ ~ Uniform{0 .. Γ_max}                          (lines 9-11)
    exploitation bin   γ = argmin_γ 1/g̃_{B,γ} + 𝟙(γ_prev = 0 ∧ γ > 0)·c_prefill/γ     (eq. 3, lines 12-14)
    after the step     g̃_{B,γ} += (r - g̃_{B,γ}) / n                   (cumulative mean, §4.2; line 15)

Exploration schedule. Alg. 1 resets b to 1 at every block (line 22), so the
first bin of every block explores for sure and the share of exploration
rounds decays only as ≈ 2·H^(-1/4): 44 % of a bucket's first 1 000 rounds,
29 % of its first 10 000. Lemma 2 (§4.3.2, eq. 6) bounds exploration by
O(√T) with p_b = 1/√b over *all* bins, which holds only if b keeps counting
across blocks. ``exploration="block"`` (the default, ``nightjar``) is the
algorithm as printed; ``exploration="global"`` (``nightjar-global``) draws
with 1/√(bins so far), Lemma 2's reading: 16 % of the first 1 000 rounds,
9 % of the first 10 000. Block and bin sizes are the same in both.

Reward r = observed goodput of the step: tokens it generated (accepted +
one bonus per request) / seconds of speculate + select + verify. So the
draft's real cost, the RPCs and the verify width all count, measured. The
switching cost is charged once, by eq. 3's second term, and kept out of the
rewards: the draft's re-prefill of requests it did not hold
(``PhaseTimes.draft_sync``) is left out of every reward, and the first
γ > 0 step after a γ = 0 step, whose speculate call runs the catch-up on the
tokens the draft did not see, records no reward at all (its bin still
advances and its acceptance counts still count; a reward with the catch-up
in it would charge the switch a second time, to the arm played).

Switching cost c_prefill (§4.2, Table 3): after a step without speculation
the draft lags the target by the tokens it did not see; the next speculate
first runs them through the draft (the whole sequence when the draft lost
it: offloaded, failed, never prefilled). The paper takes c_prefill(L_max, B)
from an offline profile as T_SD − T_base: the step with the draft's catch-up
less the step without it. Here both come from the draft's profiled cost
model T_fwd = α_d·N_context + γ_d·N_batched + δ_d (``tandem profile`` of the
draft, ``SpecContext.draft_cost_model``; a generic CPU-sized prior without
one), every request lagging by the batch's worst lag L_max as the paper
assumes, and the cached context the catch-up attends to counted in both::

    T_SD   = T_fwd(C + B·(L_max + 1), B·(L_max + 1))    the first draft forward, catching up
    T_base = T_fwd(C + B, B)                             the same forward in the steady state
    c_prefill = T_SD − T_base                            C = Σ_i tokens the draft holds for request i

(the forward's δ is paid either way; in this linear model the cached
context's term cancels, so c_prefill = (α_d + γ_d)·B·L_max).

Chain estimate (``estimate="chain"``, ``nightjar-chain``; an extension):
the observed goodput of one step is noisy (a chain of 4 at acceptance 0.45
yields 1 to 5 tokens), so with tens of plays per arm the means of k = 2..4
differ by less than their noise (bench/results/adaptive-eagle: the bandit
settled on k = 4 at batch 1 where k = 2-3 is best). But a step that played
γ also shows what every shorter chain would have accepted: a chain of 4
that accepted 2 is a chain of 2 that accepted 2. So the estimate is split
into its two factors, each learned from every play that reveals it::

    g̃_{B,γ} = (1 + Σ_{d ≤ γ} Π_{j ≤ d} q_j) / t̃_γ        q_j: acceptance at depth j given depth j-1 was
                                                         accepted, counted over all plays that reached j
                                                         t̃_γ: mean seconds per request of the plays of γ

Still per bucket, cumulative, and an arm never played has no estimate;
only the variance of the acceptance factor changes (time per arm is what
each arm's own plays say, and it varies little from step to step).
Off by default: in simulation it cuts the estimate's error by a third,
but on the stack it was no better than the observed means (feature draft,
open chat: +14 / +9 / +20 / +29 % behind the best fixed k against +11 / +7 /
+15 / +21 %, bench/results/adaptive-eagle-nightjar); at high load what Nightjar
loses is exploration, which the estimate does not change.

Arm elimination (``eliminate``, ``nightjar-elim``; an extension): the
exploration draws of line 11 go to every arm, however clearly it has lost,
and a bench run gives a bucket a few hundred rounds, most of them in
exploration bins (the early blocks): at batch 3-4, 137 of 145 rounds at 2x
explored, γ = 4-5 at 50-127 ms a step (bench/results/adaptive-eagle). With
it the draw is over the arms still in the running, successive elimination
(Even-Dar et al., 2006) on each arm's mean and standard error::

    arm γ out  ⇔  n_γ ≥ n_min  ∧  g̃_γ + z·s_γ/√n_γ  <  max_{γ': n_γ' ≥ n_min} (g̃_γ' − z·s_γ'/√n_γ')

s_γ the sample deviation of its rewards (Welford's running sum of squares,
kept per arm). An arm is out only while the bounds stay apart: the best
arm's bound can fall back as it is played, and the arm is back in the draw.
Exploitation (eq. 3) and the schedule of bins are unchanged.

The three extensions together (``nightjar-lean``: Lemma 2's schedule,
elimination, the chain estimate): on synthetic stacks (``python -m
bench.diagnostics.bandit_sim``: batch 1-4, arms 0..8, 400 steps) 0.96 of the best fixed
k's goodput on average against Alg. 1's 0.88, within 5 % in 17 of 24 cases
against 2; Lemma 2's schedule or elimination alone 0.94. With noisy step
times (``--noise 0.15 --stall 0.02``) the chain estimate's time per arm, the
mean of the arm's own plays, is what breaks (0.925); ``chain_time="pooled"``
(``nightjar-lean-pooled``) fits one line a + b·γ to every speculating play
instead, each play held within 0.5-2x its arm's mean (0.945).

Drift (``drift``, ``nightjar-lean-drift``; an extension): a bucket's arms are
played at different times, and a shared machine's speed drifts by more than
the arms differ (adaptive-eagle-nightjar-5rep: k = 2's TPOT at the same load
39-86 ms across the five repeats; the best arms differ by 5-10 %). An arm's
mean over its own plays then mixes speeds in its own shares: explored while
the machine was slow, it looks slow for good. With ``drift`` each play is
read against the machine's speed, one log average s over every play of every
bucket, and the chain estimate's time of arm γ is exp(s + r_γ)::

    s   += drift_rate · clip(log t − r_γ − s, ±ln 2)    (the speed takes its share first, from the 2nd play)
    r_γ += (clip(log t − s, r_γ ± ln 2) − r_γ) / n_γ     (the arm's time relative to the speed: a mean)

so what all arms see alike moves s, and r_γ keeps what is the arm's own. The
rewards that elimination compares are read in the same unit (reward · e^s,
s before the play). In simulation (``bench.diagnostics.bandit_sim``) with the step times
noisy (±15 %, 2 % stalled 10x) and the machine's speed redrawn every 100
steps (lognormal sd 0.25): 0.952 of the best fixed k against `nightjar-lean`'s
0.929 and the pooled time's 0.936; with noise alone 0.949 (0.925, 0.945); with
exact times 0.960, as `nightjar-lean`.

Local exploration (``neighbors``, ``nightjar-lean-local``; an extension): a
step's goodput is unimodal in γ (it rises while a further token's chance of
acceptance pays its draft and verify cost, and falls after, eq. 1), so the arms
far from the best are known losers without being played. Exploration bins
then draw only among the arms within ``neighbors`` of the leader (the arm of
best g̃ so far; every arm while none has an estimate), a unimodal bandit's
local exploration (OSUB, Combes & Proutière, 2014): the leader moves toward
the optimum a few arms at a time, and no bin goes to γ = 8 when the best is 2
(the drift variant still spent 4-11 % of its steps on γ = 5-8 where the best
fixed k was 1-3; adaptive-eagle-joint-drift). ``nightjar-lean-local`` is the
drift variant with ``neighbors`` = 2: in ``bench.diagnostics.bandit_sim`` 0.983 / 0.961 /
0.958 of the best fixed k (exact / noisy / noisy + drifting step times; 24, 17
and 18 cases of 24 within 5 %) against the drift variant's 0.960 / 0.949 /
0.952 (17, 14, 14); with ``neighbors`` = 1 a noisy early leader holds the draw
too near (0.977 / 0.928 / 0.918, worst case 0.78). On the stack it did not
carry over where buckets are sparse: at 4x (buckets 4, 8, 16 with a few
dozen plays each in a run) an early leader of γ = 4-5 kept the draw there and
the walk down to the best γ = 1 never happened (+11.3 % behind the best fixed
k against the drift variant's +2.2 %; bench/results/adaptive-eagle-local).

Bounds on the estimate (``eliminate_on="estimate"``, ``nightjar-lean-bounds``; an extension): elimination
as above compares the arms' *observed* rewards, one step's tokens over its seconds, whose spread is that of
the accepted length (1 to γ+1 tokens a step): after tens of plays its bounds are still ±20-30 %, so arms
30 % behind the best stay in the draw. On the stack the drift variant, long settled on γ = 3 at batch 1,
still spent 8 % of its batch-1 steps on γ = 4-8 and 13 % in all on exploration (adaptive-eagle-local,
0.5x), ≈ 3 % of goodput. The chain estimate is far tighter than the rewards, so elimination reads it
instead, pairwise against the leader L (best estimate among arms with ``min_plays`` plays)::

    arm γ out  ⇔  log g̃_L − log g̃_γ  >  z·se
    se² = Σ_j (∂_j log l(L) − ∂_j log l(γ))²·var(q_j)  +  var(r_L)/n_L  +  var(r_γ)/n_γ

with l the chain length estimate of eq. 1's numerator, the depth rates q_j binomial (taken at
(a + 1)/(t + 2), over at most ``bound_trials`` = 200 trials: acceptance differs between requests and
prompts, so thousands of pooled trials would overstate it), and r_γ the arm's log time relative to
the machine's speed (``drift``; its plays' spread kept by Welford). The arms share the q_j, so only the
depths where two lengths differ enter their difference. In ``bench.diagnostics.bandit_sim``, of the best fixed k
(cases of 24 within 5 %), against the drift variant: 400 steps, exact times 0.968 (20) against 0.960
(17); 400 steps, noisy and drifting 0.955 (16) against 0.952 (14); 1000 steps, noisy 0.972 (22)
against 0.965 (18); 2000 steps, noisy and drifting 0.979 (24) against 0.976 (22). On the stack not yet
separable from the drift variant: the one run (bench/results/adaptive-eagle-bounds, 3 repeats) was on a
machine whose speed swung by 30-40 % within minutes, so that no fixed k would have met the goal against
the others; it did show a cost of the narrower draw: with two or three survivors left, a uniform
exploration draw gives a mediocre one half the bins (γ = 5 in 109 of 530 batch-1 steps at 0.5x, where
the drift variant kept to γ = 3).

Weighted draw (``draw="weighted"``, ``nightjar-lean-weighted``; an extension): line 11 draws among the
survivors by each arm's chance to beat the leader on the estimate, Φ(−gap/se) (the leader ½, one standard
error behind 0.16, two 0.02; ``nightjar_arms.draw_weights``), not uniformly: every survivor is still
reached, but a mediocre one no longer gets half the bins when two or three are left. On one batch-1
stack in simulation (acceptance 0.55, 1,500 steps, the last 1,200 counted) the plays away from the best
chain fell from 151 / 122 (bounds, two seeds) to 65 / 90; in ``bench.diagnostics.bandit_sim`` (of the best fixed k,
cases of 24 within 5 %), against the bounds variant: 400 steps exact 0.971 (21) against 0.968 (20); 400
noisy and drifting 0.957 (16) against 0.955 (16); 1000 noisy 0.971 (20) against 0.972 (22); 2000 noisy and
drifting 0.982 (24) against 0.979 (24).

Batch-size buckets: 1, 2, 3, 4, then powers of two (5-8 -> 8, 9-16 -> 16,
...): exact where the optimum moves fastest, shared where it barely does.

Learned state (per bucket: block/bin counters, current bin type, per-arm
visit count and mean goodput) is a ``SharedState`` in Redis, so a restarted
scheduler resumes its schedule and estimates and replicas pool their rounds.
The exploration coin is local (a seeded RNG); the bin type drawn at a bin's
first round travels in that round's event.

Pure: no I/O, no torch.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, Field

from scheduler.policies.depth_acceptance import add_counts, chain_depth_counts, depth_gains
from scheduler.policies.draft_admission import DraftAdmission
from scheduler.policies.nightjar_arms import (
    draw_weights,
    estimate_gaps,
    estimate_surviving_arms,
    fit_arms as _fit,
    local_arms,
    surviving_arms,
)
from scheduler.policies.shared_state import SharedState
from scheduler.policies.speculation import SpecContext, SpecShape, SpeculationPolicy
from scheduler.report import StepReport
from scheduler.request import Request, SpecMode
from shared.profiling.cost_model import CostModel

STATE_VERSION = 3  # 2: per-arm seconds per request and per-depth acceptance counts (the chain estimate); 3: M2

DEFAULT_DRAFT_COST = CostModel(alpha_s=2e-7, gamma_s=2e-4, delta_s=4e-3)  # per draft forward, CPU-sized
LN2 = math.log(2.0)


class NightjarConfig(BaseModel):
    """Knobs of Nightjar's bandit; every field has a default."""

    max_k: int = Field(8, ge=1, le=32, description="Γ_max: longest chain; arms are 0..Γ_max (0 = plain decoding). "
                       "8 like SmartSpec's and FASER-AD's longest chain: with Γ_max = 5 the suffix draft's best "
                       "k = 7 was out of reach (bench/results/diag-nightjar-arms).")
    switch_cost: bool = Field(True, description="Charge c_prefill when leaving γ = 0 (eq. 3's second term).")
    seed: int = Field(0, description="Seed of the exploration coin and the uniform draws.")
    exploration: Literal["block", "global"] = Field(
        "block", description="Bin index b of the 1/√b coin: per block as Alg. 1 prints it, or over the bucket's "
        "whole life as Lemma 2 (eq. 6) counts it.")
    estimate: Literal["observed", "chain"] = Field(
        "observed", description="g̃ per arm: the mean observed goodput of its plays (§4.2), or the chain estimate "
        "(acceptance per depth pooled over every play that reached it, over the arm's mean time per request).")
    eliminate: float | None = Field(
        None, gt=0, description="z of successive elimination: exploration draws only among arms whose upper bound "
        "g̃ + z·s/√n reaches the best lower bound (None: every arm, as Alg. 1 prints it).")
    min_plays: int = Field(5, ge=2, description="Plays an arm needs before its bounds count for elimination.")
    drift: bool = Field(
        False, description="The chain estimate's times relative to the machine's speed, tracked over every "
        "play (module docstring, ``nightjar-lean-drift``); rewards normalised by it for elimination. Needs "
        "estimate 'chain'.")
    neighbors: int | None = Field(
        None, ge=1, description="Exploration draws only among the arms within this distance of the leader, the "
        "arm of best g̃ (goodput is unimodal in γ: a unimodal bandit's local exploration, module docstring; "
        "``nightjar-lean-local``). None: every arm in play, as Alg. 1 prints it.")
    neighbors_up_to: int | None = Field(
        None, ge=1, description="Largest bucket the neighbourhood applies in (None: every bucket); 4: only the "
        "exact buckets, not those that mix batch sizes (``nightjar-lean-local-exact``).")
    eliminate_on: Literal["reward", "estimate"] = Field(
        "reward", description="What elimination bounds: the arm's observed rewards (g̃ ± z·s/√n), or the chain "
        "estimate itself (log g̃ ± z·se from the depth rates' binomial error and the arm's relative time; "
        "module docstring, ``nightjar-lean-bounds``). 'estimate' needs ``drift``.")
    bound_trials: float = Field(
        200.0, gt=0.0, description="A depth's acceptance rate counts as known from at most this many trials when "
        "the estimate's error is taken (eliminate_on 'estimate'): acceptance differs between requests and "
        "prompts, so thousands of pooled trials would overstate how well the rate is known.")
    draw: Literal["uniform", "weighted"] = Field(
        "uniform", description="How an exploration bin picks among the arms in play: uniformly (Alg. 1 line 11), "
        "or weighted by each arm's chance to beat the leader on the chain estimate (``draw_weights``, "
        "``nightjar-lean-weighted``). 'weighted' needs eliminate_on 'estimate'.")
    drift_rate: float = Field(0.2, gt=0.0, le=1.0, description="Weight of one play in the speed's log average.")
    chain_time: Literal["arm", "pooled"] = Field(
        "arm", description="The chain estimate's seconds per request of arm γ: the mean of γ's own plays, or a line "
        "a + b·γ fitted to every speculating play (weighted by plays), each play held within 0.5-2x its arm's "
        "mean once the arm has 3 (step-time stalls).")


def bucket(batch_size: int) -> int:
    """The batch-size bucket a bandit is kept for: exact up to 4, then the next power of two."""
    if batch_size <= 4:
        return max(1, batch_size)
    return 1 << (batch_size - 1).bit_length()


class SwitchCostTable:
    """c_prefill = T_SD − T_base in seconds (§4.2, Table 3), from the draft's profiled cost model (module docstring)."""

    def __init__(self, cost: CostModel | None = None) -> None:
        self.cost = cost or DEFAULT_DRAFT_COST

    def __call__(self, lag: int, batch_size: int, cached: int = 0) -> float:
        """``lag``: L_max, tokens beyond the newest the worst request must catch up on; ``cached``: tokens the draft
        holds for the batch's requests (the context the catch-up attends to)."""
        if lag <= 0 or batch_size <= 0:
            return 0.0
        rows = batch_size * (lag + 1)  # each request's lag and its newest token, run in the first draft forward
        t_sd = self.cost.predict(num_context_tokens=cached + rows, num_batched_tokens=rows)
        t_base = self.cost.predict(num_context_tokens=cached + batch_size, num_batched_tokens=batch_size)
        return max(0.0, t_sd - t_base)


def draft_lag(req: Request) -> int:
    """Tokens the draft must catch up on before it can speculate for ``req`` (L_i of §4.2; ``Request.draft_lag``)."""
    return req.draft_lag


def exploit(means: Sequence[float], counts: Sequence[int], prev_k: int, c_prefill: float) -> int:
    """Eq. 3: argmin_γ 1/g̃_γ + 𝟙(γ_prev = 0 ∧ γ > 0)·c_prefill/γ; an arm never played has g̃ = 0 (cost ∞)."""
    best, best_cost = 0, math.inf
    for k, (g, n) in enumerate(zip(means, counts)):
        cost = 1.0 / g if n > 0 and g > 0 else math.inf
        if prev_k == 0 and k > 0:
            cost += c_prefill / k
        if cost < best_cost:  # ties: the shorter γ
            best, best_cost = k, cost
    return best


def _new_bucket(num_arms: int) -> dict[str, Any]:
    # Alg. 1 line 3: j = 1, H = 1, b = 1, τ = 1
    # "bins": bins begun over the bucket's life (Lemma 2's b), kept alongside the per-block b
    return {"j": 1, "H": 1, "b": 1, "bins": 1, "tau": 1, "explore": True, "n": [0] * num_arms, "g": [0.0] * num_arms,
            "q": [0.0] * num_arms, "t": [0.0] * num_arms, "depth": []}


def pooled_times(n: Sequence[int], t: Sequence[float]) -> list[float]:
    """Seconds per request of each speculating arm from the line a + b·γ fitted over arms γ >= 1 by their plays
    (weighted least squares); arm 0 keeps its own mean. Fewer than two speculating arms played: as given."""
    arms = [k for k in range(1, len(n)) if n[k] > 0 and t[k] > 0]
    if len(arms) < 2:
        return list(t)
    x, y, w = (np.array(v, dtype=float) for v in (arms, [t[k] for k in arms], [n[k] for k in arms]))
    xm, ym = np.average(x, weights=w), np.average(y, weights=w)
    slope = max(float(np.sum(w * (x - xm) * (y - ym)) / max(np.sum(w * (x - xm) ** 2), 1e-12)), 0.0)
    return [t[0]] + [max(ym + slope * (k - xm), 1e-9) for k in range(1, len(n))]


def chain_goodputs(st: dict[str, Any], num_arms: int, pooled: bool = False, scale: float | None = None) -> list[float]:
    """The chain estimate of g̃ per arm (module docstring): 0 for an arm never played. With ``scale`` (the
    machine's log speed, ``drift``) an arm's time is exp(scale) x its relative time, not its plays' mean."""
    n, t = _fit(list(st["n"]), num_arms, 0), _fit(list(st.get("t") or []), num_arms, 0.0)
    if scale is not None:
        rel = _fit(list(st.get("lr") or []), num_arms, 0.0)
        t = [math.exp(scale + r) if c > 0 else 0.0 for r, c in zip(rel, n)]
    if pooled:
        t = pooled_times(n, t)
    counts = _fit(list(st.get("depth") or []), num_arms - 1, (0.0, 0.0))
    rates = np.array([acc / trials if trials > 0 else 0.0 for acc, trials in counts])
    tokens = 1.0 + np.concatenate([[0.0], np.cumsum(depth_gains(rates))])  # l(γ) for γ = 0 .. Γ_max
    return [float(tokens[k] / t[k]) if n[k] > 0 and t[k] > 0 else 0.0 for k in range(num_arms)]


class Nightjar(SpeculationPolicy):
    name = "nightjar"

    def __init__(self, config: NightjarConfig | None = None) -> None:
        self.config = cfg = config or NightjarConfig()
        self.num_arms = cfg.max_k + 1
        if cfg.exploration == "global":
            self.name = "nightjar-global"  # its own learned state: the two schedules do not pool
        if cfg.estimate == "chain":
            self.name += "-chain"
        if cfg.eliminate is not None:
            self.name += "-elim"
        if cfg.chain_time == "pooled":
            self.name += "-pooled"
        if cfg.drift:
            if cfg.estimate != "chain":
                raise ValueError("drift needs the chain estimate (estimate='chain')")
            self.name += "-drift"
        if cfg.eliminate_on == "estimate":
            if not cfg.drift or cfg.eliminate is None:
                raise ValueError("eliminate_on='estimate' needs drift and eliminate")
            self.name += "-bounds"
        if cfg.draw == "weighted":
            if cfg.eliminate_on != "estimate":
                raise ValueError("draw='weighted' needs eliminate_on='estimate'")
            self.name += "-weighted"
        if cfg.neighbors is not None:
            self.name += f"-local{cfg.neighbors}" + (f"-upto{cfg.neighbors_up_to}" if cfg.neighbors_up_to else "")
        self.state = SharedState(f"policy:{self.name}", STATE_VERSION, self._empty, self._apply)
        self._rng = random.Random(cfg.seed)
        self._switch = SwitchCostTable()
        self._switch_prior: CostModel | None = None
        self._prev_k = 0  # γ_{t-1}: what the last step played (0 also when the draft was away)
        self._last: tuple[int, int, int, bool] | None = None  # step, bucket, γ, bin type of that round
        self.last_c_prefill = 0.0  # of the last exploitation (traces, tests)
        self._switching = False  # the last decision left γ = 0: its step's reward carries the catch-up
        self._admission = DraftAdmission()

    def wants_draft(self, req: Request) -> bool:
        """Defer the draft's prefill while the bandit mostly plays γ = 0 (draft_admission.py)."""
        return self._admission.wants_draft()

    # ------------------------------------------------------------------ learned state
    def shared_state(self) -> SharedState:
        return self.state

    def _empty(self) -> dict[str, Any]:
        return {"buckets": {}}

    def _apply(self, state: dict[str, Any], event: dict[str, Any]) -> dict[str, Any]:
        """One round of one bucket: the reward of the arm played, then Alg. 1 lines 15-22."""
        buckets = dict(state["buckets"])
        key = str(event["bucket"])
        st = dict(buckets.get(key) or _new_bucket(self.num_arms))
        n, g = _fit(list(st["n"]), self.num_arms, 0), _fit(list(st["g"]), self.num_arms, 0.0)
        q = _fit(list(st.get("q") or []), self.num_arms, 0.0)
        if st["tau"] == 1:
            st["explore"] = bool(event["explore"])  # the bin type drawn at its first round (line 8)
        k = int(event["k"])
        if event.get("switch"):  # a switch step: its time holds the catch-up, charged by eq. 3 instead
            st["depth"] = add_counts(list(st.get("depth") or []), event.get("depth") or [])
        elif 0 <= k < self.num_arms:
            n[k] += 1
            reward, old = float(event["reward"]), g[k]
            if self.config.drift and event.get("seconds_per_request") is not None:
                state, st, reward = self._track_speed(state, st, k, n[k], reward, float(event["seconds_per_request"]))
            g[k] += (reward - old) / n[k]  # cumulative moving average (§4.2)
            q[k] += (reward - old) * (reward - g[k])  # Welford: the sum of squared deviations (elimination)
            if event.get("seconds_per_request") is not None:  # the chain estimate's factors
                t = _fit(list(st.get("t") or []), self.num_arms, 0.0)
                x = float(event["seconds_per_request"])
                if self.config.chain_time == "pooled" and n[k] > 3:  # a stall moves the mean by 2x at most
                    x = min(max(x, 0.5 * t[k]), 2.0 * t[k])
                t[k] += (x - t[k]) / n[k]
                st["t"] = t
                st["depth"] = add_counts(list(st.get("depth") or []), event.get("depth") or [])
        st["n"], st["g"], st["q"] = n, g, q
        st["tau"] += 1  # line 16
        root = math.sqrt(st["H"])
        if st["tau"] > root:  # lines 17-19: bin completed
            st["b"], st["tau"] = st["b"] + 1, 1
            st["bins"] = st.get("bins", st["b"] - 1) + 1  # states from before the counter: from b
            if st["b"] > root:  # lines 20-22: block completed
                st["j"] += 1
                st["H"], st["b"] = 2 ** (st["j"] - 1), 1
        buckets[key] = st
        return {**state, "buckets": buckets}

    def _track_speed(self, state: dict[str, Any], st: dict[str, Any], k: int, plays: int, reward: float,
                     seconds: float) -> tuple[dict[str, Any], dict[str, Any], float]:  # fmt: skip
        """``drift`` (module docstring): one play of arm k (its ``plays``-th) updates the arm's log time relative
        to the machine's speed and then the speed; returns the states and the reward in the speed's units."""
        x = math.log(max(seconds, 1e-9))
        rel = _fit(list(st.get("lr") or []), self.num_arms, 0.0)
        scale = state.get("scale")
        if scale is None:
            scale = x  # the first play of all sets the unit
        normalised = reward * math.exp(scale)  # tokens per unit of the speed before this play
        if plays > 1:  # the speed first takes its share of what the arm's estimate does not explain
            scale += self.config.drift_rate * min(max(x - rel[k] - scale, -LN2), LN2)
        e = x - scale
        if plays > 3:  # a stalled play moves the arm's estimate by 2x at most
            e = min(max(e, rel[k] - LN2), rel[k] + LN2)
        m2 = _fit(list(st.get("lq") or []), self.num_arms, 0.0)
        old = rel[k]
        rel[k] += (e - old) / plays
        m2[k] += (e - old) * (e - rel[k])  # Welford: the spread of the arm's relative times (eliminate_on)
        return {**state, "scale": scale}, {**st, "lr": rel, "lq": m2}, normalised

    def bucket_state(self, batch_size: int) -> dict[str, Any]:
        return self.state.state["buckets"].get(str(bucket(batch_size))) or _new_bucket(self.num_arms)

    def bin_index(self, st: dict[str, Any]) -> int:
        """b of the exploration coin: within the block (Alg. 1 line 8) or over the bucket's life (Lemma 2)."""
        return int(st.get("bins", st["b"])) if self.config.exploration == "global" else int(st["b"])

    def switch_cost(self, ctx: SpecContext) -> SwitchCostTable:
        if ctx.draft_cost_model is not self._switch_prior:
            self._switch = SwitchCostTable(ctx.draft_cost_model)
            self._switch_prior = ctx.draft_cost_model
        return self._switch

    # ------------------------------------------------------------------ decisions
    def decide(self, batch: Sequence[Request], ctx: SpecContext) -> list[SpecShape]:
        auto = [r for r in batch if r.speculation.mode is SpecMode.AUTO]
        if not auto:
            self._last = None
            return [SpecShape.none()] * len(batch)
        b = bucket(len(batch))
        st = self.bucket_state(len(batch))
        explore = st["explore"]
        if st["tau"] == 1:  # a new bin: explore with probability 1/√b (line 8; Lemma 2 with "global")
            explore = self._rng.random() < 1.0 / math.sqrt(self.bin_index(st))
        if explore:
            k = self.draw(st, self.arms_in_play(st, b))
        else:
            c_prefill = 0.0
            if self.config.switch_cost and self._prev_k == 0:
                cached = sum(max(0, r.num_tokens - draft_lag(r) - 1) for r in auto)
                c_prefill = self.switch_cost(ctx)(max(draft_lag(r) for r in auto), len(auto), cached)
            self.last_c_prefill = c_prefill
            k = exploit(self.goodputs(st), _fit(list(st["n"]), self.num_arms, 0), self._prev_k, c_prefill)
        self._last = (ctx.step, b, k, explore)
        # eq. 3's 𝟙 with something to catch up on: this step's speculate call runs the catch-up
        self._switching = self._prev_k == 0 and k > 0 and any(draft_lag(r) > 0 for r in auto)
        self._admission.record([k] * len(auto))
        shape = SpecShape.chain(k)
        return [shape if r.speculation.mode is SpecMode.AUTO else SpecShape.none() for r in batch]

    def arms_in_play(self, st: dict[str, Any], bucket_size: int = 1) -> list[int]:
        """The arms an exploration bin draws from: all of them, or those successive elimination keeps."""
        z = self.config.eliminate
        arms = list(range(self.num_arms))
        scale = self.state.state.get("scale")
        if z is not None and self.config.eliminate_on == "estimate" and scale is not None:
            arms = estimate_surviving_arms(st, self.num_arms, z, self.config.min_plays, self.config.bound_trials)
        elif z is not None:
            n, q = _fit(list(st["n"]), self.num_arms, 0), _fit(list(st.get("q") or []), self.num_arms, 0.0)
            arms = surviving_arms(_fit(list(st["g"]), self.num_arms, 0.0), q, n, z, self.config.min_plays)
        cap = self.config.neighbors_up_to
        if self.config.neighbors is not None and (cap is None or bucket_size <= cap):
            arms = local_arms(arms, self.goodputs(st), self.config.neighbors)
        return arms

    def draw(self, st: dict[str, Any], arms: list[int]) -> int:
        """Line 11: an arm among those in play, uniformly, or weighted toward the leader (``draw_weights``)."""
        if self.config.draw == "weighted" and self.state.state.get("scale") is not None:
            gaps = estimate_gaps(st, self.num_arms, self.config.min_plays, self.config.bound_trials)
            if gaps is not None:
                weights = draw_weights(*gaps)
                return self._rng.choices(arms, weights=[float(weights[k]) for k in arms])[0]
        return arms[self._rng.randrange(len(arms))]  # over the surviving arms with ``eliminate``

    def goodputs(self, st: dict[str, Any]) -> list[float]:
        """g̃_{B,γ} per arm of bucket state ``st``: observed means (§4.2) or the chain estimate."""
        if self.config.estimate == "chain":
            scale = self.state.state.get("scale") if self.config.drift else None
            return chain_goodputs(st, self.num_arms, pooled=self.config.chain_time == "pooled", scale=scale)
        return _fit(list(st["g"]), self.num_arms, 0.0)

    def explain(self) -> dict[str, float]:
        """The last round's bucket, bin type, arm and switching cost, and the bucket's mean goodput per arm."""
        if self._last is None:
            return {}
        _, b, k, explore = self._last
        st = self.state.state["buckets"].get(str(b)) or _new_bucket(self.num_arms)
        out = {"bucket": float(b), "k": float(k), "explore": float(explore), "c_prefill_ms": self.last_c_prefill * 1e3,
               "arms_in_play": float(len(self.arms_in_play(st, b)))}
        for arm, (g, n) in enumerate(zip(self.goodputs(st), _fit(list(st["n"]), self.num_arms, 0))):
            out[f"goodput_k{arm}"], out[f"plays_k{arm}"] = float(g), float(n)
        return out

    # ------------------------------------------------------------------ learning
    def observe(self, report: StepReport) -> None:
        last, self._last = self._last, None
        played = last is not None and last[0] == report.step
        # γ_{t-1} is what the draft actually did: 0 when the step ran without it (offloaded, failed)
        self._prev_k = last[2] if played and report.num_speculating else 0
        if not played or not report.outcomes:
            return
        # the draft's resync (a request it did not hold) and the catch-up of a 0 -> γ > 0 switch are the switching
        # cost, which eq. 3 charges apart: neither enters a reward (module docstring)
        seconds = report.times.drafting + report.times.select + report.times.verify
        if seconds <= 0:
            return
        tokens = sum(o.num_accepted + 1 for o in report.outcomes)  # accepted + bonus (§4.1 goodput)
        _, b, k, explore = last
        if k > 0 and not report.num_speculating:
            k = 0  # the draft failed this step: it was plain decoding after all
        event = {"bucket": b, "k": k, "reward": tokens / seconds, "explore": explore}
        if self._switching and k > 0 and self.config.switch_cost:  # without eq. 3's term the reward carries it
            event["switch"] = True  # the bin advances and the depths count; no reward, no time for the arm
        if self.config.estimate == "chain":
            depth: list = []
            for o in report.outcomes:
                if o.num_drafted:
                    depth = add_counts(depth, chain_depth_counts(o.num_drafted, o.num_accepted))
            event.update(seconds_per_request=seconds / len(report.outcomes), depth=depth)
        self.state.record(event)
