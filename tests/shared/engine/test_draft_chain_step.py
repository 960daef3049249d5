"""The static draft chain: the eager chain's tokens, probabilities and KV state, with one host read per call."""

from __future__ import annotations

import copy
import inspect
import random

import numpy as np
import pytest
import torch

from shared.engine import chain_plan, cuda_graphs, draft_chain_step, draft_tree_step, static_draft, step_plan
from shared.engine.draft_engine import DraftEngine
from shared.engine.sequence import SpecTree
from shared.engine.errors import ContextLengthError, OutOfBlocksError
from shared.engine.types import PrefillItem, SamplingParams, SpecItem
from shared.models.tiny import build_tiny
from shared.profiling import host_work
from shared.profiling.host_work import HostWorkCounter, engine_device_tensors

from conftest import make_runner

VOCAB = 96


def pair(model, **kw) -> tuple[DraftEngine, DraftEngine]:
    fast = DraftEngine(make_runner(copy.deepcopy(model), static_step=True, **kw))
    eager = DraftEngine(make_runner(copy.deepcopy(model), static_step=False, **kw))
    assert fast.chains is not None and eager.chains is None
    return fast, eager


def same_state(a: DraftEngine, b: DraftEngine) -> None:
    for seq_id, s in a.runner.seqs.items():
        t = b.runner.seqs[seq_id]
        assert (s.token_ids, s.num_cached, s.tree.token_ids, s.tree.parent_ids) == (
            t.token_ids, t.num_cached, t.tree.token_ids, t.tree.parent_ids)  # fmt: skip
    a.runner.check_accounting()


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_static_chain_equals_eager_over_rounds(arch):
    """Rounds of speculate with accepted prefixes, bonus tokens and rollbacks of optimistic commits: the same
    chains (tokens and q) and the same sequences as the eager drafters."""
    model = build_tiny(arch, vocab_size=VOCAB, seed=3, hidden_size=32, num_layers=2)
    fast, eager = pair(model)
    rng = random.Random(0)
    prompts = {f"s{i}": [rng.randrange(VOCAB) for _ in range(2 + 7 * i)] for i in range(4)}
    for e in (fast, eager):
        e.prefill([PrefillItem(k, p) for k, p in prompts.items()])
    last = {k: [] for k in prompts}
    drafted = 0
    for step in range(10):
        k = 1 + step % 5
        items = []
        for seq_id in prompts:
            chain = last[seq_id]
            keep = rng.randrange(len(chain) + 1)  # the target accepted a prefix, then its own bonus token
            new = chain[:keep] + [rng.randrange(VOCAB)]
            rollback = 0
            if step % 4 == 3:  # a frontier step had committed a chunk optimistically: part of it is undone
                rollback = min(2, len(fast.runner.get(seq_id).token_ids) - 1)
            items.append(SpecItem(seq_id, new, chain_len=k, rollback=rollback))
        got, want = fast.speculate(copy.deepcopy(items)), eager.speculate(copy.deepcopy(items))
        for a, b in zip(got, want):
            assert (a.token_ids, a.parent_ids) == (b.token_ids, b.parent_ids)
            assert a.draft_probs == pytest.approx(b.draft_probs, abs=1e-6)
            assert not a.child_dists and not b.child_dists
            drafted += len(a)
        for it, tree in zip(items, got):
            last[it.seq_id] = tree.token_ids
        same_state(fast, eager)
        assert len(fast.costs) == k == len(eager.costs)
    assert fast.chains.runs == 10 and drafted == sum(1 + s % 5 for s in range(10)) * len(prompts)
    fast.release(list(prompts))
    assert fast.runner.cache.num_free_blocks == fast.runner.cache.num_blocks


def test_confidence_threshold_cuts_where_the_eager_chain_stops():
    model = build_tiny("llama", vocab_size=VOCAB, seed=4, hidden_size=32, num_layers=1)
    fast, eager = pair(model)
    prompts = {f"c{i}": list(range(3 + i, 9 + 2 * i)) for i in range(3)}
    for e in (fast, eager):
        e.prefill([PrefillItem(k, p) for k, p in prompts.items()])
    items = [SpecItem(k, [5], chain_len=6, confidence_threshold=0.05) for k in prompts]
    got, want = fast.speculate(copy.deepcopy(items)), eager.speculate(copy.deepcopy(items))
    assert [t.token_ids for t in got] == [t.token_ids for t in want]
    assert any(len(t) < 6 for t in want)  # the threshold really stopped some chain
    # the static chain ran every forward: its later nodes stay in the tree, the next commit reuses what matches
    nxt = [SpecItem(k, t.token_ids + [1], chain_len=2) for k, t in zip(prompts, got)]
    got, want = fast.speculate(copy.deepcopy(nxt)), eager.speculate(copy.deepcopy(nxt))
    assert [t.token_ids for t in got] == [t.token_ids for t in want]
    fast.runner.check_accounting()


