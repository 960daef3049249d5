"""Reference attention: gather each sequence's KV from the pages, one SDPA call per layer.

Storage is paged (no padding); compute pads the batch to [B, max_q, max_kv]
so the whole batch is one kernel call per layer. Padded query rows attend to
slot 0 only (never NaN) and are dropped on the way out.

Row-exact mode (one sequence, a few query rows, a 16-bit dtype on CPU): each query row
attends over exactly the slots that row sees, in order, with no mask (row_exact.py, three
small float32 ops per row: faster than one SDPA call per row on CPU). A row's result then
does not depend on how many other rows the forward carries: a verify's row at position p
computes what a plain decode at p computes, bit for bit. With a mask over a longer KV, the
kernel's softmax sums run over more (masked, zero) terms in another vector grouping, and in
bfloat16 the rounding of such differences flips greedy choices within a few dozen tokens,
so speculative output would no longer equal plain decoding token for token. In float32 the
same differences are ~1e-7 and the batched call stays (tests compare its output too).

Several sequences of a few rows each in 16 bits on CPU (a batched decode or verify): the padded
batch runs as matmul, softmax, matmul in float32 (padded_matmul.py), 1.5-5x faster than the
CPU SDPA kernel there; float32 and prefills keep SDPA.

Several sequences with a prefill among them (more than ``ROW_EXACT_MAX_Q`` rows): one SDPA call
per sequence over exactly its own rows and slots, no padding. Padded to [B, max_q, max_kv], a
call prefilling 3-4 prompts of 300-900 tokens cost 1.6-1.9 ms per prompt token against 1.0 for
one prompt alone (the padding, and the explicit mask's slower kernel, grow with B x max_len^2):
whoever arrived together paid for each other, and a slower step, which gathers more arrivals per
prefill, made the next prefill slower still (bench/results/diag-prefill). A fresh prompt (plain
causal, its KV all new) runs with ``is_causal`` and no mask, the fused kernel's fast path; the
same for a single sequence.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from shared.engine.attention.layout import BatchLayout
from shared.engine.attention.padded_matmul import attend_padded
from shared.engine.attention.row_exact import attend_rows, split_row
from shared.engine.attention.kv_store import store_kv
from shared.engine.kv_cache import PagedKVCache


ROW_EXACT_MAX_Q = 16  # row-exact mode up to this many query rows (a decode step, a verify, not a prefill)


def _packed_in_order(layout: BatchLayout) -> bool:
    """Do the sequences' rows follow one another in batch order (so per-sequence outputs concatenate)?"""
    start = 0
    for s in layout.seqs:
        if s.q_start != start:
            return False
        start += s.q_len
    return True




