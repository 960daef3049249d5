"""The hook that routes HF attention to our backend, and the choice of backend (the layout types: layout.py).

Transformers' model code stays untouched: its attention modules project q/k/v,
apply RoPE at the position ids we pass, and then call the attention function
registered as ``"tandem"``. That function hands q/k/v to the active backend,
which writes k/v into the paged cache and attends with the batch's masks.

All sequences are packed into one row of ``num_tokens`` (no padding)::

    input_ids  [1, T]  = seqA(prefill 5) | seqB(decode 1) | seqC(root 1 + tree 4)
    positions  [1, T]  = 0 1 2 3 4       | 37             | 12 13 13 14 14
"""

from __future__ import annotations

import torch
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface

from shared.engine.attention.layout import AttentionBackend, BatchLayout, SeqLayout

__all__ = ["ATTN_IMPLEMENTATION", "AttentionBackend", "BatchLayout", "SeqLayout", "register", "select_backend"]

ATTN_IMPLEMENTATION = "tandem"


def _tandem_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    backend: AttentionBackend = kwargs["tandem_backend"]
    return backend.attend(module.layer_idx, query, key, value, scaling), None


def _no_mask(*args, **kwargs):
    # Masks are built per batch by the backend (tree masks); transformers must not build its own.
    return None


def register() -> None:
    AttentionInterface.register(ATTN_IMPLEMENTATION, _tandem_attention)
    AttentionMaskInterface.register(ATTN_IMPLEMENTATION, _no_mask)


def select_backend(name: str, kv_cache, device: torch.device) -> AttentionBackend:
    """``auto``: flashinfer when CUDA and flashinfer are present, the cache is fp16/bf16 and the head dim
    one flashinfer has kernels for (64, 128, 256), else SDPA."""
    if name == "auto":
        from shared.engine.attention.flashinfer_backend import SUPPORTED_DTYPES, SUPPORTED_HEAD_DIMS

        name = "sdpa"
        head_dim = kv_cache.kv.shape[-1]  # [L, 2, slots, Hkv, D]
        if device.type == "cuda" and kv_cache.kv.dtype in SUPPORTED_DTYPES and head_dim in SUPPORTED_HEAD_DIMS:
            try:
                import flashinfer  # noqa: F401

                name = "flashinfer"
            except ImportError:
                pass
    if name == "sdpa":
        from shared.engine.attention.sdpa import SdpaBackend

        return SdpaBackend(kv_cache)
    if name == "flashinfer":
        from shared.engine.attention.flashinfer_backend import FlashinferBackend

        return FlashinferBackend(kv_cache, device)
    raise ValueError(f"unknown attention backend {name!r} (choose auto, sdpa or flashinfer)")
