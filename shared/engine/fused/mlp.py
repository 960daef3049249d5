"""The gated MLP with one merged gate-up projection: ``down(silu(gate(x)) * up(x))`` in three products' worth of ops."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from shared.engine.fused.repack import merge, shared_linear


class FusedMLP(nn.Module):
    def __init__(self, hf_mlp: nn.Module):
        super().__init__()
        self.intermediate = hf_mlp.gate_proj.weight.shape[0]
        self.gate_up_proj = merge([hf_mlp.gate_proj, hf_mlp.up_proj])
        self.down_proj = shared_linear(hf_mlp.down_proj)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, hidden] (or [1, T, hidden]) → the same shape."""
        gate_up = self.gate_up_proj(x)  # [T, 2 I]
        gate, up = gate_up.split(self.intermediate, dim=-1)  # [T, I] each, views
        return self.down_proj(F.silu(gate) * up)
