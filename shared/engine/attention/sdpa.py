"""Reference attention: gather each sequence's KV from the pages, one SDPA call per layer.

Storage is paged (no padding); compute pads the batch to [B, max_q, max_kv]
so the whole batch is one kernel call per layer. Padded query rows attend to
slot 0 only (never NaN) and are dropped on the way out.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from shared.engine.attention.layout import BatchLayout
from shared.engine.kv_cache import PagedKVCache


class SdpaBackend:
    name = "sdpa"

    def __init__(self, kv_cache: PagedKVCache):
        self.cache = kv_cache

    def plan(self, layout: BatchLayout) -> None:
        device = layout.device
        num_seqs = len(layout.seqs)
        max_q = max(s.q_len for s in layout.seqs)
        max_kv = max(int(s.kv_slots.numel()) for s in layout.seqs)
        gather = torch.zeros(num_seqs, max_kv, dtype=torch.long)  # [B, max_kv] physical slots
        mask = torch.zeros(num_seqs, 1, max_q, max_kv, dtype=torch.bool)  # [B, 1, max_q, max_kv]
        mask[:, :, :, 0] = True  # padded rows look at one real slot, so softmax stays finite
        q_index = torch.zeros(num_seqs, max_q, dtype=torch.long)  # [B, max_q] packed row of each query
        unpad = torch.empty(layout.num_tokens, dtype=torch.long)  # [T] flat [B*max_q] row of each token
        for b, s in enumerate(layout.seqs):
            kv_len = int(s.kv_slots.numel())
            gather[b, :kv_len] = s.kv_slots
            mask[b, 0, : s.q_len, :kv_len] = s.mask
            rows = torch.arange(s.q_start, s.q_start + s.q_len)
            q_index[b, : s.q_len] = rows
            unpad[rows] = b * max_q + torch.arange(s.q_len)
        self.single = num_seqs == 1
        self.new_slots = layout.new_slots
        self.gather = gather.to(device)
        self.gather_flat = self.gather.reshape(-1)
        self.mask = mask.to(device)
        self.q_index = q_index.to(device)
        self.unpad = unpad.to(device)
        self.max_q = max_q

    def attend(self, layer_idx, query, key, value, scaling):
        kv = self.cache.kv[layer_idx]  # [2, num_slots, Hkv, D]
        kv[0, self.new_slots] = key[0].transpose(0, 1)
        kv[1, self.new_slots] = value[0].transpose(0, 1)
        shape = (*self.gather.shape, *kv.shape[2:])  # index_select on the flat slots beats advanced indexing on CPU
        k = kv[0].index_select(0, self.gather_flat).view(shape).transpose(1, 2)  # [B, Hkv, max_kv, D]
        v = kv[1].index_select(0, self.gather_flat).view(shape).transpose(1, 2)  # [B, Hkv, max_kv, D]
        if self.single:
            q = query  # [1, H, T, D]
        else:
            q = query[0][:, self.q_index].transpose(0, 1)  # [B, H, max_q, D]
        # grouped-query attention without materialising repeated k/v heads
        gqa = q.shape[1] != k.shape[1]
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=self.mask, scale=scaling, enable_gqa=gqa)  # [B, H, max_q, D]
        out = out.transpose(1, 2)  # [B, max_q, H, D]
        if self.single:
            return out
        return out.reshape(-1, out.shape[2], out.shape[3])[self.unpad].unsqueeze(0)  # [1, T, H, D]
