"""The static verify step: the same tokens, statuses and KV as the eager forward, with one host read."""

from __future__ import annotations

import inspect
import random

import pytest
import torch

from shared.engine import cuda_graphs, static_step
from shared.engine.acceptance import _accept_greedy
from shared.engine.device_acceptance import accept_greedy_batch, node_status
from shared.engine.errors import ContextLengthError, OutOfBlocksError
from shared.engine.target_engine import TargetEngine
from shared.engine.tree import ancestors, children_of
from shared.engine.types import PrefillItem, TokenTree, VerifyItem
from shared.models.tiny import build_tiny
from shared.profiling import host_work
from shared.profiling.host_work import HostWorkCounter, engine_device_tensors

from conftest import Reference, make_runner


def engines(model, **kw):
    import copy

    return (
        TargetEngine(make_runner(copy.deepcopy(model), static_step=True, **kw)),
        TargetEngine(make_runner(copy.deepcopy(model), static_step=False, **kw)),
    )


def tree_for(rng: random.Random, greedy: list[int], vocab: int, k: int, chain: bool) -> TokenTree:
    """A chain of the greedy continuation with its tail spoiled, or a tree whose every level has a wrong
    sibling before the right token (so the walk must pick the right child, not the first)."""
    if chain:
        tokens = greedy[:k]
        if k > 2 and rng.random() < 0.5:
            tokens[-1] = (tokens[-1] + 1) % vocab
        return TokenTree(token_ids=tokens, parent_ids=list(range(-1, k - 1)))
    tokens, parents, right = [], [], -1
    for d in range(k):
        tokens += [(greedy[d] + 1 + rng.randrange(vocab - 1)) % vocab, greedy[d]]
        parents += [right, right]
        right = len(parents) - 1
    if k and rng.random() < 0.5:
        tokens[-1] = (tokens[-1] + 1) % vocab
    return TokenTree(token_ids=tokens, parent_ids=parents)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_static_equals_eager_and_reference(arch):
    model = build_tiny(arch, vocab_size=96, seed=0)
    fast, eager = engines(model)
    assert fast.static is not None and eager.static is None
    ref = Reference(model)
    rng = random.Random(0)
    prompts = {f"s{i}": [rng.randrange(96) for _ in range(3 + 5 * i)] for i in range(3)}
    for e in (fast, eager):
        e.prefill([PrefillItem(k, p) for k, p in prompts.items()])
    accepted = 0
    for step in range(12):
        items = []
        for k in prompts:
            ids = fast.runner.get(k).token_ids
            n = rng.randrange(0, 5)
            greedy = ref.greedy(ids, max(n, 1))
            items.append(VerifyItem(k, tree_for(rng, greedy, 96, n, chain=step % 3 == 0)))
        got, want = fast.verify(items), eager.verify(items)
        for a, b in zip(got, want):
            assert (a.tokens, a.accepted_nodes, a.node_status) == (b.tokens, b.accepted_nodes, b.node_status)
            accepted += len(a.accepted_nodes)
        fast.runner.check_accounting()
    assert accepted > 10  # the trees were really accepted, not only rejected
    for k, p in prompts.items():
        seq = fast.runner.get(k)
        assert seq.token_ids == eager.runner.get(k).token_ids
        assert seq.token_ids[len(p) :] == ref.greedy(p, len(seq.token_ids) - len(p))


def test_device_acceptance_matches_host_walk():
    rng = random.Random(3)
    gen = torch.Generator().manual_seed(3)
    for _ in range(200):
        m = rng.randrange(1, 9)
        parents = [rng.randrange(-1, j) for j in range(m)]
        tokens = [rng.randrange(4) for _ in range(m)]  # a vocabulary of 4: duplicate siblings are common
        logits = torch.randn(1 + m, 4, generator=gen)
        want = _accept_greedy(TokenTree(token_ids=tokens, parent_ids=parents), logits, children_of(parents))
        width = m + rng.randrange(3)  # padded past the tree
        pad = width - m
        out = accept_greedy_batch(
            logits.argmax(-1)[None],  # the best row r of a padded tree: only rows 0 .. m are read
            torch.tensor([tokens + [0] * pad]),
            torch.tensor([parents + [-1] * pad]),
            torch.block_diag(ancestors(parents), torch.eye(pad, dtype=torch.bool))[None] if pad else ancestors(parents)[None],
            torch.tensor([[True] * m + [False] * pad]),
        )[0].tolist()
        count, bonus, path = out[0], out[1], out[2 : 2 + out[0]]
        assert path == want.accepted_nodes and [tokens[j] for j in path] + [bonus] == want.tokens
        assert node_status(parents, path) == want.node_status


