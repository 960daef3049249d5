"""Paged KV cache: fixed-size blocks, per-sequence block tables, exact accounting.

One tensor holds every layer's keys and values, addressed by *slot*::

    kv: [num_layers, 2 (k|v), num_blocks * block_size, num_kv_heads, head_dim]

    block table of a sequence          slots
    [7, 2, 9]  ──▶ logical pos p  ──▶  block_ids[p // block_size] * block_size + p % block_size

Sequences of any length share the pool with at most ``block_size - 1``
unused slots each, so a batch never pads its storage. Per layer,
``kv[l, 0].view(num_blocks, block_size, H, D)`` is the NHD paged layout that
flashinfer expects, so both attention backends read the same memory.

Resizing (Nightjar §5.1, elastic memory: the target takes the space of an
offloaded draft)::

    ids   0 ........ base-1 | base ...... base+grow-1
          always there      | only while grown: handed out last (lowest id first),
                            | so they are the first to fall free again

``resize`` grows by copying into a larger tensor: a slot's address depends on
the block id only, so every block id handed out stays valid. It shrinks only
when every block past the new end is free (``KVBlocksInUseError`` otherwise,
nothing changed). Peak memory on a GPU: old and new tensors coexist during
the copy, so growing from N to N + G blocks briefly needs 2N + G blocks' worth.
"""

from __future__ import annotations

import heapq
import logging

import torch

from shared.engine.block_features import BlockFeatures
from shared.engine.errors import KVBlocksInUseError, OutOfBlocksError
from shared.engine.prefix_cache import PrefixIndex

log = logging.getLogger(__name__)
FEATURE_HEADROOM = 0.05  # of the device's memory kept free after the feature rows are allocated


def feature_store_fits(device: torch.device, num_bytes: int, free_total: tuple[int, int] | None = None) -> bool:
    """Whether ``num_bytes`` of feature rows fit on ``device`` and leave FEATURE_HEADROOM of it free.

    CUDA reads the device's free memory (``free_total`` overrides it, for tests); host memory is not checked."""
    if device.type != "cuda" and free_total is None:
        return True
    free, total = free_total if free_total is not None else torch.cuda.mem_get_info(device)
    return num_bytes <= free - FEATURE_HEADROOM * total


