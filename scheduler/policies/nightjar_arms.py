"""Which arms a Nightjar exploration bin draws from, and how (``scheduler/policies/nightjar.py``'s extensions).

Alg. 1 line 11 draws uniformly over every arm; the extensions narrow or tilt that draw:

- ``surviving_arms``: successive elimination on the arms' observed rewards (``eliminate``);
- ``estimate_gaps`` / ``estimate_surviving_arms``: elimination pairwise against the leader on the chain
  estimate's own error (``eliminate_on="estimate"``), its delta method over ``chain_tokens``;
- ``draw_weights``: the draw among the survivors weighted by each arm's chance to beat the leader
  (``draw="weighted"``);
- ``local_arms``: only the arms near the leader (``neighbors``, a unimodal bandit's local exploration).

The module docstring of nightjar.py says why each exists and what the simulation and the stack showed.

Pure: no I/O, no torch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np


def surviving_arms(means: Sequence[float], m2: Sequence[float], counts: Sequence[int], z: float,
                   min_plays: int) -> list[int]:
    """Successive elimination (module docstring): the arms whose upper bound reaches the best lower bound.

    Bounds are g̃ ± z·s/√n, s² = M2/(n-1); arms with fewer than ``min_plays`` plays always stay in."""
    bounds = []
    for g, q, n in zip(means, m2, counts):
        half = z * math.sqrt(max(q, 0.0) / (n - 1) / n) if n >= min_plays else math.inf
        bounds.append((g - half, g + half))
    best_lower = max((lo for lo, _ in bounds if lo > -math.inf), default=-math.inf)
    return [k for k, (_, hi) in enumerate(bounds) if hi >= best_lower]


def estimate_gaps(st: dict[str, Any], num_arms: int, min_plays: int,
                  bound_trials: float) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """Each arm's gap to the leader L on the chain estimate and that gap's standard error (module docstring)::

        gap_γ = log g̃_L − log g̃_γ,   log g̃_γ = log l(γ) − (s + r_γ)   (s cancels)
        se² = Σ_j (∂_j log l(L) − ∂_j log l(γ))²·var(q_j) + var(r_L)/n_L + var(r_γ)/n_γ

    L is the best estimate among arms with ``min_plays`` plays; returns (gap, se, known) per arm, ``known``
    marking those arms, or None while fewer than two arms are known. The arms share the depth rates q_j, so
    only the depths where their lengths differ count: a pairwise test against the leader, much tighter than
    each arm's bound alone. var(q_j) binomial (``chain_tokens``), var(r_γ) the spread of the arm's own
    relative times (Welford)."""
    n = np.array(fit_arms(list(st["n"]), num_arms, 0), dtype=float)
    rel = np.array(fit_arms(list(st.get("lr") or []), num_arms, 0.0))
    m2 = np.array(fit_arms(list(st.get("lq") or []), num_arms, 0.0))
    counts = fit_arms(list(st.get("depth") or []), num_arms - 1, (0.0, 0.0))
    known = n >= min_plays
    if known.sum() < 2:
        return None
    tokens, grads, var_q = chain_tokens(counts, bound_trials)
    log_g = np.log(tokens) - rel
    leader = int(np.argmax(np.where(known, log_g, -np.inf)))
    time_var = np.where(known, np.maximum(m2, 0.0) / np.maximum(n - 1, 1) / np.maximum(n, 1), 0.0)
    d = grads[leader] / tokens[leader] - grads / tokens[:, None]  # [arms, depths] ∂_j log l(L) − ∂_j log l(γ)
    se = np.sqrt(d**2 @ var_q + time_var[leader] + time_var)
    return log_g[leader] - log_g, se, known


def estimate_surviving_arms(st: dict[str, Any], num_arms: int, z: float, min_plays: int,
                            bound_trials: float) -> list[int]:
    """Elimination on the chain estimate (``eliminate_on="estimate"``): the arms not clearly behind the
    leader, ``gap_γ > z·se_γ`` (``estimate_gaps``); arms with fewer than ``min_plays`` plays stay in."""
    gaps = estimate_gaps(st, num_arms, min_plays, bound_trials)
    if gaps is None:
        return list(range(num_arms))
    gap, se, known = gaps
    out = known & (gap > z * se)
    return [k for k in range(num_arms) if not out[k]]


def draw_weights(gap: np.ndarray, se: np.ndarray, known: np.ndarray) -> np.ndarray:
    """Exploration weights of ``draw="weighted"``: each arm's chance to beat the leader, Φ(−gap/se) (the leader
    itself ½), an arm with fewer than ``min_plays`` plays ½ too (as uncertain as a tie). A survivor one
    standard error behind is drawn a third as often as the leader, two behind a twentieth: the draw still
    reaches every survivor, but spends its bins where the estimate says a better arm may be."""
    with np.errstate(divide="ignore", invalid="ignore"):
        x = np.where(se > 0, -gap / np.where(se > 0, se, 1.0), np.where(gap > 0, -np.inf, 0.0))
    w = np.array([0.5 * math.erfc(-v / math.sqrt(2.0)) for v in x])
    return np.where(known, w, 0.5)


def chain_tokens(counts: Sequence[Sequence[float]], max_trials: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per arm γ = 0 .. len(counts): l(γ) = 1 + Σ_{d≤γ} Π_{j≤d} q_j ([arms]), its gradient over the depth rates
    q_1..q_D ([arms, D]), and each rate's binomial variance ([D]) for the delta method.

    The gradient and variances are taken at the smoothed rates s_j = (accepted + 1) / (trials + 2), over at
    most ``max_trials`` trials (at least one): a rate seen as 0 or 1 in a few trials is not certain, and a
    depth never tested adds what the chance of reaching it, Π_{i<j} q_i, allows. With C_d = Π_{i≤d} s_i::

        ∂l(γ)/∂q_j = Σ_{j≤d<γ} C_d / s_j   (j < γ; 0 beyond the arm's depth)"""
    acc = np.array([c[0] for c in counts], dtype=float)
    trials = np.array([c[1] for c in counts], dtype=float)
    q = np.divide(acc, trials, out=np.zeros_like(acc), where=trials > 0)
    tokens = np.concatenate([[1.0], 1.0 + np.cumsum(np.cumprod(q))])
    smooth = (acc + 1.0) / (trials + 2.0)
    var_q = smooth * (1.0 - smooth) / np.clip(trials, 1.0, max_trials)
    sums = np.concatenate([[0.0], np.cumsum(np.cumprod(smooth))])  # sums[m] = Σ_{d<m} C_d
    depth = len(counts)
    arm, j = np.arange(depth + 1)[:, None], np.arange(depth)[None, :]
    grads = np.where(j < arm, (sums[:, None] - sums[None, :depth]) / smooth[None, :], 0.0)
    return tokens, grads, var_q


def local_arms(arms: Sequence[int], goodputs: Sequence[float], radius: int) -> list[int]:
    """The arms in play within ``radius`` of the leader (the arm of best estimate; module docstring), or all
    of them while no arm has an estimate. Never empty: the leader itself stays, so the draw can confirm it."""
    known = [k for k, g in enumerate(goodputs) if g > 0]
    if not known:
        return list(arms)
    leader = max(known, key=lambda k: goodputs[k])
    near = [k for k in arms if abs(k - leader) <= radius]
    return near or [leader]


def fit_arms(values: list, size: int, fill: Any) -> list:
    """``values`` padded or cut to ``size`` (a stored state from another Γ_max)."""
    return (values + [fill] * size)[:size]
