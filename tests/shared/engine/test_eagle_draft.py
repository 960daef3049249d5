"""The feature-level (EAGLE-3) draft: lossless with the scheduler, rebuilt from features after a restart,
sampling exact, bad features refused before anything changes."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest
import torch

from scheduler.engine_loop import Scheduler, SchedulerConfig
from scheduler.local_workers import LocalDraftWorker, LocalTargetWorker
from scheduler.policies.speculation import FixedChain, SpecShape, SpeculationPolicy
from scheduler.request import Request
from shared.engine.acceptance import accept_tree
from shared.engine.config import EngineConfig
from shared.engine.eagle.draft_engine import FeatureDraftEngine
from shared.engine.eagle.loading import load_head
from shared.engine.eagle.runner import EagleRunner
from shared.engine.errors import InvalidRequestError, ModelLoadError, UnknownSequenceError
from shared.engine.factory import build_feature_draft_engine, build_target_engine
from shared.engine.features import FeatureBlock
from shared.engine.runner import Work
from shared.engine.sampling import make_generator, probs_from_logits
from shared.engine.types import PrefillItem, SamplingParams, SpecItem, VerifyItem
from shared.models.tiny import save_tiny, save_tiny_eagle

from conftest import Reference

PROMPTS = [[3, 14, 15, 92], [65, 35], [89, 79, 32, 38, 46, 26, 43, 7, 7, 9]]
CONFIG = EngineConfig(num_blocks=128, block_size=4, cpu_prepack=False)


class FixedTree(SpeculationPolicy):
    name = "fixed-tree"

    def __init__(self, depth: int, width: int):
        self.shape = SpecShape.tree(depth, width)

    def decide(self, batch, ctx):
        return [self.shape for _ in batch]


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("eagle")
    target = save_tiny(root / "target", "llama", num_layers=3, seed=0)
    head = save_tiny_eagle(root / "head", target, draft_vocab_size=256)  # a d2t map that is not the identity
    return target, head


def engines(dirs):
    target_dir, head_dir = dirs
    target, loaded = build_target_engine(target_dir, device="cpu", engine_config=CONFIG, with_tokenizer=False)
    draft = build_feature_draft_engine(head_dir, target_dir=target_dir, device="cpu", engine_config=CONFIG)
    return target, draft, Reference(loaded.model)


def run(sched: Scheduler, reqs: list[Request]) -> list[list[int]]:
    async def main():
        streams = [sched.submit(r) for r in reqs]
        _, *outs = await asyncio.gather(sched.run_until_idle(), *(s.collect() for s in streams))
        return outs

    return asyncio.run(main())


@pytest.mark.parametrize("policy", [FixedChain(4), FixedTree(3, 2)], ids=["chain4", "tree3x2"])
def test_feature_draft_is_lossless_through_the_scheduler(dirs, policy):
    target, draft, ref = engines(dirs)
    sched = Scheduler(LocalTargetWorker(target), LocalDraftWorker(draft), spec_policy=policy)
    reqs = [Request(id=f"r{i}", prompt_ids=p, max_new_tokens=12 + 3 * i) for i, p in enumerate(PROMPTS)]
    outs = run(sched, reqs)
    for req, out in zip(reqs, outs):
        assert out == ref.greedy(req.prompt_ids, req.max_new_tokens)
    assert sched.features is not None and sched.features.bytes_in > 0 and sched.features.bytes_out > 0
    assert all(r.num_drafted for r in reqs) if hasattr(reqs[0], "num_drafted") else True
    for engine in (target, draft):
        engine.runner.check_accounting()
        assert engine.runner.seqs == {}
    assert draft.runner.state == {}


@pytest.mark.parametrize("chunk", [None, 1, 2], ids=["serial", "chunk1", "chunk2"])
def test_feature_draft_pipelines_frontier_chunks_losslessly(dirs, chunk):
    """FASER §4.3 with a feature draft: the lookahead runs the chunk on the head's own outputs until the
    target's rows come; every step speculates (no draft failure falls back to plain decoding)."""
    from scheduler.frontier import FrontierConfig

    target, draft, ref = engines(dirs)
    sched = Scheduler(
        LocalTargetWorker(target),
        LocalDraftWorker(draft),
        spec_policy=FixedChain(4),
        config=SchedulerConfig(frontier=FrontierConfig(chunk_size=chunk, require_gain=False) if chunk else None),
    )
    failures = []
    real_failed = sched.link.failed
    sched.link.failed = lambda exc, *a, **k: (failures.append(exc), real_failed(exc, *a, **k))
    long_prompt = [(7 * i + 3) % 250 + 1 for i in range(70)]  # past the 64 rows the feature state starts with
    prompts = [*PROMPTS, long_prompt]
    reqs = [Request(id=f"r{i}", prompt_ids=p, max_new_tokens=14 + 3 * i) for i, p in enumerate(prompts)]
    outs = run(sched, reqs)
    for req, out in zip(reqs, outs):
        assert out == ref.greedy(req.prompt_ids, req.max_new_tokens)
    assert chunk is None or sched.frontier.stats.steps > 0
    assert failures == [], "the draft refused a pipelined call"
    for engine in (target, draft):
        engine.runner.check_accounting()
        assert engine.runner.seqs == {}


