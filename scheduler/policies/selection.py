"""Which drafted nodes to verify (architecture.md §2 step 5; AdaServe §4.3, Algorithm 2).

The draft returns candidate trees; a selector prunes each to a subtree so that
the batch fits the verify token budget B. Every function here keeps the one
rule the target relies on: a kept node's parent is kept, and parents come
before children. The default selector keeps everything.

Path probability (AdaServe eq. 7) approximates f(v), the chance the target
accepts the whole root-to-v path, by the product of the draft's conditional
probabilities along it; by Theorem 3.1 the expected number of accepted tokens
of a tree is the sum of f(v) over its nodes. A beam-search candidate of depth
3, width 2 (Figure 2), and what a budget keeps of it::

    row 0 ─┬─ a  .7  ── c  .56 ─┬─ e .45        row 0 ── a ── c ── e
           │    (f)             └─ f .06        (b, d, f: lowest f, dropped)
           └─ b  .2  ── d  .02

Budget accounting follows Algorithm 2: B counts every token of the verify
forward, so each request's root (its last committed token, re-run to get the
bonus token) costs one and the drafted nodes share the remaining B - n.

Greedy selection by f takes nodes in a valid order on its own (f(child) <=
f(parent), App. A.1); the heaps below only offer a node once its parent is
in, so ties (a child whose conditional probability rounds to 1.0) cannot
break that either.
"""

from __future__ import annotations

import heapq
from collections import Counter
from dataclasses import dataclass
from collections.abc import Sequence
from typing import Protocol

from scheduler.spec_shape import SpecContext
from scheduler.request import Request
from shared.engine.tree_cut import is_valid_subset, select_expansion, subtree  # noqa: F401 - re-exported
from shared.engine.types import TokenTree


class TreeSelector(Protocol):
    def select(self, batch: Sequence[Request], trees: list[TokenTree], ctx: SpecContext) -> list[TokenTree]:
        """One tree per request (empty = plain decode); each a subtree of the candidate, parents first."""
        ...


class PassThrough:
    """Verify every drafted node."""

    def select(self, batch: Sequence[Request], trees: list[TokenTree], ctx: SpecContext) -> list[TokenTree]:
        return trees


# ----------------------------------------------------------------------------- tree helpers


def path_probs(tree: TokenTree) -> list[float]:
    """f(v) for every node: the product of draft probabilities from the root to v (eq. 7).

    A tree without ``draft_probs`` (a draft that reports none) counts every node as certain.
    """
    probs = tree.draft_probs or [1.0] * len(tree)
    out: list[float] = []
    for p, parent in zip(probs, tree.parent_ids):
        out.append(p * (1.0 if parent == -1 else out[parent]))
    return out


def node_depths(tree: TokenTree) -> list[int]:
    """Each node's depth (1 for a child of the root)."""
    depth: list[int] = []
    for parent in tree.parent_ids:
        depth.append(1 if parent == -1 else depth[parent] + 1)
    return depth


def tree_depth(tree: TokenTree) -> int:
    """Nodes on the longest root-to-leaf path (0 for an empty tree)."""
    return max(node_depths(tree), default=0)


def tree_width(tree: TokenTree) -> int:
    """Most nodes at one depth (0 for an empty tree): the beam a draft needs to have proposed them."""
    return max(Counter(node_depths(tree)).values(), default=0)


class _Frontier:
    """One candidate tree during greedy selection: a max-heap of f over the nodes whose parent is taken."""

    def __init__(self, tree: TokenTree) -> None:
        self.f = path_probs(tree)
        self.children: list[list[int]] = [[] for _ in range(len(tree) + 1)]  # by row (row 0 = root)
        for node, parent in enumerate(tree.parent_ids):
            self.children[parent + 1].append(node)
        self.heap = [(-self.f[c], c) for c in self.children[0]]
        heapq.heapify(self.heap)
        self.taken: list[int] = []

    def __bool__(self) -> bool:
        return bool(self.heap)

    def take(self) -> float:
        """GetTop: take the most probable available node; returns its f."""
        neg_f, node = heapq.heappop(self.heap)
        self._taken(node)
        return -neg_f

    def _taken(self, node: int) -> None:
        self.taken.append(node)
        for child in self.children[node + 1]:
            heapq.heappush(self.heap, (-self.f[child], child))


