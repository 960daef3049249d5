"""The confidence-stopped chain (SmartSpec App. A, Algorithm 3) under sampling: lossless, by chi-square.

A chain drafter with a threshold T keeps the token whose confidence crosses T and stops after it
(Algorithm 3: a request drafts while its last token's confidence is above T). The chain's length is then a
stopping rule, so verification emits what the target alone would. The check drives the real ``ChainDrafter``
with fixed draft logits and verifies with the real ``accept_tree``; the first emitted token must follow the
target's distribution. The issue's counterexample: q = (0.9, 0.1), p = (0.5, 0.5), T = 0.5; a drafter that
throws the unsure token away emits token 0 with probability 0.55.
"""

from __future__ import annotations

import pytest
import torch

from shared.engine.acceptance import accept_tree
from shared.engine.drafting import ChainDrafter
from shared.engine.sampling import make_generator, probs_from_logits
from shared.engine.sequence import Sequence
from shared.engine.types import SamplingParams

from test_engine_sampling import chi_square

ALPHA = 1e-3  # chi-square significance; every generator is seeded, so the outcome is deterministic
TRIALS = 4000


def draft_chain(q_logits: torch.Tensor, length: int, threshold: float, params: SamplingParams, seed: int):
    """One chain per call from a drafter that sees ``q_logits`` [vocab] at every row (a context-free draft)."""
    seq = Sequence("s", [0], params, generator=make_generator(seed))

    def draft():
        drafter = ChainDrafter(seq, length, threshold, top_k=64)
        while not drafter.done:
            drafter.absorb(q_logits[None])
        return drafter.tree

    return draft


def first_token_counts(q: list[float], p: list[float], length: int, threshold: float, params: SamplingParams):
    q_logits = torch.tensor(q).log()  # [vocab]
    p_logits = torch.tensor(p).log()  # [vocab]
    draft, gen = draft_chain(q_logits, length, threshold, params, seed=7), make_generator(8)
    counts = torch.zeros(len(p))  # [vocab]
    lengths = []
    for _ in range(TRIALS):
        tree = draft()
        rows = p_logits.expand(1 + len(tree), len(p))  # [1 + num_nodes, vocab]
        counts[accept_tree(tree, rows, params, gen).tokens[0]] += 1
        lengths.append(len(tree))
    return counts, lengths


@pytest.mark.parametrize("threshold", [0.5, 0.95])
def test_confidence_stopped_chain_first_token_follows_the_target(threshold):
    params = SamplingParams(temperature=1.0, seed=1)
    q, p = [0.9, 0.1], [0.5, 0.5]
    counts, lengths = first_token_counts(q, p, length=2, threshold=threshold, params=params)
    assert chi_square(counts, probs_from_logits(torch.tensor(p).log()[None], params)[0]) > ALPHA, counts
    assert min(lengths) >= 1  # Algorithm 3: the first token is always proposed (confidence starts at 1)
    assert len(set(lengths)) > 1 or threshold >= 0.95  # the threshold did stop chains


def test_confidence_stopped_chain_on_a_larger_vocabulary_with_top_p():
    params = SamplingParams(temperature=0.8, top_p=0.9, seed=2)
    q, p = [0.55, 0.2, 0.15, 0.06, 0.04], [0.1, 0.3, 0.3, 0.2, 0.1]
    counts, lengths = first_token_counts(q, p, length=4, threshold=0.3, params=params)
    assert chi_square(counts, probs_from_logits(torch.tensor(p).log()[None], params)[0]) > ALPHA, counts
    assert 1 < sum(lengths) / len(lengths) < 4  # stopped early, and not always at once


def test_the_token_that_crosses_the_threshold_is_kept_and_drafting_stops_after_it():
    params = SamplingParams(temperature=0.0)  # greedy: the argmax, whose probability is 0.4 < T
    seq = Sequence("s", [0], params)
    drafter = ChainDrafter(seq, 5, confidence_threshold=0.5)
    drafter.absorb(torch.tensor([0.4, 0.3, 0.3]).log()[None])
    assert drafter.done and drafter.tree.token_ids == [0] and drafter.tree.draft_probs == pytest.approx([0.4])
    sure = ChainDrafter(Sequence("t", [0], params), 3, confidence_threshold=0.5)
    while not sure.done:
        sure.absorb(torch.tensor([0.8, 0.1, 0.1]).log()[None])
    assert sure.tree.token_ids == [0, 0, 0]  # confident all the way: the chain's full length


def test_smartspec_conf_verify_length_keeps_sampled_chains_lossless():
    """The policy's verify-length choice (Algorithm 3 line 13) on the drafted chains, then verification: a sampled
    request's first token still follows the target (its chain is verified as drafted), while a greedy request's
    unsure tail is cut."""
    from scheduler.policies.smartspec import SmartSpecConfidence, SmartSpecConfig
    from scheduler.request import Request
    from scheduler.spec_shape import SpecContext
    from shared.profiling.cost_model import CostModel

    params = SamplingParams(temperature=1.0, seed=3)
    policy = SmartSpecConfidence(SmartSpecConfig(confidence_threshold=0.05, max_k=4))
    verify_cost = CostModel(alpha_s=1e-6, gamma_s=0.01, delta_s=0.03, verify_s=0.0)  # a verified token costs: cuts pay
    selector, ctx = policy.tree_selector(), SpecContext(0.0, 0, True, cost_model=verify_cost)
    sampled = Request("s", [1] * 20, sampling=params, max_new_tokens=100)
    q, p = [0.55, 0.2, 0.15, 0.06, 0.04], [0.1, 0.3, 0.3, 0.2, 0.1]
    draft = draft_chain(torch.tensor(q).log(), 4, 0.05, params, seed=9)
    p_logits, gen = torch.tensor(p).log(), make_generator(10)
    counts = torch.zeros(len(p))  # [vocab]
    for _ in range(TRIALS):
        (tree,) = selector.select([sampled], [draft()], ctx)
        rows = p_logits.expand(1 + len(tree), len(p))  # [1 + num_nodes, vocab]
        counts[accept_tree(tree, rows, params, gen).tokens[0]] += 1
    assert chi_square(counts, torch.tensor(p)) > ALPHA, counts
    greedy = Request("g", [1] * 20, max_new_tokens=100)
    from shared.engine.types import TokenTree

    (cut,) = selector.select([greedy], [TokenTree.chain([5, 6, 7, 8], [0.9, 0.05, 0.5, 0.5])], ctx)
    assert cut.token_ids == [5]