@pytest.mark.parametrize("max_call_rows", [None, 3], ids=["one-call", "split-calls"])
def test_a_restarted_draft_is_rebuilt_from_recomputed_features(dirs, max_call_rows):
    target, draft, ref = engines(dirs)
    worker = LocalDraftWorker(draft)
    sched = Scheduler(
        LocalTargetWorker(target),
        worker,
        spec_policy=FixedChain(3),
        config=SchedulerConfig(draft_retry_initial_s=0.0, draft_retry_max_s=0.0),
    )
    if max_call_rows:  # long prompts go back in several calls, none over the byte cap
        sched.features.max_call_bytes = max_call_rows * draft.runner.feature_width * 2
        calls = []
        speculate = worker.speculate

        async def counting(items):
            calls.append(sum(len(i.features.data) for i in items if i.features is not None))
            return await speculate(items)

        worker.speculate = counting
    reqs = [Request(id=f"r{i}", prompt_ids=p, max_new_tokens=24) for i, p in enumerate(PROMPTS)]
    restarted = []

    class Restart:
        def on_step(self, report):
            if report.step == 4:  # the draft process dies and comes back empty
                worker.engine = build_feature_draft_engine(dirs[1], target_dir=dirs[0], device="cpu", engine_config=CONFIG)
                restarted.append(worker.engine)

        def on_finish(self, request):
            pass

    sched.add_observer(Restart())
    outs = run(sched, reqs)
    for req, out in zip(reqs, outs):
        assert out == ref.greedy(req.prompt_ids, req.max_new_tokens)
    assert restarted and sched.features.recomputed >= 1
    if max_call_rows:
        assert max(calls) <= sched.features.max_call_bytes and len(calls) > 8
    for engine in (target, restarted[0]):
        engine.runner.check_accounting()
        assert engine.runner.seqs == {}


def test_recomputed_features_rebuild_the_same_draft_state(dirs):
    target, draft, _ = engines(dirs)
    spec = draft.spec
    prompt = PROMPTS[2]
    res = target.prefill([PrefillItem("s", prompt)], features=spec)[0]
    assert (res.features.start, res.features.num_rows, res.features.width) == (0, len(prompt), draft.runner.feature_width)
    draft.prefill([PrefillItem("s", prompt, features=res.features.rows(0, len(prompt) - 1))])
    pending, rows = [res.first_token], res.features.rows(len(prompt) - 1, len(prompt))
    for _ in range(5):
        tree = draft.speculate([SpecItem("s", pending, chain_len=3, features=rows)])[0]
        out = target.verify([VerifyItem("s", tree)], features=spec)[0]
        assert out.features.num_rows == out.num_accepted + 1  # the fed token, then the accepted path
        pending, rows = out.tokens, out.features
    seq = target.runner.get("s")
    full = target.features(["s"], spec)[0]
    assert (full.start, full.end) == (0, seq.num_committed - 1)
    assert target.runner.seqs.keys() == {"s"}  # the scratch copy is gone
    target.runner.check_accounting()
    fresh = build_feature_draft_engine(dirs[1], target_dir=dirs[0], device="cpu", engine_config=CONFIG)
    fresh.prefill([PrefillItem("s", seq.token_ids[:-1], features=full)])
    a = draft.speculate([SpecItem("s", pending, chain_len=4, features=rows)])[0]
    b = fresh.speculate([SpecItem("s", [seq.token_ids[-1]], chain_len=4)])[0]
    assert a.token_ids == b.token_ids
    torch.testing.assert_close(torch.tensor(a.draft_probs), torch.tensor(b.draft_probs), atol=1e-3, rtol=1e-3)


