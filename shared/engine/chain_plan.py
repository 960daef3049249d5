"""The host half of a static draft chain: k draft forwards staged in one ``int64`` array.

A greedy chain of k tokens is k forwards of the draft model: the first feeds each
sequence's committed tokens not yet in its KV and reads the root's logits (d_1);
forward i (1 <= i < k) feeds d_i, one row per sequence, at position n + i - 1, and
reads d_{i+1}. Every index those forwards need is known before the first runs
except the fed token ids of forwards 1..k-1, which the body takes from the previous
forward's argmax on the device. So the whole chain is staged at once::

    segment     shape            what
    first       StepShape        step_plan.build of forward 0 (the fed committed tokens, no tree nodes)
    pos         [k - 1, B]       position of sequence b's row in forward i (n_b + i - 1)
    slots       [k - 1, B]       the physical KV slot that row writes

The table, the prefix lengths and the rest of forward i's attention segments follow
from ``pos`` on the device (draft_chain_step.py). Building it is numpy over the batch,
nothing per token and nothing that grows with the context but the block tables.
Sequences past the step's own (a CUDA graph bucket's padding) write ``scratch_block``
and read its first slot, as in ``step_plan.build``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from shared.engine import graph_buckets, step_plan
from shared.engine.step_plan import AfterFirstForward, SeqStep, StepShape

MAX_GRAPH_CHAIN = 16  # longest chain a CUDA graph is captured for (longer chains run the same body eagerly)


@dataclass(frozen=True)
class ChainShape(AfterFirstForward):
    """The sizes that fix a chain's staging layout: forward 0's shape and the chain's length."""

    first: StepShape  # forward 0 (fed committed tokens); its kv_cap covers the chain's last forward
    length: int  # k >= 1: tokens drafted per sequence

    @property
    def size(self) -> int:
        return self.first.size + 2 * (self.length - 1) * self.first.batch

    @property
    def chains(self) -> bool:
        return True


def shape_of(steps: list[SeqStep], length: int, block_size: int) -> ChainShape:
    """A chain's exact sizes (an eager run's shape): forward 0's, with kv_cap reaching its last forward."""
    first = step_plan.shape_of(steps, block_size, chains=True)
    kv = max(len(s.token_ids) for s in steps) + length - 1
    return ChainShape(first=StepShape(first.batch, first.rows, first.q, first.nodes, first.blocks, kv, True), length=length)


def bucket_for(shape: ChainShape, block_size: int, max_context: int) -> ChainShape | None:
    """The CUDA graph bucket that serves ``shape`` (forward 0 rounded as a verify step), or None: run eagerly."""
    if shape.length > MAX_GRAPH_CHAIN:
        return None
    first = graph_buckets.bucket_for(shape.first, block_size, max_context)
    if first is None:
        return None
    return ChainShape(first=first, length=shape.length)


def build(steps: list[SeqStep], shape: ChainShape, block_size: int, scratch_block: int = 0) -> np.ndarray:
    """Fill the flat staging array of a chain laid out as ``shape`` (which may be a larger bucket).

    Each step's block table must already hold its n + k - 1 positions (``DraftChainStep`` grows them)."""
    flat = np.empty(shape.size, dtype=np.int64)
    first = shape.first
    flat[: first.size] = step_plan.build(steps, first, block_size, scratch_block)
    k, batch = shape.length, first.batch
    if k == 1:
        return flat
    tail = flat[first.size :].reshape(2, k - 1, batch)  # [2, k - 1, B]: positions, then slots
    pos, slots = tail[0], tail[1]
    pos[:] = 0
    slots[:] = scratch_block * block_size  # padded sequences: scratch block, position 0
    real = len(steps)
    if real:
        n = np.fromiter((len(s.token_ids) for s in steps), dtype=np.int64, count=real)  # [b] committed tokens
        logical = n[None, :] + np.arange(k - 1, dtype=np.int64)[:, None]  # [k - 1, b] position of d_1 .. d_{k-1}
        table = step_plan_table(steps, first.blocks)  # [b, NB]
        column = logical // block_size  # [k - 1, b]
        pos[:, :real] = logical
        slots[:, :real] = table[np.arange(real)[None, :], column] * block_size + logical % block_size
    return flat


def step_plan_table(steps: list[SeqStep], blocks: int) -> np.ndarray:
    """The batch's block tables as one [b, blocks] array (0-padded)."""
    table = np.zeros((len(steps), blocks), dtype=np.int64)
    for b, s in enumerate(steps):
        table[b, : len(s.block_ids)] = s.block_ids
    return table
