"""bfloat16 on CPU: a verify row computes exactly what a plain decode of the same path computes.

Greedy speculation equals plain decoding token for token only if the target's logits for a
position do not depend on how many other rows the forward carries. In float32 the batched
kernels differ by ~1e-7 and that holds in practice; in bfloat16 such differences round into
different values and flip greedy choices. So on CPU in 16-bit the attention runs one call per
query row over exactly the slots it sees (attention/sdpa.py, row-exact mode; prepacked
bf16 linears, cpu_linear.py, were row-invariant on every CPU tried). Compared here bit for bit.
"""

import random

import pytest
import torch

from shared.engine import cpu_linear
from shared.engine.runner import Work
from shared.models.tiny import build_tiny

from conftest import make_runner, path_to

SHAPES = {"chain": [-1, 0, 1, 2, 3], "tree": [-1, -1, 0, 0, 1, 3]}


@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize("prepack", [False, True])
def test_bf16_verify_rows_equal_plain_decoding_bit_for_bit(shape, prepack):
    if prepack and not cpu_linear.available(torch.device("cpu"), torch.bfloat16):
        pytest.skip("this CPU/torch has no native bf16 oneDNN matmul")
    # head dim 64 and a few hundred slots: big enough for the kernels' vector groupings to differ
    model = build_tiny("llama", vocab_size=128, hidden_size=256, num_heads=4, num_kv_heads=2, num_layers=2,
                       seed=5).to(torch.bfloat16)  # fmt: skip
    runner = make_runner(model, block_size=16, cpu_prepack=prepack, cpu_prepack_min_rows=1 if prepack else None)
    rng = random.Random(1)
    parents = SHAPES[shape]
    tree = [(rng.randrange(128), p) for p in parents]
    prefix = [rng.randrange(128) for _ in range(301)]
    seq = runner.add("v", prefix)
    runner.forward([Work(seq)])
    out = runner.forward([Work(seq, new_nodes=tree, want_root=True, want_nodes=True)])
    root, nodes = out.root(0).clone(), out.nodes(0, len(tree)).clone()
    runner.commit(seq, [])  # roll the tree back: the prefix alone again

    # plain decoding: the same prefix, then each path one token at a time in a sequence of its own
    alone = runner.add("d0", prefix)
    runner.forward([Work(alone)])
    decoded_root = runner.forward([Work(alone, want_root=True)]).root(0)
    assert torch.equal(root, decoded_root)
    for j in range(len(tree)):
        path = [tree[k][0] for k in path_to(parents, j)]
        s = runner.add(f"d{j + 1}", prefix)
        runner.forward([Work(s)])
        logits = None
        for token in path:
            logits = runner.forward([Work(s, new_nodes=[(token, -1)], want_root=False, want_nodes=True)]).nodes(0, 1)[0]
            runner.commit(s, [token])
        assert torch.equal(nodes[j], logits), f"node {j} of the {shape}"
