"""Tree attention: every node's logits equal running its root-to-node path alone (architecture.md §4)."""

import random

import pytest
import torch

from shared.engine.runner import Work
from shared.models.tiny import FAMILIES, build_tiny

from conftest import Reference, make_runner, path_to

TREE_SHAPES = {
    "chain": [-1, 0, 1, 2, 3],
    "star": [-1, -1, -1, -1],
    "binary": [-1, -1, 0, 0, 1, 1, 2, 3],
    "specinfer": [-1, 0, 1, 1, 1, 2, 3, 4, 5, 6],  # <1,1,3,1,...> style
    "ragged": [-1, 0, -1, 1, 2, 2, 5, 0, 7],
}


@pytest.mark.parametrize("family", FAMILIES)
def test_tree_logits_equal_path_alone_batched(family):
    model = build_tiny(family, vocab_size=128, seed=3)
    ref = Reference(model)
    runner = make_runner(model, block_size=4)
    rng = random.Random(0)
    seqs, trees = [], []
    # one request per tree shape, each with a different prefix length, plus a prefill and a decode
    for i, (name, parents) in enumerate(TREE_SHAPES.items()):
        prefix = [rng.randrange(128) for _ in range(3 + 4 * i)]
        seq = runner.add(name, prefix)
        seqs.append(seq)
        trees.append([(rng.randrange(128), p) for p in parents])
    runner.forward([Work(s) for s in seqs[:-1]])  # all but the last are prefilled: they verify with a cached prefix
    prefill = runner.add("prefill", [rng.randrange(128) for _ in range(9)])

    works = [Work(s, new_nodes=t, want_root=True, want_nodes=True) for s, t in zip(seqs, trees)]
    works.append(Work(prefill, want_root=True))
    out = runner.forward(works)

    worst = 0.0
    for i, (seq, tree) in enumerate(zip(seqs, trees)):
        parents = [p for _, p in tree]
        full = ref.logits(seq.token_ids)
        worst = max(worst, float((out.root(i) - full[-1]).abs().max()))
        node_logits = out.nodes(i, len(tree))  # [num_nodes, vocab]
        for j in range(len(tree)):
            path_tokens = [tree[k][0] for k in path_to(parents, j)]
            alone = ref.logits(seq.token_ids + path_tokens)[-1]
            worst = max(worst, float((node_logits[j] - alone).abs().max()))
    worst = max(worst, float((out.root(len(seqs)) - ref.logits(prefill.token_ids)[-1]).abs().max()))
    assert worst <= 1e-5, f"max abs diff {worst}"
    assert out.cost.num_seqs == len(works)
    # prefilled requests re-run their last token for root logits; the last request runs its whole prefix
    num_fed_prefix = (len(seqs) - 1) + len(seqs[-1].token_ids)
    assert out.cost.num_batched_tokens == sum(len(t) for t in trees) + num_fed_prefix + 9
    runner.check_accounting()


def test_tree_grown_over_several_forwards_matches_one_shot():
    """A draft grows its tree one layer per forward; nodes see ancestors from earlier forwards."""
    model = build_tiny("qwen3", vocab_size=64, seed=5)
    ref = Reference(model)
    runner = make_runner(model, block_size=3)
    seq = runner.add("a", [5, 6, 7, 8])
    runner.forward([Work(seq)])
    layers = [[(10, -1), (11, -1)], [(12, 0), (13, 1)], [(14, 2), (15, 2), (16, 3)]]
    got = []
    for layer in layers:
        out = runner.forward([Work(seq, new_nodes=layer, want_nodes=True)])
        got.append(out.nodes(0, len(layer)))
    got = torch.cat(got)
    parents = [p for layer in layers for _, p in layer]
    tokens = [t for layer in layers for t, _ in layer]
    for j in range(len(tokens)):
        alone = ref.logits(seq.token_ids + [tokens[k] for k in path_to(parents, j)])[-1]
        assert float((got[j] - alone).abs().max()) <= 1e-5


def test_position_ids_are_prefix_plus_depth():
    """Siblings share a position; a deeper node is one further (checked through RoPE-sensitive logits)."""
    model = build_tiny("llama", vocab_size=64, seed=7)
    runner = make_runner(model)
    seq = runner.add("a", [1, 2, 3])
    out = runner.forward([Work(seq, new_nodes=[(9, -1), (9, -1)], want_root=True, want_nodes=True)])
    # two identical siblings at the same position and with the same context give identical logits
    assert torch.allclose(out.nodes(0, 2)[0], out.nodes(0, 2)[1], atol=1e-6)