def test_bad_features_are_refused_and_change_nothing(dirs):
    target, draft, _ = engines(dirs)
    spec = draft.spec
    prompt = PROMPTS[0]
    res = target.prefill([PrefillItem("s", prompt)], features=spec)[0]
    good = res.features.rows(0, len(prompt) - 1)
    with pytest.raises(InvalidRequestError, match="features"):
        draft.prefill([PrefillItem("s", prompt)])  # none at all
    wide = FeatureBlock.from_tensor(torch.zeros(len(prompt) - 1, good.width + 8), 0, "float16")
    with pytest.raises(InvalidRequestError, match="width"):
        draft.prefill([PrefillItem("s", prompt, features=wide)])
    as_f32 = FeatureBlock.from_tensor(good.to_tensor().float(), 0, "float32")
    with pytest.raises(InvalidRequestError, match="float32"):
        draft.prefill([PrefillItem("s", prompt, features=as_f32)])
    assert draft.runner.seqs == {} and draft.runner.state == {}
    draft.prefill([PrefillItem("s", prompt, features=good)])
    last = res.features.rows(len(prompt) - 1, len(prompt))
    snapshot = (draft.runner.get("s").num_committed, draft.runner.state["s"].num_exact)
    gap = FeatureBlock(last.start + 1, 1, last.width, last.dtype, last.data)
    with pytest.raises(InvalidRequestError, match="gap"):
        draft.speculate([SpecItem("s", [res.first_token], chain_len=2, features=gap)])
    too_many = FeatureBlock.join([last, FeatureBlock(last.end, 1, last.width, last.dtype, last.data)])
    with pytest.raises(InvalidRequestError, match="committed"):
        draft.speculate([SpecItem("s", [res.first_token], chain_len=2, features=too_many)])
    with pytest.raises(UnknownSequenceError):
        draft.speculate([SpecItem("nobody", [1], chain_len=2, features=last)])
    assert (draft.runner.get("s").num_committed, draft.runner.state["s"].num_exact) == snapshot
    tree = draft.speculate([SpecItem("s", [res.first_token], chain_len=2, features=last)])[0]
    assert len(tree) == 2  # still usable
    draft.release(["s"])
    draft.runner.check_accounting()
    with pytest.raises(InvalidRequestError, match="feature layers"):
        target.prefill([PrefillItem("t", prompt)], features=replace(spec, layer_ids=(0, 99)))
    assert "t" not in target.runner.seqs
    target.runner.check_accounting()


def test_a_head_that_does_not_fit_its_target_fails_to_load(dirs, tmp_path):
    other = save_tiny(tmp_path / "wide-target", "llama", num_layers=3, hidden_size=96, seed=0)
    with pytest.raises(ModelLoadError, match="width|hidden"):
        load_head(dirs[1], target_dir=other)


VOCAB = 12
COPIES = 100
TRIALS = 2000


FEATURE_SHAPES = {"chain": dict(chain_len=3), "conf_chain": dict(chain_len=3, confidence_threshold=0.3),
                  "tree": dict(tree_depth=2, tree_width=3),
                  "expansion": dict(tree_depth=2, tree_width=2, tree_expansion=(1, 2))}  # fmt: skip


