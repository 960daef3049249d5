"""Which CUDA graph serves a step: its shape rounded up to a bucket (pure; no torch).

A captured graph has fixed shapes, so each step is padded to the smallest bucket
that holds it (``step_plan.build`` pads with dummy rows and sequences that touch
only a scratch KV block)::

    batch B      1, 2, 4, 8, 16, 24, 32, 48, 64, then multiples of 32 up to MAX_BATCH
    rows/seq Q   1 .. 8, then 16 (a bonus token and up to 15 tree nodes)
    nodes M      Q (so a Q bucket holds every tree that fits it)
    rows T       B x Q
    kv_cap       the longest sequence rounded up to a multiple of KV_STEP
    chains       whether every tree is a chain (a chain's accepted KV needs no move)

A step that fits no bucket (B x Q past MAX_TOKENS, Q past 16, or a context past the
model's) runs eagerly.
"""

from __future__ import annotations

from shared.engine.step_plan import StepShape

BATCH_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64)
MAX_BATCH = 256
Q_BUCKETS = (1, 2, 3, 4, 5, 6, 7, 8, 16)
KV_STEP = 256
MAX_TOKENS = 2048


def batch_bucket(batch: int) -> int | None:
    for b in BATCH_BUCKETS:
        if batch <= b:
            return b
    if batch <= MAX_BATCH:
        return -(-batch // 32) * 32
    return None


def q_bucket(q: int) -> int | None:
    return next((b for b in Q_BUCKETS if q <= b), None)


def bucket_for(shape: StepShape, block_size: int, max_context: int) -> StepShape | None:
    """The bucket that serves ``shape`` (an exact step's sizes), or None: run it eagerly."""
    batch, q = batch_bucket(shape.batch), q_bucket(max(shape.q, shape.nodes))
    if batch is None or q is None or batch * q > MAX_TOKENS:
        return None
    kv_cap = -(-shape.kv_cap // KV_STEP) * KV_STEP
    if shape.kv_cap > max_context:
        return None
    return StepShape(
        batch=batch, rows=batch * q, q=q, nodes=q, blocks=-(-kv_cap // block_size), kv_cap=kv_cap, chains=shape.chains
    )
