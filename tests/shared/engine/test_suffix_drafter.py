"""Suffix-tree drafting: the trees against brute force (incremental, rollback, eviction), proposal scoring,
chain vs tree, global vs per-request, the engine interface, and lossless SD with it (greedy and sampling)."""

import random
from collections import Counter
from dataclasses import replace

import pytest
import torch
from scipy.stats import chisquare

from shared.engine.acceptance import accept_tree
from shared.engine.errors import DuplicateSequenceError, InvalidRequestError, UnknownSequenceError
from shared.engine.runner import Work
from shared.engine.sampling import make_generator, probs_from_logits
from shared.engine.suffix_drafter import SuffixConfig, SuffixDraftEngine, propose
from shared.engine.suffix_tree import CorpusTree, SequenceTree
from shared.engine.target_engine import TargetEngine
from shared.engine.tree import validate_tree
from shared.engine.types import PrefillItem, SamplingParams, SpecItem, VerifyItem
from shared.models.tiny import build_tiny

from tests.shared.engine.conftest import make_runner  # (not "conftest": another may hold that name)

NUM_TOKENS = 24


# ---------------------------------------------------------------------------- the trees


def brute(seqs, depth):
    """(occurrences of every substring of length <= depth, Counter of the tokens following each)."""
    occ, after = Counter(), {}
    for s in seqs:
        for i in range(len(s)):
            for n in range(1, min(depth, len(s) - i) + 1):
                x = tuple(s[i : i + n])
                occ[x] += 1
                if n < depth and i + n < len(s):
                    after.setdefault(x, Counter())[s[i + n]] += 1
    return occ, after


def assert_tree_holds(tree, seqs):
    """Every substring's count and continuations as brute force has them; nothing else matches."""
    occ, after = brute(seqs, tree.max_depth)
    for x, count in occ.items():
        pos = tree.match(x)
        assert pos is not None, x
        node, off = pos
        assert (node.count if off == 0 else 1) == count, x
        assert {t: c for t, c, _, _ in tree.continuations(pos)} == dict(after.get(x, {})), x
    rng = random.Random(len(occ))
    for _ in range(30):
        x = tuple(rng.randrange(5) for _ in range(rng.randint(1, tree.max_depth + 1)))
        assert (tree.match(x) is not None) == (x in occ), x
    assert count_nodes(tree) == tree.num_nodes


def count_nodes(tree):
    n, stack = 0, [tree.root]
    while stack:
        node = stack.pop()
        n += 1
        stack.extend((node.children or {}).values())
    return n


def test_sequence_tree_grows_incrementally_as_brute_force_says():
    rng = random.Random(0)
    for _ in range(150):
        depth, vocab = rng.randint(1, 6), rng.randint(1, 4)
        tokens = [rng.randrange(vocab) for _ in range(rng.randint(0, 40))]
        cut = rng.randint(0, len(tokens))
        tree = SequenceTree(tokens[:cut], max_depth=depth)
        for i in range(cut, len(tokens)):  # one token at a time, as speculate calls commit them
            tree.extend(tokens[i : i + 1])
        assert tree.tokens == tokens
        assert_tree_holds(tree, [tokens])


def test_the_running_example():
    a, b, c, d = 1, 2, 3, 4
    tree = SequenceTree([a, b, c, a, b, d, a, b], max_depth=3)
    node, off = tree.match([a, b])
    assert (node.count, off) == (3, 0)
    assert [(t, n) for t, n, _, _ in tree.continuations((node, off))] == [(d, 1), (c, 1)]  # ties: most recent first
    assert tree.match([a, b, c, a]) is None  # longer than the depth
    assert tree.own_match(2)[0] == 2  # "a b" occurred before, with something after it


