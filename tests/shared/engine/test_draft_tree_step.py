"""Static beam and expansion trees: the eager drafters' nodes, parents, probabilities and KV state, one read."""

from __future__ import annotations

import copy
import random

import pytest

from shared.engine.draft_engine import DraftEngine
from shared.engine.draft_tree_step import TreeShape, level_sizes
from shared.engine.errors import OutOfBlocksError
from shared.engine.step_plan import StepShape
from shared.engine.types import PrefillItem, SamplingParams, SpecItem, TokenTree
from shared.models.tiny import build_tiny
from shared.profiling.host_work import HostWorkCounter, engine_device_tensors

from conftest import make_runner

VOCAB = 96
SHAPES = {
    "beam-3x2": dict(tree_depth=3, tree_width=2),
    "beam-1x4": dict(tree_depth=1, tree_width=4),
    "beam-4x3": dict(tree_depth=4, tree_width=3),
    "expansion-2-1-2": dict(tree_depth=3, tree_width=4, tree_expansion=(2, 1, 2)),
    "expansion-1-1-3-1": dict(tree_depth=4, tree_width=3, tree_expansion=(1, 1, 3, 1)),
}


def pair(model) -> tuple[DraftEngine, DraftEngine]:
    fast = DraftEngine(make_runner(copy.deepcopy(model), static_step=True))
    eager = DraftEngine(make_runner(copy.deepcopy(model), static_step=False))
    assert fast.trees is not None and eager.trees is None
    return fast, eager


def a_path(rng: random.Random, tree: TokenTree) -> list[int]:
    """The tokens of a random root-to-node path (what a target may accept), possibly empty."""
    if not len(tree) or rng.random() < 0.2:
        return []
    node = rng.randrange(len(tree))
    path = []
    while node >= 0:
        path.append(tree.token_ids[node])
        node = tree.parent_ids[node]
    return path[::-1]


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_static_tree_equals_eager_over_rounds(arch, shape):
    model = build_tiny(arch, vocab_size=VOCAB, seed=11, hidden_size=32, num_layers=2)
    fast, eager = pair(model)
    rng = random.Random(1)
    prompts = {f"t{i}": [rng.randrange(VOCAB) for _ in range(2 + 6 * i)] for i in range(3)}
    for e in (fast, eager):
        e.prefill([PrefillItem(k, p) for k, p in prompts.items()])
    last = {k: TokenTree() for k in prompts}
    for _ in range(6):
        items = [SpecItem(k, a_path(rng, last[k]) + [rng.randrange(VOCAB)], **SHAPES[shape]) for k in prompts]
        got, want = fast.speculate(copy.deepcopy(items)), eager.speculate(copy.deepcopy(items))
        for a, b in zip(got, want):
            assert (a.token_ids, a.parent_ids) == (b.token_ids, b.parent_ids)
            assert a.draft_probs == pytest.approx(b.draft_probs, abs=1e-6)
        for k, tree in zip(prompts, got):
            last[k] = tree
            s, t = fast.runner.get(k), eager.runner.get(k)
            assert (s.token_ids, s.num_cached, s.tree.token_ids, s.tree.parent_ids) == (
                t.token_ids, t.num_cached, t.tree.token_ids, t.tree.parent_ids)  # fmt: skip
        fast.runner.check_accounting()
        assert len(fast.costs) == len(eager.costs) == SHAPES[shape]["tree_depth"]
    assert fast.trees.runs == 6
    fast.release(list(prompts))
    assert fast.runner.cache.num_free_blocks == fast.runner.cache.num_blocks


@pytest.mark.parametrize("shape", ["beam-3x2", "expansion-2-1-2"])
def test_sampling_requests_trees_rank_by_their_own_probabilities(shape):
    """A sampling request's tree is its top choices by its tempered, filtered probabilities: the eager tree exactly,
    greedy requests beside it on the plain softmax."""
    model = build_tiny("llama", vocab_size=VOCAB, seed=16, hidden_size=32, num_layers=2)
    fast, eager = pair(model)
    params = {"g": SamplingParams(), "t": SamplingParams(temperature=0.7, seed=1),
              "k": SamplingParams(temperature=1.3, top_k=9, seed=2), "p": SamplingParams(temperature=0.9, top_p=0.8, min_p=0.02)}
    for e in (fast, eager):
        e.prefill([PrefillItem(s, [2 + i, 5, 8], p) for i, (s, p) in enumerate(params.items())])
    for step in range(4):
        items = [SpecItem(s, [step + 3], **SHAPES[shape]) for s in params]
        got, want = fast.speculate(copy.deepcopy(items)), eager.speculate(copy.deepcopy(items))
        for a, b in zip(got, want):
            assert (a.token_ids, a.parent_ids, a.child_dists) == (b.token_ids, b.parent_ids, {})
            assert a.draft_probs == pytest.approx(b.draft_probs, abs=1e-6)
        fast.runner.check_accounting()
    assert fast.trees.runs == 4