def test_mixed_calls_take_the_eager_drafters():
    model = build_tiny("llama", vocab_size=VOCAB, seed=5, hidden_size=32, num_layers=1)
    fast, _ = pair(model)
    fast.prefill([PrefillItem("a", [1, 2, 3]), PrefillItem("b", [4, 5]),
                  PrefillItem("s", [6, 7], sampling=SamplingParams(temperature=0.8, seed=1))])  # fmt: skip
    fast.speculate([SpecItem("a", [9], chain_len=3), SpecItem("b", [9], chain_len=2)])  # two lengths
    fast.speculate([SpecItem("a", [9], chain_len=2), SpecItem("b", [9], tree_depth=2, tree_width=2)])  # a tree
    fast.speculate([SpecItem("a", [9], chain_len=2), SpecItem("s", [9], chain_len=2)])  # sampling
    assert fast.chains.runs == 0
    trees = fast.speculate([SpecItem("a", [9], chain_len=3), SpecItem("b", [9], chain_len=0)])
    assert fast.chains.runs == 1 and len(trees[0]) == 3 and len(trees[1]) == 0
    fast.runner.check_accounting()


def test_one_host_sync_per_call():
    """The whole chain (k forwards) reads the device once; nothing else blocks."""
    model = build_tiny("llama", vocab_size=VOCAB, seed=6, hidden_size=32, num_layers=2)
    fast, _ = pair(model)
    fast.prefill([PrefillItem(f"q{i}", list(range(1, 4 + i))) for i in range(4)])
    items = [SpecItem(f"q{i}", [7], chain_len=4) for i in range(4)]
    fast.speculate(copy.deepcopy(items))
    with HostWorkCounter(device_tensors=engine_device_tensors(fast.runner)) as counter:
        trees = fast.speculate([SpecItem(f"q{i}", t.token_ids + [3], chain_len=4) for i, t in enumerate(
            fast.speculate(copy.deepcopy([SpecItem(f"q{i}", [7], chain_len=4) for i in range(4)])))])
    assert all(len(t) == 4 for t in trees)
    assert sum(counter.syncs.values()) == 2, dict(counter.syncs)  # two calls, one read each


def test_errors_leave_the_sequences_as_they_were():
    model = build_tiny("llama", vocab_size=VOCAB, seed=7, hidden_size=32, num_layers=1)
    fast = DraftEngine(make_runner(model, num_blocks=6, max_context=24))
    fast.prefill([PrefillItem("a", list(range(1, 18)))])
    before = (list(fast.runner.get("a").token_ids), fast.runner.get("a").num_cached, list(fast.runner.get("a").block_ids))
    with pytest.raises(ContextLengthError):
        fast.speculate([SpecItem("a", [3], chain_len=8)])  # 18 + 7 > 24
    seq = fast.runner.get("a")
    assert (seq.token_ids[:-1], len(seq.block_ids)) == (before[0], len(before[2]))  # only the commit happened
    fast.prefill([PrefillItem("b", list(range(1, 5)))])
    with pytest.raises(OutOfBlocksError):
        fast.speculate([SpecItem("a", [], chain_len=6), SpecItem("b", [2], chain_len=6)])
    fast.runner.check_accounting()
    trees = fast.speculate([SpecItem("a", [], chain_len=2)])
    assert len(trees[0]) == 2
    fast.runner.check_accounting()


def test_build_pads_to_a_bucket_with_the_scratch_block():
    steps = [step_plan.SeqStep([1, 2, 3, 4, 5], 4, [3, 7], [], []), step_plan.SeqStep([1, 2], 1, [5], [], [])]
    exact = chain_plan.shape_of(steps, 4, block_size=4)
    assert exact.kv_cap == 5 + 3 and exact.batch == 2
    bucket = chain_plan.bucket_for(exact, block_size=4, max_context=64)
    assert bucket.batch == 2 and bucket.length == 4 and bucket.first.kv_cap >= exact.kv_cap
    flat = chain_plan.build(steps, bucket, block_size=4, scratch_block=9)
    tail = flat[bucket.first.size :].reshape(2, 3, bucket.batch)
    assert tail[0, :, 0].tolist() == [5, 6, 7] and tail[0, :, 1].tolist() == [2, 3, 4]
    assert tail[1, :, 0].tolist() == [7 * 4 + 1, 7 * 4 + 2, 7 * 4 + 3]  # positions 5, 6, 7 in block 7
    assert tail[1, :, 1].tolist() == [5 * 4 + 2, 5 * 4 + 3, 0]  # position 4: the table's 2nd entry, 0-padded
    big = chain_plan.bucket_for(chain_plan.shape_of(steps * 3, 4, 4), 4, 64)  # 6 sequences -> 8
    flat = chain_plan.build(steps * 3, big, 4, scratch_block=9)
    tail = flat[big.first.size :].reshape(2, 3, big.batch)
    assert (tail[1, :, 6:] == 9 * 4).all() and (tail[0, :, 6:] == 0).all()
    assert chain_plan.bucket_for(chain_plan.shape_of(steps, 17, 4), 4, 64) is None  # past MAX_GRAPH_CHAIN


