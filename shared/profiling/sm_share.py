"""The draft's share r of the compute (FASER §4.4, eq. 11-12): SMs on a GPU, threads on a CPU.

When draft and target run side by side (frontier pipelining overlaps them),
the draft gets a share r and the target 1 - r. Latency is piecewise linear in
a model's own share, with a knee R where the slope changes (eq. 11-12)::

    draft   T_q(b, s, r) = (a_q,j - g_q,j * r)       * (alpha_q * b + beta_q * s + c_q)      j = 1 iff r <= R_q
    target  T_p(b, s, r) = (a_p,j - g_p,j * (1 - r)) * ((alpha_p * b + lambda_p) * s + c_p)  j = 1 iff 1 - r <= R_p

(eq. 12 writes the target's case as r >= 1 - R_p: the same thing.) A pipelined
round drafts s_c + 1 lookahead tokens while the target verifies s_c, so it
lasts max(T_q(b, s_c + 1, r), T_p(b, s_c, r)); ``choose_share`` picks the r on
a grid that minimises it.

Where the coefficients come from (``fit_latency``, on what
``tandem profile --shares`` measures, ``measure_shares.py``): each model runs
alone at several shares x of the machine (CPU: 1..N torch threads, x = n/N;
CUDA: MPS active-thread percentages). The product form is fitted by
alternating least squares::

    f(x)      one scale per measured share: latency at x / latency at the largest share (f(x_max) = 1)
    L(b, s)   the linear part (eq. 11: b, s, 1; eq. 12: b*s, s, 1), least squares on T / f(x);
              a coefficient that comes out negative is dropped, as in cost_model.fit_cost_model
    curve     f(x) as a continuous two-piece line, the knee R tried at every inner measured share,
              kept when it halves the squared error of one straight line (else R = 1: one piece)

With N = 2 cores there are two shares (1/2, 1) and the curve is one line.
Co-location interference (both models busy at once) is not measured: each
model runs alone at its share.

``split_threads`` turns r into the CPU fallback: torch threads of the two
processes (TANDEM_THREADS, set per service by the launcher). ``auto_share``
is what the launcher's ``draft_share="auto"`` calls: it reads both models'
stored share profiles and chooses r on the shares the machine can realise.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import BaseModel, Field

from shared.profiling.cost_model import slug, write_model

SHARE_PROFILE_VERSION = 1
Role = Literal["draft", "target"]


class ShareCurve(BaseModel):
    """The piecewise-linear factor of eq. 11-12 in a model's own share x: a1 - g1*x up to the knee, a2 - g2*x after."""

    a1: float = 1.0
    g1: float = 0.0
    a2: float = 1.0
    g2: float = 0.0
    knee: float = Field(1.0, gt=0.0, le=1.0, description="R: the share where the slope changes.")

    def factor(self, share: float) -> float:
        return self.a1 - self.g1 * share if share <= self.knee else self.a2 - self.g2 * share


class DraftLatency(BaseModel):
    """Eq. 11: T_q(b, s, r) = curve(r) * (alpha*b + beta*s + c); s = tokens drafted."""

    alpha: float = 0.0
    beta: float = 0.0
    c: float = 0.0
    curve: ShareCurve = Field(default_factory=ShareCurve)

    def predict(self, b: int, s: int, r: float) -> float:
        return self.curve.factor(r) * (self.alpha * b + self.beta * s + self.c)


class TargetLatency(BaseModel):
    """Eq. 12: T_p(b, s, r) = curve(1 - r) * ((alpha*b + lam)*s + c); s = tokens verified per request."""

    alpha: float = 0.0
    lam: float = 0.0
    c: float = 0.0
    curve: ShareCurve = Field(default_factory=ShareCurve)

    def predict(self, b: int, s: int, r: float) -> float:
        return self.curve.factor(1.0 - r) * ((self.alpha * b + self.lam) * s + self.c)


def share_grid(step: float = 0.05) -> list[float]:
    """r = step, 2*step, ... < 1: each model keeps some of the machine."""
    n = round(1.0 / step)
    return [round(i * step, 6) for i in range(1, n)]


def round_time(draft: DraftLatency, target: TargetLatency, b: int, s_c: int, r: float) -> float:
    """One pipelined round: the lookahead draft (s_c + 1 tokens) beside the chunk's verify (s_c tokens)."""
    return max(draft.predict(b, s_c + 1, r), target.predict(b, s_c, r))


def choose_share(
    draft: DraftLatency, target: TargetLatency, b: int, s_c: int, grid: list[float] | None = None
) -> float:
    """The r of ``grid`` (default steps of 0.05) with the shortest pipelined round; ties: the smaller r."""
    grid = grid or share_grid()
    return min(grid, key=lambda r: (round_time(draft, target, b, s_c, r), r))