class SdpaBackend:
    name = "sdpa"

    def __init__(self, kv_cache: PagedKVCache):
        self.cache = kv_cache

    def plan(self, layout: BatchLayout) -> None:
        device = layout.device
        num_seqs = len(layout.seqs)
        max_q = max(s.q_len for s in layout.seqs)
        self.single = num_seqs == 1
        self.new_slots = layout.new_slots
        self.max_q = max_q
        self.row_slots = None  # row-exact mode: per query row, the gathered KV positions it sees
        self.matmul = False
        # a fresh causal prompt: SDPA's is_causal (top-left aligned) is its mask exactly, with no mask to read
        self.fresh = [s.causal and s.q_len == int(s.kv_slots.numel()) for s in layout.seqs]
        self.per_seq = None  # several sequences with a prefill among them: one call each (module docstring)
        if not self.single and max_q > ROW_EXACT_MAX_Q and _packed_in_order(layout):
            self.per_seq = [
                (s.q_start, s.q_len, s.kv_slots.to(device), None if fresh else s.mask[None, None].to(device))
                for s, fresh in zip(layout.seqs, self.fresh)
            ]  # fmt: skip
            return  # none of the padded batch's metadata below is read
        kv_dtype = self.cache.kv[0].dtype if len(self.cache.kv) else torch.float32
        small_cpu16 = max_q <= ROW_EXACT_MAX_Q and kv_dtype != torch.float32 and torch.device(device).type == "cpu"
        self.matmul = small_cpu16 and not self.single  # several sequences: padded_matmul.py, not SDPA
        # a lone fresh prompt runs with is_causal: its [T, T] mask is not built
        need_mask = not (self.single and self.fresh[0] and not small_cpu16)
        max_kv = max(int(s.kv_slots.numel()) for s in layout.seqs)
        gather = torch.zeros(num_seqs, max_kv, dtype=torch.long)  # [B, max_kv] physical slots
        mask = torch.zeros(num_seqs, 1, max_q, max_kv, dtype=torch.bool) if need_mask else None  # [B, 1, max_q, max_kv]
        if mask is not None:
            mask[:, :, :, 0] = True  # padded rows look at one real slot, so softmax stays finite
        q_index = torch.zeros(num_seqs, max_q, dtype=torch.long)  # [B, max_q] packed row of each query
        unpad = torch.empty(layout.num_tokens, dtype=torch.long)  # [T] flat [B*max_q] row of each token
        for b, s in enumerate(layout.seqs):
            kv_len = int(s.kv_slots.numel())
            gather[b, :kv_len] = s.kv_slots
            if mask is not None:
                mask[b, 0, : s.q_len, :kv_len] = s.mask
            rows = torch.arange(s.q_start, s.q_start + s.q_len)
            q_index[b, : s.q_len] = rows
            unpad[rows] = b * max_q + torch.arange(s.q_len)
        if self.single and small_cpu16:
            s = layout.seqs[0]
            seen = [split_row(s.mask[t].nonzero().squeeze(1)) for t in range(s.q_len)]
            self.row_slots = [x if isinstance(x, int) else (x[0], x[1].to(device)) for x in seen]
        self.gather = gather.to(device)
        self.gather_flat = self.gather.reshape(-1)
        self.mask = mask.to(device) if mask is not None else None
        self.q_index = q_index.to(device)
        self.unpad = unpad.to(device)

    def attend(self, layer_idx, query, key, value, scaling, new_kv=None):
        kv = self.cache.kv[layer_idx]  # [2, num_slots, Hkv, D]
        store_kv(kv, self.new_slots, key, value, new_kv)
        if self.row_slots is not None:  # row-exact mode (module docstring): per row over exactly its slots
            keys = kv[0].index_select(0, self.gather_flat)  # [kv_len, Hkv, D], position order
            values = kv[1].index_select(0, self.gather_flat)
            return attend_rows(query, keys, values, self.row_slots, scaling)  # [1, T, H, D]
        if self.per_seq is not None:
            return self._attend_each(kv, query, scaling)
        shape = (*self.gather.shape, *kv.shape[2:])  # index_select on the flat slots beats advanced indexing on CPU
        k = kv[0].index_select(0, self.gather_flat).view(shape).transpose(1, 2)  # [B, Hkv, max_kv, D]
        v = kv[1].index_select(0, self.gather_flat).view(shape).transpose(1, 2)  # [B, Hkv, max_kv, D]
        if self.single:
            q = query  # [1, H, T, D]
        else:
            q = query[0][:, self.q_index].transpose(0, 1)  # [B, H, max_q, D]
        # grouped-query attention without materialising repeated k/v heads
        gqa = q.shape[1] != k.shape[1]
        if self.matmul:
            out = attend_padded(q, k, v, self.mask, scaling)  # [B, H, max_q, D]
        elif self.single and self.fresh[0]:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scaling, enable_gqa=gqa)
        else:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=self.mask, scale=scaling, enable_gqa=gqa)
        out = out.transpose(1, 2)  # [B, max_q, H, D]
        if self.single:
            return out
        return out.reshape(-1, out.shape[2], out.shape[3])[self.unpad].unsqueeze(0)  # [1, T, H, D]

    def _attend_each(self, kv: torch.Tensor, query: torch.Tensor, scaling: float) -> torch.Tensor:
        """One SDPA call per sequence over its own rows and slots (several sequences, a prefill among them)."""
        outs = []
        for q_start, q_len, slots, mask in self.per_seq:
            q = query[:, :, q_start : q_start + q_len]  # [1, H, q_len, D]
            k = kv[0].index_select(0, slots).transpose(0, 1).unsqueeze(0)  # [1, Hkv, kv_len, D]
            v = kv[1].index_select(0, slots).transpose(0, 1).unsqueeze(0)
            gqa = q.shape[1] != k.shape[1]
            if mask is None:
                outs.append(F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scaling, enable_gqa=gqa))
            else:
                outs.append(F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scaling, enable_gqa=gqa))
        return torch.cat(outs, dim=2).transpose(1, 2)  # [1, T, H, D]
