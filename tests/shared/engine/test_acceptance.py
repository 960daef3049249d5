"""Lossless acceptance: the rule by hand, greedy walks, and statistics against the target.

The statistical tests compare emitted-token frequencies with the target's own
distribution using a chi-square goodness-of-fit test at significance ALPHA.
Every generator is seeded, so each test is deterministic: it either always
passes or always fails. ``test_chisquare_catches_a_lossy_rule`` shows the same
test has the power to flag a classic bug.
"""

import math

import pytest
import torch
from scipy.stats import binomtest, chisquare

from shared.engine import acceptance
from shared.engine.acceptance import (
    accept_batch,
    accept_chain,
    accept_probability,
    accept_tree,
    residual,
)
from shared.engine.errors import EngineError, InvalidRequestError, InvalidTreeError
from shared.engine.sampling import make_generator, probs_from_logits
from shared.engine.types import SamplingParams, SparseDist, TokenTree

ALPHA = 1e-3  # chi-square / binomial significance level; all seeds fixed -> deterministic outcome
TRIALS = 8_000  # per statistical test; the lossy-rule control below is caught with 5_000
SAMPLING = SamplingParams(temperature=1.0)
GREEDY = SamplingParams(temperature=0.0)


def sparse(probs: list[float]) -> SparseDist:
    """A dense probability list as a SparseDist over the tokens with non-zero mass."""
    ids = [t for t, pr in enumerate(probs) if pr > 0]
    return SparseDist(token_ids=torch.tensor(ids), probs=torch.tensor([probs[t] for t in ids]))


def logits_of(*rows: list[float]) -> torch.Tensor:
    """Logits whose softmax (T = 1) is each given probability row; zeros become -inf."""
    return torch.tensor(rows, dtype=torch.float64).log().float()  # [num_rows, vocab_size]


# ---- the rule, by hand (vocab 4) ---------------------------------------------------

P = torch.tensor([0.5, 0.3, 0.2, 0.0])
Q = torch.tensor([0.25, 0.25, 0.25, 0.25])


@pytest.mark.parametrize(
    "q, token, expected",
    [
        (Q, 0, 1.0),  # p = 0.5 >= q = 0.25: always accept
        (Q, 2, 0.8),  # p = 0.2 <  q = 0.25: accept with p/q
        (Q, 3, 0.0),  # target never emits 3
        (None, 0, 0.5),  # point mass: accept with p(x)
        (None, 3, 0.0),
    ],
)
def test_accept_probability(q, token, expected):
    assert accept_probability(P, q, token) == pytest.approx(expected)


def test_residual_is_normalised_positive_part():
    # max(0, p - q) = [0.25, 0.05, 0, 0], mass 0.3
    torch.testing.assert_close(residual(P, Q, 2), torch.tensor([0.25 / 0.3, 0.05 / 0.3, 0.0, 0.0]))


def test_residual_of_point_mass_removes_the_token():
    torch.testing.assert_close(residual(P, None, 0), torch.tensor([0.0, 0.6, 0.4, 0.0]))


def test_degenerate_residual_falls_back_to_p():
    # p == q leaves no mass; rejection could only have been a rounding event, keep p
    assert torch.equal(residual(P, P.clone(), 1), P)
    one_hot = torch.tensor([0.0, 1.0, 0.0, 0.0])
    assert torch.equal(residual(one_hot, None, 1), one_hot)


def exact_output(p: torch.Tensor, q: torch.Tensor | None, rounds: int, tokens: list[int] | None = None) -> torch.Tensor:
    """Exact distribution of the first emitted token after ``rounds`` candidate children.

    Sampled children (q given) are enumerated over x ~ q; point-mass children use ``tokens``.
    out_0(p) = p (the bonus draw); out_k(p) = E_x[ a(x) delta_x + (1 - a(x)) out_{k-1}(residual) ].
    """
    if rounds == 0:
        return p
    out = torch.zeros_like(p)
    candidates = [(x, float(q[x])) for x in range(len(p)) if q[x] > 0] if q is not None else [(tokens[0], 1.0)]
    rest = tokens[1:] if tokens is not None else None
    for x, weight in candidates:
        a = accept_probability(p, q, x)
        out[x] += weight * a
        out += weight * (1 - a) * exact_output(residual(p, q, x), q, rounds - 1, rest)
    return out