@dataclass(frozen=True)
class MarginalCost:
    """What one more verify token costs, for a budget that is not free (AdaServe's B assumes it is).

    AdaServe spends the budget to the last token because below B a GPU's verify is memory-bound: a
    token more costs ~nothing. Where the verify's time grows from the first token (a CPU: ~1 ms per
    token on a 28 ms decode here), a node is worth its token only if it raises the step's expected
    goodput, tokens emitted per second (SmartSpec eq. 3)::

        (E + f) / (T + c) > E / T   <=>   f * T > c * E

    E: expected tokens the step emits so far (a bonus token per request + sum of f taken),
    T: the step's time so far (drafting, sunk by now, and the verify of what is taken),
    c: ``per_token_s``, f: the node's path probability. Nodes come in descending f and E / T
    rises while they pay, so the first node that does not pay ends the selection.
    """

    per_token_s: float  # c: seconds one more verified token adds
    step_s: float  # T of the step with no node taken: drafting + the verify of the roots

    def pays(self, f: float, expected: float, num_taken: int) -> bool:
        return f * (self.step_s + self.per_token_s * num_taken) > self.per_token_s * expected


@dataclass(frozen=True)
class SloPace:
    """AdaServe's TPOT constraint with the step's time depending on what is verified (``adaserve:paced``).

    Eq. 5 asks E[acc(T_i)] >= A(r_i) = (l_i + t_spec) / t_TPOT_i - o_i with t_spec fixed: below B a GPU
    verifies a node for free. Where every verified token adds ``per_token_s`` to the step (a CPU), each
    node taken raises every request's A by per_token_s / t_TPOT_i, so filling the budget for throughput can
    push a request that meets its SLO this step below it. With a pace, the throughput-optimized step skips
    a node that would do so::

        A_j(N) = base_j + (step_s + per_token_s * N) * inv_tpot_j,   base_j = l_j / t_TPOT_j - o_j

    N: the drafted nodes taken so far; a request j is protected while 1 + sum f of its nodes >= A_j(N).
    ``base``/``inv_tpot`` hold None/0 for requests without a TPOT constraint (best effort, triaged).
    """

    per_token_s: float  # c: seconds one more verified token adds to the step
    step_s: float  # T(0): the step's time with no drafted node taken
    base: tuple[float | None, ...]  # per request: l / t_TPOT - o, or None (no constraint)
    inv_tpot: tuple[float, ...]  # per request: 1 / t_TPOT (s^-1), 0 without a constraint

    def required(self, j: int, taken: int) -> float:
        base = self.base[j]
        return 0.0 if base is None else base + (self.step_s + self.per_token_s * taken) * self.inv_tpot[j]

    def allows(self, emitted: Sequence[float], taken: int, owner: int, f: float) -> bool:
        """May a node of request ``owner`` with path probability ``f`` be taken, ``taken`` nodes in?"""
        for j, base in enumerate(self.base):
            if base is None or emitted[j] < self.required(j, taken):
                continue  # no constraint, or not met anyway: nothing to protect
            if emitted[j] + (f if j == owner else 0.0) < self.required(j, taken + 1):
                return False
        return True


