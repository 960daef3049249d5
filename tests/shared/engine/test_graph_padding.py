"""The CUDA graph path's bucketing, padding and scratch block, on CPU: every step kind run padded to its bucket
(``GraphPool(capture=False)``: the graph path without the capture) gives what the exact eager body gives."""

from __future__ import annotations

import copy
import random

import pytest

from shared.engine.config import EngineConfig
from shared.engine.cuda_graphs import GraphPool
from shared.engine.draft_engine import DraftEngine
from shared.engine.factory import build_feature_draft_engine, build_target_engine
from shared.engine.target_engine import TargetEngine
from shared.engine.types import PrefillItem, SamplingParams, SparseDist, SpecItem, TokenTree, VerifyItem
from shared.models.tiny import build_tiny, save_tiny, save_tiny_eagle

from conftest import make_runner

VOCAB = 96


def padded(engine, *kinds) -> GraphPool:
    pool = GraphPool(engine.runner, capture=False)
    for kind in kinds:
        kind.graphs = pool
    return pool


def test_verify_steps_padded_to_buckets_equal_exact_ones():
    model = build_tiny("llama", vocab_size=VOCAB, seed=0)
    exact, bucketed = (TargetEngine(make_runner(copy.deepcopy(model), static_step=True)) for _ in range(2))
    pool = padded(bucketed, bucketed.static)
    rng = random.Random(3)
    ids = [f"s{i}" for i in range(3)]  # batch 3: a bucket of 4, one padded sequence on the scratch block
    prompts = [[rng.randrange(VOCAB) for _ in range(3 + 4 * i)] for i in range(len(ids))]
    for e in (exact, bucketed):
        e.prefill([PrefillItem(s, p) for s, p in zip(ids, prompts)])
    for step in range(6):
        items = []
        for s in ids:
            m = rng.randrange(0, 5)
            parents = list(range(-1, m - 1)) if step % 2 else [rng.randrange(-1, j) for j in range(m)]
            items.append(VerifyItem(s, TokenTree([rng.randrange(VOCAB) for _ in range(m)], parents)))
        got, want = bucketed.verify(copy.deepcopy(items)), exact.verify(copy.deepcopy(items))
        assert [(r.tokens, r.accepted_nodes) for r in got] == [(r.tokens, r.accepted_nodes) for r in want]
        bucketed.runner.check_accounting()
    assert pool.replays == 6 and pool.scratch_block in bucketed.runner.reserved


def test_sampled_steps_padded_to_buckets_equal_exact_ones():
    """Sampled walks with sparse draft distributions: padded rows, widths, q entries and sequences change nothing
    (the same seeds, so the same uniforms)."""
    model = build_tiny("llama", vocab_size=VOCAB, seed=1)
    exact, bucketed = (TargetEngine(make_runner(copy.deepcopy(model), static_step=True, device_sampling=True))
                       for _ in range(2))  # fmt: skip
    pool = padded(bucketed, bucketed.static)
    params = [SamplingParams(temperature=0.9, top_p=0.9, seed=1), SamplingParams(temperature=1.1, top_k=12, seed=2),
              SamplingParams(), SamplingParams(temperature=0.7, min_p=0.05, seed=3),
              SamplingParams(temperature=1.0, seed=4)]  # fmt: skip
    ids = [f"p{i}" for i in range(len(params))]  # batch 5: a bucket of 8
    for e in (exact, bucketed):
        e.prefill([PrefillItem(s, [1 + i, 2, 3, 4], p) for i, (s, p) in enumerate(zip(ids, params))])
    rng = random.Random(5)
    for _ in range(8):
        items = []
        for s in ids:
            m = rng.randrange(0, 5)
            parents = [rng.randrange(-1, j) for j in range(m)]
            tokens = [rng.randrange(VOCAB) for _ in range(m)]
            dists = {}
            for row in range(m + 1):
                kids = [j for j, p in enumerate(parents) if p == row - 1]
                if kids and rng.random() < 0.7:  # sampled children: their q covers them and a few others
                    support = sorted({tokens[j] for j in kids} | {rng.randrange(VOCAB) for _ in range(rng.randrange(1, 6))})
                    weights = [rng.random() + 0.05 for _ in support]
                    import torch

                    dists[row] = SparseDist(torch.tensor(support), torch.tensor(weights) / sum(weights))
            items.append(VerifyItem(s, TokenTree(tokens, parents, child_dists=dists)))
        got, want = bucketed.verify(copy.deepcopy(items)), exact.verify(copy.deepcopy(items))
        assert [(r.tokens, r.accepted_nodes) for r in got] == [(r.tokens, r.accepted_nodes) for r in want]
        bucketed.runner.check_accounting()
    assert pool.replays == 8 and bucketed.static.num_host_accept == 0