def test_truncate_undoes_appends_and_rebuilds_past_the_undo_log():
    rng = random.Random(1)
    for _ in range(150):
        depth, vocab = rng.randint(1, 6), rng.randint(1, 4)
        tokens = [rng.randrange(vocab) for _ in range(rng.randint(1, 30))]
        tree = SequenceTree(tokens, max_depth=depth, max_undo=rng.randint(1, 8))
        for _ in range(4):
            k = rng.randint(0, len(tokens))
            tree.truncate(k)
            tokens = tokens[: len(tokens) - k]
            assert_tree_holds(tree, [tokens])
            more = [rng.randrange(vocab) for _ in range(rng.randint(0, 8))]
            tree.extend(more)
            tokens += more
            assert_tree_holds(tree, [tokens])
            fresh = SequenceTree(tokens, max_depth=depth)
            for m in range(1, depth + 1):  # the tracked suffixes answer as a walk from the root would
                assert tree.own_match(m) == tree.longest_match(tokens, m)
                assert (tree.own_match(m) or (None,))[0] == (fresh.own_match(m) or (None,))[0]
    with pytest.raises(ValueError):
        SequenceTree([1, 2], max_depth=3).truncate(3)


def test_corpus_adds_removes_and_evicts_the_oldest_under_its_token_cap():
    rng = random.Random(2)
    for _ in range(100):
        depth, vocab, cap = rng.randint(1, 6), rng.randint(1, 3), rng.randint(1, 50)
        corpus = CorpusTree(max_depth=depth, max_tokens=cap)
        gone = []
        for key in range(12):
            before = dict(corpus.seqs)
            tokens = [rng.randrange(vocab) for _ in range(rng.randint(0, 20))]
            corpus.add(key, tokens)
            if tokens:
                assert corpus.seqs[key] == tokens[-cap:]  # longer than the cap: its last tokens
            evicted = [k for k in before if k not in corpus.seqs]
            assert evicted == list(before)[: len(evicted)]  # oldest first
            gone += [before[k] for k in evicted]
            if corpus.seqs and rng.random() < 0.3:
                gone.append(corpus.seqs[rng.choice(list(corpus.seqs))])
                corpus.remove(next(k for k, v in corpus.seqs.items() if v is gone[-1]))
            assert corpus.num_tokens == sum(map(len, corpus.seqs.values())) <= cap
            assert_tree_holds(corpus, list(corpus.seqs.values()))
            # nothing keeps a forgotten sequence alive (memory stays bounded by what is held)
            ids, stack = {id(s) for s in gone}, [corpus.root]
            while stack:
                node = stack.pop()
                assert id(node.src) not in ids
                stack.extend((node.children or {}).values())
        for key in list(corpus.seqs):
            corpus.remove(key)
        assert corpus.num_nodes == 1 and not corpus.root.children and corpus.num_tokens == 0
    empty = CorpusTree(max_depth=4, max_tokens=0)
    empty.add("x", [1, 2, 3])
    assert not empty.seqs and empty.num_nodes == 1


def test_implicit_tails_keep_the_node_count_near_the_token_count():
    rng = random.Random(3)
    tokens = [rng.randrange(1000) for _ in range(3000)]
    tree = SequenceTree(tokens, max_depth=24)
    assert tree.num_nodes < 1.5 * len(tokens)  # a plain depth-24 trie: ~24 nodes per token
    copied = SequenceTree(tokens[:500] * 4, max_depth=24)
    assert copied.num_nodes <= 24 * 500 + 2 * 2000  # repeats cost nodes, but never more than depth per token


# ---------------------------------------------------------------------------- proposals


def paths(tree):
    out = []
    for i in range(len(tree)):
        path, j = [], i
        while j >= 0:
            path.append(tree.token_ids[j])
            j = tree.parent_ids[j]
        out.append(tuple(reversed(path)))
    return out


