"""Sampling through the real engines follows the target's distribution exactly.

Each trial drafts from the same committed prefix (the draft rolls back its
tree), verifies on the target and rolls the target back, so thousands of
a hundred trials share each batched forward. Significance: the chi-square test rejects at
p < 1e-3; seeds are fixed, so the outcome is deterministic.
"""

from dataclasses import replace

import pytest
import torch
from scipy.stats import chisquare

from shared.engine.acceptance import accept_tree
from shared.engine.draft_engine import DraftEngine
from shared.engine.runner import Work
from shared.engine.sampling import draft_dist, make_generator, probs_from_logits, sample_sparse
from shared.engine.types import PrefillItem, SamplingParams, SpecItem, TokenTree
from shared.models.tiny import build_tiny
from scheduler.request import Request
from scheduler.spec_shape import SpecContext

from conftest import make_runner

VOCAB = 12
TRIALS = 2000
COPIES = 100  # trials batched per forward
ALPHA = 1e-3


def models():
    # a larger init spreads the distributions so the test has power
    target = build_tiny("llama", vocab_size=VOCAB, seed=11, initializer_range=0.3)
    draft = build_tiny("llama", vocab_size=VOCAB, seed=12, initializer_range=0.3, hidden_size=32, num_layers=1)
    return target, draft


def chi_square(counts: torch.Tensor, p: torch.Tensor) -> float:
    expected = p * counts.sum()
    keep = expected >= 5
    observed = torch.cat([counts[keep], counts[~keep].sum(0, keepdim=True)])
    expected = torch.cat([expected[keep], expected[~keep].sum(0, keepdim=True)])
    if expected[-1] == 0:
        observed, expected = observed[:-1], expected[:-1]
    expected = expected * observed.sum() / expected.sum()
    return float(chisquare(observed.numpy(), expected.numpy()).pvalue)


def selector(shape: str):
    """The tree selector a policy applies to the drafted trees before verification (None: verify as drafted)."""
    if shape == "smartspec_conf":
        from scheduler.policies.smartspec import SmartSpecConfidence, SmartSpecConfig

        return SmartSpecConfidence(SmartSpecConfig(confidence_threshold=CONFIDENCE, max_k=3)).tree_selector()
    if shape == "adaserve":
        from scheduler.policies.adaserve import AdaServe, TreePolicyConfig

        return AdaServe(TreePolicyConfig(token_budget=COPIES * 3)).tree_selector()  # 2 of each 6-node tree on average
    if shape == "specinfer":
        from scheduler.policies.adaserve import SpecInferTree

        return SpecInferTree((1, 2)).tree_selector()
    return None


CONFIDENCE = 0.3  # the tiny draft's probabilities straddle it: chains stop at every depth


# every drafting mode and every policy that reshapes what was drafted (a tree selector), under sampling
@pytest.mark.parametrize("shape", ["chain", "conf_chain", "beam_tree", "iid_tree", "smartspec_conf", "adaserve",
                                   "specinfer"])
@pytest.mark.parametrize("params", [SamplingParams(temperature=1.0, seed=1), SamplingParams(temperature=0.8, top_p=0.9, seed=2)])
def test_first_token_follows_target_distribution(shape, params):
    target_model, draft_model = models()
    prompt = [3, 1, 4, 1, 5]
    target = make_runner(target_model)
    draft = DraftEngine(make_runner(draft_model))
    # COPIES identical sequences per forward: each trial is one copy in one round
    seqs = [target.add(f"t{i}", prompt, params) for i in range(COPIES)]
    root = target.forward([Work(seqs[0], want_root=True)]).root(0)
    target.commit(seqs[0], [])
    p = probs_from_logits(root[None], params)[0]  # [vocab] the target's next-token distribution

    ids = [f"d{i}" for i in range(COPIES)]
    # distinct draft seeds: copies with one seed would draw the same drafts, correlating the trials
    draft.prefill([PrefillItem(d, prompt[:-1], replace(params, seed=1000 * params.seed + i)) for i, d in enumerate(ids)])
    draft.speculate([SpecItem(d, [prompt[-1]], chain_len=0) for d in ids])  # now in step with the target
    gen = make_generator(99)
    q_root = draft.runner.forward([Work(draft.runner.get(ids[0]), want_root=True)]).root(0)
    draft.runner.commit(draft.runner.get(ids[0]), [])
    q = draft_dist(q_root, params)

    counts = torch.zeros(VOCAB)
    accepted = 0
    for _ in range(TRIALS // COPIES):
        if shape == "chain":
            trees = draft.speculate([SpecItem(d, [], chain_len=3) for d in ids])
        elif shape in ("conf_chain", "smartspec_conf"):
            trees = draft.speculate([SpecItem(d, [], chain_len=3, confidence_threshold=CONFIDENCE) for d in ids])
        elif shape in ("beam_tree", "adaserve"):
            trees = draft.speculate([SpecItem(d, [], tree_depth=2, tree_width=3) for d in ids])
        elif shape == "specinfer":  # per-node top-k expansion <1, 2>, as SpecInferTree((1, 2)) asks for it
            trees = draft.speculate([SpecItem(d, [], tree_depth=2, tree_width=2, tree_expansion=(1, 2)) for d in ids])
        else:  # SpecInfer: k children drawn i.i.d. from the draft's q at the root
            trees = []
            for _ in ids:
                tree = TokenTree(token_ids=[sample_sparse(q, gen) for _ in range(3)], parent_ids=[-1, -1, -1])
                tree.child_dists[0] = q
                trees.append(tree)
        if (policy := selector(shape)) is not None:
            batch = [Request(f"t{i}", prompt, sampling=params, max_new_tokens=100) for i in range(COPIES)]
            trees = policy.select(batch, trees, SpecContext(0.0, 0, True))
        works = [
            Work(seq, new_nodes=list(zip(t.token_ids, t.parent_ids)), want_root=True, want_nodes=True)
            for seq, t in zip(seqs, trees)
        ]
        out = target.forward(works)
        for i, (seq, tree) in enumerate(zip(seqs, trees)):
            rows = torch.cat([out.root(i)[None], out.nodes(i, len(tree))])
            result = accept_tree(tree, rows, params, gen)
            target.commit(seq, [])  # roll back: every trial starts from the same prefix
            counts[result.tokens[0]] += 1
            accepted += result.num_accepted > 0
    assert counts.sum() == TRIALS
    assert chi_square(counts, p) > ALPHA
    assert accepted > 0  # speculation really happened
    target.check_accounting()
    draft.runner.check_accounting()
