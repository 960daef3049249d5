"""Prompt-lookup drafting: matching rules, tree shape, the engine interface, and lossless SD with it."""

import random

import pytest

from shared.engine.errors import DuplicateSequenceError, InvalidRequestError, UnknownSequenceError
from shared.engine.ngram_drafter import NgramDraftEngine, NgramIndex, propose_chain, propose_tree
from shared.engine.target_engine import TargetEngine
from shared.engine.tree import validate_tree
from shared.engine.types import PrefillItem, SpecItem, VerifyItem

from conftest import make_runner

NUM_TOKENS = 24


def run_sd(target, draft, prompts, shape_of):
    """prefill → (speculate → verify)* on a batch until every request has NUM_TOKENS; returns (outputs, steps)."""
    outs, new = {}, {}
    for r in target.prefill([PrefillItem(k, v) for k, v in prompts.items()]):
        outs[r.seq_id] = [r.first_token]
        new[r.seq_id] = [r.first_token]
    draft.prefill([PrefillItem(k, v) for k, v in prompts.items()])
    steps = 0
    while live := [k for k in prompts if len(outs[k]) < NUM_TOKENS]:
        trees = draft.speculate([shape_of(i, k, new[k]) for i, k in enumerate(live)])
        for k, accepted in zip(live, target.verify([VerifyItem(k, t) for k, t in zip(live, trees)])):
            outs[k] += accepted.tokens
            new[k] = accepted.tokens
        steps += 1
    return {k: v[:NUM_TOKENS] for k, v in outs.items()}, steps


def chain(tokens, k, **kw):
    return propose_chain(NgramIndex(tokens, **kw), k).token_ids


def test_longest_suffix_wins_over_more_recent_shorter_match():
    #          0  1  2  3  4  5  6  7  8  9
    tokens = [7, 1, 2, 3, 9, 9, 5, 2, 3, 6, 1, 2, 3]
    # suffix (1, 2, 3) occurs at 1 -> continues 9 9 5; (2, 3) alone also occurs at 7 -> 6, but 3-gram wins
    assert chain(tokens, 3) == [9, 9, 5]
    assert chain(tokens, 3, max_ngram=2) == [6, 1, 2]  # with n <= 2 the most recent (2, 3) wins


def test_most_recent_occurrence_and_short_continuations():
    tokens = [4, 5, 1, 4, 5, 2, 4, 5]
    assert chain(tokens, 2) == [2, 4]  # most recent earlier "4 5" is at 3
    assert chain([3, 8, 3], 5) == [8, 3]  # continuation runs into the end: fewer than k tokens
    assert chain([1, 2, 3, 4], 4) == []  # nothing repeats: no proposal
    assert chain([1, 2, 1, 2], 0) == []
    assert chain([5, 5, 5, 5], 3) == [5]  # "5 5 5" at 0 is followed by exactly one token


def test_min_ngram_excludes_short_matches():
    assert chain([1, 9, 2, 3, 1], 2) == [9, 2]
    assert chain([1, 9, 2, 3, 1], 2, min_ngram=2) == []


def test_chain_tree_shape_and_point_masses():
    tree = propose_chain(NgramIndex([1, 2, 3, 4, 1, 2]), 2)
    assert tree.token_ids == [3, 4] and tree.parent_ids == [-1, 0]
    assert tree.draft_probs == [1.0, 1.0] and not tree.child_dists  # deterministic picks


def test_tree_merges_matches_into_a_trie():
    # "a b" is followed by: c d (at 0), c e (at 5), x y (at 10); most recent first
    a, b, c, d, e, x, y = 1, 2, 3, 4, 5, 6, 7
    tokens = [a, b, c, d, 0, a, b, c, e, 0, a, b, x, y, 0, a, b]
    tree = propose_tree(NgramIndex(tokens, min_ngram=2, max_ngram=2), depth=2, width=3)
    validate_tree(tree.token_ids, tree.parent_ids, 16)
    paths = set()
    for i in range(len(tree)):
        if i not in tree.parent_ids:  # a leaf
            path, j = [], i
            while j >= 0:
                path.append(tree.token_ids[j])
                j = tree.parent_ids[j]
            paths.add(tuple(reversed(path)))
    assert paths == {(x, y), (c, e), (c, d)}
    assert len(tree) == 5  # x y c e d: the shared "c" is one node
    probs = dict(zip(zip(tree.parent_ids, tree.token_ids), tree.draft_probs))
    assert probs[(-1, c)] == pytest.approx(2 / 3) and probs[(-1, x)] == pytest.approx(1 / 3)
    # width 1 is the chain
    narrow = propose_tree(NgramIndex(tokens, min_ngram=2, max_ngram=2), depth=2, width=1)
    assert narrow.token_ids == [x, y] and narrow.parent_ids == [-1, 0]