def test_scores_are_products_of_conditional_frequencies():
    a, b, c, d, e, x = 1, 2, 3, 4, 5, 9
    # after "a b": c d (twice), c e (once), d (once)
    tokens = [a, b, c, d, x, a, b, c, d, x, a, b, c, e, x, a, b, d, x, a, b]
    tree = SequenceTree(tokens, max_depth=8)
    p, pos = tree.own_match(max_match=2)
    assert p == 2
    out, score = propose(tree, pos, budget=10, depth=3, width=4)
    probs = dict(zip(paths(out), out.draft_probs))
    assert probs[(c,)] == pytest.approx(3 / 4) and probs[(d,)] == pytest.approx(1 / 4)
    assert probs[(c, d)] == pytest.approx(2 / 3) and probs[(c, e)] == pytest.approx(1 / 3)
    assert paths(out)[:3] == [(c,), (c, d), (c, d, x)]  # best first: 3/4, then 3/4 * 2/3 = 1/2, then 1/2
    path_scores = []  # a node's score: the product of the conditional frequencies on its path
    for parent, prob in zip(out.parent_ids, out.draft_probs):
        path_scores.append(prob * (path_scores[parent] if parent >= 0 else 1.0))
    assert dict(zip(paths(out), path_scores))[(c, e, x)] == pytest.approx(1 / 4)
    assert score == pytest.approx(sum(path_scores))  # = expected accepted tokens, were the frequencies p
    assert not out.child_dists  # deterministic picks: point masses
    # min_prob drops the unlikely branches, budget caps the node count
    pruned, _ = propose(tree, pos, budget=10, depth=3, width=4, min_prob=0.3)
    assert set(paths(pruned)) == {(c,), (c, d), (c, d, x)}
    assert len(propose(tree, pos, budget=2, depth=3, width=4)[0]) == 2


def test_chain_is_the_best_path_and_a_tree_keeps_its_width_per_level():
    rng = random.Random(4)
    tokens = [rng.randrange(4) for _ in range(400)]
    tree = SequenceTree(tokens, max_depth=12)
    p, pos = tree.own_match(max_match=3)
    chain, _ = propose(tree, pos, budget=6, depth=6, width=1)
    assert chain.parent_ids == list(range(-1, len(chain) - 1)) and len(chain) == 6
    at = pos
    for token, prob in zip(chain.token_ids, chain.draft_probs):  # each step takes the most frequent child
        kids = tree.continuations(at)
        assert kids[0][0] == token and prob == pytest.approx(kids[0][1] / sum(k[1] for k in kids))
        at = kids[0][3]
    for depth, width in [(1, 1), (2, 3), (4, 2), (5, 4)]:
        out, _ = propose(tree, pos, budget=depth * width, depth=depth, width=width)
        validate_tree(out.token_ids, out.parent_ids, 4)
        levels = Counter(len(q) for q in paths(out))
        assert max(levels) <= depth and max(levels.values()) <= width
        siblings = Counter(zip(out.parent_ids, out.token_ids))
        assert max(siblings.values()) == 1  # distinct tokens under one parent
        assert out.token_ids[0] == chain.token_ids[0]


def test_an_expansion_takes_each_nodes_most_frequent_continuations():
    """SpecInfer's <1,1,3,1,1,1,1,1> on a suffix tree: every node at depth d gets its expansion[d] most frequent
    continuations (fewer only where the history has fewer), not a level's width shared across branches."""
    rng = random.Random(4)
    tokens = [rng.randrange(4) for _ in range(2000)]
    tree = SequenceTree(tokens, max_depth=12)
    p, pos = tree.own_match(max_match=3)
    expansion = (1, 1, 3, 1, 1, 1, 1, 1)
    out, _ = propose(tree, pos, budget=20, depth=8, width=3, expansion=expansion)
    validate_tree(out.token_ids, out.parent_ids, 4)
    assert len(out) == 20  # 1 + 1 + 3 x 6: a long random history has the continuations
    children = Counter(out.parent_ids)
    for node in range(len(out)):
        level = len(paths(out)[node])
        if level < 8:
            assert children[node] == expansion[level]


def engine(**config):
    return SuffixDraftEngine(vocab_size=100, config=SuffixConfig(**config))


