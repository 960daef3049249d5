"""Acceptance per draft depth: alpha_j = P(token j accepted | tokens 1..j-1 accepted), for SmartSpec's eq. 8.

SmartSpec's eq. 8 takes one alpha for every depth, l(alpha, k) = 1 + alpha + ... + alpha^k. Drafts
are not like that: the EAGLE head on chat accepts 0.44 of first tokens but 0.56 of second ones after
an accepted first (bench/results/faser-eagle, per_position_acceptance). Worse, the single alpha is
estimated from the chains the policy chose: running mostly k = 1 it sees only first tokens, so it
rates a second token at 0.44^2 = 0.19 where it is worth 0.44 x 0.56 = 0.25, a third too little, and
stays at k = 1 where k = 2 was 10 % faster (bench/results/diag-burst, the bursty trace). With a
conditional rate per depth the expected length is::

    l(k) = 1 + sum_{j=1..k} prod_{i<=j} alpha_i                  (eq. 8 with alpha_j per depth)

What a chain of k drafted tokens with a accepted tells: depths 1..a were accepted, depth a+1 (if
a < k) rejected, deeper ones not tested. Each depth keeps decayed counts of its own tests (a depth
the policy stopped drafting keeps what it last saw, fading only as it is tested again). The counts
set the shape over depth only: alpha_j is the pooled alpha (Alg. 1, with its drift back to the
prior) times depth j's rate over the mean rate of all depths, each shrunk toward that mean with
``prior_trials`` tokens of weight, so a depth seldom tested reads as the pooled alpha (eq. 8 as the
paper has it).

Pure: lists of floats in, numpy out; no I/O.
"""

from __future__ import annotations

import numpy as np

Counts = list[list[float]]  # [depth - 1] -> [accepted, tested], decayed


def chain_depth_counts(num_drafted: int, num_accepted: int) -> Counts:
    """Per depth 1..(tested depth): [1, 1] accepted, [0, 1] the rejected one."""
    tested = min(num_drafted, num_accepted + 1)
    return [[1.0 if j < num_accepted else 0.0, 1.0] for j in range(tested)]


def add_counts(total: Counts, new: Counts) -> Counts:
    """Sum of two steps' (or two requests') counts, depth by depth."""
    out = [list(c) for c in total]
    for j, (a, t) in enumerate(new):
        if j < len(out):
            out[j][0] += a
            out[j][1] += t
        else:
            out.append([a, t])
    return out


def decay_into(state: Counts, new: Counts, decay: float, max_depth: int) -> Counts:
    """The state after one step's counts: a depth tested this step weighs its past by ``decay``."""
    out = [list(c) for c in state[:max_depth]]
    for j, (a, t) in enumerate(new[:max_depth]):
        if t <= 0:
            continue
        if j >= len(out):
            out += [[0.0, 0.0] for _ in range(j + 1 - len(out))]
        out[j] = [decay * out[j][0] + a, decay * out[j][1] + t]
    return out


def conditional_rates(state: Counts, pooled: float, prior_trials: float, depth: int) -> np.ndarray:
    """[depth] alpha_j for j = 1..depth: the pooled alpha times how depth j compares with all depths.

    The counts give each depth's rate c_j (shrunk toward their own mean c with ``prior_trials``);
    alpha_j = pooled * c_j / c. The level stays the pooled alpha's, with its drift back to the prior
    while the policy does not speculate (smartspec.py: a low streak cannot switch speculation off for
    good); the counts only set the shape over depth, so stale counts cannot pin a depth low.
    """
    rates = np.full(depth, float(pooled))
    tested = sum(t for _, t in state[:depth])
    mean = sum(a for a, _ in state[:depth]) / tested if tested > 0 else 0.0
    if mean <= 0.0:
        return np.clip(rates, 0.0, 1.0)
    for j, (a, t) in enumerate(state[:depth]):
        rates[j] = pooled * ((a + mean * prior_trials) / (t + prior_trials)) / mean
    return np.clip(rates, 0.0, 1.0)


def depth_gains(rates: np.ndarray) -> np.ndarray:
    """[depth] what token j adds to the expected length: prod_{i<=j} alpha_i."""
    return np.cumprod(rates)
