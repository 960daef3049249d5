"""Attention for a static verify step: every index and mask built on the device from the staged step.

The eager backends (``sdpa.py``, ``flashinfer_backend.py``) plan from per-sequence
``[q_len, kv_len]`` masks and slot lists built on the host, which grows with the
context. This one is prepared inside the step's body from the compact segments of
``step_plan.py`` (block tables, per-row prefix lengths, ancestor bits), with tensor
ops only, so a CUDA graph captures the preparation with the layers::

    slot[b, p]     = table[b, p // block_size] * block_size + p % block_size     p < kv_cap
    mask[b, q, p]  = p < prefix[b, q]                                 (committed context, causal fed rows)
                   | n_b <= p < kvlen_b and tree[b, q, p - n_b]       (the row's tree ancestors)

then one SDPA call per layer over the padded ``[B, H, Q, kv_cap]`` batch. Padded
query rows see position 0 only (prefix 1), so the softmax stays finite.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from shared.engine.kv_cache import PagedKVCache


class StaticBatchAttention:
    name = "static"

    def __init__(self, kv_cache: PagedKVCache):
        self.cache = kv_cache

    def plan(self, layout) -> None:  # the eager interface; a static step prepares from its staged segments
        raise RuntimeError("StaticBatchAttention is prepared by prepare(), inside the step body")

    def prepare(self, seg: dict[str, torch.Tensor], kv_cap: int) -> None:
        """Device metadata for one step from the staged segments (``step_plan.SEGMENTS``)."""
        bs = self.cache.block_size
        table, prefix, tree = seg["table"], seg["prefix"], seg["tree"]  # [B, NB], [B, Q], [B, Q, M]
        batch, q = prefix.shape
        nodes = tree.shape[2]
        cols = torch.arange(kv_cap, device=table.device)  # [K]
        blocks = table.gather(1, (cols // bs).clamp_max(table.shape[1] - 1).expand(batch, kv_cap))  # [B, K]
        self.gather_flat = (blocks * bs + cols % bs).reshape(-1)  # [B * K] physical slot of (b, p)
        n = seg["ncommit"][:, None, None]  # [B, 1, 1]
        in_tree = (cols >= n) & (cols < seg["kvlen"][:, None, None])  # [B, 1, K]
        node = (cols - n).clamp(0, nodes - 1).expand(batch, q, kv_cap)  # [B, Q, K]
        sees_node = tree.gather(2, node) > 0  # [B, Q, K]
        self.mask = ((cols < prefix[:, :, None]) | (in_tree & sees_node))[:, None]  # [B, 1, Q, K]
        self.q_index = seg["q_index"]  # [B, Q]
        self.unpad = seg["unpad"]  # [T]
        self.new_slots = seg["new_slots"]  # [T]
        self.shape = (batch, kv_cap)

    def attend(self, layer_idx, query, key, value, scaling, new_kv=None):
        """query [1, H, T, D], key/value [1, Hkv, T, D] (or new_kv [2, T, Hkv, D]) -> [1, T, H, D]; writes the
        new k/v first."""
        kv = self.cache.kv[layer_idx]  # [2, num_slots, Hkv, D]
        if new_kv is not None:
            kv.index_copy_(1, self.new_slots, new_kv)
        else:
            kv[0, self.new_slots] = key[0].transpose(0, 1)
            kv[1, self.new_slots] = value[0].transpose(0, 1)
        shape = (*self.shape, *kv.shape[2:])
        k = kv[0].index_select(0, self.gather_flat).view(shape).transpose(1, 2)  # [B, Hkv, K, D]
        v = kv[1].index_select(0, self.gather_flat).view(shape).transpose(1, 2)  # [B, Hkv, K, D]
        q = query[0][:, self.q_index].transpose(0, 1)  # [B, H, Q, D]
        gqa = q.shape[1] != k.shape[1]
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=self.mask, scale=scaling, enable_gqa=gqa)
        out = out.transpose(1, 2)  # [B, Q, H, D]
        return out.reshape(-1, out.shape[2], out.shape[3])[self.unpad].unsqueeze(0)  # [1, T, H, D]
