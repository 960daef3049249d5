"""The layout of one batched forward, and the interface every attention backend implements.

Plain data shared by ``base.py`` (which routes transformers' attention to a
backend) and the backends (``sdpa.py``, ``flashinfer_backend.py``); it imports
none of them.

All sequences are packed into one row of ``num_tokens`` (no padding)::

    input_ids  [1, T]  = seqA(prefill 5) | seqB(decode 1) | seqC(root 1 + tree 4)
    positions  [1, T]  = 0 1 2 3 4       | 37             | 12 13 13 14 14
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch


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
        self,
        layer_idx: int,
        query: torch.Tensor,
        key: torch.Tensor | None,
        value: torch.Tensor | None,
        scaling: float,
        new_kv: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """query [1, H, T, D], key/value [1, Hkv, T, D] → output [1, T, H, D]; writes k/v to the cache.
        ``new_kv`` [2, T, Hkv, D]: the keys and values as one tensor (then key and value are None), stored in one op."""
