"""Commit and rollback keep exactly the accepted path in the KV cache."""

import random

import pytest

from shared.engine.runner import Work
from shared.models.tiny import build_tiny

from conftest import Reference, make_runner, path_to

PARENTS = [-1, -1, 0, 0, 1, 2, 2, 4, 5]


@pytest.mark.parametrize("accepted_leaf", [None, 0, 1, 2, 3, 5, 6, 7, 8])
@pytest.mark.parametrize("block_size", [1, 4, 16])
def test_next_decode_after_commit_equals_fresh_run(accepted_leaf, block_size):
    model = build_tiny("llama", vocab_size=80, seed=2)
    ref = Reference(model)
    runner = make_runner(model, block_size=block_size)
    rng = random.Random(accepted_leaf or 0)
    seq = runner.add("a", [rng.randrange(80) for _ in range(6)])
    other = runner.add("b", [rng.randrange(80) for _ in range(11)])
    runner.forward([Work(seq), Work(other)])
    runner.commit(other, [3])

    tokens = [rng.randrange(80) for _ in PARENTS]
    runner.forward([Work(seq, new_nodes=list(zip(tokens, PARENTS)), want_root=True), Work(other, want_root=True)])
    path = [] if accepted_leaf is None else path_to(PARENTS, accepted_leaf)
    emitted = [tokens[j] for j in path] + [rng.randrange(80)]  # accepted path + bonus
    reused = runner.commit(seq, emitted)
    assert reused == len(path)
    assert seq.num_cached == 6 + len(path)
    runner.check_accounting()

    out = runner.forward([Work(seq, want_root=True), Work(other, want_root=True)])
    assert float((out.root(0) - ref.logits(seq.token_ids)[-1]).abs().max()) <= 1e-5
    assert float((out.root(1) - ref.logits(other.token_ids)[-1]).abs().max()) <= 1e-5
    runner.check_accounting()


def test_rollback_frees_speculative_blocks():
    model = build_tiny("llama", vocab_size=64, seed=2)
    runner = make_runner(model, num_blocks=16, block_size=2)
    seq = runner.add("a", [1, 2, 3])
    runner.forward([Work(seq)])
    free_before = runner.cache.num_free_blocks
    runner.forward([Work(seq, new_nodes=[(5, -1), (6, 0), (7, 1), (8, 2), (9, 3)])])
    assert runner.cache.num_free_blocks < free_before
    runner.commit(seq, [])
    assert runner.cache.num_free_blocks == free_before
    assert len(seq.tree) == 0
    runner.check_accounting()


def test_commit_reuses_cached_bonus_match_only_on_tree_path():
    """Tokens that leave the tree are appended uncached and run next step."""
    model = build_tiny("llama", vocab_size=64, seed=4)
    ref = Reference(model)
    runner = make_runner(model)
    seq = runner.add("a", [1, 2, 3, 4])
    runner.forward([Work(seq, new_nodes=[(10, -1), (11, 0)])])
    assert runner.commit(seq, [10, 12, 13]) == 1
    assert seq.num_cached == 5 and seq.token_ids[-3:] == [10, 12, 13]
    out = runner.forward([Work(seq, want_root=True)])
    assert float((out.root(0) - ref.logits(seq.token_ids)[-1]).abs().max()) <= 1e-5
