"""The EAGLE-3 head's static chain: the eager chain's tokens, probabilities, head outputs and feature state."""

from __future__ import annotations

import copy

import pytest
import torch

from shared.engine.config import EngineConfig
from shared.engine.eagle.static_chain import EagleChainStep
from shared.engine.eagle.static_tree import EagleTreeStep
from shared.engine.errors import InvalidRequestError
from shared.engine.factory import build_feature_draft_engine, build_target_engine
from shared.engine.types import PrefillItem, SamplingParams, SpecItem, VerifyItem
from shared.models.tiny import save_tiny, save_tiny_eagle
from shared.profiling.host_work import HostWorkCounter, engine_device_tensors

PROMPTS = {"a": [3, 14, 15, 92], "b": [65, 35], "c": [89, 79, 32, 38, 46, 26, 43, 7, 7, 9]}


def config(static: bool) -> EngineConfig:
    return EngineConfig(num_blocks=128, block_size=4, cpu_prepack=False, static_step=static)


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("eagle-static")
    target = save_tiny(root / "target", "llama", num_layers=3, seed=0)
    head = save_tiny_eagle(root / "head", target, draft_vocab_size=256)  # a d2t map that is not the identity
    return target, head


def engines(dirs):
    target_dir, head_dir = dirs
    target, _ = build_target_engine(target_dir, device="cpu", engine_config=config(True), with_tokenizer=False)
    fast, slow = (build_feature_draft_engine(head_dir, target_dir=target_dir, device="cpu", engine_config=config(s))
                  for s in (True, False))  # fmt: skip
    assert isinstance(fast.chains, EagleChainStep) and isinstance(fast.trees, EagleTreeStep) and slow.chains is None
    return target, fast, slow


