"""Paged KV cache: fixed-size blocks, per-sequence block tables, exact accounting.

One tensor holds every layer's keys and values, addressed by *slot*::

    kv: [num_layers, 2 (k|v), num_blocks * block_size, num_kv_heads, head_dim]

    block table of a sequence          slots
    [7, 2, 9]  ──▶ logical pos p  ──▶  block_ids[p // block_size] * block_size + p % block_size

Sequences of any length share the pool with at most ``block_size - 1``
unused slots each, so a batch never pads its storage. Per layer,
``kv[l, 0].view(num_blocks, block_size, H, D)`` is the NHD paged layout that
flashinfer expects, so both attention backends read the same memory.
"""

from __future__ import annotations

import torch

from shared.engine.errors import OutOfBlocksError


class BlockAllocator:
    """Hands out block ids; knows exactly who owns each one."""

    def __init__(self, num_blocks: int):
        self.num_blocks = num_blocks
        self._free: list[int] = list(range(num_blocks - 1, -1, -1))  # stack: low ids first
        self._owner: dict[int, str] = {}

    @property
    def num_free(self) -> int:
        return len(self._free)

    def can_allocate(self, num_blocks: int) -> bool:
        return num_blocks <= len(self._free)

    def allocate(self, num_blocks: int, owner: str) -> list[int]:
        if num_blocks > len(self._free):
            raise OutOfBlocksError(
                f"KV cache needs {num_blocks} more blocks for {owner!r} but only {len(self._free)} "
                f"of {self.num_blocks} are free"
            )
        block_ids = [self._free.pop() for _ in range(num_blocks)]
        for block_id in block_ids:
            self._owner[block_id] = owner
        return block_ids

    def free(self, block_ids: list[int]) -> None:
        for block_id in block_ids:
            if self._owner.pop(block_id, None) is None:
                raise RuntimeError(f"double free of KV block {block_id}")
            self._free.append(block_id)

    def owners(self) -> dict[int, str]:
        return dict(self._owner)


class PagedKVCache:
    """The KV tensors plus the allocator that partitions them."""

    def __init__(
        self,
        *,
        num_layers: int,
        num_blocks: int,
        block_size: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str,
    ):
        self.num_layers = num_layers
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.dtype, self.device = dtype, device
        self.kv = self._zeros()
        self.allocator = BlockAllocator(num_blocks)
        self.released = False  # True between release_memory() and reallocate()

    def _zeros(self) -> torch.Tensor:
        # [num_layers, 2, num_slots, num_kv_heads, head_dim]
        return torch.zeros(
            self.num_layers, 2, self.num_blocks * self.block_size, self.num_kv_heads, self.head_dim,
            dtype=self.dtype, device=self.device,
        )  # fmt: skip

    def release_memory(self) -> int:
        """Free the KV tensors (every block must be free); no block can be allocated until ``reallocate``.
        Returns the bytes given back (Nightjar §5: the draft's KV space goes with its weights)."""
        if self.released:
            return 0
        if self.allocator.num_free != self.num_blocks:
            raise RuntimeError(f"{self.num_blocks - self.allocator.num_free} KV blocks are still owned")
        freed = self.kv.numel() * self.kv.element_size()
        self.kv = torch.empty(0, dtype=self.dtype, device=self.device)
        self.allocator = BlockAllocator(0)
        self.released = True
        return freed

    def reallocate(self) -> None:
        """A fresh pool of ``num_blocks`` after ``release_memory`` (zeroed, all free)."""
        if self.released:
            self.kv = self._zeros()
            self.allocator = BlockAllocator(self.num_blocks)
            self.released = False

    @property
    def num_free_blocks(self) -> int:
        return self.allocator.num_free

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def layer(self, layer_idx: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Paged views of one layer: each [num_blocks, block_size, num_kv_heads, head_dim]."""
        shape = (self.num_blocks, self.block_size, self.num_kv_heads, self.head_dim)
        return self.kv[layer_idx, 0].view(shape), self.kv[layer_idx, 1].view(shape)

    def move(self, src_slots: torch.Tensor, dst_slots: torch.Tensor) -> None:
        """Copy the entries at src to dst in every layer (gather first, so overlaps are safe)."""
        self.kv[:, :, dst_slots] = self.kv[:, :, src_slots]

    @staticmethod
    def bytes_per_block(num_layers: int, block_size: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
        return num_layers * 2 * block_size * num_kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()