def test_the_graph_pool_captures_the_traced_body():
    """What the CUDA path captures is the body the CPU path marks as graph_body (the host-work proxy's region)."""
    run = inspect.getsource(static_draft.StaticDraft._run)
    assert "self.graphs.run(self, staged, shape)" in run and "with graph_body():" in run
    assert "self.body(flat, shape)" in run
    pool = inspect.getsource(cuda_graphs.GraphPool)
    assert "step.body(static_in, bucket)" in pool and "step.build(steps, bucket, scratch)" in pool
    from shared.engine import sampled_chain_step

    sampled = sampled_chain_step.SampledDraftChain
    for kind in (draft_chain_step.DraftChainStep, draft_tree_step.DraftTreeStep, sampled._choose, sampled._outcome,
                 sampled._context):  # fmt: skip
        body = inspect.getsource(getattr(kind, "body", kind))
        for read in (".tolist()", ".item()", ".cpu()", "numpy", " int(", " float(", "(int(", "(float("):
            assert read not in body


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_cuda_graph_chain_equals_eager_on_gpu():
    model = build_tiny("llama", vocab_size=VOCAB, seed=8, hidden_size=64, num_layers=2).cuda()
    fast = DraftEngine(make_runner(copy.deepcopy(model), static_step=True))
    eager = DraftEngine(make_runner(copy.deepcopy(model), static_step=False))
    assert fast.chains.graphs is not None
    prompts = {f"g{i}": list(range(1 + i, 6 + 3 * i)) for i in range(3)}
    for e in (fast, eager):
        e.prefill([PrefillItem(k, p) for k, p in prompts.items()])
    for step in range(4):
        items = [SpecItem(k, [step + 1], chain_len=4) for k in prompts]
        got, want = fast.speculate(copy.deepcopy(items)), eager.speculate(copy.deepcopy(items))
        assert [t.token_ids for t in got] == [t.token_ids for t in want]
    assert fast.chains.graphs.replays >= 3
    for step in range(3):  # a beam tree through the same pool
        items = [SpecItem(k, [step + 2], tree_depth=3, tree_width=2) for k in prompts]
        got, want = fast.speculate(copy.deepcopy(items)), eager.speculate(copy.deepcopy(items))
        assert [(t.token_ids, t.parent_ids) for t in got] == [(t.token_ids, t.parent_ids) for t in want]
    assert fast.trees.runs == 3 and fast.chains.graphs.replays >= 5
    fast.offload()
    fast.reload()
    fast.prefill([PrefillItem(k, p) for k, p in prompts.items()])
    fast.speculate([SpecItem(k, [1], chain_len=4) for k in prompts])
    fast.runner.check_accounting()


@pytest.mark.parametrize("parents", [[], [-1], [-1, 0, 1], list(range(-1, 8)), [-1, -1, 0, 0, 1, 3, 3, 2, 7],
                                     list(range(-1, 19))])
def test_nodes_added_at_once_equal_node_by_node(parents):
    m = len(parents)
    fast, slow = SpecTree(), SpecTree()
    for t in (fast, slow):  # rows are reused across trees: an earlier tree leaves bits behind
        for j in range(6):
            t.add(j, j - 1 if j % 2 else -1)
        t.clear()
    fast.add_nodes(list(range(m)), parents)
    for j, p in enumerate(parents):
        slow.add(j, p)
    assert (fast.token_ids, fast.parent_ids, fast.depths) == (slow.token_ids, slow.parent_ids, slow.depths)
    assert torch.equal(fast.anc[:m, :m], slow.anc[:m, :m]) and not fast.anc[:m, m:].any()
    if m:
        with pytest.raises(ValueError):  # it starts a tree; it does not extend one
            slow.add_nodes([1], [-1])
