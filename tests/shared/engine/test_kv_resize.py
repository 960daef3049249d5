"""The target's KV pool grows into an offloaded draft's space and shrinks back (Nightjar §5.1, elastic memory)."""

from __future__ import annotations

import pytest
import torch

from shared.engine.errors import KVBlocksInUseError, KVPoolSizeError, OutOfBlocksError
from shared.engine.kv_cache import BlockAllocator, PagedKVCache
from shared.engine.target_engine import TargetEngine
from shared.engine.types import PrefillItem, VerifyItem

from conftest import make_runner


def _cache(num_blocks: int) -> PagedKVCache:
    return PagedKVCache(num_layers=2, num_blocks=num_blocks, block_size=4, num_kv_heads=2, head_dim=8,
                        dtype=torch.float32, device="cpu")  # fmt: skip


def test_allocator_hands_out_lowest_ids_first():
    alloc = BlockAllocator(6)
    a = alloc.allocate(3, "a")
    b = alloc.allocate(2, "b")
    assert (a, b) == ([0, 1, 2], [3, 4])
    alloc.free([1])
    assert alloc.allocate(2, "c") == [1, 5]  # a freed low id before the top ones


def test_grow_keeps_every_block_and_its_contents():
    cache = _cache(4)
    held = cache.allocator.allocate(3, "seq")
    cache.kv.copy_(torch.randn_like(cache.kv))
    before = cache.kv.clone()
    pool_bytes = cache.resize(10)
    assert pool_bytes == cache.kv.numel() * cache.kv.element_size()
    assert cache.num_blocks == 10 and cache.num_free_blocks == 7
    assert cache.allocator.owners() == {b: "seq" for b in held}  # ids handed out stay valid ...
    assert torch.equal(cache.kv[:, :, : 4 * 4], before)  # ... and address the same entries
    assert cache.layer(0)[0].shape == (10, 4, 2, 8)  # the paged views follow
    assert cache.allocator.allocate(7, "more") == [3, 4, 5, 6, 7, 8, 9]
    with pytest.raises(OutOfBlocksError):
        cache.allocator.allocate(1, "one too many")


def test_shrink_needs_the_dropped_blocks_free():
    cache = _cache(4)
    cache.resize(8)
    low = cache.allocator.allocate(4, "low")
    high = cache.allocator.allocate(1, "high")  # block 4: one of the grown ones
    kv = cache.kv.clone()
    with pytest.raises(KVBlocksInUseError, match="owned by live sequences \\(high\\)"):
        cache.resize(4)
    assert cache.num_blocks == 8 and torch.equal(cache.kv, kv)  # refused: nothing changed
    cache.allocator.free(high)
    cache.resize(4)
    assert (cache.num_blocks, cache.num_free_blocks, cache.kv.shape[2]) == (4, 0, 16)
    assert torch.equal(cache.kv, kv[:, :, :16]) and cache.allocator.owners() == {b: "low" for b in low}
    cache.allocator.free(low)
    assert cache.num_free_blocks == 4 and sorted(cache.allocator.allocate(4, "x")) == [0, 1, 2, 3]


def test_resize_needs_a_live_pool():
    cache = _cache(4)
    with pytest.raises(ValueError):
        cache.resize(0)
    cache.release_memory()
    with pytest.raises(RuntimeError, match="released"):
        cache.resize(8)


def test_target_grows_mid_generation_and_output_is_unchanged(target_model, reference):
    """Sequences keep decoding across a grow and a shrink; a shrink is refused while a grown block is owned."""
    engine = TargetEngine(make_runner(target_model, num_blocks=6, kv_grow_blocks=10))
    runner = engine.runner
    assert (runner.base_blocks, runner.max_blocks) == (6, 16)
    prompts = {"a": [5, 9, 2, 7, 1], "b": [3, 3, 8]}
    outs = {r.seq_id: [r.first_token] for r in engine.prefill([PrefillItem(k, v) for k, v in prompts.items()])}

    def decode(ids: list[str], steps: int) -> None:
        for _ in range(steps):
            for k, res in zip(ids, engine.verify([VerifyItem(k) for k in ids])):
                outs[k] += res.tokens

    with pytest.raises(OutOfBlocksError):  # the start-up pool fills up (6 blocks of 4); the step changes nothing
        decode(["a", "b"], 10)
    engine.resize_kv(16)
    decode(["a", "b"], 12)  # beyond the start-up pool
    runner.check_accounting()
    with pytest.raises(KVBlocksInUseError):
        engine.resize_kv(6)
    assert runner.cache.num_blocks == 16
    for k, out in outs.items():
        assert out == reference.greedy(prompts[k], len(out)), k
    engine.release(["a", "b"])
    engine.resize_kv(6)
    assert (runner.cache.num_blocks, runner.cache.num_free_blocks) == (6, 6)
    runner.check_accounting()


@pytest.mark.parametrize("num_blocks", [0, 5, 17])
def test_target_refuses_sizes_outside_its_range(target_model, num_blocks):
    engine = TargetEngine(make_runner(target_model, num_blocks=6, kv_grow_blocks=10))
    with pytest.raises(KVPoolSizeError, match=r"outside \[6, 16\]"):
        engine.resize_kv(num_blocks)
    assert KVPoolSizeError.grpc_code == "OUT_OF_RANGE"
    assert engine.resize_kv(6) == engine.runner.cache.kv.numel() * 4  # its size now: a no-op