def _take_globally(
    frontiers: list[_Frontier], budget: int, cost: MarginalCost | None = None, pace: SloPace | None = None
) -> int:
    """Algorithm 2 lines 18-23: the globally most probable available nodes, over all trees, until the
    budget is spent (or, with ``cost``, until a node no longer pays; with ``pace``, skipping a node that
    would push a request that meets its SLO this step below it); returns the budget left."""
    heap = [(neg_f, i, node) for i, fr in enumerate(frontiers) for neg_f, node in fr.heap]
    heapq.heapify(heap)
    for fr in frontiers:
        fr.heap = []  # the global heap owns the available nodes from here on
    taken = sum(len(fr.taken) for fr in frontiers)
    emitted = [1.0 + sum(fr.f[n] for n in fr.taken) for fr in frontiers]  # bonus token + sum f, per request
    expected = sum(emitted)
    while budget > 0 and heap:
        if cost is not None and not cost.pays(-heap[0][0], expected, taken):
            break
        neg_f, i, node = heapq.heappop(heap)
        if pace is not None and not pace.allows(emitted, taken, i, -neg_f):
            continue  # skipped, and its subtree with it
        taken, expected = taken + 1, expected - neg_f
        emitted[i] -= neg_f
        fr = frontiers[i]
        fr.taken.append(node)
        for child in fr.children[node + 1]:
            heapq.heappush(heap, (-fr.f[child], i, child))
        budget -= 1
    return budget


# ----------------------------------------------------------------------------- selection algorithms
# Each returns, per candidate tree, the indices of the nodes to keep (in the order taken).


def select_slo_customized(
    candidates: Sequence[TokenTree], required: Sequence[float], budget: int, n_max: int,
    cost: MarginalCost | None = None, pace: SloPace | None = None,
) -> list[list[int]]:  # fmt: skip
    """AdaServe's selection (Algorithm 2, lines 3-23) under a budget of ``budget`` verify tokens.

    ``required[i]`` is A(r_i): the tokens request i must emit this iteration to
    stay on its TPOT SLO (0 for best-effort requests). Its own verified token
    is certain (the bonus, n_acc = 1.0, line 6), so a request takes nodes while
    1 + sum f < A_cap = min(A, d + 1) (§4.3 step 2; d = the depth of its
    candidate), at most ``n_max`` of them, most urgent request first (line 9).
    The rest of the budget goes to the globally most probable nodes (step 3); with ``cost``, only
    while a node raises the step's expected goodput (``MarginalCost``); with ``pace``, none that would
    push a request meeting its SLO this step below it (``SloPace``).

    The sum is of path probabilities f(v), as eq. (5) and Theorem 3.1 have
    it; line 15 of Algorithm 2 writes the conditional M_q(v | ...), which only
    equals f(v) on the first layer.
    """
    if len(required) != len(candidates):
        raise ValueError(f"{len(required)} requirements for {len(candidates)} candidate trees")
    frontiers = [_Frontier(tree) for tree in candidates]
    left = budget - len(candidates)  # line 7: one token per request for its root
    # line 9: descending A(r); sorted() is stable, so ties keep batch order
    for i in sorted(range(len(candidates)), key=lambda i: -required[i]):
        a_cap = min(required[i], tree_depth(candidates[i]) + 1)
        fr, n_acc = frontiers[i], 1.0
        while n_acc < a_cap and len(fr.taken) < n_max and left > 0 and fr:  # line 12
            n_acc += fr.take()
            left -= 1
    _take_globally(frontiers, left, cost, pace)
    return [fr.taken for fr in frontiers]


def select_global_greedy(
    candidates: Sequence[TokenTree], budget: int, cost: MarginalCost | None = None
) -> list[list[int]]:
    """GlobalGreedy (AdaServe §6.3): the most probable nodes across all trees, no SLO step."""
    frontiers = [_Frontier(tree) for tree in candidates]
    _take_globally(frontiers, budget - len(candidates), cost)
    return [fr.taken for fr in frontiers]


def select_equal_greedy(candidates: Sequence[TokenTree], budget: int) -> list[list[int]]:
    """EqualGreedy (AdaServe §6.3): each request gets an equal share floor(B / n) of the budget (its
    root included) and fills it with its own most probable nodes; shares are not lent to others."""
    if not candidates:
        return []
    share = budget // len(candidates) - 1
    out = []
    for tree in candidates:
        fr = _Frontier(tree)
        while len(fr.taken) < share and fr:
            fr.take()
        out.append(fr.taken)
    return out
