"""Sampled draft chains on the device: the q each token was drawn from is draft_dist's at that prefix, draws
follow q, a seed fixes the chain, and the chains are the eager drafter's, draw for draw."""

from __future__ import annotations

import copy

import pytest
import torch
from scipy.stats import chisquare

from shared.engine.draft_engine import DraftEngine
from shared.engine.sampling import inverse_cdf as draw
from shared.engine.sampling import draft_dist
from shared.engine.types import PrefillItem, SamplingParams, SpecItem
from shared.models.tiny import build_tiny
from shared.profiling.host_work import HostWorkCounter, engine_device_tensors

from conftest import make_runner

VOCAB = 96
PARAMS = {"g": SamplingParams(), "t": SamplingParams(temperature=0.9, seed=1),
          "k": SamplingParams(temperature=1.2, top_k=10, seed=2), "p": SamplingParams(temperature=0.8, top_p=0.9, min_p=0.01, seed=3)}  # fmt: skip


def engine(model, static: bool) -> DraftEngine:
    e = DraftEngine(make_runner(copy.deepcopy(model), static_step=static))
    e.prefill([PrefillItem(s, [3 + i, 9, 27, 81 % VOCAB], p) for i, (s, p) in enumerate(PARAMS.items())])
    return e


def test_each_q_is_draft_dist_at_its_prefix_and_greedy_rows_are_exact():
    model = build_tiny("llama", vocab_size=VOCAB, seed=21, hidden_size=32, num_layers=2)
    fast, slow = engine(model, True), engine(model, False)
    for step in range(4):
        items = [SpecItem(s, [step + 1], chain_len=4) for s in PARAMS]
        got, want = fast.speculate(copy.deepcopy(items)), slow.speculate(copy.deepcopy(items))
        assert fast.sampled_chains.runs == step + 1
        assert (got[0].token_ids, not got[0].child_dists) == (want[0].token_ids, True)  # greedy: the eager chain
        for a, b in zip(got, want):  # the same uniforms, the same inverse CDF: the eager drafter's draws
            assert a.token_ids == b.token_ids
            assert a.draft_probs == pytest.approx(b.draft_probs, abs=1e-6)
            assert a.child_dists.keys() == b.child_dists.keys()
        for seq_id, tree in zip(PARAMS, got):
            seq = fast.runner.get(seq_id)
            context = seq.token_ids + tree.token_ids
            with torch.inference_mode():
                logits = model(torch.tensor([context])).logits[0].float()  # [n + k, V]
            n = len(seq.token_ids)
            for j, token in enumerate(tree.token_ids):
                if seq.sampling.greedy:
                    continue
                ref = draft_dist(logits[n - 1 + j], seq.sampling, fast.runner.config.draft_top_k)
                dist = tree.child_dists[j]
                assert set(dist.token_ids.tolist()) == set(ref.token_ids.tolist())
                torch.testing.assert_close(dist.probs, ref.probs, atol=1e-5, rtol=1e-4)
                assert token in dist.token_ids.tolist()
                assert tree.draft_probs[j] == pytest.approx(float(dist.probs[dist.token_ids == token].sum()), abs=1e-6)
        for e in (fast, slow):
            e.speculate([SpecItem(s, t.token_ids + [5], chain_len=0) for s, t in zip(PARAMS, got)])
    fast.runner.check_accounting()


def test_a_seed_fixes_the_chain_and_one_read_per_call():
    model = build_tiny("llama", vocab_size=VOCAB, seed=22, hidden_size=32, num_layers=2)
    a, b = engine(model, True), engine(model, True)
    items = [SpecItem(s, [7], chain_len=3) for s in PARAMS]
    with HostWorkCounter(device_tensors=engine_device_tensors(a.runner)) as counter:
        first = a.speculate(copy.deepcopy(items))
    assert sum(counter.syncs.values()) == 1, dict(counter.syncs)
    assert [t.token_ids for t in first] == [t.token_ids for t in b.speculate(copy.deepcopy(items))]


def test_draws_follow_q():
    """The inverse-CDF draw of a column: chi-square over 40,000 draws of two distributions (one with zeros)."""
    gen = torch.Generator().manual_seed(0)
    mass = torch.tensor([[0.4, 0.3, 0.2, 0.1, 0.0, 0.0], [0.05, 0.05, 0.3, 0.25, 0.2, 0.15]])
    n = 40_000
    u = torch.rand(n, 2, generator=gen)
    counts = torch.zeros(2, 6)
    for row in range(2):
        cols = draw(mass[row].expand(n, 6), u[:, row])
        counts[row] = torch.bincount(cols, minlength=6).float()
    assert counts[0, 4:].sum() == 0  # a zero-mass column is never drawn
    for row, keep in ((0, 4), (1, 6)):
        assert chisquare(counts[row, :keep].numpy(), (n * mass[row, :keep]).numpy()).pvalue > 1e-3
