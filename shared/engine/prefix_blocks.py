"""A sequence's side of prefix caching: attach cached blocks, register full ones, copy before a write.

    attach     before a forward: while the sequence's KV ends on a block boundary, look up its next full
               prompt blocks (never the one holding its last committed token, whose logits the step needs)
               and share every hit: the forward then feeds only the tokens after them
    register   after a forward or commit: every block now full of committed KV gets its chained key
    writable   before a write at position p: the block holding p, if it is cached, becomes private first,
               copied when another sequence holds it too (copy-on-write), else just dropped from the index

``Sequence.block_keys[i]`` is the key of block i for every full block below
``num_cached`` (the chain a later lookup continues); a sequence whose
``cache_salt`` is None neither looks up nor registers anything.

With target features kept beside the KV (block_features.py), a step that asks for features attaches only
featured blocks (up to the first one without rows), ``register`` marks each block it indexes featured when
all of its rows are stored (prefix_features.py), and a copy-on-write copies the rows too.
"""

from __future__ import annotations

import torch

from shared.engine.kv_cache import PagedKVCache
from shared.engine.prefix_cache import ROOT, block_key
from shared.engine.sequence import Sequence


def attach(cache: PagedKVCache, seq: Sequence, featured: bool = False) -> int:
    """Share the cached blocks that continue the sequence's KV; returns the tokens now served from the cache.

    ``featured``: the step returns features, so only blocks whose feature rows are stored are shared."""
    bs = cache.block_size
    first = seq.num_cached // bs
    if seq.cache_salt is None or seq.tree or seq.num_cached % bs or len(seq.block_ids) != first:
        return 0
    store = cache.features if featured else None
    if featured and store is None:
        return 0
    if len(seq.block_keys) != first or seq.num_committed - seq.num_cached <= 1:
        return 0
    index = cache.allocator.prefix
    last = (seq.num_committed - 1) // bs  # blocks entirely before the last committed token
    parent = seq.block_keys[-1] if seq.block_keys else ROOT
    i = first
    while i < last:
        key = block_key(parent, seq.token_ids[i * bs : (i + 1) * bs], seq.cache_salt)
        block_id = index.lookup(key)
        if block_id is None or (store is not None and not store.has(block_id)):
            break
        cache.allocator.share(block_id, seq.seq_id)
        seq.block_ids.append(block_id)
        seq.block_keys.append(key)
        parent, i = key, i + 1
    index.queries += seq.num_committed - seq.num_cached
    index.hits += (i - first) * bs
    seq.num_cached = i * bs
    return (i - first) * bs


def cached_tokens(cache: PagedKVCache, token_ids: list[int], salt: str | None) -> int:
    """Tokens of a new sequence's prompt the cache would serve now (a pure lookup: what ``attach`` would share)."""
    if salt is None:
        return 0
    bs = cache.block_size
    index = cache.allocator.prefix
    parent = ROOT
    last = (len(token_ids) - 1) // bs  # never the block holding the last token
    for i in range(last):
        parent = block_key(parent, token_ids[i * bs : (i + 1) * bs], salt)
        if index.lookup(parent) is None:
            return i * bs
    return last * bs


def detach(cache: PagedKVCache, seq: Sequence, num_blocks: int, num_cached: int) -> None:
    """Undo a failed forward's attach and growth: back to ``num_blocks`` blocks and ``num_cached`` tokens."""
    if len(seq.block_ids) > num_blocks:
        cache.allocator.free(seq.block_ids[num_blocks:])
        del seq.block_ids[num_blocks:]
    del seq.block_keys[num_cached // cache.block_size :]
    seq.num_cached = num_cached


def register(cache: PagedKVCache, seq: Sequence, limit: int | None = None) -> None:
    """Index every block that is now full of the sequence's committed, computed KV (below ``limit`` when
    given: positions past it hold KV no other sequence may reuse)."""
    if seq.cache_salt is None:
        return
    bs = cache.block_size
    end = min(seq.num_cached, seq.num_committed)
    full = (end if limit is None else min(end, limit)) // bs
    index = cache.allocator.prefix
    store = cache.features
    parent = seq.block_keys[-1] if seq.block_keys else ROOT
    for i in range(len(seq.block_keys), full):
        parent = block_key(parent, seq.token_ids[i * bs : (i + 1) * bs], seq.cache_salt)
        block_id = seq.block_ids[i]
        has_rows = (i + 1) * bs <= seq.feature_rows
        if index.register(block_id, parent):
            if store is not None:
                store.mark(block_id, has_rows)
        elif store is not None and has_rows and index.lookup(parent) not in (None, block_id):
            store.adopt(block_id, index.lookup(parent))  # an equal block is cached already: give it the rows
        # not registered: an equal block is cached already (this one stays private), or this one is, under a
        # key of KV it held before a rollback (a write makes it private first)
        seq.block_keys.append(parent)


def trim_keys(cache: PagedKVCache, seq: Sequence) -> None:
    """Keys only for full blocks below ``num_cached`` (after a rollback)."""
    del seq.block_keys[seq.num_cached // cache.block_size :]


def _written(cache: PagedKVCache, seq: Sequence, first_write: int, end: int | None) -> range:
    """Indices of the existing blocks a write of positions ``first_write .. end-1`` touches (end None: one)."""
    bs = cache.block_size
    last = first_write // bs + 1 if end is None else -(-end // bs)
    return range(first_write // bs, min(len(seq.block_ids), last))


def cow_blocks(cache: PagedKVCache, seq: Sequence, first_write: int, end: int | None = None) -> int:
    """Fresh blocks ``writable`` will need for a write of positions ``first_write .. end-1``."""
    allocator = cache.allocator
    return sum(
        1 for i in _written(cache, seq, first_write, end)
        if seq.block_ids[i] in allocator.prefix and allocator.ref(seq.block_ids[i]) > 1
    )  # fmt: skip


def writable(cache: PagedKVCache, seq: Sequence, first_write: int, end: int | None = None) -> None:
    """Make every block a write of positions ``first_write .. end-1`` touches the sequence's own."""
    bs = cache.block_size
    del seq.block_keys[first_write // bs :]
    allocator = cache.allocator
    for i in _written(cache, seq, first_write, end):
        block_id = seq.block_ids[i]
        if block_id not in allocator.prefix:
            continue
        if allocator.ref(block_id) == 1:
            allocator.make_private(block_id)
            continue
        # copy-on-write: a copy of the shared block; the original stays cached for its other holders
        new_id = allocator.allocate(1, seq.seq_id)[0]
        offsets = torch.arange(bs)
        cache.move((block_id * bs + offsets).to(cache.device), (new_id * bs + offsets).to(cache.device))
        if cache.features is not None:
            cache.features.copy_block(block_id, new_id)
        allocator.free([block_id])
        seq.block_ids[i] = new_id