@pytest.mark.parametrize("rounds", [1, 2, 3])
@pytest.mark.parametrize(
    "q",
    [Q, torch.tensor([0.0, 0.1, 0.2, 0.7]), torch.tensor([0.6, 0.1, 0.3, 0.0])],
    ids=["uniform", "garbage", "close"],
)
def test_multi_round_rule_is_exactly_lossless(q, rounds):
    torch.testing.assert_close(exact_output(P, q, rounds), P)


@pytest.mark.parametrize("tokens", [[0], [1, 0], [3, 2, 1], [1, 1]])
def test_point_mass_rule_is_exactly_lossless(tokens):
    torch.testing.assert_close(exact_output(P, None, len(tokens), tokens), P)


# ---- greedy walks ---------------------------------------------------------------------


def argmax_logits(best: list[int], vocab_size: int = 6) -> torch.Tensor:
    """Logits whose argmax at row r is best[r]."""
    logits = torch.zeros(len(best), vocab_size)  # [num_rows, vocab_size]
    logits[torch.arange(len(best)), torch.tensor(best)] = 5.0
    return logits


#   root ── n0 (2)
#       └── n1 (3) ── n2 (1) ── n3 (0)
#                 └── n4 (5)
GREEDY_TREE = TokenTree(token_ids=[2, 3, 1, 0, 5], parent_ids=[-1, -1, 1, 2, 1])


def test_greedy_second_child_matches_and_walk_reaches_leaf():
    # rows: 0 root, 1 n0, 2 n1, 3 n2, 4 n3, 5 n4
    result = accept_tree(GREEDY_TREE, argmax_logits([3, 0, 1, 0, 4, 0]), GREEDY)
    assert result.accepted_nodes == [1, 2, 3]
    assert result.tokens == [3, 1, 0, 4]  # bonus = argmax at the leaf n3's row
    assert result.node_status == [0, 1, 1, 1, 0]  # n0 and n4 lost to their matching siblings


def test_greedy_rejects_at_root():
    result = accept_tree(GREEDY_TREE, argmax_logits([4, 0, 1, 0, 4, 0]), GREEDY)
    assert result.accepted_nodes == [] and result.tokens == [4] and result.bonus_token == 4
    assert result.node_status == [0, 0, -1, -1, -1]


def test_greedy_stops_midway_with_bonus_correction():
    result = accept_tree(GREEDY_TREE, argmax_logits([3, 0, 4, 0, 0, 0]), GREEDY)
    assert result.accepted_nodes == [1] and result.tokens == [3, 4]
    assert result.node_status == [0, 1, 0, -1, 0]


def test_greedy_chain_and_empty_tree():
    result = accept_chain([1, 2, 3], argmax_logits([1, 2, 5, 0]), GREEDY)
    assert result.tokens == [1, 2, 5] and result.node_status == [1, 1, 0]
    plain = accept_tree(TokenTree(), argmax_logits([4]), GREEDY)
    assert plain.tokens == [4] and plain.node_status == []


def test_greedy_ignores_top_p_and_draws_nothing():
    params = SamplingParams(temperature=0.0, top_p=0.1, seed=1)
    gen = make_generator(0)
    state = gen.get_state()
    result = accept_chain([1], argmax_logits([1, 2]), params, gen)
    assert result.tokens == [1, 2]
    assert torch.equal(gen.get_state(), state)


# ---- sampling, deterministic corners ----------------------------------------------------


def test_sure_accept_and_sure_reject():
    #   root ── n0 (1)            p_root = delta_2: n0 always rejected, then n1 always accepted,
    #       ├── n1 (2) ── n2 (0)  so n3 is never tried; at n1's row p = delta_3: n2 always rejected
    #       └── n3 (3)            and the bonus is 3
    gen = make_generator(0)
    tree = TokenTree([1, 2, 0, 3], [-1, -1, 1, -1])
    logits = logits_of([0, 0, 1, 0], [1, 0, 0, 0], [0, 0, 0, 1], [1, 0, 0, 0], [1, 0, 0, 0])  # root, n0..n3
    for _ in range(100):
        result = accept_tree(tree, logits, SAMPLING, gen)
        assert result.node_status == [0, 1, 0, -1]
        assert result.accepted_nodes == [1] and result.tokens == [2, 3]