@pytest.mark.parametrize("shape", [dict(chain_len=4), dict(tree_depth=3, tree_width=2),
                                   dict(tree_depth=3, tree_width=3, tree_expansion=(1, 3, 1))])  # fmt: skip
def test_static_drafts_padded_to_buckets_equal_exact_ones(shape):
    model = build_tiny("qwen2", vocab_size=VOCAB, seed=2, hidden_size=32, num_layers=2)
    exact, bucketed = (DraftEngine(make_runner(copy.deepcopy(model), static_step=True)) for _ in range(2))
    pool = padded(bucketed, bucketed.chains, bucketed.trees)
    rng = random.Random(6)
    ids = [f"d{i}" for i in range(5)]
    prompts = [[rng.randrange(VOCAB) for _ in range(2 + 3 * i)] for i in range(len(ids))]
    for e in (exact, bucketed):
        e.prefill([PrefillItem(s, p) for s, p in zip(ids, prompts)])
    last = {s: [] for s in ids}
    for _ in range(5):
        items = [SpecItem(s, last[s][:1] + [rng.randrange(VOCAB)], **shape) for s in ids]
        got, want = bucketed.speculate(copy.deepcopy(items)), exact.speculate(copy.deepcopy(items))
        assert [(t.token_ids, t.parent_ids) for t in got] == [(t.token_ids, t.parent_ids) for t in want]
        for s, t in zip(ids, got):
            last[s] = t.token_ids
        bucketed.runner.check_accounting()
    assert pool.replays == 5
    bucketed.offload()  # the scratch block goes back with the pool, and is taken again after the reload
    assert pool.scratch_block is None and bucketed.runner.cache.allocator.num_free == 0
    bucketed.reload()
    bucketed.prefill([PrefillItem("again", [1, 2, 3])])
    assert len(bucketed.speculate([SpecItem("again", [4], **shape)])[0]) and pool.scratch_block is not None
    bucketed.runner.check_accounting()


@pytest.mark.parametrize("shape", [dict(chain_len=3), dict(tree_depth=3, tree_width=2)], ids=["chain", "beam"])
def test_eagle_drafts_padded_to_buckets_equal_exact_ones(tmp_path, shape):
    target_dir = save_tiny(tmp_path / "target", "llama", num_layers=3, seed=0)
    head_dir = save_tiny_eagle(tmp_path / "head", target_dir, draft_vocab_size=256)
    config = EngineConfig(num_blocks=128, block_size=4, cpu_prepack=False)
    target, _ = build_target_engine(target_dir, device="cpu", engine_config=config, with_tokenizer=False)
    exact, bucketed = (build_feature_draft_engine(head_dir, target_dir=target_dir, device="cpu", engine_config=config)
                       for _ in range(2))  # fmt: skip
    pool = padded(bucketed, bucketed.chains, bucketed.trees)
    prompts = {"a": [3, 14, 15, 92], "b": [65, 35], "c": [89, 79, 32, 38, 46, 26, 43, 7, 7, 9]}
    res = target.prefill([PrefillItem(k, p) for k, p in prompts.items()], features=exact.spec)
    for d in (exact, bucketed):
        d.prefill([PrefillItem(k, p, features=r.features.rows(0, len(p) - 1)) for (k, p), r in zip(prompts.items(), res)])
    pending = {k: ([r.first_token], r.features.rows(len(p) - 1, len(p))) for (k, p), r in zip(prompts.items(), res)}
    for _ in range(4):
        items = [SpecItem(s, pending[s][0], features=pending[s][1], **shape) for s in prompts]
        got, want = bucketed.speculate(copy.deepcopy(items)), exact.speculate(copy.deepcopy(items))
        assert [(t.token_ids, t.parent_ids) for t in got] == [(t.token_ids, t.parent_ids) for t in want]
        outs = target.verify([VerifyItem(s, t) for s, t in zip(prompts, got)], features=exact.spec)
        pending = {s: (o.tokens, o.features) for s, o in zip(prompts, outs)}
    assert pool.replays == 4


