"""The draft's share r of the compute (FASER §4.4, eq. 11-12): SMs on a GPU, threads on a CPU.

When draft and target run side by side (frontier pipelining overlaps them),
the draft gets a share r and the target 1 - r. Latency is piecewise linear in
a model's own share, with a knee R where the slope changes (eq. 11-12)::

    draft   T_q(b, s, r) = (a_q,j - g_q,j * r)       * (alpha_q * b + beta_q * s + c_q)      j = 1 iff r <= R_q
    target  T_p(b, s, r) = (a_p,j - g_p,j * (1 - r)) * ((alpha_p * b + lambda_p) * s + c_p)  j = 1 iff 1 - r <= R_p

(eq. 12 writes the target's case as r >= 1 - R_p: the same thing.) A pipelined
round drafts s_c + 1 lookahead tokens while the target verifies s_c, so it
lasts max(T_q(b, s_c + 1, r), T_p(b, s_c, r)); ``choose_share`` picks the r on
a grid that minimises it. The coefficients come from profiling each model
under a range of shares (not built: nothing here measures them yet).

``split_threads`` turns r into the CPU fallback: torch threads of the two
processes (TANDEM_THREADS, set per service by the launcher).
"""

from __future__ import annotations

from pydantic import BaseModel, Field


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
