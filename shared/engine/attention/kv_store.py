"""Write a forward's new keys and values into a layer's paged cache (what every backend's attend does first).

    store_kv(kv, slots, key, value)          # kv [2, num_slots, Hkv, D]; key / value [1, Hkv, T, D]; slots [T]
    store_kv(kv, slots, None, None, pair)    # pair [2, T, Hkv, D]: keys and values as one tensor, one op

The fused decoder's keys and values are two halves of one merged projection's rows
(fused/attention.py): it hands them over as one [2, T, Hkv, D] view, which goes into
the cache with one ``index_copy_``. The transformers path's separate tensors are
written one after the other.
"""

from __future__ import annotations

import torch


def store_kv(
    kv: torch.Tensor,
    slots: torch.Tensor,
    key: torch.Tensor | None,
    value: torch.Tensor | None,
    pair: torch.Tensor | None = None,
) -> None:
    """kv [2, num_slots, Hkv, D] ← ``pair`` [2, T, Hkv, D], else key / value [1, Hkv, T, D], at ``slots`` [T] (distinct)."""
    if pair is not None:
        kv.index_copy_(1, slots, pair)
        return
    kv[0, slots] = key[0].transpose(0, 1)
    kv[1, slots] = value[0].transpose(0, 1)
