"""The goodput-optimal chain lengths of a batch under the step cost model (SmartSpec §4.3-4.4, eq. 3, 8-9).

Pure solvers, shared by SmartSpec (smartspec.py: one k for the batch, Algorithm 2, or a k per request) and
FASER-AD's joint choice (faser.py): given what each request's j-th drafted token is expected to add and
the step cost T(k) of step_cost.py (the draft's depth is the batch's longest chain, the verify the sum of
them, the feed and a resumed request's catch-up), the lengths that maximise generated tokens per second.

Pure: numpy, no I/O.
"""

from __future__ import annotations

import numpy as np

from scheduler.policies.step_cost import StepCost


def uniform_goodputs(
    alphas: np.ndarray, free: np.ndarray, caps: np.ndarray, fixed: np.ndarray, contexts: np.ndarray,
    cost: StepCost, max_k: int, switch: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """Algorithm 2's candidates: for k = 0..max_k, every free request's length (row k) and the step's goodput.

    ``alphas`` [n] is each request's alpha (eq. 8), or [n, depth] the gain of each request's j-th token
    (depth_acceptance.depth_gains: alpha per depth); depths past the last given gain nothing. ``switch`` [n]:
    tokens each request's catch-up adds to the feed when it speculates (s_i above; None: none)."""
    n = len(free)
    depth = int(max(max_k, fixed.max() if n else 0))
    gains = (alphas[:, None] ** np.arange(1, depth + 1)[None, :] if alphas.ndim == 1
             else np.pad(alphas[:, :depth], ((0, 0), (0, max(0, depth - alphas.shape[1])))))  # fmt: skip
    cum = np.concatenate([np.zeros((n, 1)), np.cumsum(gains, axis=1)], axis=1)  # [n, depth + 1]
    candidates = np.where(free[None, :], np.minimum(np.arange(max_k + 1)[:, None], caps[None, :]), fixed[None, :])
    per_request = 1.0 + cum[np.arange(n)[None, :], candidates]  # [max_k + 1, n]
    fed = per_request if switch is None else per_request + switch[None, :]  # the feed (step_cost.py) + switch
    t = cost.steps(candidates, contexts) + cost.feed(candidates, fed)
    return candidates, per_request.sum(axis=1) / t  # eq. 3, 8-9: one row per k


def best_uniform_k(
    alphas: np.ndarray, free: np.ndarray, caps: np.ndarray, fixed: np.ndarray, contexts: np.ndarray,
    cost: StepCost, max_k: int, switch: np.ndarray | None = None,
) -> tuple[np.ndarray, float]:  # fmt: skip
    """Algorithm 2 with Algorithm 1's estimate: the one k for all free requests that maximises goodput."""
    candidates, goodput = uniform_goodputs(alphas, free, caps, fixed, contexts, cost, max_k, switch)
    best = int(np.argmax(goodput > goodput.max() - 1e-12))  # ties: the shorter k
    return candidates[best], float(goodput[best])


def best_request_ks(
    gains: np.ndarray, free: np.ndarray, caps: np.ndarray, fixed: np.ndarray, contexts: np.ndarray,
    cost: StepCost, max_k: int, sunk_s: float = 0.0, draft_terms: bool = True, switch: np.ndarray | None = None,
) -> tuple[np.ndarray, float]:  # fmt: skip
    """Per-request lengths maximising sum_i l_i(k_i) / T(k) exactly (``request_ks_by_depth``'s best row)."""
    ks, g = request_ks_by_depth(gains, free, caps, fixed, contexts, cost, max_k, sunk_s, draft_terms, switch)
    best = int(np.argmax(g > g.max() - 1e-12))  # row 0 is the fixed lengths alone; ties: the earlier row
    return ks[best], float(g[best])


def request_ks_by_depth(
    gains: np.ndarray, free: np.ndarray, caps: np.ndarray, fixed: np.ndarray, contexts: np.ndarray,
    cost: StepCost, max_k: int, sunk_s: float = 0.0, draft_terms: bool = True, switch: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """Per-request lengths maximising sum_i l_i(k_i) / T(k) under each max depth m (Dinkelbach per m).

    Returns ([M + 1, n] lengths, [M + 1] goodputs): row 0 the fixed lengths with every free request at 0,
    then one row per depth m the runs covered (what FASER's joint choice corrects by its GP, faser.py).

    ``gains[i, j-1]`` is what request i's j-th token adds to its expected length (alpha_i^j for a
    chain of acceptance alpha_i, a path probability for a drafted chain); non-increasing in j.
    ``sunk_s`` is time already spent (the confidence variant's drafting); ``draft_terms`` False
    leaves the draft's per-depth costs and its feed out (drafting is over).

    The feed (step_cost.py): a speculating request also costs c_f per token it generates, so at rate lam
    its k tokens are worth cum_k (1 - lam c_f) - lam (k u_i + c_f) against k = 0: token j is taken while
    gain_j (1 - lam c_f) > lam u_i, and the chain is kept only if that total is positive. A switch s_i
    (``switch``, tokens of catch-up) is one more fixed cost of speculating at all: lam c_f s_i.
    """
    n = len(free)
    cum = np.concatenate([np.zeros((n, 1)), np.cumsum(gains, axis=1)], axis=1)  # [n, max_k + 1]
    u = cost.per_token(contexts) if draft_terms else np.full(n, cost.gamma_t)
    f = cost.feed_d if draft_terms else 0.0
    s = np.zeros(n) if switch is None or not draft_terms else switch  # [n] catch-up tokens when speculating
    base = cost.base(contexts) + sunk_s
    j = np.arange(1, max_k + 1)

    rows = np.arange(n)

    def goodputs(ks: np.ndarray) -> np.ndarray:  # [M, n] -> [M]: eq. 3 for each row of chain lengths
        k_max = ks.max(axis=1) if n else np.zeros(len(ks), dtype=int)
        per_request = 1.0 + cum[rows, ks]
        t = base + ks @ u + f * np.where(ks > 0, per_request + s, 0.0).sum(axis=1)
        spec = cost.call_t + (cost.call_d + k_max * cost.delta_d if draft_terms else 0.0)
        t = t + np.where(k_max > 0, spec, 0.0)
        return per_request.sum(axis=1) / t

    def lengths(lam: np.ndarray, allowed: np.ndarray) -> np.ndarray:  # [M] rates -> [M, n] free requests' k
        keep = np.maximum(1.0 - lam * f, 0.0)  # [M]: what a token is worth net of its feed
        take = (gains[None] * keep[:, None, None] > (lam[:, None] * u[None, :])[:, :, None]) & allowed
        ks = take.sum(axis=2)
        net = cum[rows, ks] * keep[:, None] - lam[:, None] * (ks * u[None, :] + f * (1.0 + s[None, :]))  # vs k = 0
        return np.where(net > 0, ks, 0)

    fixed_max = int(fixed[~free].max()) if (~free).any() else 0
    depths = np.arange(fixed_max, max_k + 1) if draft_terms else np.array([max_k])  # one Dinkelbach run per m
    limit = np.where(free[None, :], np.minimum(caps[None, :], depths[:, None]), fixed[None, :])  # [M, n]
    ks, g = limit.copy(), goodputs(limit)
    lam, done = g.copy(), np.zeros(len(depths), dtype=bool)
    allowed = j[None, None, :] <= limit[:, :, None]  # [M, n, max_k]
    for _ in range(20):  # all depths' runs at once; a run that has converged keeps its ks
        new_ks = np.where(free[None, :], lengths(lam, allowed), fixed[None, :])  # gain beats its cost at rate lam
        new_g = goodputs(new_ks)
        ks, g = np.where(done[:, None], ks, new_ks), np.where(done, g, new_g)
        done |= np.abs(g - lam) <= 1e-9 * np.maximum(g, 1e-12)
        if done.all():
            break
        lam = np.where(done, lam, g)
    return np.concatenate([fixed[None, :], ks]), np.concatenate([goodputs(fixed[None, :]), g])
