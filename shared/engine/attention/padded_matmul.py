"""Masked attention over a padded batch as matmul, softmax, matmul in float32 (CPU, 16-bit, decode-sized rows).

    out = attend_padded(q, k, v, mask, scaling)
    # q [B, H, max_q, D]; k / v [B, Hkv, max_kv, D]; mask [B, 1, max_q, max_kv] (True: may attend)

What sdpa.py uses for several sequences of a few query rows each (a batched
decode or verify step) when the KV cache is 16-bit on CPU. torch's CPU SDPA
kernel is slow there: 8 sequences x 1 row x 200 positions (9 heads of 64, 3 KV
heads) took 626 us per layer in bfloat16 against 132 us for these three ops,
and 8 x 3 rows 302 against 196 us; in float32 SDPA is as fast or faster, so
float32 keeps it (prefill-sized rows keep it too: its blocked kernel does not
materialise the [max_q, max_kv] scores). Results agree with SDPA to bfloat16
rounding; like SDPA over a padded batch they are not row-exact (sdpa.py's
docstring: the row-exact mode covers one sequence).
"""

from __future__ import annotations

import torch


def attend_padded(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scaling: float
) -> torch.Tensor:
    """q [B, H, max_q, D], k / v [B, Hkv, max_kv, D], mask [B, 1, max_q, max_kv] → [B, H, max_q, D] in q's dtype."""
    b, num_heads, max_q, head_dim = q.shape
    num_kv, max_kv = k.shape[1], k.shape[2]
    rep = num_heads // num_kv  # query heads per KV head (repeat_interleave order)
    qf = q.float().reshape(b, num_kv, rep * max_q, head_dim)  # the heads sharing a KV head, stacked
    scores = torch.matmul(qf, k.float().transpose(-1, -2)).view(b, num_kv, rep, max_q, max_kv) * scaling
    scores = scores.masked_fill(~mask[:, :, None], float("-inf"))  # mask [B, 1, 1, max_q, max_kv]
    probs = torch.softmax(scores, dim=-1).view(b, num_kv, rep * max_q, max_kv)
    out = torch.matmul(probs, v.float())  # [B, Hkv, rep * max_q, D]
    return out.view(b, num_heads, max_q, head_dim).to(q.dtype)
