"""Target feature rows kept beside the KV slots, so a cached prefix block serves its features too.

An EAGLE draft reads the target's hidden states at a few layers for every committed token. A step that
returns them and shares cached blocks must hand back the rows of the positions the cache served, so
they are kept with the blocks, addressed like the KV itself::

    rows: [num_blocks * block_size, width]     slot s = block_ids[p // block_size] * block_size + p % block_size
    featured: [num_blocks] bool                 (host) an indexed block all of whose rows are stored

Written at the forward's new slots (the same index as its KV), moved with the accepted path's KV at a
commit, copied with a block on copy-on-write. ``featured`` is set each time a block enters the prefix
index (prefix_blocks.register), so a block reclaimed and reused starts over; it is read only for indexed
blocks. One layer set at a time: features of another set start the store over (nothing is featured).
Allocated on the first feature step of a sequence that may share blocks; its memory is the pool's block
count times ``block_size * width`` values, and each block's rows live and die with the block.
"""

from __future__ import annotations

import numpy as np
import torch


class BlockFeatures:
    def __init__(self, layer_ids: tuple[int, ...], width: int, num_blocks: int, block_size: int, dtype, device) -> None:
        self.layer_ids = layer_ids
        self.block_size = block_size
        with torch.inference_mode(False):  # made inside a forward, written outside one too (a commit's move)
            self.rows = torch.zeros(num_blocks * block_size, width, dtype=dtype, device=device)  # [num_slots, width]
        self.featured = np.zeros(num_blocks, dtype=bool)  # [num_blocks] host flags

    @property
    def width(self) -> int:
        return self.rows.shape[1]

    def fits(self, layer_ids: tuple[int, ...], width: int) -> bool:
        return self.layer_ids == tuple(layer_ids) and self.width == width

    def write(self, slots: torch.Tensor, rows: torch.Tensor) -> None:
        """slots [T] (device), rows [T, width]: a forward's feature rows at the slots its KV went to."""
        self.rows[slots] = rows.to(self.rows.dtype)

    def read(self, slots: torch.Tensor) -> torch.Tensor:
        """slots [R] → the stored rows [R, width]."""
        return self.rows[slots]

    def move(self, src_slots: torch.Tensor, dst_slots: torch.Tensor) -> None:
        """src, dst [M] slots (gather first, so overlaps are safe), as PagedKVCache.move does for the KV."""
        self.rows[dst_slots] = self.rows[src_slots]

    def copy_block(self, src: int, dst: int) -> None:
        """Copy-on-write of block ``src`` into ``dst``: its rows go along (``dst`` is private: not featured)."""
        bs = self.block_size
        self.rows[dst * bs : (dst + 1) * bs] = self.rows[src * bs : (src + 1) * bs]

    def mark(self, block_id: int, has_rows: bool) -> None:
        """The block just entered the prefix index, with (True) or without all of its rows stored."""
        self.featured[block_id] = has_rows

    def adopt(self, block_id: int, cached_id: int) -> None:
        """An equal block is cached already, without rows: give it this block's (same prefix, same rows)."""
        if not self.featured[cached_id]:
            bs = self.block_size
            self.rows[cached_id * bs : (cached_id + 1) * bs] = self.rows[block_id * bs : (block_id + 1) * bs]
            self.featured[cached_id] = True

    def has(self, block_id: int) -> bool:
        return bool(self.featured[block_id])

    def resize(self, num_blocks: int) -> None:
        """Follow the pool's resize: block b keeps its rows while it exists."""
        keep = min(num_blocks, len(self.featured))
        with torch.inference_mode(False):
            rows = self.rows.new_zeros(num_blocks * self.block_size, self.width)  # [num_slots, width]
            rows[: keep * self.block_size] = self.rows[: keep * self.block_size]
        featured = np.zeros(num_blocks, dtype=bool)  # [num_blocks]
        featured[:keep] = self.featured[:keep]
        self.rows, self.featured = rows, featured