def same(fast, slow, got, want) -> None:
    for a, b in zip(got, want):
        assert a.token_ids == b.token_ids
        assert a.draft_probs == pytest.approx(b.draft_probs, abs=1e-5)
    for seq_id, s in fast.runner.seqs.items():
        t = slow.runner.seqs[seq_id]
        assert (s.token_ids, s.num_cached, s.tree.token_ids, s.tree.parent_ids) == (
            t.token_ids, t.num_cached, t.tree.token_ids, t.tree.parent_ids)  # fmt: skip
        x, y = fast.runner.state[seq_id], slow.runner.state[seq_id]
        assert (x.num_rows, x.num_exact, x.exact_kv, x.num_out) == (y.num_rows, y.num_exact, y.exact_kv, y.num_out)
        torch.testing.assert_close(x.out[: x.num_out], y.out[: y.num_out], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(x.fused[: x.num_rows], y.fused[: y.num_rows], atol=1e-5, rtol=1e-5)
    fast.runner.check_accounting()


def prefilled(dirs):
    target, fast, slow = engines(dirs)
    spec = fast.spec
    res = target.prefill([PrefillItem(k, p) for k, p in PROMPTS.items()], features=spec)
    for d in (fast, slow):
        d.prefill([PrefillItem(k, p, features=r.features.rows(0, len(p) - 1)) for (k, p), r in zip(PROMPTS.items(), res)])
    pending = {k: ([r.first_token], r.features.rows(len(p) - 1, len(p))) for (k, p), r in zip(PROMPTS.items(), res)}
    return target, fast, slow, pending


def test_static_eagle_chain_equals_eager_through_verify_rounds(dirs):
    target, fast, slow, pending = prefilled(dirs)
    for step in range(6):
        k = 2 + step % 3
        items = [SpecItem(s, pending[s][0], chain_len=k, features=pending[s][1]) for s in PROMPTS]
        got, want = fast.speculate(copy.deepcopy(items)), slow.speculate(copy.deepcopy(items))
        same(fast, slow, got, want)
        outs = target.verify([VerifyItem(s, t) for s, t in zip(PROMPTS, got)], features=fast.spec)
        pending = {s: (o.tokens, o.features) for s, o in zip(PROMPTS, outs)}
    assert fast.chains.runs == 6


@pytest.mark.parametrize("shape", [dict(tree_depth=3, tree_width=2), dict(tree_depth=3, tree_width=3, tree_expansion=(1, 3, 1))])
def test_static_eagle_trees_equal_eager_through_verify_rounds(dirs, shape):
    """Beams and expansions: each level's nodes fed their parents' outputs, the same trees and head outputs."""
    target, fast, slow, pending = prefilled(dirs)
    for _ in range(4):
        items = [SpecItem(s, pending[s][0], features=pending[s][1], **shape) for s in PROMPTS]
        got, want = fast.speculate(copy.deepcopy(items)), slow.speculate(copy.deepcopy(items))
        assert [t.parent_ids for t in got] == [t.parent_ids for t in want]
        same(fast, slow, got, want)
        outs = target.verify([VerifyItem(s, t) for s, t in zip(PROMPTS, got)], features=fast.spec)
        pending = {s: (o.tokens, o.features) for s, o in zip(PROMPTS, outs)}
    assert fast.trees.runs == 4


def test_optimistic_commits_run_on_the_heads_outputs_then_the_targets_rows(dirs):
    """FASER's lookahead: the drafted chain committed before the target's rows came (provisional input rows
    from the head's outputs), then the rows arrive and those positions run again, and a rollback."""
    target, fast, slow, pending = prefilled(dirs)
    items = [SpecItem(s, pending[s][0], chain_len=3, features=pending[s][1]) for s in PROMPTS]
    chunk = fast.speculate(copy.deepcopy(items))
    same(fast, slow, chunk, slow.speculate(copy.deepcopy(items)))
    ahead = [SpecItem(s, t.token_ids, chain_len=3) for s, t in zip(PROMPTS, chunk)]  # no rows yet: optimistic
    same(fast, slow, fast.speculate(copy.deepcopy(ahead)), slow.speculate(copy.deepcopy(ahead)))
    outs = target.verify([VerifyItem(s, t) for s, t in zip(PROMPTS, chunk)], features=fast.spec)
    back = [SpecItem(s, o.tokens, chain_len=2, features=o.features, rollback=len(t)) for s, o, t in zip(PROMPTS, outs, chunk)]
    same(fast, slow, fast.speculate(copy.deepcopy(back)), slow.speculate(copy.deepcopy(back)))


def test_one_host_sync_and_the_same_refusals(dirs):
    target, fast, slow, pending = prefilled(dirs)
    items = [SpecItem(s, pending[s][0], chain_len=4, features=pending[s][1]) for s in PROMPTS]
    with HostWorkCounter(device_tensors=engine_device_tensors(fast.runner)) as counter:
        trees = fast.speculate(copy.deepcopy(items))
    slow.speculate(copy.deepcopy(items))
    assert all(len(t) == 4 for t in trees) and sum(counter.syncs.values()) == 1, dict(counter.syncs)
    # two tokens past the target's rows: positions without features are refused by both, before anything runs
    behind = [SpecItem("a", trees[0].token_ids[:1] + [5, 6], chain_len=2, rollback=0)]
    for d in (fast, slow):
        with pytest.raises(InvalidRequestError, match="no target features"):
            d.speculate(copy.deepcopy(behind))
    assert fast.runner.get("a").num_cached == slow.runner.get("a").num_cached
    fast.runner.check_accounting()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_the_cuda_graph_chain_equals_the_eager_chain_on_gpu(dirs):
    target_dir, head_dir = dirs
    target, _ = build_target_engine(target_dir, device="cuda", engine_config=config(True), with_tokenizer=False)
    fast, slow = (build_feature_draft_engine(head_dir, target_dir=target_dir, device="cuda", engine_config=config(s))
                  for s in (True, False))  # fmt: skip
    assert fast.chains.graphs is not None
    res = target.prefill([PrefillItem(k, p) for k, p in PROMPTS.items()], features=fast.spec)
    for d in (fast, slow):
        d.prefill([PrefillItem(k, p, features=r.features.rows(0, len(p) - 1)) for (k, p), r in zip(PROMPTS.items(), res)])
    pending = {k: ([r.first_token], r.features.rows(len(p) - 1, len(p))) for (k, p), r in zip(PROMPTS.items(), res)}
    for _ in range(4):
        items = [SpecItem(s, pending[s][0], chain_len=3, features=pending[s][1]) for s in PROMPTS]
        got, want = fast.speculate(copy.deepcopy(items)), slow.speculate(copy.deepcopy(items))
        assert [t.token_ids for t in got] == [t.token_ids for t in want]
        outs = target.verify([VerifyItem(s, t) for s, t in zip(PROMPTS, got)], features=fast.spec)
        pending = {s: (o.tokens, o.features) for s, o in zip(PROMPTS, outs)}
    assert fast.chains.graphs.replays >= 3


@pytest.mark.parametrize("shape", [dict(chain_len=3), dict(tree_depth=3, tree_width=2)], ids=["chain", "beam"])
def test_sampling_requests_take_the_static_eagle_drafts_and_equal_eager_ones(dirs, shape):
    """Sampling requests: chains drawn as the eager drafter draws (the same uniforms, inverse CDF over the draft
    vocabulary, q mapped to target ids), trees ranked by each request's own probabilities."""
    target_dir, head_dir = dirs
    target, _ = build_target_engine(target_dir, device="cpu", engine_config=config(True), with_tokenizer=False)
    fast, slow = (build_feature_draft_engine(head_dir, target_dir=target_dir, device="cpu", engine_config=config(s))
                  for s in (True, False))  # fmt: skip
    params = {"a": SamplingParams(temperature=0.8, seed=1), "b": SamplingParams(),
              "c": SamplingParams(temperature=1.1, top_k=20, top_p=0.9, seed=2)}  # fmt: skip
    res = target.prefill([PrefillItem(k, PROMPTS[k], params[k]) for k in PROMPTS], features=fast.spec)
    for d in (fast, slow):
        d.prefill([PrefillItem(k, PROMPTS[k], params[k], features=r.features.rows(0, len(PROMPTS[k]) - 1))
                   for k, r in zip(PROMPTS, res)])  # fmt: skip
    pending = {k: ([r.first_token], r.features.rows(len(PROMPTS[k]) - 1, len(PROMPTS[k]))) for k, r in zip(PROMPTS, res)}
    ids = set(fast.runner.logit_ids.tolist())
    for _ in range(4):
        items = [SpecItem(s, pending[s][0], features=pending[s][1], **shape) for s in PROMPTS]
        got, want = fast.speculate(copy.deepcopy(items)), slow.speculate(copy.deepcopy(items))
        assert [t.parent_ids for t in got] == [t.parent_ids for t in want]
        same(fast, slow, got, want)
        for a, b in zip(got, want):
            assert a.child_dists.keys() == b.child_dists.keys()
            for row, dist in a.child_dists.items():
                assert dist.token_ids.tolist() == b.child_dists[row].token_ids.tolist() and set(dist.token_ids.tolist()) <= ids
                torch.testing.assert_close(dist.probs, b.child_dists[row].probs, atol=1e-5, rtol=1e-4)
        outs = target.verify([VerifyItem(s, t) for s, t in zip(PROMPTS, got)], features=fast.spec)
        pending = {s: (o.tokens, o.features) for s, o in zip(PROMPTS, outs)}
    assert (fast.sampled_chains.runs if "chain_len" in shape else fast.trees.runs) == 4