@pytest.mark.parametrize("shape", list(FEATURE_SHAPES))
def test_sampling_with_the_feature_draft_follows_the_target(tmp_path, shape):
    from test_engine_sampling import chi_square

    params = SamplingParams(temperature=1.0, seed=3)
    target_dir = save_tiny(tmp_path / "t", "llama", vocab_size=VOCAB, num_layers=2, seed=11, initializer_range=0.3)
    head_dir = save_tiny_eagle(tmp_path / "h", target_dir, seed=5)
    target, _ = build_target_engine(target_dir, device="cpu", engine_config=EngineConfig(num_blocks=2048, block_size=4, cpu_prepack=False), with_tokenizer=False)
    draft = build_feature_draft_engine(head_dir, target_dir=target_dir, device="cpu", engine_config=EngineConfig(num_blocks=2048, block_size=4, cpu_prepack=False))
    runner = target.runner
    prompt = [3, 1, 4, 1, 5]
    seqs = [runner.add(f"t{i}", prompt, params) for i in range(COPIES)]
    first = runner.forward([Work(seqs[0], want_root=True)], feature_layers=draft.spec.layer_ids)
    feats = FeatureBlock.from_tensor(first.features, 0, draft.spec.dtype)  # rows of the prompt's 5 tokens
    runner.commit(seqs[0], [])
    p = probs_from_logits(first.root(0)[None], params)[0]
    ids = [f"d{i}" for i in range(COPIES)]
    draft.prefill([PrefillItem(d, prompt[:-1], replace(params, seed=100 + i), features=feats.rows(0, 4)) for i, d in enumerate(ids)])
    draft.speculate([SpecItem(d, [prompt[-1]]) for d in ids])  # its row (f_3) came with the prefill
    gen = make_generator(7)
    counts = torch.zeros(VOCAB)
    accepted = 0
    for _ in range(TRIALS // COPIES):
        items = [SpecItem(d, [], **FEATURE_SHAPES[shape]) for d in ids]
        trees = draft.speculate(items)
        works = [Work(s, new_nodes=list(zip(t.token_ids, t.parent_ids)), want_root=True, want_nodes=True) for s, t in zip(seqs, trees)]
        out = runner.forward(works)
        for i, (seq, tree) in enumerate(zip(seqs, trees)):
            rows = torch.cat([out.root(i)[None], out.nodes(i, len(tree))])
            result = accept_tree(tree, rows, params, gen)
            runner.commit(seq, [])
            counts[result.tokens[0]] += 1
            accepted += result.num_accepted > 0
    assert chi_square(counts, p) > 1e-3
    assert accepted > 0
    runner.check_accounting()
    draft.runner.check_accounting()


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])
def test_a_published_layout_head_serves_llama_and_qwen_targets(tmp_path, family):
    """A head as vLLM / SGLang load it (config + safetensors, no embedding, d2t) drafts for each family's target."""
    target_dir = save_tiny(tmp_path / "t", family, num_layers=3, seed=2)
    head_dir = save_tiny_eagle(tmp_path / "h", target_dir, aux_layer_ids=None, draft_vocab_size=128)
    from safetensors import safe_open

    with safe_open(str(head_dir / "model.safetensors"), framework="pt") as f:
        keys = set(f.keys())
    assert {"fc.weight", "midlayer.self_attn.q_proj.weight", "midlayer.hidden_norm.weight", "d2t", "t2d"} <= keys
    assert "embed_tokens.weight" not in keys
    target, loaded = build_target_engine(target_dir, device="cpu", engine_config=CONFIG, with_tokenizer=False)
    draft = build_feature_draft_engine(head_dir, target_dir=target_dir, device="cpu", engine_config=CONFIG)
    ref = Reference(loaded.model)
    sched = Scheduler(LocalTargetWorker(target), LocalDraftWorker(draft), spec_policy=FixedChain(3))
    reqs = [Request(id=f"r{i}", prompt_ids=p, max_new_tokens=10) for i, p in enumerate(PROMPTS[:2])]
    for req, out in zip(reqs, run(sched, reqs)):
        assert out == ref.greedy(req.prompt_ids, req.max_new_tokens)


@pytest.mark.parametrize("shape", [{"chain_len": 4}, {"tree_depth": 3, "tree_width": 3}], ids=["chain", "tree"])
@pytest.mark.parametrize("sampling", [SamplingParams(), SamplingParams(temperature=0.8, seed=3)], ids=["greedy", "sampled"])
def test_drafting_over_the_draft_vocabulary_picks_what_the_full_vocabulary_would(dirs, shape, sampling):
    """The head's logits stay over its draft vocabulary (ForwardOutput.vocab_ids); the drafters map the columns they
    pick. Same trees, token ids and probabilities as the logits scattered into the whole vocabulary (-inf elsewhere)."""
    from bench.diagnostics.draft_trees import scatter_to_full_vocabulary

    target, compact, _ = engines(dirs)
    _, full, _ = engines(dirs)
    ids = full.runner.logit_ids
    assert ids is not None and len(ids) < full.runner.vocab_size
    scatter_to_full_vocabulary(full)  # the logits as before: every column, -inf outside the draft vocabulary
    spec = compact.spec
    prompt = PROMPTS[1]
    res = target.prefill([PrefillItem("s", prompt, sampling)], features=spec)[0]
    rows = res.features.rows(0, len(prompt) - 1)
    trees = []
    for draft in (compact, full):
        draft.prefill([PrefillItem("s", prompt, sampling, features=rows)])
        step = res.features.rows(len(prompt) - 1, len(prompt))
        trees.append(draft.speculate([SpecItem("s", [res.first_token], features=step, **shape)])[0])
    a, b = trees
    assert a.token_ids == b.token_ids and a.parent_ids == b.parent_ids
    assert all(t in set(ids.tolist()) for t in a.token_ids)
    torch.testing.assert_close(torch.tensor(a.draft_probs), torch.tensor(b.draft_probs))
    for row, dist in a.child_dists.items():
        other = b.child_dists[row]
        assert dist.token_ids.tolist() == other.token_ids.tolist()
        torch.testing.assert_close(dist.probs, other.probs)
