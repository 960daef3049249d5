"""Self-attention with one merged QKV projection, rotary from a table, and the engine's attention backend.

Per layer, for the batch's T packed tokens::

    qkv = qkv_proj(x)                      [T, (H + 2 Hkv) D]      one product (q, k, v rows merged; Qwen2's biases too)
    q|k = q_norm / k_norm (Qwen3)          [1, T, H + Hkv, D]      a norm without weight, a multiply by per-head weights
    q|k rotated in place in qkv            [1, T, H + Hkv, D]      four elementwise ops (rotary.py)
    out = backend.attend(q, new_kv=k|v)    [1, T, H, D]            k and v adjacent in qkv: one store into the cache
    o_proj(out)                            [T, hidden]

The backend is the one the transformers path calls through its attention hook
(attention/base.py): it writes k/v to the paged cache at the batch's slots and
attends with the batch's masks, so both paths share the cache, the masks and
the row-exact rules. The new keys and values go to it as one [2, T, Hkv, D]
view of the merged projection's rows (``new_kv=``), which it stores with one op.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from shared.engine.fused.repack import merge, shared_linear
from shared.engine.fused.rotary import apply_rotary


class FusedAttention(nn.Module):
    def __init__(self, hf_attn: nn.Module, config):
        super().__init__()
        self.layer_idx = hf_attn.layer_idx
        self.head_dim = hf_attn.head_dim
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.scaling = hf_attn.scaling
        self.qkv_proj = merge([hf_attn.q_proj, hf_attn.k_proj, hf_attn.v_proj])
        self.o_proj = shared_linear(hf_attn.o_proj)
        self.register_buffer("qk_weight", None, persistent=False)  # [H + Hkv, D] Qwen3's q/k norm weights per head
        self.qk_eps = 0.0
        if getattr(hf_attn, "q_norm", None) is not None:
            qn, kn = hf_attn.q_norm, hf_attn.k_norm
            with torch.no_grad():
                weight = torch.cat([qn.weight.detach().expand(self.num_heads, -1),
                                    kn.weight.detach().expand(self.num_kv_heads, -1)])  # fmt: skip
            self.register_buffer("qk_weight", weight.contiguous(), persistent=False)
            self.qk_eps = float(getattr(qn, "variance_epsilon", None) or qn.eps)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, backend) -> torch.Tensor:
        """x [T, hidden] (or [1, T, hidden]), cos / sin [1, T, 1, D] → [T, hidden]."""
        num_tokens = x.shape[-2]
        h, hkv, d = self.num_heads, self.num_kv_heads, self.head_dim
        qkv = self.qkv_proj(x)  # [T, (H + 2 Hkv) D]
        qk = qkv[..., : (h + hkv) * d].view(1, num_tokens, h + hkv, d)  # [1, T, H + Hkv, D], a view into qkv
        if self.qk_weight is None:
            apply_rotary(qk, cos, sin, out=qk)
        else:  # Qwen3: RMSNorm over each head's D, then rotary (the same order as the transformers module)
            normed = F.rms_norm(qk, (d,), None, self.qk_eps) * self.qk_weight  # [1, T, H + Hkv, D]
            apply_rotary(normed, cos, sin, out=qk)
        q = qk[:, :, :h].transpose(1, 2)  # [1, H, T, D]
        kv = qkv[..., h * d :].view(num_tokens, 2, hkv, d).transpose(0, 1)  # [2, T, Hkv, D]: k (rotated), v
        out = backend.attend(self.layer_idx, q, None, None, self.scaling, new_kv=kv)  # [1, T, H, D]; one KV store
        return self.o_proj(out.reshape(num_tokens, h * d))  # [T, hidden]
