"""Greedy speculative decoding through the engines is token-for-token target-only greedy decoding."""

import random

import pytest

from shared.engine.draft_engine import DraftEngine
from shared.engine.target_engine import TargetEngine
from shared.engine.types import PrefillItem, SpecItem, TokenTree, VerifyItem
from shared.models.tiny import build_tiny

from conftest import make_runner

NUM_TOKENS = 24


def run_sd(target, draft_or_fn, prompts, shape_of):
    """Drive prefill → (speculate → verify)* for a batch until every request has NUM_TOKENS."""
    outs = {k: [] for k in prompts}
    new = {}
    for r in target.prefill([PrefillItem(k, v) for k, v in prompts.items()]):
        outs[r.seq_id].append(r.first_token)
        new[r.seq_id] = [r.first_token]
    if isinstance(draft_or_fn, DraftEngine):
        draft_or_fn.prefill([PrefillItem(k, v) for k, v in prompts.items()])
    steps = 0
    while live := [k for k in prompts if len(outs[k]) < NUM_TOKENS]:
        if isinstance(draft_or_fn, DraftEngine):
            trees = draft_or_fn.speculate([shape_of(i, k, new[k]) for i, k in enumerate(live)])
        else:
            trees = [draft_or_fn(k) for k in live]
        for k, accepted in zip(live, target.verify([VerifyItem(k, t) for k, t in zip(live, trees)])):
            outs[k] += accepted.tokens
            new[k] = accepted.tokens
        steps += 1
    return {k: v[:NUM_TOKENS] for k, v in outs.items()}, steps


def prompts_for(batch, seed):
    rng = random.Random(seed)
    return {f"r{i}": [rng.randrange(96) for _ in range(rng.randint(1, 30))] for i in range(batch)}


SHAPES = {
    "chain1": lambda i, k, new: SpecItem(k, new, chain_len=1),
    "chain4": lambda i, k, new: SpecItem(k, new, chain_len=4),
    "tree3x2": lambda i, k, new: SpecItem(k, new, tree_depth=3, tree_width=2),
    "mixed": lambda i, k, new: [
        SpecItem(k, new, chain_len=i % 5),
        SpecItem(k, new, tree_depth=1 + i % 4, tree_width=1 + i % 3),
    ][i % 2],
}


@pytest.mark.parametrize("batch", [1, 5])
@pytest.mark.parametrize("shape", list(SHAPES))
def test_draft_model_sd_equals_greedy(target_model, draft_model, reference, batch, shape):
    prompts = prompts_for(batch, seed=batch)
    target = TargetEngine(make_runner(target_model))
    draft = DraftEngine(make_runner(draft_model))
    outs, _ = run_sd(target, draft, prompts, SHAPES[shape])
    for k, prompt in prompts.items():
        assert outs[k] == reference.greedy(prompt, NUM_TOKENS), k
    target.release(list(prompts))
    draft.release(list(prompts))
    target.runner.check_accounting()
    draft.runner.check_accounting()
    assert target.runner.cache.num_free_blocks == target.runner.cache.num_blocks


def test_self_draft_accepts_everything_and_stays_exact(target_model, reference):
    """The target as its own draft: every token accepted, output still exactly greedy."""
    prompts = prompts_for(3, seed=9)
    target = TargetEngine(make_runner(target_model))
    draft = DraftEngine(make_runner(build_tiny("llama", vocab_size=96, seed=0)))
    outs, steps = run_sd(target, draft, prompts, lambda i, k, new: SpecItem(k, new, chain_len=5))
    for k, prompt in prompts.items():
        assert outs[k] == reference.greedy(prompt, NUM_TOKENS)
    assert steps <= -(-(NUM_TOKENS - 1) // 6) + 1  # 6 tokens per step


@pytest.mark.parametrize("kind", ["garbage_chain", "garbage_tree", "empty"])
def test_garbage_drafts_never_change_output(target_model, reference, kind):
    rng = random.Random(kind)
    prompts = prompts_for(4, seed=3)
    target = TargetEngine(make_runner(target_model))

    def garbage(_k):
        if kind == "empty":
            return TokenTree()
        if kind == "garbage_chain":
            return TokenTree.chain([rng.randrange(96) for _ in range(rng.randint(1, 8))])
        parents = [-1]
        for j in range(1, rng.randint(2, 12)):
            parents.append(rng.randrange(-1, j))
        return TokenTree(token_ids=[rng.randrange(96) for _ in parents], parent_ids=parents)

    outs, _ = run_sd(target, garbage, prompts, None)
    for k, prompt in prompts.items():
        assert outs[k] == reference.greedy(prompt, NUM_TOKENS)
    target.runner.check_accounting()


def test_mixed_prefill_and_verify_in_one_forward(target_model, draft_model, reference):
    target = TargetEngine(make_runner(target_model))
    draft = DraftEngine(make_runner(draft_model))
    first = target.prefill([PrefillItem("old", [4, 5, 6, 7])])[0].first_token
    draft.prefill([PrefillItem("old", [4, 5, 6, 7])])
    tree = draft.speculate([SpecItem("old", [first], chain_len=3)])[0]
    out = target.step([PrefillItem("new", [9, 8, 7, 6, 5, 4])], [VerifyItem("old", tree)])
    assert out.cost.num_seqs == 2
    assert out.cost.num_batched_tokens == 6 + 1 + len(tree)
    assert [first] + out.verifies[0].tokens == reference.greedy([4, 5, 6, 7], 1 + len(out.verifies[0].tokens))
    assert out.prefills[0].first_token == reference.greedy([9, 8, 7, 6, 5, 4], 1)[0]