class BlockAllocator:
    """Hands out block ids, lowest free id first; knows exactly who holds each one.

    A block is in exactly one state (the accounting invariant ``check`` tests)::

        free       in the heap, no holder, not indexed
        cached     indexed in the prefix cache, no holder: evictable (LRU), counted as free
        held       ref count >= 1 (one per block table, or the scratch owner), maybe indexed too

    ``allocate`` takes plainly free blocks first and reclaims cached ones, least recently used first,
    only when none is left; ``share`` adds a holder to a cached block; ``free`` drops one holder.
    """

    def __init__(self, num_blocks: int):
        self.num_blocks = num_blocks
        self._free: list[int] = list(range(num_blocks))  # min-heap: low ids first, so the top ones stay free
        self._owner: dict[int, str] = {}  # held blocks: the first holder's name (messages)
        self._ref: dict[int, int] = {}  # held blocks: number of holders
        self.prefix = PrefixIndex()

    @property
    def num_free(self) -> int:
        """Blocks an allocation can take: plainly free plus cached-and-evictable."""
        return len(self._free) + len(self.prefix.evictable)

    @property
    def num_cached(self) -> int:
        """Blocks indexed in the prefix cache (held or evictable)."""
        return len(self.prefix.key_of)

    def can_allocate(self, num_blocks: int) -> bool:
        return num_blocks <= self.num_free

    def allocate(self, num_blocks: int, owner: str) -> list[int]:
        if num_blocks > self.num_free:
            raise OutOfBlocksError(
                f"KV cache needs {num_blocks} more blocks for {owner!r} but only {self.num_free} "
                f"of {self.num_blocks} are free"
            )
        block_ids = [heapq.heappop(self._free) if self._free else self.prefix.evict_oldest() for _ in range(num_blocks)]
        for block_id in block_ids:
            self._owner[block_id] = owner
            self._ref[block_id] = 1
        return block_ids

    def share(self, block_id: int, owner: str) -> None:
        """One more holder of a cached block (taken off the evictable list if nobody held it)."""
        if block_id not in self.prefix:
            raise RuntimeError(f"KV block {block_id} is not cached; only cached blocks are shared")
        if block_id in self._ref:
            self._ref[block_id] += 1
        else:
            self.prefix.unpark(block_id)
            self._ref[block_id], self._owner[block_id] = 1, owner

    def ref(self, block_id: int) -> int:
        return self._ref.get(block_id, 0)

    def free(self, block_ids: list[int]) -> None:
        for block_id in block_ids:
            ref = self._ref.get(block_id)
            if ref is None:
                raise RuntimeError(f"double free of KV block {block_id}")
            if ref > 1:
                self._ref[block_id] = ref - 1
                continue
            del self._ref[block_id], self._owner[block_id]
            if block_id in self.prefix:
                self.prefix.park(block_id)  # stays cached until an allocation reclaims it
            else:
                heapq.heappush(self._free, block_id)

    def make_private(self, block_id: int) -> None:
        """A sole holder is about to write into its block: drop it from the prefix cache."""
        self.prefix.forget(block_id)

    def owners(self) -> dict[int, str]:
        return dict(self._owner)

    def check(self) -> None:
        """Every block is exactly one of free, cached-evictable or held (AssertionError otherwise)."""
        free, parked, held = set(self._free), set(self.prefix.evictable), set(self._ref)
        assert len(free) == len(self._free), "a block is twice in the free heap"
        assert not (free & parked) and not (free & held) and not (parked & held), "a block is in two states"
        assert free | parked | held == set(range(self.num_blocks)), "a block is lost (in no state)"
        assert parked <= set(self.prefix.key_of), "an evictable block is not indexed"
        assert set(self.prefix.key_of) == set(self.prefix.by_key.values()), "the prefix index disagrees with itself"
        assert all(r >= 1 for r in self._ref.values()) and set(self._owner) == held

    def drop_cache(self) -> None:
        """Forget every cached block nobody holds (they become plainly free)."""
        for block_id in list(self.prefix.evictable):
            self.prefix.forget(block_id)
            heapq.heappush(self._free, block_id)

    def resize(self, num_blocks: int) -> None:
        """Add ids at the top, or drop the top ones, which must all be free (``KVBlocksInUseError``)."""
        self.check_shrink(num_blocks)
        if num_blocks >= self.num_blocks:
            for block_id in range(self.num_blocks, num_blocks):
                heapq.heappush(self._free, block_id)
        else:
            for block_id in [b for b in self.prefix.evictable if b >= num_blocks]:
                self.prefix.forget(block_id)  # a cached block past the new end is simply lost
            self._free = [b for b in self._free if b < num_blocks]
            heapq.heapify(self._free)
        self.num_blocks = num_blocks

    def check_shrink(self, num_blocks: int) -> None:
        """Raise ``KVBlocksInUseError`` when a block at or past ``num_blocks`` is held."""
        owned = sorted(b for b in self._owner if b >= num_blocks)
        if owned:
            owners = sorted({self._owner[b] for b in owned})
            raise KVBlocksInUseError(
                f"cannot shrink the KV pool to {num_blocks} blocks: {len(owned)} of blocks {num_blocks}.."
                f"{self.num_blocks - 1} are owned by live sequences ({', '.join(owners[:4])}"
                f"{', ...' if len(owners) > 4 else ''}); retry once they finish"
            )


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
        self.kv = self._zeros(num_blocks)
        self.allocator = BlockAllocator(num_blocks)
        self.released = False  # True between release_memory() and reallocate()
        self.features: BlockFeatures | None = None  # target feature rows beside the KV (block_features.py)
        self._warned_features = False

    def feature_store(self, layer_ids: tuple[int, ...], width: int) -> tuple[BlockFeatures | None, bool]:
        """The feature rows for ``layer_ids`` (made on first use); True when it (re)started empty.

        None when the device cannot hold them beside the pool (the pool was sized before any step asked for
        features): feature steps then compute every token they feed, as without the store."""
        store = self.features
        if store is not None and store.fits(layer_ids, width):
            return store, False
        dropped, self.features = store is not None, None
        need = self.num_blocks * self.block_size * width * torch.finfo(self.dtype).bits // 8
        if not feature_store_fits(self.device, need):
            if not self._warned_features:
                log.warning("prefix cache: no room for %.0f MiB of feature rows beside the KV pool on %s; "
                            "feature steps recompute cached prefixes", need / 2**20, self.device)
                self._warned_features = True
            return None, dropped
        self.features = BlockFeatures(tuple(layer_ids), width, self.num_blocks, self.block_size, self.dtype, self.device)
        return self.features, True

    def _zeros(self, num_blocks: int) -> torch.Tensor:
        # [num_layers, 2, num_slots, num_kv_heads, head_dim]
        return torch.zeros(
            self.num_layers, 2, num_blocks * self.block_size, self.num_kv_heads, self.head_dim,
            dtype=self.dtype, device=self.device,
        )  # fmt: skip

    def release_memory(self) -> int:
        """Free the KV tensors (every block must be free); no block can be allocated until ``reallocate``.
        Returns the bytes given back (Nightjar §5: the draft's KV space goes with its weights)."""
        if self.released:
            return 0
        if self.allocator.num_free != self.num_blocks:
            raise RuntimeError(f"{self.num_blocks - self.allocator.num_free} KV blocks are still owned")
        self.allocator.drop_cache()
        freed = self.kv.numel() * self.kv.element_size()
        self.kv = torch.empty(0, dtype=self.dtype, device=self.device)
        self.allocator = BlockAllocator(0)
        self.features = None
        self.released = True
        return freed

    def reallocate(self) -> None:
        """A fresh pool of ``num_blocks`` after ``release_memory`` (zeroed, all free)."""
        if self.released:
            self.kv = self._zeros(self.num_blocks)
            self.allocator = BlockAllocator(self.num_blocks)
            self.features = None
            self.released = False

    def resize(self, num_blocks: int) -> int:
        """Grow or shrink the pool to ``num_blocks`` (see the module docstring); returns the pool's bytes after."""
        if self.released:
            raise RuntimeError("the KV pool is released; reallocate() it before resizing")
        if num_blocks < 1:
            raise ValueError(f"a KV pool needs at least one block, got {num_blocks}")
        if num_blocks != self.num_blocks:
            self.allocator.check_shrink(num_blocks)  # before anything changes
            keep = min(num_blocks, self.num_blocks) * self.block_size
            kv = self._zeros(num_blocks)  # [num_layers, 2, num_blocks * block_size, num_kv_heads, head_dim]
            kv[:, :, :keep] = self.kv[:, :, :keep]  # block b keeps slots b*block_size.. in both tensors
            self.allocator.resize(num_blocks)
            if self.features is not None:
                self.features.resize(num_blocks)
            self.kv, self.num_blocks = kv, num_blocks
        return self.kv.numel() * self.kv.element_size()

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