@pytest.mark.parametrize("batch", [1, 4])
@pytest.mark.parametrize("parents", [[], [-1, 0, 1, 2], [-1, -1, 0, 0, 1, 2]], ids=["decode", "chain4", "tree6"])
def test_one_host_sync_per_step(batch, parents):
    """The GPU property held on CPU: a static step reads the device once and does little host work."""
    fast, eager = engines(build_tiny("llama", vocab_size=96, seed=0))
    rng = random.Random(1)
    for e in (fast, eager):
        e.prefill([PrefillItem(f"s{i}", [rng.randrange(96) for _ in range(9)]) for i in range(batch)])
    counts = {}
    for name, e in (("static", fast), ("eager", eager)):
        items = [VerifyItem(f"s{i}", TokenTree([rng.randrange(96) for _ in parents], list(parents))) for i in range(batch)]
        e.verify(items)  # warm
        items = [VerifyItem(f"s{i}", TokenTree([rng.randrange(96) for _ in parents], list(parents))) for i in range(batch)]
        with HostWorkCounter(engine_device_tensors(e.runner)) as counter:
            e.verify(items)
        counts[name] = counter
    static = counts["static"]
    assert static.num_syncs == 1, dict(static.syncs)
    assert next(iter(static.syncs)).startswith("shared/engine/static_step.py")
    assert static.ops <= 100 + 10 * batch
    assert static.calls <= 300 + 30 * batch
    assert counts["eager"].num_syncs >= 5  # the counter sees the eager path's reads (it is not blind)


def test_body_is_the_captured_region(monkeypatch):
    """On CPU the body runs inside graph_body(), and the CUDA path captures that same method."""
    fast, _ = engines(build_tiny("llama", vocab_size=96, seed=0))
    fast.prefill([PrefillItem("a", [1, 2, 3])])
    seen = []
    body = static_step.StaticStep.body

    def spy(self, flat, shape):
        seen.append(host_work.inside_body())
        return body(self, flat, shape)

    monkeypatch.setattr(static_step.StaticStep, "body", spy)
    fast.verify([VerifyItem("a", TokenTree([4, 5], [-1, 0]))])
    assert seen == [True]
    capture = inspect.getsource(cuda_graphs.GraphPool._capture)
    assert "with torch.cuda.graph(graph, pool=self.pool):\n            static_out = step.body(static_in, bucket)" in capture


def test_bad_steps_change_nothing():
    fast, _ = engines(build_tiny("llama", vocab_size=96, seed=0), num_blocks=8)
    fast.prefill([PrefillItem("a", [1, 2, 3]), PrefillItem("b", [4, 5])])
    before = {k: (list(s.token_ids), s.num_cached, list(s.block_ids)) for k, s in fast.runner.seqs.items()}
    with pytest.raises(OutOfBlocksError):
        fast.verify([VerifyItem("a", TokenTree([1] * 20, list(range(-1, 19)))), VerifyItem("b", TokenTree([1] * 20, list(range(-1, 19))))])
    fast.runner.max_context = 10
    with pytest.raises(ContextLengthError):
        fast.verify([VerifyItem("a", TokenTree([1] * 8, list(range(-1, 7))))])
    assert {k: (list(s.token_ids), s.num_cached, list(s.block_ids)) for k, s in fast.runner.seqs.items()} == before
    fast.runner.check_accounting()


