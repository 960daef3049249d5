"""Training-time test (EAGLE-3 §3.3): train the head on its own drafts, as it will be used.

At inference the head drafts k tokens in a row: the first from the target's
features, each next one from the head's own previous output. Training only
on true features would teach it step 0 alone; so every batch is unrolled
``steps`` times, each step feeding the previous step's outputs::

    step 0   position p: token x_p,     feature fc(f_{p-1})       → predicts the target's choice at p
    step s   position p: token x_{p+s}, feature out_{s-1}[p]      → predicts the target's choice at p+s
             attends to step-0 keys at positions <= p (the true prefix) and to the step-1..s keys at p
             (the drafts before it), each with RoPE at its own position p + j

which is exactly what a query of the s-th drafted token sees at inference
(committed prefix, then the drafted tokens). ``unroll`` returns the logits
of every step; ``Eagle3Head.forward`` over a causal sequence equals step 0.
"""

from __future__ import annotations

import torch
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from shared.engine.eagle.model import Eagle3Head


def input_features(head: Eagle3Head, aux: torch.Tensor) -> torch.Tensor:
    """aux [B, T, width] (target features of each position) → head features [B, T, H]: position p gets fc(f_{p-1})."""
    fused = head.fuse(aux)  # [B, T, H]
    return torch.cat([torch.zeros_like(fused[:, :1]), fused[:, :-1]], dim=1)


def unroll(head: Eagle3Head, ids: torch.Tensor, aux: torch.Tensor, steps: int) -> list[torch.Tensor]:
    """ids [B, T], aux [B, T, width] → per step, pre-norm outputs [B, T, H] (position p of step s is token p+s)."""
    layer = head.midlayer
    attn = layer.self_attn
    b, t = ids.shape
    rep = attn.num_heads // attn.num_kv_heads
    feats = input_features(head, aux)
    base_pos = torch.arange(t, device=ids.device)[None].expand(b, t)
    causal = torch.ones(t, t, dtype=torch.bool, device=ids.device).tril()  # [T, T] key <= query
    keys: list[tuple[torch.Tensor, torch.Tensor]] = []  # per step: k, v [B, kv_heads, T, D]
    outs: list[torch.Tensor] = []
    for s in range(steps):
        step_ids = torch.cat([ids[:, s:], ids.new_zeros(b, s)], dim=1)  # token x_{p+s} at p (zeros past the end)
        pos = base_pos + s
        embeds = head.embed_tokens(step_ids)
        cos, sin = head.rotary_emb(embeds, pos)
        normed = layer.hidden_norm(feats)
        x = torch.cat([layer.input_layernorm(embeds), normed], dim=-1)  # [B, T, 2H]
        q, k, v = attn.qkv(x, cos, sin)  # q [B, heads, T, D], k/v [B, kv_heads, T, D]
        keys.append((k, v))
        k0, v0 = keys[0]
        k0, v0 = k0.repeat_interleave(rep, 1), v0.repeat_interleave(rep, 1)
        scores = (q @ k0.transpose(-1, -2)) * attn.scaling  # [B, heads, T, T]
        scores = scores.masked_fill(~causal, float("-inf"))
        diag = [(q * kj.repeat_interleave(rep, 1)).sum(-1, keepdim=True) * attn.scaling for kj, _ in keys[1:]]
        probs = torch.softmax(torch.cat([scores, *diag], dim=-1), dim=-1)  # [B, heads, T, T + s]
        ctx = probs[..., :t] @ v0  # [B, heads, T, D]
        for j, (_, vj) in enumerate(keys[1:]):
            ctx = ctx + probs[..., t + j : t + j + 1] * vj.repeat_interleave(rep, 1)
        ctx = ctx.transpose(1, 2).reshape(b, t, -1)  # [B, T, heads*D]
        h = attn.o_proj(ctx) + (normed if layer.norm_before_residual else feats)
        out = layer.mlp(layer.post_attention_layernorm(h)) + h  # [B, T, H]
        outs.append(out)
        feats = out  # the next step is fed this step's outputs at the same p
    return outs
