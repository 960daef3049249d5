"""Write a forward's new keys and values into a layer's paged cache: one op when k and v share a tensor.

    store_kv(kv, slots, key, value)    # kv [2, num_slots, Hkv, D]; key / value [1, Hkv, T, D]; slots [T]

The fused decoder's k and v are two halves of one merged projection's rows
(fused/attention.py): seen as a [2, T, Hkv, D] view of that tensor they go into
the cache with one ``index_copy_``. Keys and values from separate tensors (the
transformers path) are written one after the other.
"""

from __future__ import annotations

import torch


def adjacent_pair(key: torch.Tensor, value: torch.Tensor) -> torch.Tensor | None:
    """key / value [1, Hkv, T, D] as one [2, T, Hkv, D] view when they are equal-strided parts of one storage
    (value a fixed offset after key), else None."""
    if (
        key.shape != value.shape
        or key.stride() != value.stride()
        or key.dtype != value.dtype
        or key.untyped_storage().data_ptr() != value.untyped_storage().data_ptr()
    ):
        return None
    delta = value.storage_offset() - key.storage_offset()
    if delta <= 0:
        return None
    _, num_kv, num_tokens, head_dim = key.shape
    _, s_head, s_token, s_dim = key.stride()
    return key.as_strided((2, num_tokens, num_kv, head_dim), (delta, s_token, s_head, s_dim), key.storage_offset())


def store_kv(kv: torch.Tensor, slots: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> None:
    """kv [2, num_slots, Hkv, D] ← key / value [1, Hkv, T, D] at ``slots`` [T] (distinct)."""
    pair = adjacent_pair(key, value)  # [2, T, Hkv, D]
    if pair is not None:
        kv.index_copy_(1, slots, pair)
        return
    kv[0, slots] = key[0].transpose(0, 1)
    kv[1, slots] = value[0].transpose(0, 1)
