"""Sampled acceptance as batched tensor ops (shared/engine/device_sampling.py): the host walk's rule try for
try on the same uniforms, the target's distribution exactly (chi-square), and per-row sampling parameters as
``probs_from_logits`` gives them."""

from __future__ import annotations

import random

import pytest
import torch

from shared.engine.acceptance import accept_probability, residual
from shared.engine.device_sampling import accept_sampled_batch, batched_probs, draw_uniforms, tried_status
from shared.engine.sampling import make_generator, probs_from_logits
from shared.engine.types import SamplingParams


def kids_table(parents: list[int], rows: int, width: int) -> list[list[int]]:
    table = [[-1] * width for _ in range(rows)]
    for node, p in enumerate(parents):
        slot = table[p + 1]
        slot[slot.index(-1)] = node
    return table


def reference(probs, tokens, parents, q, has_q, u_node, u_bonus) -> tuple[list[int], int]:
    """The host walk (acceptance._accept_sampled) with its draws replaced by the given uniforms."""
    path, row = [], 0
    p = probs[0]
    while True:
        qd = q[row] if has_q[row] else None
        chosen = None
        for node in [j for j, par in enumerate(parents) if par == row - 1]:
            x = tokens[node]
            if float(u_node[node]) < accept_probability(p, qd, x):
                chosen = node
                break
            p = residual(p, qd, x)
        if chosen is None:
            cdf = p.cumsum(0)
            bonus = int((cdf <= u_bonus * cdf[-1]).sum().clamp_max(len(p) - 1))
            return path, bonus if p[bonus] > 0 else int(p.argmax())
        path.append(chosen)
        row = chosen + 1
        p = probs[row]


def random_case(rng: random.Random, vocab: int, nodes: int):
    parents = [-1] + [rng.randrange(-1, j) for j in range(1, nodes)] if nodes else []
    tokens = [rng.randrange(vocab) for _ in range(nodes)]
    return parents, tokens


def test_the_batch_walk_is_the_host_walk_on_the_same_uniforms():
    torch.manual_seed(0)
    rng = random.Random(1)
    batch, vocab, nodes, width = 64, 12, 6, 6
    probs = torch.softmax(torch.randn(batch, 1 + nodes, vocab) * 2, -1)
    probs[:5] = torch.zeros_like(probs[:5]).scatter_(-1, probs[:5].argmax(-1, keepdim=True), 1.0)  # greedy rows
    q = torch.softmax(torch.randn(batch, 1 + nodes, vocab) * 2, -1)
    has_q = torch.rand(batch, 1 + nodes) < 0.5
    cases = [random_case(rng, vocab, rng.randint(0, nodes)) for _ in range(batch)]
    tokens = torch.zeros(batch, nodes, dtype=torch.long)
    kids = torch.full((batch, 1 + nodes, width), -1, dtype=torch.long)
    for b, (parents, toks) in enumerate(cases):
        tokens[b, : len(toks)] = torch.tensor(toks, dtype=torch.long)
        kids[b] = torch.tensor(kids_table(parents, 1 + nodes, width))
        for node, par in enumerate(parents):  # a sampled child lies in its q's support
            if has_q[b, par + 1]:
                q[b, par + 1, toks[node]] = max(float(q[b, par + 1, toks[node]]), 0.05)
        q[b] = q[b] / q[b].sum(-1, keepdim=True)
    u_node, u_bonus = torch.rand(batch, nodes), torch.rand(batch)
    out = accept_sampled_batch(probs, tokens, kids, q, has_q, u_node, u_bonus).tolist()
    for b, (parents, toks) in enumerate(cases):
        path, bonus = reference(probs[b], toks, parents, q[b], has_q[b], u_node[b], float(u_bonus[b]))
        count = out[b][0]
        assert (out[b][2 : 2 + count], out[b][1]) == (path, bonus), b
        assert all(v == -1 for v in out[b][2 + count :])


def _chi_square_ok(counts: torch.Tensor, probs: torch.Tensor, n: int) -> bool:
    """Pearson's statistic over the cells with expected count >= 5, against a generous critical value."""
    expected = probs * n
    keep = expected >= 5
    stat = float((((counts - expected) ** 2) / expected.clamp_min(1e-9))[keep].sum())
    dof = int(keep.sum()) - 1
    return stat < dof + 6 * (2 * dof) ** 0.5 + 10  # ~ the 1e-6 tail


@pytest.mark.parametrize("shape", ["chain_q", "chain_point", "tree_q"])
def test_the_first_token_is_distributed_as_the_target(shape):
    """Whatever the draft proposed, the token the walk emits first is distributed as the target's row 0."""
    torch.manual_seed(3)
    n, vocab = 40000, 10
    p0 = torch.softmax(torch.randn(vocab) * 1.5, -1)
    q0 = torch.softmax(torch.randn(vocab) * 1.5, -1)
    probs = torch.softmax(torch.randn(1, 4, vocab), -1).repeat(n, 1, 1)
    probs[:, 0] = p0
    if shape == "tree_q":  # two children of the root, both drawn from q0, then one grandchild
        parents, width = [-1, -1, 0], 2
    else:
        parents, width = [-1, 0, 1], 1
    nodes = len(parents)
    gen = torch.Generator().manual_seed(5)
    tokens = torch.multinomial(q0, n * nodes, replacement=True, generator=gen).view(n, nodes)
    if shape == "chain_point":
        tokens[:, 0] = 3  # a deterministic pick: a point mass
    kids = torch.tensor(kids_table(parents, 1 + nodes, width)).repeat(n, 1, 1)
    q = q0.repeat(n, 1 + nodes, 1)
    has_q = torch.full((n, 1 + nodes), shape != "chain_point")
    u_node, u_bonus = torch.rand(n, nodes, generator=gen), torch.rand(n, generator=gen)
    out = accept_sampled_batch(probs, tokens, kids, q, has_q, u_node, u_bonus)
    first = torch.where(out[:, 0] > 0, tokens.gather(1, out[:, 2:3].clamp_min(0))[:, 0], out[:, 1])
    counts = torch.bincount(first, minlength=vocab).float()
    assert _chi_square_ok(counts, p0, n)


def test_each_rows_sampling_parameters_give_the_hosts_probabilities():
    torch.manual_seed(7)
    logits = torch.randn(5, 3, 50) * 3
    params = [SamplingParams(temperature=0.0), SamplingParams(temperature=0.7), SamplingParams(temperature=1.0, top_k=5),
              SamplingParams(temperature=1.3, top_p=0.8), SamplingParams(temperature=0.9, top_k=20, top_p=0.9, min_p=0.05)]
    got = batched_probs(logits, params)
    for b, prm in enumerate(params):
        assert torch.allclose(got[b], probs_from_logits(logits[b], prm), atol=1e-6), b


def test_a_requests_uniforms_come_from_its_own_generator_only():
    a1, b1 = draw_uniforms([make_generator(1), make_generator(2)], 4, "cpu")
    a2, b2 = draw_uniforms([make_generator(1)], 4, "cpu")
    assert torch.equal(a1[:1], a2) and torch.equal(b1[:1], b2)


def test_tried_status_marks_what_the_walk_tried():
    parents = [-1, -1, 0, 0, 1]
    assert tried_status(parents, [1, 4]) == [0, 1, -1, -1, 1]  # root: 0 rejected, 1 taken; node 4 taken, a leaf
    assert tried_status(parents, [0]) == [1, -1, 0, 0, -1]  # stopped at node 0's row: both its children rejected
    assert tried_status(parents, []) == [0, 0, -1, -1, -1]