def available_cores() -> int:
    """CPU cores this process may run on (its affinity mask on Linux)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def split_threads(share: float, cores: int) -> tuple[int, int]:
    """(draft threads, target threads) for a draft share of ``share`` of ``cores``; each gets at least one.

    With one core both get one (they time-share it).
    """
    if not 0.0 < share < 1.0:
        raise ValueError(f"a draft share is in (0, 1), got {share}")
    if cores <= 1:
        return 1, 1
    draft = min(cores - 1, max(1, round(share * cores)))
    return draft, cores - draft


def mps_percentages(share: float) -> tuple[int, int]:
    """CUDA_MPS_ACTIVE_THREAD_PERCENTAGE of the (draft, target) processes for a draft share r (1..100 each)."""
    if not 0.0 < share < 1.0:
        raise ValueError(f"a draft share is in (0, 1), got {share}")
    draft = min(99, max(1, round(100 * share)))
    return draft, 100 - draft


# ----------------------------------------------------------------------------- fitting (eq. 11-12)


class ShareSample(BaseModel):
    """Median latency of one (b, s) at one share x of the machine, the model running alone."""

    share: float = Field(gt=0.0, le=1.0, description="x: the model's own share (threads / cores, or MPS %/100).")
    b: int = Field(ge=1, description="Batch size: sequences in the call.")
    s: int = Field(ge=1, description="Tokens per sequence: drafted (draft) or verified (target).")
    duration_s: float


def _features(role: Role, b: np.ndarray, s: np.ndarray) -> np.ndarray:
    """The linear part's columns: eq. 11 (b, s, 1), eq. 12 (b*s, s, 1)."""
    first = b if role == "draft" else b * s
    return np.stack([first, s, np.ones_like(b)], axis=1)  # [num_samples, 3]


def _nonneg_lstsq(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares, dropping the most negative non-constant coefficient until none is (the last column is 1)."""
    active = list(range(x.shape[1]))
    while True:
        coef, *_ = np.linalg.lstsq(x[:, active], y, rcond=None)
        negative = [j for j, c in zip(active, coef) if c < 0 and j != x.shape[1] - 1]
        if not negative:
            break
        active.remove(min(negative, key=lambda j: coef[active.index(j)]))
    out = np.zeros(x.shape[1])
    out[active] = coef
    return out


def fit_share_curve(shares: Sequence[float], factors: Sequence[float]) -> ShareCurve:
    """f(x) at measured shares -> ShareCurve: a continuous hinge at the best inner share, or one line.

    The hinge f = c0 + c1*x + c2*max(0, x - R) is kept when it halves the squared
    error of a straight line (a hinge always fits noise a little better).
    """
    x, f = np.asarray(shares, dtype=float), np.asarray(factors, dtype=float)
    if len(x) == 1:
        return ShareCurve(a1=float(f[0]), g1=0.0, a2=float(f[0]), g2=0.0, knee=1.0)
    ones = np.ones_like(x)
    (a, slope), *_ = np.linalg.lstsq(np.stack([ones, x], 1), f, rcond=None)
    sse_line = float(((f - a - slope * x) ** 2).sum())
    best = None
    for k in x[1:-1]:  # a knee with measured shares on both sides
        h = np.stack([ones, x, np.maximum(0.0, x - k)], 1)
        coef, *_ = np.linalg.lstsq(h, f, rcond=None)
        sse = float(((f - h @ coef) ** 2).sum())
        if best is None or sse < best[0]:
            best = (sse, float(k), coef)
    if best is not None and sse_line > 1e-12 * float((f**2).sum()) and best[0] <= 0.5 * sse_line:
        _, k, (c0, c1, c2) = best
        return ShareCurve(a1=float(c0), g1=float(-c1), a2=float(c0 - c2 * k), g2=float(-(c1 + c2)), knee=k)
    return ShareCurve(a1=float(a), g1=float(-slope), a2=float(a), g2=float(-slope), knee=1.0)


def fit_latency(samples: Sequence[ShareSample], role: Role) -> tuple[DraftLatency | TargetLatency, float | None]:
    """Eq. 11 (role "draft") or eq. 12 ("target") from samples at several shares; (model, R^2).

    Alternating least squares on T = f(x) * L(b, s) (module docstring), f
    normalised to 1 at the largest share, then ``fit_share_curve`` on f.
    """
    if len({(x.b, x.s) for x in samples}) < 3:
        raise ValueError("need at least 3 distinct (b, s) to fit the linear part")
    shares = sorted({x.share for x in samples})
    at = np.array([shares.index(x.share) for x in samples])  # share index of each sample
    y = np.array([x.duration_s for x in samples])
    feats = _features(role, np.array([x.b for x in samples], float), np.array([x.s for x in samples], float))
    f = np.array([y[at == i].mean() for i in range(len(shares))])
    f = f / f[-1]  # exact for the product form when every share ran the same (b, s)
    for _ in range(100):
        coef = _nonneg_lstsq(feats * f[at][:, None], y)
        lin = feats @ coef  # [num_samples] L(b, s)
        # the best scale per share given L: sum(T * L) / sum(L^2) over that share's samples
        new = np.array([y[m] @ lin[m] / max(lin[m] @ lin[m], 1e-300) for m in (at == i for i in range(len(shares)))])
        new = new / new[-1]
        done = float(np.abs(new - f).max()) < 1e-12
        f = new
        if done:
            break
    coef = _nonneg_lstsq(feats * f[at][:, None], y)
    curve = fit_share_curve(shares, f.tolist())
    linear = dict(zip(("alpha", "beta" if role == "draft" else "lam", "c"), coef.tolist()))
    model = DraftLatency(**linear, curve=curve) if role == "draft" else TargetLatency(**linear, curve=curve)
    # the draft's own share is r, the target's 1 - r: predict at the r that gives this sample's share
    pred = np.array([model.predict(x.b, x.s, x.share if role == "draft" else 1.0 - x.share) for x in samples])
    ss_tot = float(((y - y.mean()) ** 2).sum())
    r2 = 1.0 - float(((y - pred) ** 2).sum()) / ss_tot if ss_tot > 0 else None
    return model, r2


# ----------------------------------------------------------------------------- storage
#   <home>/profiles/<model>/shares/<hardware slug>.json   (a folder of its own: the budget
#   loader reads every *.json directly under <model>/ as a verify profile)


class ShareProfile(BaseModel):
    """What `tandem profile --shares` stores, per model and hardware: eq. 11 or 12 and its samples."""

    version: int = SHARE_PROFILE_VERSION
    model: str
    role: Role
    hardware: str = Field(description="What the shares are of: share_hardware(), e.g. 'cpu <model> (2 cores)'.")
    device: str
    dtype: str
    unit: Literal["threads", "mps"] = Field(description="threads: x = n / total; mps: x = percentage / 100.")
    total: int = Field(description="Cores split (threads) or 100 (mps).")
    created_at: str = Field(default_factory=lambda: time.strftime("%Y-%m-%dT%H:%M:%S%z"))
    draft: DraftLatency | None = Field(None, description="Eq. 11 (role draft).")
    target: TargetLatency | None = Field(None, description="Eq. 12 (role target).")
    r2: float | None = None
    samples: list[ShareSample] = Field(default_factory=list)
    settings: dict = Field(default_factory=dict, description="How it was measured (grids, repeats, seconds).")


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (the platform's machine name elsewhere)."""
    import platform

    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), name)
    except OSError:
        return name


