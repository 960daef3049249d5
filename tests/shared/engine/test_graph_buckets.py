"""Bucket choice and bucket padding for CUDA graphs (pure; the graphs themselves need a GPU)."""

from __future__ import annotations

import numpy as np

from shared.engine import graph_buckets, step_plan
from shared.engine.step_plan import SeqStep, StepShape


def shape(batch, q, nodes=None, kv=100, chains=True):
    return StepShape(batch=batch, rows=batch * q, q=q, nodes=nodes or max(1, q - 1), blocks=8, kv_cap=kv, chains=chains)


def test_buckets_round_up():
    assert [graph_buckets.batch_bucket(b) for b in (1, 3, 5, 17, 33, 64, 65, 200, 257)] == [1, 4, 8, 24, 48, 64, 96, 224, None]
    b = graph_buckets.bucket_for(shape(3, 5, kv=300), block_size=16, max_context=4096)
    assert (b.batch, b.q, b.nodes, b.rows, b.kv_cap, b.blocks) == (4, 5, 5, 20, 512, 32)
    assert graph_buckets.bucket_for(shape(1, 17), 16, 4096) is None  # Q past 16
    assert graph_buckets.bucket_for(shape(256, 16), 16, 4096) is None  # B x Q past MAX_TOKENS
    assert graph_buckets.bucket_for(shape(1, 2, kv=5000), 16, 4096) is None  # past the context window


def test_padding_touches_only_the_scratch_block():
    steps = [SeqStep(token_ids=[5, 6, 7], num_cached=2, block_ids=[3, 6], tokens=[8, 9], parents=[-1, 0])]
    exact = step_plan.shape_of(steps, block_size=4, chains=True)
    bucket = graph_buckets.bucket_for(exact, block_size=4, max_context=64)
    flat = step_plan.build(steps, bucket, block_size=4, scratch_block=7)
    seg = {k: flat[a : a + n].reshape(d) for k, (a, n, d) in bucket.offsets().items()}
    assert seg["ids"][:3].tolist() == [7, 8, 9] and seg["pos"][:3].tolist() == [2, 3, 4]
    assert seg["new_slots"][:3].tolist() == [3 * 4 + 2, 3 * 4 + 3, 6 * 4 + 0]
    assert (seg["new_slots"][3:] == 7 * 4).all()  # dummy rows write the scratch block only
    assert seg["root_row"][0] == 0 and seg["node_row"][0, :2].tolist() == [1, 2]
    assert seg["prefix"][0, :3].tolist() == [3, 3, 3]  # the fed row at position 2 sees 0..2; nodes see n = 3
    assert seg["tree"][0, 1:3, :2].tolist() == [[1, 0], [1, 1]]
    assert np.asarray(seg["valid"][0]).tolist()[:3] == [1, 1, 0]