def test_q_below_p_always_accepts():
    gen = make_generator(0)
    logits = logits_of([0.7, 0.1, 0.1, 0.1], [0.25, 0.25, 0.25, 0.25])
    q = sparse([0.4, 0.2, 0.2, 0.2])  # q(0) = 0.4 <= p(0) = 0.7
    assert all(accept_chain([0], logits, SAMPLING, gen, [q]).num_accepted == 1 for _ in range(200))


def test_acceptance_rate_is_min_one_p_over_q():
    gen = make_generator(1)
    logits = logits_of([0.25, 0.25, 0.25, 0.25], [0.25, 0.25, 0.25, 0.25])
    q = sparse([0.1, 0.5, 0.2, 0.2])  # token 1: min(1, 0.25 / 0.5) = 0.5
    accepted = sum(accept_chain([1], logits, SAMPLING, gen, [q]).num_accepted for _ in range(4000))
    assert binomtest(accepted, 4000, 0.5).pvalue > ALPHA


def test_seeded_acceptance_reproduces():
    logits = torch.randn(4, 8, generator=torch.Generator().manual_seed(0))  # [1 + 3 nodes, 8]
    tree = TokenTree([1, 2, 3], [-1, -1, 0], child_dists={0: sparse([0.2, 0.3, 0.5])})
    params = SamplingParams(temperature=0.9, top_p=0.95, seed=7)
    runs = []
    for _ in range(2):
        gen = make_generator(params.seed)
        runs.append([accept_tree(tree, logits, params, gen).tokens for _ in range(50)])
    assert runs[0] == runs[1]
    assert len({tuple(t) for t in runs[0]}) > 1  # it does vary from step to step


# ---- statistical losslessness ---------------------------------------------------------------

VOCAB = 5
P_ROOT = [0.35, 0.25, 0.2, 0.15, 0.05]
Q_DRAFT = [0.1, 0.4, 0.1, 0.3, 0.1]


class Draws:
    """Independent draws from q, made in bulk: one multinomial per 4096 tokens instead of one per token."""

    def __init__(self, q: SparseDist, gen: torch.Generator):
        self.q, self.gen, self.buffer = q, gen, []

    def __call__(self) -> int:
        if not self.buffer:
            picks = torch.multinomial(self.q.probs, 4096, replacement=True, generator=self.gen)  # [4096]
            self.buffer = self.q.token_ids[picks].tolist()
        return self.buffer.pop()


def first_token_frequencies(build_tree, logits_row: torch.Tensor, params: SamplingParams, trials: int = TRIALS):
    """Counts of the first emitted token over ``trials`` steps; every row of the target uses ``logits_row``."""
    draft_gen, accept_gen = make_generator(1234), make_generator(5678)
    build = build_tree(draft_gen)
    counts = [0] * VOCAB
    for _ in range(trials):
        tree = build()
        logits = logits_row.expand(1 + len(tree), VOCAB)  # [1 + num_nodes, vocab_size]
        counts[accept_tree(tree, logits, params, accept_gen).tokens[0]] += 1
    return counts


def assert_matches(counts: list[int], p: torch.Tensor):
    """Chi-square over the target's support; tokens outside it must never appear."""
    support = [t for t in range(len(p)) if p[t] > 0]
    assert all(counts[t] == 0 for t in range(len(p)) if p[t] == 0), counts
    observed = [counts[t] for t in support]
    mass = [float(p[t]) for t in support]
    expected = [m / sum(mass) * sum(observed) for m in mass]
    result = chisquare(observed, expected)
    assert result.pvalue > ALPHA, (counts, expected, result)


def chain_from_q(q: SparseDist, length: int):
    """(a) Leviathan: each chain token drawn from q, q reported for its row."""

    def builder(gen):
        draw = Draws(q, gen)
        parents, child_dists = list(range(-1, length - 1)), {row: q for row in range(length)}
        return lambda: TokenTree([draw() for _ in range(length)], parents, child_dists=child_dists)

    return builder