def test_tree_width_caps_branches_and_depth_caps_length():
    rng = random.Random(0)
    tokens = [rng.randrange(5) for _ in range(300)]
    for depth, width in [(1, 1), (3, 2), (5, 4), (8, 16)]:
        tree = propose_tree(NgramIndex(tokens), depth, width)
        validate_tree(tree.token_ids, tree.parent_ids, 5)
        leaves = [i for i in range(len(tree)) if i not in tree.parent_ids]
        assert 1 <= len(leaves) <= width
        depths = []
        for i, p in enumerate(tree.parent_ids):
            depths.append(0 if p < 0 else depths[p] + 1)
        assert max(depths) < depth
        assert all(0 < q <= 1 for q in tree.draft_probs)


def test_index_matches_brute_force():
    rng = random.Random(1)
    for _ in range(200):
        tokens = [rng.randrange(4) for _ in range(rng.randint(1, 40))]
        k = rng.randint(1, 5)
        expected = []
        for n in range(min(3, len(tokens) - 1), 0, -1):
            suffix = tokens[-n:]
            hits = [s for s in range(len(tokens) - n) if tokens[s : s + n] == suffix]
            if hits:
                expected = tokens[hits[-1] + n : hits[-1] + n + k]
                break
        index = NgramIndex(tokens[:1], max_ngram=3)
        index.extend(tokens[1:])  # built incrementally, as the engine does
        assert propose_chain(index, k).token_ids == expected, tokens


def test_engine_interface():
    engine = NgramDraftEngine(vocab_size=10)
    engine.prefill([PrefillItem("a", [1, 2, 3, 1, 2]), PrefillItem("b", [4])])
    trees = engine.speculate([SpecItem("a", [], chain_len=2), SpecItem("b", [5, 4], chain_len=3)])
    assert trees[0].token_ids == [3, 1] and trees[1].token_ids == [5, 4]
    assert engine.runner.get("b").index.token_ids == [4, 5, 4]
    tree = engine.speculate([SpecItem("a", [3], tree_depth=2, tree_width=2)])[0]
    assert tree.token_ids[:2] == [1, 2]
    assert len(engine.costs) == 1 and engine.costs[0].duration_s >= 0
    with pytest.raises(InvalidRequestError):
        engine.speculate([SpecItem("a", [10], chain_len=1)])  # outside the vocabulary
    with pytest.raises(InvalidRequestError):
        engine.speculate([SpecItem("a", [], chain_len=2, tree_depth=2, tree_width=1)])
    with pytest.raises(DuplicateSequenceError):
        engine.prefill([PrefillItem("a", [1])])
    engine.release(["a", "b"])
    with pytest.raises(UnknownSequenceError):
        engine.speculate([SpecItem("a", [], chain_len=1)])
    assert not engine.runner.seqs


def repetitive_prompts(batch, seed):
    """Prompts that repeat a motif, so lookup has something to find."""
    rng = random.Random(seed)
    prompts = {}
    for i in range(batch):
        motif = [rng.randrange(96) for _ in range(rng.randint(2, 6))]
        prompts[f"r{i}"] = (motif * 6)[: rng.randint(8, 30)] + [rng.randrange(96)]
    return prompts


@pytest.mark.parametrize(
    "shape",
    [
        lambda i, k, new: SpecItem(k, new, chain_len=4),
        lambda i, k, new: SpecItem(k, new, tree_depth=3, tree_width=3),
        lambda i, k, new: SpecItem(k, new, chain_len=i % 3) if i % 2 else SpecItem(k, new, tree_depth=2, tree_width=2),
    ],
    ids=["chain4", "tree3x3", "mixed"],
)
def test_ngram_sd_equals_target_greedy(target_model, reference, shape):
    prompts = repetitive_prompts(4, seed=5)
    target = TargetEngine(make_runner(target_model))
    draft = NgramDraftEngine(vocab_size=96)
    outs, steps = run_sd(target, draft, prompts, shape)
    for k, prompt in prompts.items():
        assert outs[k] == reference.greedy(prompt, NUM_TOKENS), k
    target.release(list(prompts))
    target.runner.check_accounting()
    assert steps <= NUM_TOKENS


def test_ngram_drafts_get_accepted_on_repetitive_output(target_model, reference):
    """The tiny random target loops; once it does, lookup should predict it and SD take fewer steps."""
    prompts = {f"r{i}": p + reference.greedy(p, 40) for i, p in enumerate(repetitive_prompts(3, seed=2).values())}
    target = TargetEngine(make_runner(target_model))
    outs, steps = run_sd(target, NgramDraftEngine(vocab_size=96), prompts, lambda i, k, new: SpecItem(k, new, chain_len=6))
    for k, prompt in prompts.items():
        assert outs[k] == reference.greedy(prompt, NUM_TOKENS)
    assert steps < NUM_TOKENS - 1  # plain decoding would take NUM_TOKENS - 1 verify steps
