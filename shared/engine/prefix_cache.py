"""Automatic prefix caching: full KV blocks keyed by the hash of their tokens and of every block before them.

vLLM's scheme. A block's key chains its parent's::

    key(block i) = blake2b( key(block i-1) | salt (block 0 only) | tokens[i*bs : (i+1)*bs] )

    sequence A  [t0..t15][t16..t31][t32..t40·····]      full blocks 0, 1 registered under k0, k1
    sequence B  [t0..t15][t16..t31][u32..         ]     B's lookup walks k0, k1: both hit, B shares A's
                    ▲ ref 2    ▲ ref 2                  blocks (ref count 2) and computes from t32 on

A block whose key is registered here is *cached*: while sequences hold it
(ref > 0) it is theirs; once the last one lets go (ref 0) it stays indexed
and joins the LRU list of evictable blocks, reclaimed (least recently used
first) only when a fresh block is needed and none is plainly free. A
128-bit digest makes a false hit as likely as a hardware fault; the key
covers the whole prefix, so a hit means the block's KV is exactly what a
fresh computation would write. ``salt`` isolates tenants (``cache_salt``):
sequences with different salts never share.

No torch here: the allocator (kv_cache.py) owns the ids, this owns the index.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence

import numpy as np

ROOT = b""  # the parent key of block 0


def block_key(parent: bytes, tokens: Sequence[int], salt: str = "") -> bytes:
    """The cache key of a full block of ``tokens`` after the block keyed ``parent`` (ROOT for block 0)."""
    h = hashlib.blake2b(parent, digest_size=16)
    if parent == ROOT and salt:
        h.update(b"salt:" + salt.encode())
    h.update(np.asarray(tokens, dtype=np.int64).tobytes())
    return h.digest()


def chain_keys(token_ids: Sequence[int], block_size: int, start: int, stop: int, parent: bytes, salt: str = "") -> list[bytes]:
    """Keys of full blocks ``start .. stop-1`` of ``token_ids``, block ``start``'s parent keyed ``parent``."""
    keys = []
    for i in range(start, stop):
        parent = block_key(parent, token_ids[i * block_size : (i + 1) * block_size], salt)
        keys.append(parent)
    return keys


class PrefixIndex:
    """key <-> block id for cached blocks, and the LRU order of the evictable ones (ref count 0)."""

    def __init__(self) -> None:
        self.by_key: dict[bytes, int] = {}
        self.key_of: dict[int, bytes] = {}
        self.evictable: OrderedDict[int, None] = OrderedDict()  # oldest first
        self.hits = 0  # tokens served from the cache, all time
        self.queries = 0  # prompt tokens looked up, all time
        self.evictions = 0

    def __contains__(self, block_id: int) -> bool:
        return block_id in self.key_of

    def lookup(self, key: bytes) -> int | None:
        return self.by_key.get(key)

    def register(self, block_id: int, key: bytes) -> bool:
        """Index ``block_id`` under ``key``; False (nothing changed) when the key or the block is indexed already."""
        if key in self.by_key or block_id in self.key_of:
            return False
        self.by_key[key] = block_id
        self.key_of[block_id] = key
        return True

    def forget(self, block_id: int) -> None:
        """Drop a block from the index (it is about to be written, or reclaimed)."""
        key = self.key_of.pop(block_id, None)
        if key is not None:
            del self.by_key[key]
        self.evictable.pop(block_id, None)

    def park(self, block_id: int) -> None:
        """Its last holder let go: evictable, most recently used."""
        self.evictable[block_id] = None

    def unpark(self, block_id: int) -> None:
        self.evictable.pop(block_id, None)

    def evict_oldest(self) -> int:
        block_id, _ = self.evictable.popitem(last=False)
        key = self.key_of.pop(block_id)
        del self.by_key[key]
        self.evictions += 1
        return block_id

    @property
    def hit_rate(self) -> float:
        return self.hits / self.queries if self.queries else 0.0
