"""Rotary position embedding from a table of cos/sin computed once, indexed by the batch's positions.

    table = RotaryTable.from_hf(decoder.rotary_emb, num_positions, dtype)
    cos, sin = table(hidden, position_ids)         # [1, T, 1, D] each: one gather per forward
    apply_rotary(qk, cos, sin, out=qk)             # qk [1, T, heads, D], rotated in place

The transformers module computes ``positions x inv_freq``, its cos and sin and
the casts for every forward (and the rotation as seven ops per tensor). Here
the table is built once by the transformers module itself, over positions
0 .. num_positions-1, so a position's values are the module's values; every
forward then gathers its rows. A position's cos/sin no longer depend on where
it sits in the batch (the elementwise kernels' vector tail), which keeps a
verify row equal to a decode row.

``rotate_half(x) * sin`` equals ``roll(x, D/2) * sin_signed`` with ``sin_signed``
the sin row with its first half negated (a sign flip is exact), so the rotation
is four ops for q and k together (``x * cos``, ``roll``, ``* sin``, ``+`` into the
output), each rounding as the transformers formula's own: the same bits. One
``addcmul`` would save an op, but it rounds the product and the sum once (an FMA
on this CPU, even in float32), which is not the transformers module's result.
"""

from __future__ import annotations

import torch
from torch import nn

# rope types whose frequencies change with the sequence length (transformers' dynamic_rope_update)
DYNAMIC_ROPE_TYPES = ("dynamic", "longrope")

TABLE_CHUNK = 4096  # positions per call of the transformers module while building the table


class RotaryTable(nn.Module):
    """cos and signed sin for every position below ``num_positions``, in the model's dtype."""

    def __init__(self, table: torch.Tensor):
        super().__init__()
        self.register_buffer("table", table, persistent=False)  # [num_positions, 2, D]: cos, signed sin
        self.num_positions = table.shape[0]

    @classmethod
    @torch.no_grad()
    def from_hf(cls, rotary_emb: nn.Module, num_positions: int, dtype: torch.dtype) -> "RotaryTable":
        device = rotary_emb.inv_freq.device
        probe = torch.empty(0, dtype=dtype, device=device)  # the module reads only x's device and dtype
        rows = []
        for start in range(0, num_positions, TABLE_CHUNK):
            pos = torch.arange(start, min(num_positions, start + TABLE_CHUNK), device=device)[None]  # [1, n]
            cos, sin = rotary_emb(probe, position_ids=pos)  # [1, n, D] each
            half = sin.shape[-1] // 2
            signed = torch.cat([-sin[..., :half], sin[..., half:]], dim=-1)  # [1, n, D]
            rows.append(torch.stack([cos[0], signed[0]], dim=1))  # [n, 2, D]
        return cls(torch.cat(rows).contiguous())

    def forward(self, hidden: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """position_ids [1, T] → (cos, signed sin), [1, T, 1, D] each: views of one gathered [1, T, 2, D], shaped
        to broadcast over the heads (and, like the transformers module's, indexable by token on dim 1)."""
        rows = self.table[position_ids]  # [1, T, 2, D]
        return rows[:, :, :1], rows[:, :, 1:]


def apply_rotary(qk: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """qk [1, T, heads, D] rotated by cos / signed sin [1, T, 1, D] into ``out`` [1, T, heads, D]
    (``out`` may be ``qk`` itself: the inputs of the last op are fresh tensors)."""
    rolled = qk.roll(qk.shape[-1] // 2, dims=-1)  # [1, T, heads, D]: (x2, x1), rotate_half up to the sign in sin
    return torch.add(qk * cos, rolled * sin, out=out)
