"""Sampling stays exact with chunked prefill and the prefix cache: a prompt prefilled in chunks, its copies
sharing the cached blocks (n samples), drawn from and speculated on, follows the target's distribution.

Two checks, chi-square at p < 1e-3 with fixed seeds (deterministic): the first token each chunked prefill
draws (one seed per copy), and the first token a speculative step accepts after it (chain of 3, each copy
rolled back after its trial, as in test_engine_sampling.py).
"""

from dataclasses import replace

import pytest
import torch

from shared.engine.acceptance import accept_tree
from shared.engine.draft_engine import DraftEngine
from shared.engine.runner import Work
from shared.engine.sampling import make_generator, probs_from_logits
from shared.engine.target_engine import TargetEngine
from shared.engine.types import PrefillItem, SamplingParams, SpecItem

from conftest import make_runner
from test_engine_sampling import ALPHA, VOCAB, chi_square, models

PROMPT = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5]  # 11 tokens: two full blocks of 4 shared, chunks of 3
CHUNK = 3
COPIES = 100
TRIALS = 2000


def _reference(target_model, prompt, params) -> torch.Tensor:
    runner = make_runner(target_model)
    seq = runner.add("ref", prompt, params)
    root = runner.forward([Work(seq, want_root=True)]).root(0)  # [vocab]
    return probs_from_logits(root[None], params)[0]  # [vocab] the target's next-token distribution


def _chunked_prefill(target: TargetEngine, ids: list[str], prompt, params, seed: int) -> list[int]:
    """Every copy in chunks of CHUNK, all copies in each forward (copy k seeded ``seed + k``); the first tokens
    drawn."""
    items = [PrefillItem(i, prompt, replace(params, seed=seed + k), max_tokens=CHUNK) for k, i in enumerate(ids)]
    results = target.prefill(items)
    while any(r.pending for r in results):
        assert all(r.pending for r in results)  # the copies move in step
        results = target.prefill([PrefillItem(i, [], params, max_tokens=CHUNK, resume=True) for i in ids])
    return [r.first_token for r in results]


@pytest.mark.parametrize("cache", [False, True], ids=["cold", "cache"])
def test_the_first_token_of_a_chunked_prefill_follows_the_target(cache):
    target_model, _ = models()
    params = SamplingParams(temperature=1.0, seed=1)
    p = _reference(target_model, PROMPT, params)
    target = TargetEngine(make_runner(target_model, prefix_caching=cache))
    counts = torch.zeros(VOCAB)
    for r in range(TRIALS // COPIES):  # each round: fresh copies (warm from the last round's blocks with the cache)
        ids = [f"r{r}-{k}" for k in range(COPIES)]
        for token in _chunked_prefill(target, ids, PROMPT, params, seed=COPIES * r):
            counts[token] += 1
        target.release(ids)
        target.runner.check_accounting()
    if cache:
        assert target.runner.cache.allocator.prefix.hits > 0  # the copies shared the prompt's full blocks
    assert chi_square(counts, p) > ALPHA


def test_speculation_after_a_chunked_prefill_with_shared_blocks_follows_the_target():
    """The copies' chunked prefills draw their own first tokens t_k, so each trial's target distribution is the
    one after PROMPT + [t_k]: the pooled counts are tested against the mixture of those (conservative)."""
    target_model, draft_model = models()
    params = SamplingParams(temperature=1.0, seed=3)
    target = TargetEngine(make_runner(target_model, num_blocks=2048, prefix_caching=True))
    ids = [f"t{k}" for k in range(COPIES)]
    firsts = _chunked_prefill(target, ids[:1], PROMPT, params, seed=0)  # the first, then the copies from its blocks
    firsts += _chunked_prefill(target, ids[1:], PROMPT, params, seed=1)
    assert target.runner.cache.allocator.prefix.hits >= 2 * (COPIES - 1)
    p = torch.stack([_reference(target_model, PROMPT + [t], params) for t in firsts]).mean(0)  # [vocab]
    draft = DraftEngine(make_runner(draft_model, num_blocks=2048, prefix_caching=True))
    drafts = [f"d{k}" for k in range(COPIES)]
    draft.prefill([PrefillItem(d, PROMPT, replace(params, seed=2000 + k)) for k, d in enumerate(drafts)])
    draft.speculate([SpecItem(d, [t], chain_len=0) for d, t in zip(drafts, firsts)])  # in step with the target
    gen = make_generator(7)
    counts, accepted = torch.zeros(VOCAB), 0
    for _ in range(TRIALS // COPIES):
        trees = draft.speculate([SpecItem(d, [], chain_len=3) for d in drafts])  # the last tree rolled back
        seqs = [target.runner.get(i) for i in ids]
        works = [Work(seq, new_nodes=list(zip(t.token_ids, t.parent_ids)), want_root=True, want_nodes=True)
                 for seq, t in zip(seqs, trees)]  # fmt: skip
        out = target.runner.forward(works)
        for k, (seq, tree) in enumerate(zip(seqs, trees)):
            rows = torch.cat([out.root(k)[None], out.nodes(k, len(tree))])  # [1 + nodes, vocab]
            result = accept_tree(tree, rows, params, gen)
            target.runner.commit(seq, [])  # roll back: every trial from the same prefix
            counts[result.tokens[0]] += 1
            accepted += result.num_accepted > 0
    assert chi_square(counts, p) > ALPHA
    assert accepted > 0
    target.runner.check_accounting()
    draft.runner.check_accounting()