def test_max_spec_grows_with_the_match_length():
    motif = list(range(10, 30))
    e = engine(alpha=0.5, min_prob=0.0)
    e.prefill([PrefillItem("s", motif + motif[:6])])  # the suffix matches 6 tokens (max_match 12)
    assert len(e.speculate([SpecItem("s", [], chain_len=10)])[0]) == 3  # floor(0.5 * 6)
    assert len(e.speculate([SpecItem("s", motif[6:10], chain_len=10)])[0]) == 5  # p = 10
    assert len(e.speculate([SpecItem("s", motif[10:14], chain_len=10)])[0]) == 6  # p capped at max_match 12
    assert len(e.speculate([SpecItem("s", [], chain_len=4)])[0]) == 4  # the request's shape caps it too


def test_global_tree_serves_other_requests_and_the_better_score_wins():
    e = engine(alpha=4.0, min_prob=0.0)
    answer = [50, 51, 52, 53, 54, 55]
    e.prefill([PrefillItem("first", [1, 2, 3])])
    e.speculate([SpecItem("first", answer, chain_len=0)])
    assert e.speculate([SpecItem("first", [], chain_len=3)])[0].token_ids == []  # no repeat within it yet
    e.release(["first"])  # its output (not its prompt) joins the global tree
    assert list(e.runner.corpus.seqs.values()) == [answer]
    e.prefill([PrefillItem("second", [7, 8, 50, 51])])
    assert e.speculate([SpecItem("second", [], chain_len=3)])[0].token_ids == [52, 53, 54]
    for i in range(2):  # two more outputs that go "50 51 52 53"
        e.prefill([PrefillItem(f"more{i}", [9])])
        e.speculate([SpecItem(f"more{i}", [50, 51, 52, 53], chain_len=0)])
        e.release([f"more{i}"])
    # per request: "50 51" -> 99 98 97, each once seen, once followed (score 3);
    # global: "50 51" -> 52 53 (3 of 3 outputs), then 54 (1 of 3): score 2 1/3. The request's own tree wins.
    e.prefill([PrefillItem("own", [50, 51, 99, 98, 97, 50, 51])])
    assert e.speculate([SpecItem("own", [], chain_len=3)])[0].token_ids == [99, 98, 97]
    # per request: "50 51" -> 99 or 52 (1/2 each): score 1/2 + 1/2; global: 52 53 (score 2). Global wins.
    e.prefill([PrefillItem("split", [50, 51, 99, 7, 50, 51, 52, 8, 50, 51])])
    assert e.speculate([SpecItem("split", [], chain_len=2)])[0].token_ids == [52, 53]
    e.runner.check_accounting()


def test_global_tree_is_bounded_and_evicts_oldest_outputs():
    e = engine(global_tokens=10)
    for i in range(5):
        e.prefill([PrefillItem(f"r{i}", [1])])
        e.speculate([SpecItem(f"r{i}", [10 + i] * 4, chain_len=0)])
        e.release([f"r{i}"])
        assert e.runner.corpus.num_tokens <= 10
    assert list(e.runner.corpus.seqs.values()) == [[13] * 4, [14] * 4]  # the newest two fit
    e.runner.check_accounting()


def test_engine_interface_and_errors():
    e = SuffixDraftEngine(vocab_size=10)
    e.prefill([PrefillItem("a", [1, 2, 3, 1, 2]), PrefillItem("b", [4])])
    trees = e.speculate([SpecItem("a", [], chain_len=2), SpecItem("b", [5, 4], chain_len=3)])
    assert trees[0].token_ids == [3, 1] and trees[1].token_ids == [5, 4]  # b: p = 1, so at most 2 * 1 tokens
    assert e.runner.get("b").tokens == [4, 5, 4]
    assert len(e.costs) == 1 and e.costs[0].num_batched_tokens == 4
    cases = [
        (InvalidRequestError, lambda: e.speculate([SpecItem("a", [10], chain_len=1)])),  # outside the vocabulary
        (InvalidRequestError, lambda: e.speculate([SpecItem("a", [], chain_len=2, tree_depth=2, tree_width=1)])),
        (InvalidRequestError, lambda: e.speculate([SpecItem("a", [], chain_len=33)])),
        (InvalidRequestError, lambda: e.speculate([SpecItem("a", [1], rollback=5)])),  # only 5 tokens held
        (InvalidRequestError, lambda: e.speculate([SpecItem("a", []), SpecItem("a", [])])),
        (InvalidRequestError, lambda: e.prefill([PrefillItem("c", [])])),
        (InvalidRequestError, lambda: e.prefill([PrefillItem("c", [1, -1])])),
        (DuplicateSequenceError, lambda: e.prefill([PrefillItem("a", [1])])),
        (UnknownSequenceError, lambda: e.speculate([SpecItem("b", [1]), SpecItem("ghost", [1])])),
        (UnknownSequenceError, lambda: e.release(["ghost"])),
    ]
    for error, call in cases:
        with pytest.raises(error):
            call()
    assert e.runner.get("b").tokens == [4, 5, 4]  # a batch with one bad item changed nothing
    assert set(e.runner.seqs) == {"a", "b"}
    e.release(["a", "b"])
    assert not e.runner.seqs
    e.runner.check_accounting()


