"""Greedy draft chains with one host read: k draft forwards in one body, the next token chosen on the device.

    host                                             device (the body: a CUDA graph replays it)
    grow block tables, chain_plan.build (numpy) ──copy──▶ staged chain
                                                     forward 0: fed committed tokens -> root logits
                                                       d_1 = argmax, q_1 = softmax(.)[d_1]
                                                     forward i: d_i at n + i - 1 -> d_{i+1}, q_{i+1}
    outcome.tolist()  ◀──────── one read ───────────  [B, 2k] tokens, then their draft probabilities
    the sequences' trees: d_1 .. d_{k-1} (their KV is in place), num_cached = n

The eager chain (drafting.ChainDrafter through ModelRunner.forward) runs the same k
forwards with a host read of every drafted token and host-built masks per forward;
this path is taken when every drafter of a call is a greedy chain of one length on a
plain draft model with nothing to process (no grammar, no reduced vocabulary), and it
drafts the same tokens with the same probabilities. A confidence threshold
(SmartSpec App. A) is applied to the drafted chain afterwards: it cuts after the
first token whose probability is at or below it, which is what the eager chain
stops at (a stopping rule on d_1..d_i); the KV of the later tokens stays as tree
nodes that a commit reuses only when the target's tokens spell them.

On CPU the body runs eagerly inside ``graph_body()``; on CUDA ``cuda_graphs.GraphPool``
captures it per bucket (batch and fed rows as a verify step's, chain length exact).
"""

from __future__ import annotations

import numpy as np
import torch

from shared.engine import chain_plan, step_plan
from shared.engine.chain_plan import ChainShape
from shared.engine.sequence import Sequence
from shared.engine.static_draft import StaticDraft
from shared.engine.types import ForwardCost, TokenTree


class DraftChainStep(StaticDraft):
    what = "draft chain"

    # the graph pool's view of a step kind (cuda_graphs.GraphPool)
    def bucket(self, shape: ChainShape) -> ChainShape | None:
        return chain_plan.bucket_for(shape, self.runner.cache.block_size, self.runner.max_context)

    def build(self, steps: list[step_plan.SeqStep], shape: ChainShape, scratch_block: int = 0) -> np.ndarray:
        return chain_plan.build(steps, shape, self.runner.cache.block_size, scratch_block)

    @torch.inference_mode()  # the trees' ancestor bits may be inference tensors (made in an eager forward)
    def run(self, seqs: list[Sequence], length: int, thresholds: list[float]) -> tuple[list[TokenTree], list[ForwardCost]]:
        """Draft a chain of ``length`` for every sequence (``applies`` was checked); trees and k forward costs."""
        bs = self.runner.cache.block_size
        rows, shape, seconds = self._run(seqs, length - 1, lambda steps: chain_plan.shape_of(steps, length, bs))
        trees = [self._finish(s, row, length, t) for s, row, t in zip(seqs, rows, thresholds)]
        return trees, self.costs(seconds, length, len(seqs), shape.first.rows, [len(seqs)] * (length - 1))

    def body(self, flat: torch.Tensor, shape) -> torch.Tensor:
        """The captured region: staged chain [size] -> [B, 2k] float64 (k tokens, then their probabilities)."""
        chain = shape.chain if hasattr(shape, "chain") else shape  # a sampled chain's shape wraps the chain's
        first, k, batch = chain.first, chain.length, chain.batch
        seg = {name: flat[a : a + n].view(dims) for name, (a, n, dims) in first.offsets().items()}
        tail = flat[first.size : chain.size].view(2, k - 1, batch)  # [2, k - 1, B] positions, slots
        ctx = self._context(flat, shape)
        self.attn.prepare(seg, first.kv_cap)
        picks = [self._choose(self._decode(seg["ids"], seg["pos"])[seg["root_row"]], 0, ctx)]  # (token [B], ...)
        step_seg = self._step_segments(seg["table"])
        for i in range(k - 1):
            pos = self._prepare_step(step_seg, tail, i, first.kv_cap)  # [B]
            picks.append(self._choose(self._decode(picks[-1][0], pos), i + 1, ctx))
        return self._outcome(picks)

    # what a chain picks per forward (sampled_chain_step.py samples)
    def _context(self, flat: torch.Tensor, shape) -> object:
        """The body's per-call inputs beyond the plan (none for greedy chains)."""
        return None

    def _choose(self, hidden: torch.Tensor, i: int, ctx) -> tuple[torch.Tensor, ...]:
        """hidden [B, H] of forward i -> (token [B], its draft probability [B])."""
        return self._pick(self._probs(hidden))

    def _outcome(self, picks: list[tuple[torch.Tensor, ...]]) -> torch.Tensor:
        """[B, 2k] float64: the k tokens, then their probabilities."""
        return torch.cat([torch.stack([p[0] for p in picks], 1).double(), torch.stack([p[1] for p in picks], 1).double()], 1)

    @staticmethod
    def _step_segments(table: torch.Tensor) -> dict[str, torch.Tensor]:
        """The attention segments forwards 1..k-1 share: the block tables [B, NB], one row per sequence."""
        batch = table.shape[0]
        rows = torch.arange(batch, device=table.device)  # [B] forward i's packed row of sequence b
        tree = torch.zeros(batch, 1, 1, dtype=torch.long, device=table.device)  # [B, 1, 1] no tree nodes
        return {"table": table, "tree": tree, "q_index": rows[:, None], "unpad": rows}

    def _prepare_step(self, step_seg: dict, tail: torch.Tensor, i: int, kv_cap: int) -> torch.Tensor:
        """Forward i + 1's attention from its staged positions and slots (tail [2, k - 1, B]); its positions [B]."""
        pos = tail[0, i]  # [B] n + i
        step_seg.update(prefix=pos[:, None] + 1, ncommit=pos + 1, kvlen=pos + 1, new_slots=tail[1, i])
        self.attn.prepare(step_seg, kv_cap)
        return pos

    @staticmethod
    def _pick(probs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """probs [B, vocab] -> the greedy token [B] and its draft probability [B] (ChainDrafter.absorb)."""
        token = probs.argmax(-1)  # [B]
        return token, probs.gather(1, token[:, None])[:, 0]

    @staticmethod
    def _finish(seq: Sequence, row: list[float], length: int, threshold: float) -> TokenTree:
        """d_1 .. d_{k-1} into the sequence's tree (their KV is in place); its drafted chain."""
        tokens = [int(t) for t in row[:length]]
        probs = row[length:]
        seq.tree.add_nodes(tokens[:-1], list(range(-1, length - 2)))
        if threshold > 0:  # Algorithm 3 line 8: the first token at or below T is kept, then drafting stops
            cut = next((j + 1 for j, p in enumerate(probs) if p <= threshold), length)
            tokens, probs = tokens[:cut], probs[:cut]
        return TokenTree(tokens, list(range(-1, len(tokens) - 1)), list(probs))
