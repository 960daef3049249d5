"""The host half of a static verify step: every index the device needs, in one int64 staging array.

A greedy verify step (each sequence: the fed committed token(s), then a tree of
draft nodes) is described by a handful of small integer arrays. They are built
with numpy from the sequences' own lists -- no torch op, no per-token Python
call, nothing that grows with the context except the block table (one entry per
KV block) -- and laid out back to back in one ``int64`` array, so one
non-blocking copy moves the whole step to the device (``StaticStep``)::

    segment    shape        what
    ids        [T]          token of each packed row (fed tokens, then nodes, sequence by sequence)
    pos        [T]          its position id (fed: its index; node j: n + depth(j))
    new_slots  [T]          physical KV slot its k/v is written to
    unpad      [T]          flat [B * Q] index of each packed row in the padded batch
    q_index    [B, Q]       packed row of (sequence b, its q-th row); padding -> row 0
    prefix     [B, Q]       KV positions 0 .. prefix-1 the row sees in full (fed row at p: p + 1; node: n)
    tree       [B, Q, M]    1 where a node row sees node i (ancestor-or-self), at KV position n + i
    ncommit    [B]          n: committed tokens
    kvlen      [B]          n + nodes: KV positions in use
    table      [B, NB]      block table (0-padded)
    root_row   [B]          packed row of the last fed token (its logits predict the tree's first level)
    node_row   [B, M]       packed row of node j (padding -> the root row)
    tokens     [B, M]       node tokens (padding 0)
    parents    [B, M]       node parents, -1 the root (padding -1)
    anc        [B, M, M]    ancestor-or-self bits of the nodes (padding: its own bit)
    valid      [B, M]       1 for real nodes

T: packed rows, B: sequences, Q: most rows of one sequence, M: most nodes (>= 1), NB: most blocks.
A CUDA graph's bucket fixes (B, T, Q, M, NB, kv_cap); eager runs use the step's own sizes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

SEGMENTS = ("ids", "pos", "new_slots", "unpad", "q_index", "prefix", "tree", "ncommit", "kvlen", "table",
            "root_row", "node_row", "tokens", "parents", "anc", "valid")  # fmt: skip


@dataclass(frozen=True)
class StepShape:
    """The sizes that fix every segment's shape (a CUDA graph bucket, or one eager step's own)."""

    batch: int  # B
    rows: int  # T
    q: int  # Q
    nodes: int  # M (>= 1)
    blocks: int  # NB
    kv_cap: int  # KV positions the attention gathers per sequence (>= every kvlen)
    chains: bool  # every tree is a chain: the accepted path's KV is already in place (no move)

    def shapes(self) -> dict[str, tuple[int, ...]]:
        b, t, q, m = self.batch, self.rows, self.q, self.nodes
        return {
            "ids": (t,), "pos": (t,), "new_slots": (t,), "unpad": (t,),
            "q_index": (b, q), "prefix": (b, q), "tree": (b, q, m),
            "ncommit": (b,), "kvlen": (b,), "table": (b, self.blocks),
            "root_row": (b,), "node_row": (b, m), "tokens": (b, m), "parents": (b, m),
            "anc": (b, m, m), "valid": (b, m),
        }  # fmt: skip

    def offsets(self) -> dict[str, tuple[int, int, tuple[int, ...]]]:
        """(start, size, shape) of every segment in the flat staging array."""
        return _offsets(self.batch, self.rows, self.q, self.nodes, self.blocks)

    @property
    def size(self) -> int:
        start, size, _ = self.offsets()["valid"]
        return start + size


class AfterFirstForward:
    """A step of several forwards (a static draft: chain_plan.ChainShape, draft_tree_step.TreeShape) seen by
    the graph pool as its first forward's batch, rows per sequence and context."""

    first: StepShape

    @property
    def batch(self) -> int:
        return self.first.batch

    @property
    def q(self) -> int:
        return self.first.q

    @property
    def kv_cap(self) -> int:
        return self.first.kv_cap


@lru_cache(maxsize=1024)
def _offsets(batch: int, rows: int, q: int, nodes: int, blocks: int) -> dict[str, tuple[int, int, tuple[int, ...]]]:
    shape = StepShape(batch=batch, rows=rows, q=q, nodes=nodes, blocks=blocks, kv_cap=0, chains=True)
    out, start = {}, 0
    for name, dims in shape.shapes().items():
        size = math.prod(dims)
        out[name] = (start, size, dims)
        start += size
    return out


@dataclass
class SeqStep:
    """One sequence's share of a verify step, as the host knows it."""

    token_ids: list[int]  # committed tokens
    num_cached: int  # committed tokens already in the KV cache (< len(token_ids): at least one is fed)
    block_ids: list[int]  # block table, already grown to hold n + nodes positions
    tokens: list[int]  # tree node tokens
    parents: list[int]  # tree node parents (-1 the root)