def iid_tree_from_q(q: SparseDist, k: int):
    """(b) SpecInfer: k root children drawn i.i.d. from q (duplicates allowed), each with one grandchild from q."""

    def builder(gen):
        draw = Draws(q, gen)
        parents, child_dists = [-1] * k + list(range(k)), {row: q for row in range(k + 1)}
        return lambda: TokenTree([draw() for _ in range(2 * k)], parents, child_dists=child_dists)

    return builder


def deterministic_tree(tokens: list[int], parents: list[int]):
    """(c) Children picked deterministically (greedy / beam draft): no child_dists, point masses."""
    return lambda gen: lambda: TokenTree(list(tokens), list(parents))


Q_SPARSE = sparse(Q_DRAFT)
ROOT_LOGITS = logits_of(P_ROOT)[0]  # [vocab_size]


@pytest.mark.parametrize(
    "build_tree",
    [
        chain_from_q(Q_SPARSE, 3),
        iid_tree_from_q(Q_SPARSE, 3),
        deterministic_tree([1, 3, 3, 0], [-1, -1, 0, 1]),
    ],
    ids=["a-leviathan-chain", "b-specinfer-iid-tree", "c-point-mass-tree"],
)
def test_first_token_is_target_distributed(build_tree):
    assert_matches(first_token_frequencies(build_tree, ROOT_LOGITS, SAMPLING), torch.tensor(P_ROOT))


def test_first_token_with_garbage_drafts_temperature_and_top_p():
    """(d) q nearly disjoint from p; p itself shaped by temperature 0.7 and top-p 0.9."""
    params = SamplingParams(temperature=0.7, top_p=0.9)
    p = probs_from_logits(ROOT_LOGITS[None], params)[0]
    assert p[4] == 0 and p[3] > 0  # top-p cut token 4 only
    garbage = sparse([0.05, 0.0, 0.0, 0.05, 0.9])  # mostly the token the target never emits
    assert_matches(first_token_frequencies(iid_tree_from_q(garbage, 2), ROOT_LOGITS, params), p)


def test_chisquare_catches_a_lossy_rule(monkeypatch):
    """The classic bug -- resampling from p instead of the residual after a rejection -- is caught."""
    monkeypatch.setattr(acceptance, "residual", lambda p, q, token_id: p)
    counts = first_token_frequencies(chain_from_q(Q_SPARSE, 1), ROOT_LOGITS, SAMPLING, trials=5000)
    p = torch.tensor(P_ROOT)
    expected = [float(p[t]) * sum(counts) for t in range(VOCAB)]
    assert chisquare(counts, expected).pvalue < ALPHA


# Two-token stream test: an order-1 Markov target and a different Markov draft over 4 tokens.
P_NEXT = [[0.4, 0.3, 0.2, 0.1], [0.1, 0.2, 0.3, 0.4], [0.25, 0.25, 0.25, 0.25], [0.6, 0.1, 0.1, 0.2]]
Q_NEXT = [[0.1, 0.2, 0.3, 0.4], [0.4, 0.3, 0.2, 0.1], [0.7, 0.1, 0.1, 0.1], [0.25, 0.25, 0.25, 0.25]]
START = 2  # the last committed token


def markov_tree(branching: list[int], context: int, draws: list[Draws] | None) -> TokenTree:
    """A tree whose depth-d nodes each get branching[d] children proposed by the Markov draft.

    ``draws[c]`` samples from Q_NEXT[c]; without it the draft proposes its top choices deterministically.
    """
    tokens, parents, child_dists = [], [], {}
    frontier = [(-1, context)]  # (node, its token); -1 is the root row
    for width in branching:
        next_frontier = []
        for parent, parent_token in frontier:
            if draws is not None:
                child_dists[parent + 1] = draws[parent_token].q
                picks = [draws[parent_token]() for _ in range(width)]  # i.i.d., duplicates allowed
            else:
                picks = sorted(range(4), key=lambda t: -Q_NEXT[parent_token][t])[:width]  # draft's top-width
            for token in picks:
                tokens.append(token)
                parents.append(parent)
                next_frontier.append((len(tokens) - 1, token))
        frontier = next_frontier
    return TokenTree(tokens, parents, child_dists=child_dists)


