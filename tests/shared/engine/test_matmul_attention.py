"""The CPU attention paths that replace SDPA calls compute attention: compared with SDPA itself.

row_exact.attend_rows (one sequence, each row over exactly its slots) and padded_matmul.attend_padded
(several sequences, padded and masked) against torch's scaled_dot_product_attention on the same
inputs, with grouped-query heads, tree rows and padding; float32 to ~1e-6, bfloat16 to its rounding.
"""

import pytest
import torch
import torch.nn.functional as F

from shared.engine.attention.padded_matmul import attend_padded
from bench.diagnostics.attention_rows import reference_rows
from shared.engine.attention.row_exact import attend_rows


def _sdpa(q, k, v, mask, scale):
    return F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask, scale=scale, enable_gqa=True)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_rows_over_their_own_slots_are_attention(dtype, tol):
    g = torch.Generator().manual_seed(0)
    heads, kv_heads, dim, prefix = 6, 2, 32, 40
    # a chain row (the first 41 slots), a tree row (prefix + slot 42, skipping 41), a row seeing all 43
    row_slots = [prefix + 1, torch.tensor([*range(prefix), prefix + 2]), prefix + 3]
    n = prefix + 3
    q = torch.randn(1, heads, len(row_slots), dim, generator=g).to(dtype)
    keys, values = (torch.randn(n, kv_heads, dim, generator=g).to(dtype) for _ in range(2))
    got = attend_rows(q, keys, values, row_slots, 0.2)  # [1, T, H, D]
    for t, seen in enumerate(row_slots):
        idx = torch.arange(seen) if isinstance(seen, int) else seen
        k, v = keys[idx].transpose(0, 1)[None], values[idx].transpose(0, 1)[None]  # [1, Hkv, n, D]
        want = _sdpa(q[:, :, t : t + 1], k, v, None, 0.2)[0, :, 0]  # [H, D]
        assert torch.allclose(got[0, t].float(), want, atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_a_padded_masked_batch_is_attention(dtype, tol):
    g = torch.Generator().manual_seed(1)
    b, heads, kv_heads, max_q, max_kv, dim = 3, 9, 3, 4, 30, 64
    q = torch.randn(b, heads, max_q, dim, generator=g).to(dtype)
    k, v = (torch.randn(b, kv_heads, max_kv, dim, generator=g).to(dtype) for _ in range(2))
    mask = torch.zeros(b, 1, max_q, max_kv, dtype=torch.bool)
    mask[..., 0] = True  # padded rows see one slot, as sdpa.py plans them
    for i, (q_len, kv_len) in enumerate([(1, 12), (4, 30), (3, 20)]):
        mask[i, 0, :q_len, :kv_len] = torch.ones(q_len, kv_len, dtype=torch.bool).tril(kv_len - q_len)
    got = attend_padded(q, k, v, mask, 0.125)
    assert got.dtype == dtype and got.shape == q.shape
    assert torch.allclose(got.float(), _sdpa(q, k, v, mask, 0.125), atol=tol, rtol=tol)


def _row_cases(dtype, trials=60):
    g = torch.Generator().manual_seed(2)
    for trial in range(trials):
        rows, prefix = 1 + trial % 6, 1 + (37 * trial) % 600
        q = torch.randn(1, 9, rows, 64, generator=g).to(dtype)
        keys, values = (torch.randn(prefix + rows, 3, 64, generator=g).to(dtype) for _ in range(2))
        row_slots = [prefix + t + 1 if trial % 3 or t == 0 else torch.tensor([*range(prefix), prefix + t])
                     for t in range(rows)]  # fmt: skip
        scaling = 0.0917 + trial / 100  # not a power of two: the product's rounding matters
        yield q, keys, values, row_slots, scaling


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_each_row_is_bit_for_bit_that_row_alone(dtype):
    """Row exactness: a row's result cannot depend on how many other rows the forward carries."""
    for q, keys, values, row_slots, scaling in _row_cases(dtype):
        together = attend_rows(q, keys, values, row_slots, scaling)  # [1, T, H, D]
        for t, seen in enumerate(row_slots):
            alone = attend_rows(q[:, :, t : t + 1], keys, values, [seen], scaling)
            assert torch.equal(together[:, t : t + 1], alone)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_the_fused_scaling_is_the_reference_formula(dtype):
    """baddbmm's alpha and the in-place output compute the first formula (matmul, * scaling, a copy per row).
    Bit for bit on the AMD EPYC this was written on; MKL on AVX-512 Intel folds alpha into the product, which
    moves the float32 scores' last bits (measured there: 3.3e-6 of the largest output in float32, within one
    16-bit rounding of it in bf16 / fp16), so the outputs are compared against the largest one with a tolerance."""
    tol = {torch.float32: 2e-5, torch.bfloat16: 2**-7, torch.float16: 2**-10}[dtype]  # one rounding at the largest
    for q, keys, values, row_slots, scaling in _row_cases(dtype):
        got = attend_rows(q, keys, values, row_slots, scaling).float()
        want = reference_rows(q, keys, values, row_slots, scaling).float()
        assert (got - want).abs().max() <= tol * want.abs().max()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_a_tree_row_is_bit_for_bit_a_decode_over_its_positions(dtype):
    """A tree row (a prefix, then ancestors further on) computes what a plain decode over exactly those
    positions, gathered in order, computes; its ancestors are moved in behind the prefix for the row and
    put back, so the other rows and the caller's keys see the context unchanged."""
    g = torch.Generator().manual_seed(3)
    prefix, nodes = 300, 12
    keys, values = (torch.randn(prefix + nodes, 3, 64, generator=g).to(dtype) for _ in range(2))
    saved = keys.clone(), values.clone()
    rows = [torch.tensor([*range(prefix), prefix + 2, prefix + 5]),  # skips nodes 0, 1, 3, 4
            prefix + 1,  # a chain row between two tree rows: reads the context as it was
            torch.tensor([*range(prefix + 1), prefix + 3, prefix + 7, prefix + 11]),
            torch.tensor([prefix + 4, prefix + 9])]  # fmt: skip  # no prefix at all
    q = torch.randn(1, 9, len(rows), 64, generator=g).to(dtype)
    got = attend_rows(q, keys, values, rows, 0.125)
    assert torch.equal(keys, saved[0]) and torch.equal(values, saved[1])
    for t, seen in enumerate(rows):
        idx = torch.arange(seen) if isinstance(seen, int) else seen
        decode = attend_rows(q[:, :, t : t + 1], keys[idx].contiguous(), values[idx].contiguous(), [len(idx)], 0.125)
        assert torch.equal(got[:, t : t + 1], decode), t


def test_split_row():
    from shared.engine.attention.row_exact import split_row

    assert split_row(torch.arange(5)) == 5
    p, tail = split_row(torch.tensor([0, 1, 2, 5, 7]))
    assert p == 3 and tail.tolist() == [5, 7]
    p, tail = split_row(torch.tensor([2, 3]))
    assert p == 0 and tail.tolist() == [2, 3]