def ancestors(parents: list[int]) -> tuple[np.ndarray, list[int]]:
    """anc [M, M] uint8 (anc[j, i] = 1 iff i is j or an ancestor of j) and each node's depth."""
    m = len(parents)
    anc = np.zeros((m, m), dtype=np.uint8)
    depth: list[int] = []
    for j, p in enumerate(parents):
        if p >= 0:
            anc[j] = anc[p]
            depth.append(depth[p] + 1)
        else:
            depth.append(0)
        anc[j, j] = 1
    return anc, depth


def shape_of(steps: list[SeqStep], block_size: int, chains: bool) -> StepShape:
    """The exact sizes of a step (an eager run's shape)."""
    rows = q = kv = 0
    nodes = blocks = 1
    for s in steps:  # one plain loop: no per-sequence Python calls
        k = len(s.tokens)
        q_len = len(s.token_ids) - s.num_cached + k
        rows += q_len
        q = max(q, q_len)
        kv = max(kv, len(s.token_ids) + k)
        nodes = max(nodes, k)
        blocks = max(blocks, len(s.block_ids))
    blocks = 1 << (blocks - 1).bit_length()  # a power of two: the segment layout repeats from step to step
    return StepShape(batch=len(steps), rows=rows, q=q, nodes=nodes, blocks=blocks, kv_cap=kv, chains=chains)


def build(steps: list[SeqStep], shape: StepShape, block_size: int, scratch_block: int = 0) -> np.ndarray:
    """Fill the flat ``int64`` staging array for ``steps`` laid out as ``shape`` (which may be larger: a bucket).

    Bucket padding touches only ``scratch_block`` (a KV block no sequence owns, cuda_graphs.py): rows past the
    step's own write their k/v to its first slot; sequences past the step's own (one committed token, no nodes)
    have it as their block table, so their reads and their no-op path move stay inside it.
    """
    scratch_slot = scratch_block * block_size
    flat = np.zeros(shape.size, dtype=np.int64)
    seg = {name: flat[a : a + n].reshape(dims) for name, (a, n, dims) in shape.offsets().items()}
    seg["new_slots"][:] = scratch_slot
    seg["prefix"][:] = 1  # padded rows see KV position 0 only (softmax stays finite)
    seg["parents"][:] = -1
    m = shape.nodes
    eye = np.eye(m, dtype=np.int64)
    seg["anc"][:] = eye  # padded nodes: their own bit
    q_max = shape.q
    row = 0
    for b, s in enumerate(steps):
        n = len(s.token_ids)
        fed = n - s.num_cached
        k = len(s.tokens)
        q_len = fed + k
        table = np.asarray(s.block_ids, dtype=np.int64)  # [num_blocks]
        rows = slice(row, row + q_len)
        logical = np.arange(s.num_cached, n + k, dtype=np.int64)  # [q_len] KV positions written (fed, then nodes)
        seg["ids"][rows] = s.token_ids[s.num_cached :] + s.tokens
        seg["pos"][rows] = logical
        seg["new_slots"][rows] = table[logical // block_size] * block_size + logical % block_size
        fed_pos = logical[:fed]  # [fed]
        seg["unpad"][rows] = b * q_max + np.arange(q_len)
        seg["q_index"][b, :q_len] = np.arange(row, row + q_len)
        seg["prefix"][b, :fed] = fed_pos + 1
        seg["prefix"][b, fed:q_len] = n
        if k:
            anc, depth = ancestors(s.parents)  # [k, k]
            seg["pos"][row + fed : row + q_len] = depth
            seg["pos"][row + fed : row + q_len] += n
            seg["tree"][b, fed:q_len, :k] = anc
            seg["node_row"][b, :k] = np.arange(row + fed, row + q_len)
            seg["node_row"][b, k:] = row + fed - 1
            seg["tokens"][b, :k] = s.tokens
            seg["parents"][b, :k] = s.parents
            seg["anc"][b, :k, :k] = anc
            seg["valid"][b, :k] = 1
        else:
            seg["node_row"][b, :] = row + fed - 1
        seg["ncommit"][b] = n
        seg["kvlen"][b] = n + k
        seg["table"][b, : len(table)] = table
        seg["root_row"][b] = row + fed - 1
        row += q_len
    # bucket padding: rows past the step's own read cell 0 of the padded batch (their output is never used)
    for b in range(len(steps), shape.batch):
        seg["root_row"][b] = 0
        seg["node_row"][b, :] = 0
        seg["ncommit"][b] = 1
        seg["kvlen"][b] = 1
        seg["table"][b, :] = scratch_block
    return flat