@pytest.mark.parametrize(
    "branching, sampled",
    [([1, 1], True), ([2, 2], True), ([2, 1], False)],
    ids=["chain2-sampled", "tree2x2-sampled", "tree-point-mass"],
)
def test_first_two_tokens_jointly_target_distributed(branching, sampled):
    """P(x1, x2) = p(x1 | start) * p(x2 | x1), continuing with a fresh step when one step emits one token."""
    next_logits = logits_of(*P_NEXT)  # [4, 4], row c = target logits after token c
    p_next = probs_from_logits(next_logits, SAMPLING).double()  # what the target really samples from
    draft_gen, accept_gen = make_generator(11), make_generator(22)
    draws = [Draws(sparse(row), draft_gen) for row in Q_NEXT] if sampled else None
    counts = [[0] * 4 for _ in range(4)]
    for _ in range(TRIALS):
        emitted, context = [], START
        while len(emitted) < 2:
            tree = markov_tree(branching, context, draws)
            # row 0 conditions on the context, row i + 1 on node i's token
            logits = next_logits[[context] + tree.token_ids]  # [1 + num_nodes, 4]
            emitted += accept_tree(tree, logits, SAMPLING, accept_gen).tokens
            context = emitted[-1]
        counts[emitted[0]][emitted[1]] += 1
    joint = p_next[START][:, None] * p_next  # [4, 4]: p(x1) p(x2 | x1)
    expected = joint / joint.sum() * TRIALS
    result = chisquare(torch.tensor(counts).flatten().numpy(), expected.flatten().numpy())
    assert result.pvalue > ALPHA, (counts, expected, result)


# ---- validation and batching -------------------------------------------------------------------


def test_invalid_inputs_raise():
    logits = torch.zeros(3, 4)
    with pytest.raises(InvalidTreeError, match="node 1 has parent 1"):
        accept_tree(TokenTree([0, 1], [-1, 1]), logits, SAMPLING)
    with pytest.raises(InvalidRequestError, match="token id 4"):
        accept_tree(TokenTree([0, 4], [-1, 0]), logits, SAMPLING)
    with pytest.raises(EngineError, match="target_logits"):
        accept_tree(TokenTree([0], [-1]), logits, SAMPLING)
    with pytest.raises(InvalidRequestError, match="temperature"):
        accept_tree(TokenTree([0, 1], [-1, 0]), logits, SamplingParams(temperature=math.nan))
    with pytest.raises(InvalidRequestError, match="cannot have been sampled"):
        accept_tree(TokenTree([0, 1], [-1, 0], child_dists={0: sparse([0.0, 1.0])}), logits, SAMPLING)
    with pytest.raises(InvalidTreeError, match="child_dists has row 5"):
        accept_tree(TokenTree([0, 1], [-1, 0], child_dists={5: sparse([1.0])}), logits, SAMPLING)
    bad_probs = SparseDist(torch.tensor([0, 1]), torch.tensor([-0.5, 1.5]))
    with pytest.raises(InvalidRequestError, match="probabilities"):
        accept_tree(TokenTree([1, 1], [-1, 0], child_dists={0: bad_probs}), logits, SAMPLING)


def test_accept_batch_packed_equals_list():
    trees = [
        TokenTree([1, 2], [-1, 0]),
        TokenTree(),
        TokenTree([3, 0, 1], [-1, -1, 1], child_dists={0: sparse([0.5, 0, 0, 0.5])}),
    ]
    logits_list = [torch.randn(1 + len(t), 4, generator=torch.Generator().manual_seed(i)) for i, t in enumerate(trees)]
    params_list = [GREEDY, SAMPLING, SamplingParams(temperature=0.8, top_p=0.9)]
    packed = accept_batch(trees, torch.cat(logits_list), params_list, [make_generator(s) for s in (1, 2, 3)])
    listed = accept_batch(trees, logits_list, params_list, [make_generator(s) for s in (1, 2, 3)])
    assert packed == listed and len(packed) == 3
    assert packed[0] == accept_tree(trees[0], logits_list[0], GREEDY)
    with pytest.raises(EngineError, match="rows"):
        accept_batch(trees, torch.zeros(5, 4), params_list)
    with pytest.raises(EngineError, match="batch sizes differ"):
        accept_batch(trees, logits_list, params_list[:2])