@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs a GPU")
def test_captured_sampled_steps_equal_eager_ones_on_gpu():
    """On a GPU the sampled body is captured and replayed: the same outcomes as the same body run eagerly."""
    model = build_tiny("llama", vocab_size=VOCAB, seed=1).cuda()
    graphed = TargetEngine(make_runner(copy.deepcopy(model), static_step=True, device_sampling=True))
    eager = TargetEngine(make_runner(copy.deepcopy(model), static_step=True, device_sampling=True))
    eager.static.graphs = None
    params = [SamplingParams(temperature=0.9, top_p=0.9, seed=1), SamplingParams(temperature=1.1, top_k=12, seed=2),
              SamplingParams()]  # fmt: skip
    ids = ["a", "b", "c"]
    for e in (graphed, eager):
        e.prefill([PrefillItem(s, [1 + i, 2, 3], p) for i, (s, p) in enumerate(zip(ids, params))])
    rng = random.Random(2)
    for _ in range(5):
        items = [VerifyItem(s, TokenTree([rng.randrange(VOCAB) for _ in range(3)], [-1, 0, 1])) for s in ids]
        got, want = graphed.verify(copy.deepcopy(items)), eager.verify(copy.deepcopy(items))
        assert [r.tokens for r in got] == [r.tokens for r in want]
    assert graphed.static.graphs.replays >= 4


def test_sampling_requests_trees_padded_to_buckets_equal_exact_ones():
    model = build_tiny("llama", vocab_size=VOCAB, seed=4, hidden_size=32, num_layers=2)
    exact, bucketed = (DraftEngine(make_runner(copy.deepcopy(model), static_step=True)) for _ in range(2))
    pool = padded(bucketed, bucketed.chains, bucketed.trees, bucketed.sampled_chains)
    params = [SamplingParams(temperature=0.8, top_k=11, seed=1), SamplingParams(), SamplingParams(temperature=1.2, top_p=0.9, seed=3)]
    for e in (exact, bucketed):
        e.prefill([PrefillItem(f"t{i}", [3 + i, 4, 5 + 2 * i], p) for i, p in enumerate(params)])
    for step in range(3):
        items = [SpecItem(f"t{i}", [step + 1], tree_depth=3, tree_width=2) for i in range(len(params))]
        got, want = bucketed.speculate(copy.deepcopy(items)), exact.speculate(copy.deepcopy(items))
        assert [(t.token_ids, t.parent_ids) for t in got] == [(t.token_ids, t.parent_ids) for t in want]
    seeded = [SpecItem(f"t{i}", [9], chain_len=3) for i in range(len(params))]  # a sampled chain, padded: seeds hold
    got, want = bucketed.speculate(copy.deepcopy(seeded)), exact.speculate(copy.deepcopy(seeded))
    assert [t.token_ids for t in got] == [t.token_ids for t in want]
    assert pool.replays == 4
    bucketed.runner.check_accounting()


def test_start_captures_the_common_buckets_largest_first(monkeypatch):
    """What a GPU captures when the target starts: decode and 4-token verifies at every batch bucket, largest
    first, each once (the capture itself is CUDA's; recorded here)."""
    import torch

    from shared.engine import graph_buckets

    engine = TargetEngine(make_runner(build_tiny("llama", vocab_size=VOCAB, seed=7), static_step=True))
    pool = GraphPool(engine.runner, capture=False)
    pool.capture = True  # the capture is recorded instead of made
    captured = []
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 0)
    monkeypatch.setattr(pool, "_capture", lambda step, key, scratch: (captured.append(key[1]), pool.graphs.__setitem__(key, None)))
    buckets = engine.static.warm_buckets()
    assert {(b.batch, b.q) for b in buckets} == {(b, q) for b in graph_buckets.BATCH_BUCKETS for q in (1, 5)}
    pool.warm(engine.static, buckets)
    assert len(captured) == len(buckets) and [b.size for b in captured] == sorted((b.size for b in captured), reverse=True)
    pool.warm(engine.static, buckets)
    assert len(captured) == len(buckets)  # captured once
    assert all(k[0] == "StaticStep" for k in pool.graphs)
