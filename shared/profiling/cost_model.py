"""Forward-cost models fitted from measured forwards, and the token budget B (pure: numpy, no torch).

What the profiler measures is one ``ForwardCost`` per target forward. Two
things are fitted from them:

1. The linear cost model every policy shares (SmartSpec §4, architecture.md §5)::

       T_fwd = alpha * N_context + gamma * N_batched + delta

   by least squares over all samples (a coefficient that comes out negative
   on noisy data is dropped and the rest refitted, so predictions stay
   monotone in both counts).

2. The budget B (AdaServe §3): how many tokens one forward can take before it
   stops being memory-bound. It is read off the sweep of median verify
   latency T(N) against batched tokens N at a short context::

       T |                    /            knee: the breakpoint K of the best
         |                  /              continuous two-segment fit
         |  ______________/                T = c0 + c1*N + c2*max(0, N - K)
         |                                 (the roofline's ridge point)
         +----------------K-------- N

   The knee is accepted when the two-segment fit explains the sweep clearly
   better than a straight line (residual <= 1/4 of the line's), the slope
   after K is at least 3x the slope before, and T grows by at least 20 %
   of T(K) from K to the end of the sweep (noise on a flat sweep also "bends").
   On hardware with no such bend (a CPU: every extra token costs compute
   from the start) the sweep is a line
   T = a + b*N, and B is its ridge N = a / b: the batch at which the
   per-token compute equals the fixed per-forward cost (loading the
   weights), i.e. where a forward costs twice a one-token decode. Either way
   B is clipped to the measured range.
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import BaseModel, Field

PROFILE_VERSION = 1


class Sample(BaseModel):
    """One measured forward (the fields of ``shared.engine.types.ForwardCost``)."""

    duration_s: float
    num_seqs: int
    num_batched_tokens: int
    num_context_tokens: int


class CostModel(BaseModel):
    """T_fwd = alpha * N_context + gamma * N_batched + delta, in seconds."""

    alpha_s: float = Field(0.0, description="Seconds per context token (KV entry attended to).")
    gamma_s: float = Field(0.0, description="Seconds per batched token (run through the model).")
    delta_s: float = Field(0.0, description="Seconds per forward (weights, launch, host overhead).")
    verify_s: float = Field(
        0.0,
        description="c_t: what a forward with drafted tokens (a verify) costs beyond a plain decode of as many "
        "tokens: the tree mask, the drafted rows' logits (0 when the profile had no plain decodes to compare).",
    )
    r2: float | None = Field(None, description="Coefficient of determination of the fit.")

    def predict(self, num_context_tokens: float, num_batched_tokens: float, verify: bool = False) -> float:
        """T_fwd; ``verify``: the forward carries drafted tokens (adds c_t)."""
        t = self.alpha_s * num_context_tokens + self.gamma_s * num_batched_tokens + self.delta_s
        return t + self.verify_s if verify else t


class Knee(BaseModel):
    """How the budget was found (see the module docstring)."""

    budget: int
    method: Literal["knee", "ridge"]
    slope_before_s: float  # seconds per token below B (line: the one slope)
    slope_after_s: float  # above B
    latency_at_budget_s: float  # T(B) on the fitted curve
    latency_at_one_s: float  # T(1) on the fitted curve


class Profile(BaseModel):
    """What `tandem profile` stores, per model and hardware."""

    version: int = PROFILE_VERSION
    model: str
    hardware: str
    device: str
    dtype: str
    created_at: str = Field(default_factory=lambda: time.strftime("%Y-%m-%dT%H:%M:%S%z"))
    token_budget: int = Field(description="B: verify tokens per forward before it turns compute-bound.")
    knee: Knee
    cost_model: CostModel
    sweep: list[tuple[int, float]] = Field(description="(batched tokens, median seconds) at the sweep's context.")
    samples: list[Sample] = Field(default_factory=list)
    settings: dict = Field(default_factory=dict, description="How it was measured (grid, repeats, threads).")


# ----------------------------------------------------------------------------- fitting


def is_verify(sample: Sample) -> bool:
    """Did the forward carry drafted tokens (more tokens than sequences), or was it a plain decode?"""
    return sample.num_batched_tokens > sample.num_seqs


def fit_cost_model(samples: Sequence[Sample]) -> CostModel:
    """Least squares T = alpha*C + gamma*N + delta [+ c_t * verify], dropping a coefficient that
    comes out negative; c_t is fitted only when the samples hold plain decodes and verifies both."""
    if len(samples) < 3:
        raise ValueError(f"need at least 3 samples to fit the cost model, got {len(samples)}")
    y = np.array([s.duration_s for s in samples])
    columns = {
        "alpha_s": np.array([s.num_context_tokens for s in samples], dtype=float),
        "gamma_s": np.array([s.num_batched_tokens for s in samples], dtype=float),
        "delta_s": np.ones(len(samples)),
    }
    verify = np.array([is_verify(s) for s in samples], dtype=float)
    if 0.0 < verify.mean() < 1.0:
        columns["verify_s"] = verify
    active = list(columns)
    while True:
        x = np.stack([columns[k] for k in active], axis=1)  # [num_samples, num_active]
        coef, *_ = np.linalg.lstsq(x, y, rcond=None)
        negative = [k for k, c in zip(active, coef) if c < 0 and k != "delta_s"]
        if not negative:
            break
        active.remove(min(negative, key=lambda k: coef[active.index(k)]))
    fitted = dict(zip(active, coef.tolist()))
    pred = np.stack([columns[k] for k in active], axis=1) @ coef
    ss_tot = float(((y - y.mean()) ** 2).sum())
    r2 = 1.0 - float(((y - pred) ** 2).sum()) / ss_tot if ss_tot > 0 else None
    return CostModel(**fitted, r2=r2)


def _lstsq_sse(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, float]:
    coef, *_ = np.linalg.lstsq(x, y, rcond=None)
    return coef, float(((y - x @ coef) ** 2).sum())


def _best_breakpoint(n: np.ndarray, t: np.ndarray) -> tuple[float, float, np.ndarray] | None:
    """(sse, K, (c0, c1, c2)) of the best continuous two-segment fit, K at a measured inner point."""
    best = None
    for k in n[1:-1]:  # a breakpoint with measured points on both sides
        x = np.stack([np.ones_like(n), n, np.maximum(0.0, n - k)], 1)
        coef, sse = _lstsq_sse(x, t)
        if best is None or sse < best[0]:
            best = (sse, float(k), coef)
    return best


def find_budget(sweep: Sequence[tuple[int, float]]) -> Knee:
    """B from (batched tokens, median latency) points; see the module docstring for the criterion."""
    pts = sorted(sweep)
    if len(pts) < 3:
        raise ValueError(f"need at least 3 sweep points to find the budget, got {len(pts)}")
    n = np.array([p[0] for p in pts], dtype=float)
    t = np.array([p[1] for p in pts], dtype=float)
    ones = np.ones_like(n)
    (a, b), sse_line = _lstsq_sse(np.stack([ones, n], 1), t)

    if sse_line <= 1e-12 * float((t**2).sum()):  # a line explains the sweep exactly: no bend to find
        best = None
    else:
        best = _best_breakpoint(n, t)
    lo, hi = int(n[0]), int(n[-1])
    if best is not None:
        sse, k, (c0, c1, c2) = best
        after = c1 + c2
        rise = after * (hi - k)  # how much T grows from K to the end of the sweep
        if (
            c2 > 0
            and sse <= 0.25 * sse_line
            and after >= 3 * max(c1, 0.0)
            and rise >= 0.2 * (c0 + c1 * k)  # noise on a flat sweep bends too, but not this much
        ):
            return Knee(
                budget=int(k),
                method="knee",
                slope_before_s=float(c1),
                slope_after_s=float(after),
                latency_at_budget_s=float(c0 + c1 * k),
                latency_at_one_s=float(c0 + c1),
            )
    ridge = a / b if b > 0 else float(hi)
    budget = int(min(hi, max(lo, round(ridge))))
    return Knee(
        budget=budget,
        method="ridge",
        slope_before_s=float(b),
        slope_after_s=float(b),
        latency_at_budget_s=float(a + b * budget),
        latency_at_one_s=float(a + b),
    )


def median_sweep(samples: Sequence[Sample]) -> list[tuple[int, float]]:
    """(batched tokens, median duration) per distinct batched-token count."""
    by_n: dict[int, list[float]] = {}
    for s in samples:
        by_n.setdefault(s.num_batched_tokens, []).append(s.duration_s)
    return [(k, float(np.median(v))) for k, v in sorted(by_n.items())]


# ----------------------------------------------------------------------------- storage
#   <home>/profiles/<model>/<hardware slug>.json


def redis_blob_name(model: str) -> str:
    """The Redis blob (``StateStore.put_json``) a profile of ``model`` is published under."""
    return f"profile:{model}"


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "unknown"


def profile_path(home: Path, model: str, hardware: str, variant: str = "") -> Path:
    """``variant``: a dtype other than the device's default (``dtype_variant``), so the profiles of one model on
    one machine in float32 and in bfloat16 are two files; the scheduler picks by dtype (services/scheduler/budget.py)."""
    return home / "profiles" / slug(model) / f"{slug(hardware)}{'-' + slug(variant) if variant else ''}.json"


def dtype_variant(device: str, dtype: str) -> str:
    """'' for the device's default dtype (float32 on CPU, bfloat16 on CUDA), else the dtype."""
    default = "float32" if str(device).split(":")[0] == "cpu" else "bfloat16"
    return "" if dtype == default else dtype


def write_model(path: Path, model: BaseModel) -> Path:
    """``model`` as JSON at ``path``, written aside and renamed: readers never see half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(model.model_dump_json(indent=2) + "\n")
    tmp.replace(path)
    return path


def save_profile(profile: Profile, home: Path) -> Path:
    return write_model(profile_path(home, profile.model, profile.hardware, dtype_variant(profile.device, profile.dtype)), profile)


def load_profile(path: Path) -> Profile:
    return Profile.model_validate_json(Path(path).read_text())


def find_profile(home: Path, model: str, hardware: str | None = None) -> Path | None:
    """The stored profile of ``model``: the one for ``hardware`` if there is one, else the newest."""
    folder = home / "profiles" / slug(model)
    if hardware is not None and (exact := profile_path(home, model, hardware)).is_file():
        return exact
    found = sorted(folder.glob("*.json"), key=lambda p: p.stat().st_mtime) if folder.is_dir() else []
    return found[-1] if found else None
