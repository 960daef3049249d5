"""The layout of one batched forward and the hook that routes HF attention to our backend.

Transformers' model code stays untouched: its attention modules project q/k/v,
apply RoPE at the position ids we pass, and then call the attention function
registered as ``"tandem"``. That function hands q/k/v to the active backend,
which writes k/v into the paged cache and attends with the batch's masks.

All sequences are packed into one row of ``num_tokens`` (no padding)::

    input_ids  [1, T]  = seqA(prefill 5) | seqB(decode 1) | seqC(root 1 + tree 4)
    positions  [1, T]  = 0 1 2 3 4       | 37             | 12 13 13 14 14
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface

ATTN_IMPLEMENTATION = "tandem"


@dataclass
class SeqLayout:
    """One sequence's share of the batch."""

    q_start: int  # first row in the packed token dimension
    q_len: int  # tokens this sequence runs now
    kv_slots: torch.Tensor  # [kv_len] physical slots of logical positions 0..kv_len-1 (new tokens included)
    mask: torch.Tensor  # [q_len, kv_len] bool, True = may attend
    causal: bool  # mask is plain causal over the last q_len positions (no tree): kernels may skip it


@dataclass
class BatchLayout:
    seqs: list[SeqLayout]
    new_slots: torch.Tensor  # [num_tokens] physical slot each new token's k/v is written to
    num_tokens: int
    device: torch.device

    @property
    def num_context_tokens(self) -> int:
        return sum(int(s.kv_slots.numel()) for s in self.seqs)


class AttentionBackend(Protocol):
    name: str

    def plan(self, layout: BatchLayout) -> None:
        """Build per-forward metadata once; attend() is then called for every layer."""

    def attend(
        self, layer_idx: int, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scaling: float
    ) -> torch.Tensor:
        """query [1, H, T, D], key/value [1, Hkv, T, D] → output [1, T, H, D]; writes k/v to the cache."""


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
    """``auto``: flashinfer when CUDA and flashinfer are present and the cache is fp16/bf16, else SDPA."""
    if name == "auto":
        name = "sdpa"
        if device.type == "cuda" and kv_cache.kv.dtype in (torch.float16, torch.bfloat16):
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
