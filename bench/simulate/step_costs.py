"""What one forward costs the simulated workers: from a measured profile, or a constant.

Every simulated worker call is priced by a ``StepCosts``::

    forward_s(num_seqs, num_batched, num_context, verify)   seconds of one forward
    call_s                                                  seconds per worker call on top (host, RPC)

the same four counts the profiler records for every real forward
(``shared.engine.types.ForwardCost``). Implementations:

    ProfileCosts     a profile `tandem profile` (or the GPU kit) measured: its fitted
                     T_fwd = alpha*N_context + gamma*N_batched + delta (+ c_t when verifying),
                     SmartSpec §4.3 eq. 4, plus an optional per-call host overhead
    ConstantCosts    a fixed cost per call (model-free drafts: ngram, suffix)
    RooflineCosts    a named GPU and a model shape (roofline.py)

A bad profile (missing, not JSON, wrong schema, negative or all-zero coefficients)
raises ``ProfileError`` naming the file and what is wrong.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from pydantic import ValidationError

from shared.profiling.cost_model import CostModel, Profile, Sample, find_budget, fit_cost_model, median_sweep


class ProfileError(ValueError):
    """A step-cost profile that cannot be used; the message names the file and the problem."""


class StepCosts(Protocol):
    name: str
    call_s: float

    def forward_s(self, num_seqs: int, num_batched: int, num_context: int, verify: bool = False) -> float: ...


@dataclass(frozen=True)
class ProfileCosts:
    """T_fwd from a fitted cost model (SmartSpec eq. 4), plus ``call_s`` per worker call."""

    name: str
    cost_model: CostModel
    token_budget: int | None = None  # B, when the profile found one
    call_s: float = 0.0  # per worker call (the profile measures forwards only)

    def forward_s(self, num_seqs: int, num_batched: int, num_context: int, verify: bool = False) -> float:
        return self.cost_model.predict(num_context, num_batched, verify)


@dataclass(frozen=True)
class ConstantCosts:
    """The same cost for every call, whatever it carries (a model-free draft's lookup)."""

    name: str
    call_s: float = 0.0

    def forward_s(self, num_seqs: int, num_batched: int, num_context: int, verify: bool = False) -> float:
        return 0.0


def load_profile_costs(path: Path | str, call_s: float = 0.0) -> ProfileCosts:
    """The profile JSON at ``path`` (what `tandem profile` stores) as step costs; ProfileError if unusable."""
    path = Path(path)
    if not path.is_file():
        raise ProfileError(f"{path}: no such profile (write one with `tandem profile`, or `make profile`)")
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ProfileError(f"{path}: not JSON ({exc})") from None
    try:
        profile = Profile.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ProfileError(f"{path}: not a `tandem profile` profile ({where}: {first['msg']})") from None
    return profile_costs(profile, str(path), call_s)


def profile_costs(profile: Profile, source: str = "profile", call_s: float = 0.0) -> ProfileCosts:
    cm = profile.cost_model
    coefs = {"alpha_s": cm.alpha_s, "gamma_s": cm.gamma_s, "delta_s": cm.delta_s, "verify_s": cm.verify_s}
    negative = [k for k, v in coefs.items() if v < 0 and k != "delta_s"]
    if negative:
        raise ProfileError(f"{source}: negative cost coefficient(s) {negative}: a forward would get cheaper with more work")
    if cm.predict(1, 1) <= 0:
        raise ProfileError(f"{source}: a one-token forward costs {cm.predict(1, 1):.3g} s; a profile must predict > 0")
    if call_s < 0:
        raise ProfileError(f"{source}: call overhead must be >= 0, got {call_s}")
    return ProfileCosts(name=profile.model, cost_model=cm, token_budget=profile.token_budget, call_s=call_s)


# Where the scheduler's policies need a linear model and a budget B (SpecContext), the simulator hands them
# the ones fitted to the very costs it charges: sampled on the profiler's grid and fitted the profiler's way.
FIT_BATCHED = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)
FIT_CONTEXT = (64, 512, 2048)


def fitted(costs: StepCosts, num_seqs: int = 4, short_context: int = 64) -> tuple[CostModel, int]:
    """(cost model, budget B) of ``costs``, as `tandem profile` would have measured them."""
    if isinstance(costs, ProfileCosts):
        cm = costs.cost_model
        if costs.call_s:
            cm = cm.model_copy(update={"delta_s": cm.delta_s + costs.call_s})
        return cm, costs.token_budget or find_budget(_sweep(costs, num_seqs, short_context)).budget
    samples = []
    for ctx in FIT_CONTEXT:
        for n in FIT_BATCHED:
            seqs = min(n, num_seqs)
            for verify in (False, True) if n > seqs else (False,):
                t = costs.call_s + costs.forward_s(seqs, n, seqs * ctx, verify)
                samples.append(Sample(duration_s=t, num_seqs=seqs, num_batched_tokens=n, num_context_tokens=seqs * ctx))
    budget = find_budget(_sweep(costs, num_seqs, short_context)).budget
    return fit_cost_model(samples), budget


def _sweep(costs: StepCosts, num_seqs: int, context: int) -> list[tuple[int, float]]:
    samples = [
        Sample(duration_s=costs.call_s + costs.forward_s(min(n, num_seqs), n, min(n, num_seqs) * context, n > num_seqs),
               num_seqs=min(n, num_seqs), num_batched_tokens=n, num_context_tokens=min(n, num_seqs) * context)
        for n in FIT_BATCHED
    ]  # fmt: skip
    return median_sweep(samples)