def share_hardware(*, cores: int | None = None, gpu: str | None = None) -> str:
    """The key of a share profile: the GPU's name, or the CPU and how many cores were split."""
    return gpu if gpu is not None else f"cpu {cpu_model()} ({cores} cores)"


def model_name(path: Path | str) -> str:
    """The name loading gives the model at ``path`` (a .gguf's stem, else the directory's name)."""
    path = Path(path)
    return path.stem if path.suffix == ".gguf" else path.name


def share_profile_path(home: Path, model: str, hardware: str) -> Path:
    return Path(home) / "profiles" / slug(model) / "shares" / f"{slug(hardware)}.json"


def save_share_profile(profile: ShareProfile, home: Path) -> Path:
    return write_model(share_profile_path(home, profile.model, profile.hardware), profile)


def load_share_profile(path: Path) -> ShareProfile:
    return ShareProfile.model_validate_json(Path(path).read_text())


# ----------------------------------------------------------------------------- choosing r from the profiles


class ShareChoice(BaseModel):
    """The r ``auto_share`` chose, and from what (the launcher writes it to <log_dir>/share.json)."""

    share: float
    b: int
    s_c: int
    round_s: float = Field(description="Predicted pipelined round at this r: max(T_q(b, s_c+1, r), T_p(b, s_c, r)).")
    grid: list[float]
    draft_profile: str
    target_profile: str


def realisable_grid(on_cuda: bool, cores: int) -> list[float]:
    """The r the machine can give: n / cores for n = 1..cores-1 on CPU, steps of 0.05 under MPS."""
    return share_grid() if on_cuda else [n / cores for n in range(1, cores)]


def auto_share(
    home: Path, draft_model: str, target_model: str, hardware: str, *, grid: list[float], b: int = 1, s_c: int = 2
) -> ShareChoice:
    """``choose_share`` on both models' stored share profiles for ``hardware``.

    Raises FileNotFoundError when either profile is missing, ValueError when the grid is empty (one core).
    """
    if not grid:
        raise ValueError("nothing to split: one core")
    paths = {m: share_profile_path(home, m, hardware) for m in (draft_model, target_model)}
    missing = [str(p) for p in paths.values() if not p.is_file()]
    if missing:
        raise FileNotFoundError(f"no share profile at {', '.join(missing)} (run `tandem profile --shares`)")
    draft, target = load_share_profile(paths[draft_model]).draft, load_share_profile(paths[target_model]).target
    if draft is None or target is None:
        raise FileNotFoundError(f"the share profiles of {draft_model} / {target_model} lack the draft / target fit")
    r = choose_share(draft, target, b, s_c, grid)
    return ShareChoice(
        share=r, b=b, s_c=s_c, round_s=round_time(draft, target, b, s_c, r), grid=grid,
        draft_profile=str(paths[draft_model]), target_profile=str(paths[target_model]),
    )  # fmt: skip