def test_one_host_sync_per_tree_call():
    model = build_tiny("llama", vocab_size=VOCAB, seed=12, hidden_size=32, num_layers=2)
    fast, _ = pair(model)
    fast.prefill([PrefillItem(f"q{i}", list(range(1, 5 + i))) for i in range(3)])
    fast.speculate([SpecItem(f"q{i}", [3], tree_depth=3, tree_width=2) for i in range(3)])
    with HostWorkCounter(device_tensors=engine_device_tensors(fast.runner)) as counter:
        trees = fast.speculate([SpecItem(f"q{i}", [4], tree_depth=3, tree_width=2) for i in range(3)])
    assert all(len(t) == 6 for t in trees)
    assert sum(counter.syncs.values()) == 1, dict(counter.syncs)


def test_calls_it_does_not_take():
    model = build_tiny("llama", vocab_size=VOCAB, seed=13, hidden_size=32, num_layers=1)
    fast, _ = pair(model)
    fast.prefill([PrefillItem("a", [1, 2, 3]), PrefillItem("b", [4, 5]),
                  PrefillItem("s", [6, 7], sampling=SamplingParams(temperature=0.7, seed=2))])  # fmt: skip
    fast.speculate([SpecItem("a", [9], tree_depth=2, tree_width=2), SpecItem("b", [9], tree_depth=3, tree_width=2)])
    assert fast.trees.runs == 0
    small = DraftEngine(make_runner(build_tiny("llama", vocab_size=8, seed=13, hidden_size=32, num_layers=1)))
    small.prefill([PrefillItem("a", [1, 2, 3])])
    assert len(small.speculate([SpecItem("a", [4], tree_depth=1, tree_width=9)])[0]) == 8  # more children than tokens
    assert small.trees.runs == 0
    trees = fast.speculate([SpecItem("a", [9], tree_depth=2, tree_width=2), SpecItem("b", [9], tree_depth=2, tree_width=0)])
    assert fast.trees.runs == 1 and len(trees[0]) == 4 and len(trees[1]) == 0
    fast.runner.check_accounting()


def test_out_of_blocks_changes_nothing():
    model = build_tiny("llama", vocab_size=VOCAB, seed=14, hidden_size=32, num_layers=1)
    fast = DraftEngine(make_runner(model, num_blocks=5))
    fast.prefill([PrefillItem("a", list(range(1, 9)))])
    with pytest.raises(OutOfBlocksError):
        fast.speculate([SpecItem("a", [2], tree_depth=4, tree_width=4)])  # 9 + 12 nodes run > 5 blocks of 4
    fast.runner.check_accounting()
    assert len(fast.speculate([SpecItem("a", [], tree_depth=2, tree_width=2)])[0]) == 4


def test_levels_and_buckets():
    assert level_sizes(True, (3, 3, 3)) == [3, 3, 3] and level_sizes(False, (1, 1, 3, 1)) == [1, 1, 3, 3]
    first = StepShape(batch=3, rows=5, q=2, nodes=1, blocks=4, kv_cap=20, chains=True)
    shape = TreeShape(first, False, (2, 2, 2))
    assert (shape.nodes, shape.nodes_run) == (14, 6)
    fast, _ = pair(build_tiny("llama", vocab_size=VOCAB, seed=15, hidden_size=32, num_layers=1))
    bucket = fast.trees.bucket(shape)
    assert bucket.batch == 4 and bucket.first.kv_cap >= 20 and bucket.fan == (2, 2, 2)
    assert fast.trees.bucket(TreeShape(first, True, (9,) * 8)) is None  # 72 nodes: eager body