def test_rollback_leaves_the_state_a_fresh_draft_would_have():
    rng = random.Random(5)
    e, tokens = engine(max_depth=6, max_match=3), [rng.randrange(6) for _ in range(20)]
    e.prefill([PrefillItem("s", tokens)])
    for _ in range(60):
        optimistic = [rng.randrange(6) for _ in range(rng.randint(0, 4))]
        e.speculate([SpecItem("s", optimistic, chain_len=2)])  # an optimistic prefix ...
        true = [rng.randrange(6) for _ in range(rng.randint(1, 4))]
        got = e.speculate([SpecItem("s", true, chain_len=3, rollback=len(optimistic))])[0]  # ... that failed
        tokens += true
        fresh = engine(max_depth=6, max_match=3)
        fresh.prefill([PrefillItem("s", tokens)])
        assert got == fresh.speculate([SpecItem("s", [], chain_len=3)])[0]
        assert_tree_holds(e.runner.get("s").tree, [tokens])


# ---------------------------------------------------------------------------- lossless SD with the engine


def run_sd(target, draft, prompts, shape_of, num_tokens=NUM_TOKENS):
    """prefill → (speculate → verify)* on a batch until every request has num_tokens; returns (outputs, steps)."""
    outs, new = {}, {}
    for r in target.prefill([PrefillItem(k, v) for k, v in prompts.items()]):
        outs[r.seq_id] = [r.first_token]
        new[r.seq_id] = [r.first_token]
    draft.prefill([PrefillItem(k, v) for k, v in prompts.items()])
    steps = 0
    while live := [k for k in prompts if len(outs[k]) < num_tokens]:
        trees = draft.speculate([shape_of(i, k, new[k]) for i, k in enumerate(live)])
        for k, accepted in zip(live, target.verify([VerifyItem(k, t) for k, t in zip(live, trees)])):
            outs[k] += accepted.tokens
            new[k] = accepted.tokens
        steps += 1
    return {k: v[:num_tokens] for k, v in outs.items()}, steps


def repetitive_prompts(batch, seed):
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
def test_suffix_sd_equals_target_greedy(target_model, reference, shape):
    prompts = repetitive_prompts(4, seed=5)
    target = TargetEngine(make_runner(target_model))
    draft = SuffixDraftEngine(vocab_size=96, config=SuffixConfig(alpha=2.0))
    outs, steps = run_sd(target, draft, prompts, shape)
    for k, prompt in prompts.items():
        assert outs[k] == reference.greedy(prompt, NUM_TOKENS), k
    target.release(list(prompts))
    target.runner.check_accounting()
    draft.release(list(prompts))
    draft.runner.check_accounting()


def test_suffix_drafts_get_accepted_on_repetitive_output(target_model, reference):
    """The tiny random target loops; once it does, the suffix trees predict it and SD takes fewer steps."""
    prompts = {f"r{i}": p + reference.greedy(p, 40) for i, p in enumerate(repetitive_prompts(3, seed=2).values())}
    target = TargetEngine(make_runner(target_model))
    draft = SuffixDraftEngine(vocab_size=96, config=SuffixConfig(alpha=2.0))
    outs, steps = run_sd(target, draft, prompts, lambda i, k, new: SpecItem(k, new, chain_len=6))
    for k, prompt in prompts.items():
        assert outs[k] == reference.greedy(prompt, NUM_TOKENS)
    assert steps < NUM_TOKENS - 1  # plain decoding would take NUM_TOKENS - 1 verify steps