def test_what_stays_eager():
    """16-bit models on CPU (row exactness), prefills and feature capture run the eager forward."""
    model = build_tiny("llama", vocab_size=96, seed=0).to(torch.bfloat16)
    assert not static_step.supported(make_runner(model))
    fast, _ = engines(build_tiny("llama", vocab_size=96, seed=0))
    fast.prefill([PrefillItem("a", [1, 2, 3])])
    item = VerifyItem("a", TokenTree([4], [-1]))
    assert fast._static_eligible([], [item], None)
    assert not fast._static_eligible([PrefillItem("b", [1])], [item], None)
    assert not fast._static_eligible([], [item], features=object())


def test_sampled_steps_seeded_and_equal_to_eager():
    """A sampled verify through the static forward draws what the eager forward draws, seed for seed."""
    from shared.engine.types import SamplingParams

    fast, eager = engines(build_tiny("llama", vocab_size=96, seed=0))
    for e in (fast, eager):
        e.prefill([PrefillItem(f"s{i}", [1 + i, 2, 3], SamplingParams(temperature=0.9, top_p=0.95, seed=i)) for i in range(3)])
    rng = random.Random(5)
    for step in range(10):
        items = []
        for i in range(3):
            m = rng.randrange(0, 5)
            parents = [rng.randrange(-1, j) for j in range(m)]
            items.append(VerifyItem(f"s{i}", TokenTree([rng.randrange(96) for _ in range(m)], parents)))
        for a, b in zip(fast.verify(items), eager.verify(items)):
            assert (a.tokens, a.accepted_nodes) == (b.tokens, b.accepted_nodes)
        fast.runner.check_accounting()
    for i in range(3):
        assert fast.runner.get(f"s{i}").token_ids == eager.runner.get(f"s{i}").token_ids


def _random_items(rng: random.Random, ids: list[str], vocab: int) -> list[VerifyItem]:
    items = []
    for sid in ids:
        m = rng.randrange(0, 6)
        parents = [rng.randrange(-1, j) for j in range(m)]
        items.append(VerifyItem(sid, TokenTree([rng.randrange(vocab) for _ in range(m)], parents)))
    return items


def test_device_sampled_steps_read_the_device_once_and_keep_greedy_rows_exact():
    """With acceptance on the device for sampled steps (device_sampling.py; on by default on a GPU): one host
    read per step, the seed fixes the output, and a greedy request sampled beside others gets exactly the eager
    path's tokens, trees and their KV moves included."""
    from shared.engine.types import SamplingParams

    model = build_tiny("llama", vocab_size=96, seed=0)
    fast, eager = engines(model, device_sampling=True)
    again, _ = engines(model, device_sampling=True)
    assert fast.static.device_sampling and not eager.static
    params = [SamplingParams(temperature=0.0), SamplingParams(temperature=0.9, top_p=0.95, seed=1),
              SamplingParams(temperature=1.2, top_k=20, seed=2)]  # fmt: skip
    ids = ["g", "s1", "s2"]
    for e in (fast, eager, again):
        e.prefill([PrefillItem(sid, [1 + i, 2, 3], p) for i, (sid, p) in enumerate(zip(ids, params))])
    rng = random.Random(9)
    for step in range(12):
        items = _random_items(rng, ids, 96)
        with HostWorkCounter(engine_device_tensors(fast.runner)) as counter:
            got = fast.verify(items)
        assert counter.num_syncs == 1, dict(counter.syncs)
        want, same = eager.verify(items), again.verify(items)
        assert (got[0].tokens, got[0].accepted_nodes, got[0].node_status) == (
            want[0].tokens, want[0].accepted_nodes, want[0].node_status)  # greedy: exact
        assert [(r.tokens, r.node_status) for r in got] == [(r.tokens, r.node_status) for r in same]  # seeded
        for r, item in zip(got, items):
            assert r.tokens[:-1] == [item.tree.token_ids[j] for j in r.accepted_nodes]
        fast.runner.check_accounting()
    assert fast.static.num_host_accept == 0
    assert fast.runner.get("g").token_ids == eager.runner.get("g").token_ids
