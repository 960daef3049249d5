"""One fused decoder layer: pre-norm attention and MLP with residual adds, on the packed [T, hidden] rows.

Called as the transformers layer is (``layer(hidden, position_embeddings=(cos, sin), tandem_backend=...)``
with hidden [1, T, hidden], returning [1, T, hidden]), so early exit's layer-by-layer loop and the
feature-capture hooks (which read the hidden state entering each layer) work on either. The residual
adds stay separate ops: eager torch has no add-and-norm kernel, so deferring the add into the next
norm (as CUDA engines' fused kernels do) would save nothing here and hide the residual stream the
hooks and early exit read. The fused decoder's own loop passes [T, hidden] (2-D products take three
ops fewer each inside ``F.linear``); early exit passes [1, T, hidden], as to transformers' layers.
"""

from __future__ import annotations

import torch
from torch import nn

from shared.engine.fused.attention import FusedAttention
from shared.engine.fused.mlp import FusedMLP
from shared.engine.fused.norm import RMSNorm


class FusedDecoderLayer(nn.Module):
    def __init__(self, hf_layer: nn.Module, config):
        super().__init__()
        self.input_layernorm = RMSNorm.like(hf_layer.input_layernorm)
        self.self_attn = FusedAttention(hf_layer.self_attn, config)
        self.post_attention_layernorm = RMSNorm.like(hf_layer.post_attention_layernorm)
        self.mlp = FusedMLP(hf_layer.mlp)

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        tandem_backend,
        **_,
    ) -> torch.Tensor:
        """hidden_states [T, hidden] or [1, T, hidden] (the residual stream) → the same shape."""
        cos, sin = position_embeddings
        # the parts' forwards are called directly: nothing hooks them (feature capture hooks whole layers), and
        # nn.Module.__call__'s hook checks, four per layer, were a measurable share of a hollow model's forward
        attn, mlp = self.self_attn.forward, self.mlp.forward
        x = hidden_states + attn(self.input_layernorm.forward(hidden_states), cos, sin, tandem_backend)
        return x + mlp(self.post_attention_layernorm.forward(x))