VOCAB = 12
COPIES = 100
TRIALS = 2000


def chi_square(counts: torch.Tensor, p: torch.Tensor) -> float:
    """p-value of ``counts`` under ``p``, the bins expecting fewer than 5 pooled (as test_engine_sampling does)."""
    expected = p * counts.sum()
    keep = expected >= 5
    observed = torch.cat([counts[keep], counts[~keep].sum(0, keepdim=True)])
    expected = torch.cat([expected[keep], expected[~keep].sum(0, keepdim=True)])
    if expected[-1] == 0:
        observed, expected = observed[:-1], expected[:-1]
    return float(chisquare(observed.numpy(), (expected * observed.sum() / expected.sum()).numpy()).pvalue)


@pytest.mark.parametrize("shape", ["chain", "conf_chain", "tree", "expansion"])
def test_sampling_with_suffix_drafts_follows_the_target(shape):
    """Drafts from a global tree full of varied continuations: the first emitted token is still ~ p."""
    params = SamplingParams(temperature=1.0, seed=3)
    runner = make_runner(build_tiny("llama", vocab_size=VOCAB, seed=11, initializer_range=0.3), num_blocks=2048)
    prompt = [3, 1, 4, 1, 5]
    seqs = [runner.add(f"t{i}", prompt, params) for i in range(COPIES)]
    first = runner.forward([Work(seqs[0], want_root=True)])
    runner.commit(seqs[0], [])
    p = probs_from_logits(first.root(0)[None], params)[0]  # [vocab] the target's next-token distribution

    draft = SuffixDraftEngine(vocab_size=VOCAB, config=SuffixConfig(min_prob=0.0, alpha=3.0))
    rng = random.Random(0)
    for i in range(40):  # earlier outputs: "1 5" followed by many different tokens, a few more often
        draft.prefill([PrefillItem(f"old{i}", [0])])
        output = [1, 5, rng.choice([2, 2, 7, 7, 7, rng.randrange(VOCAB)]), 6]
        draft.speculate([SpecItem(f"old{i}", output)])
        draft.release([f"old{i}"])
    ids = [f"d{i}" for i in range(COPIES)]
    draft.prefill([PrefillItem(d, prompt, replace(params, seed=100 + i)) for i, d in enumerate(ids)])
    gen = make_generator(7)
    counts = torch.zeros(VOCAB)
    accepted = 0
    for _ in range(TRIALS // COPIES):
        shapes = {"chain": dict(chain_len=3), "conf_chain": dict(chain_len=3, confidence_threshold=0.3),
                  "tree": dict(tree_depth=2, tree_width=3),
                  "expansion": dict(tree_depth=2, tree_width=2, tree_expansion=(2, 1))}[shape]  # fmt: skip
        trees = draft.speculate([SpecItem(d, [], **shapes) for d in ids])  # nothing new: the same prefix each time
        assert all(len(t) for t in trees)
        works = [
            Work(s, new_nodes=list(zip(t.token_ids, t.parent_ids)), want_root=True, want_nodes=True)
            for s, t in zip(seqs, trees)
        ]
        out = runner.forward(works)
        for i, (seq, tree) in enumerate(zip(seqs, trees)):
            rows = torch.cat([out.root(i)[None], out.nodes(i, len(tree))])
            result = accept_tree(tree, rows, params, gen)
            runner.commit(seq, [])  # roll back: every trial starts from the same prefix
            counts[result.tokens[0]] += 1
            accepted += result.num_accepted > 0
    if shape in ("tree", "expansion"):
        assert len({t for t, parent in zip(trees[0].token_ids, trees[0].parent_ids) if parent == -1}) > 1
    assert chi_square(counts, p) > 1e-3
    assert accepted > 0  # speculation really happened
    runner.check_accounting()
