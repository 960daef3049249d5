"""bfloat16 on CPU: a verify row computes exactly what a plain decode of the same path computes.

Greedy speculation equals plain decoding token for token only if the target's logits for a
position do not depend on how many other rows the forward carries. In float32 the batched
kernels differ by ~1e-7 and that holds in practice; in bfloat16 such differences round into
different values and flip greedy choices. So on CPU in 16-bit each query row attends over
exactly the slots it sees (attention/row_exact.py, sdpa.py's row-exact mode), and every linear
computes a one-row product as two rows (cpu_linear.pad_single_rows: single rows take a GEMV
kernel that sums in another order). Compared here bit for bit.
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
def test_bf16_verify_rows_equal_plain_decoding_bit_for_bit(shape, prepack, monkeypatch):
    # rows of one fresh forward each: a prefix-cache hit between the two runs is a different computation
    monkeypatch.setenv("TANDEM_PREFIX_CACHE", "0")
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
    # as in serving: the prompt but its last token is prefilled; the last committed token is fed with the tree
    seq = runner.add("v", prefix[:-1])
    runner.forward([Work(seq)])
    runner.commit(seq, prefix[-1:])
    out = runner.forward([Work(seq, new_nodes=tree, want_root=True, want_nodes=True)])
    root, nodes = out.root(0).clone(), out.nodes(0, len(tree)).clone()

    # plain decoding: the same prefill, then each path one token at a time in a sequence of its own
    def decoded(seq_id: str) -> tuple:
        s = runner.add(seq_id, prefix[:-1])
        runner.forward([Work(s)])
        runner.commit(s, prefix[-1:])
        return s, runner.forward([Work(s, want_root=True)]).root(0)

    _, decoded_root = decoded("d0")
    assert torch.equal(root, decoded_root)
    for j in range(len(tree)):
        path = [tree[k][0] for k in path_to(parents, j)]
        s, _ = decoded(f"d{j + 1}")
        logits = None
        for token in path:
            logits = runner.forward([Work(s, new_nodes=[(token, -1)], want_root=False, want_nodes=True)]).nodes(0, 1)[0]
            runner.commit(s, [token])
        assert torch.equal(nodes[j], logits), f"node {j} of the {shape}"


@pytest.mark.parametrize("prepack", [False, True])
def test_bf16_one_row_products_equal_the_same_row_of_a_verify(prepack):
    """A decode multiplies one row, a verify 2-16: in 16 bits the one-row GEMV kernel sums K in another
    order (K = 1,536, SmolLM2's down_proj, differed in 5 of 36,864 outputs on an AMD EPYC). So one-row
    products run as two rows; every row then equals the same row of any product of up to 16 rows."""
    if prepack and not cpu_linear.available(torch.device("cpu"), torch.bfloat16):
        pytest.skip("this CPU/torch has no native bf16 oneDNN matmul")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(1536, 576, bias=False)).to(torch.bfloat16)
    with torch.no_grad():
        model[0].weight.mul_(0.05)
    if prepack:
        assert cpu_linear.prepack(model) == 1 and model[0].min_rows == 1  # 16 bits: one kernel, never MKL
    assert cpu_linear.pad_single_rows(model) == 1
    layer = model[0]
    x = torch.randn(64, 1536, dtype=torch.bfloat16)
    with torch.inference_mode():
        one_by_one = torch.cat([layer(x[i : i + 1].unsqueeze(0))[0] for i in range(64)])  # [1, 1, K]: a decode
        for rows in (2, 3, 5, 16):
            verify = torch.cat([layer(x[i : i + rows].unsqueeze(0))[0] for i in range(0, 64, rows)])
            assert torch.equal(one_by_one, verify), f"{rows} rows"


def test_pad_single_rows_keeps_weights_and_leaves_float32_alone():
    model = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.Linear(4, 2))
    assert cpu_linear.pad_single_rows(model) == 0 and type(model[0]) is torch.nn.Linear
    model.to(torch.bfloat16)
    weights, keys = [layer.weight for layer in model], model.state_dict().keys()
    assert cpu_linear.pad_single_rows(model) == 2
    assert type(model[0]) is cpu_linear.PaddedLinear and model.state_dict().keys() == keys
    assert all(layer.weight is w for layer, w in zip(model, weights))  # the same Parameters: ties stay tied
    with torch.inference_mode():
        assert model(torch.randn(1, 8, dtype=torch.bfloat16)).shape == (1, 2)


def test_a_padded_row_takes_the_path_two_rows_take():
    if not cpu_linear.available(torch.device("cpu"), torch.bfloat16):
        pytest.skip("this CPU/torch has no native bf16 oneDNN matmul")
    calls = []
    layer = cpu_linear.PackedLinear(torch.nn.Linear(16, 8).to(torch.bfloat16), min_rows=3)
    layer.pad_single_row = True
    layer.packed_forward = lambda x: calls.append(("packed", x.shape[0])) or torch.zeros(x.shape[0], 8)
    with torch.inference_mode():
        one = layer(torch.randn(1, 1, 16, dtype=torch.bfloat16))
        two = layer(torch.randn(1, 2, 16, dtype=torch.bfloat16))
    assert one.shape == (1, 1, 8) and two.shape == (1, 2, 8) and calls == []  # below min_rows: MKL, at 2 rows
    layer.min_rows = 2
    with torch.inference_mode():
        layer(torch.randn(1, 1, 16, dtype=torch.bfloat16))
    assert calls == [("packed", 2)]
