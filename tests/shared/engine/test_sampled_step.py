"""The sampled step's staged walk inputs (sampled_plan.py) are device_sampling's: children, dense draft q,
uniforms and per-row parameters, exactly, for exact shapes and for buckets."""

from __future__ import annotations

import random

import numpy as np
import torch

from shared.engine import sampled_plan
from shared.engine.device_sampling import sampled_inputs, sampling_columns
from shared.engine.sampled_plan import SampledInput
from shared.engine.step_plan import SeqStep, StepShape
from shared.engine.types import SamplingParams, SparseDist, TokenTree

VOCAB = 50


def random_batch(rng: random.Random, batch: int):
    trees, params = [], []
    for b in range(batch):
        m = rng.randrange(0, 7)
        parents = [rng.randrange(-1, j) for j in range(m)]
        tokens = [rng.randrange(VOCAB) for _ in range(m)]
        dists = {}
        for row in range(m + 1):
            if rng.random() < 0.6:
                support = [rng.randrange(VOCAB) for _ in range(rng.randrange(1, 9))]  # repeats add up
                dists[row] = SparseDist(torch.tensor(support), torch.rand(len(support), generator=torch.Generator().manual_seed(b)))
        trees.append(TokenTree(tokens, parents, child_dists=dists))
        params.append(rng.choice([SamplingParams(), SamplingParams(temperature=0.8, top_k=7),
                                  SamplingParams(temperature=1.3, top_p=0.8, min_p=0.02)]))  # fmt: skip
    return trees, params


def decoded(shape, flat: np.ndarray) -> dict[str, torch.Tensor]:
    t = torch.from_numpy(flat)
    s = {name: t[a : a + n].view(dims) for name, (a, n, dims) in shape.offsets().items()}
    out = {k: s[k] for k in ("kids", "has_q", "q_ids", "greedy", "top_k")}
    for name in ("q_mass", "u", "temp", "top_p", "min_p"):
        out[name] = s[name].view(torch.float64).float()
    q = torch.zeros(*s["q_ids"].shape[:2], VOCAB)
    out["q"] = q.scatter_add_(2, s["q_ids"], out["q_mass"])
    return out


def test_staged_inputs_are_device_samplings():
    rng = random.Random(0)
    for _ in range(20):
        batch = rng.randrange(1, 6)
        trees, params = random_batch(rng, batch)
        nodes = max(len(t) for t in trees)
        m = max(1, nodes)
        step = StepShape(batch=batch, rows=batch, q=1 + nodes, nodes=m, blocks=1, kv_cap=8, chains=False)
        u = np.random.default_rng(1).random((batch, nodes + 1), dtype=np.float32)
        inp = SampledInput([SeqStep([1], 0, [0], [], [])] * batch, trees, u, params)
        exact = sampled_plan.shape_of(step, inp, VOCAB)
        for shape in (exact, sampled_plan.SampledShape(StepShape(8, 8 * 16, 16, 16, 4, 256, False), 16, 16,
                                                       exact.filters)):  # fmt: skip
            flat = np.zeros(shape.size, dtype=np.int64)
            sampled_plan.build_sampled(inp, shape, VOCAB, flat)
            got = decoded(shape, flat)
            tokens, kids, q, has_q = sampled_inputs(trees, nodes, VOCAB, "cpu")
            rows, width = kids.shape[1], kids.shape[2]
            assert torch.equal(got["kids"][:batch, :rows, :width], kids) and (got["kids"][:batch, :, width:] == -1).all()
            assert (got["kids"][batch:] == -1).all() and (got["kids"][:batch, rows:] == -1).all()
            assert torch.equal(got["has_q"][:batch, :rows] > 0, has_q) and not got["has_q"][batch:].any()
            torch.testing.assert_close(got["q"][:batch, :rows], q, rtol=1e-6, atol=1e-7)
            assert not got["q"][:batch, rows:].any() and not got["q"][batch:].any()
            assert torch.equal(got["u"][:batch, :nodes], torch.from_numpy(u[:, :nodes]))
            assert torch.equal(got["u"][:batch, -1], torch.from_numpy(u[:, nodes]))
            columns = sampling_columns(params, VOCAB, "cpu")
            assert columns["any"] == exact.filters
            assert torch.equal(got["greedy"][:batch] > 0, columns["greedy"]) and (got["greedy"][batch:] == 1).all()
            for name in ("temp", "top_k", "top_p", "min_p"):
                assert torch.equal(got[name][:batch], columns[name]), name


def test_buckets_round_widths_and_entries_up():
    step = StepShape(batch=3, rows=9, q=3, nodes=3, blocks=2, kv_cap=40, chains=False)
    shape = sampled_plan.SampledShape(step, 3, 5, (True, False, False))
    bucket = sampled_plan.bucket_for(shape, block_size=16, max_context=4096, vocab=VOCAB)
    assert (bucket.batch, bucket.width, bucket.entries, bucket.filters) == (4, 3, 8, (True, False, False))
    assert bucket.first.nodes >= 3 and bucket.width <= bucket.first.nodes
    assert sampled_plan.bucket_for(sampled_plan.SampledShape(step, 3, 300, shape.filters), 16, 4096, VOCAB) is None
    assert sampled_plan.bucket_for(shape, 16, 4096, vocab=1 << 26) is None  # 4 x 4 x 64M: too dense for a graph
