"""Greedy EAGLE-3 chains with one host read: the head's k forwards in one body, each fed its parent's output.

The token draft's static chain (draft_chain_step.py) with the head's inputs and outputs
(static_inputs.py)::

    forward 0    the fed committed positions with their input rows -> the root's output h_0
    forward i    d_i at n + i - 1 with feature h_{i-1}, the head's output at its parent -> h_i
    each         logits over the draft vocabulary (norm, lm_head), argmax column, its target token id
"""

from __future__ import annotations

import torch

from shared.engine.draft_chain_step import DraftChainStep
from shared.engine.eagle.static_inputs import EagleInputs, supported  # noqa: F401 - the feature draft's check
from shared.engine.sampled_chain_step import SampledDraftChain


class EagleChainStep(EagleInputs, DraftChainStep):
    what = "EAGLE draft chain"

    def body(self, flat: torch.Tensor, shape) -> torch.Tensor:
        """The captured region: staged chain [size] (+ the fed rows' features) -> the outcome (``_outcome``)."""
        chain = shape.chain if hasattr(shape, "chain") else shape  # a sampled chain's shape wraps the chain's
        first, k, batch = chain.first, chain.length, chain.batch
        self._room(first.rows, batch, k)  # eager steps only (a bucket's sizes fit the buffers from the start)
        seg = {name: flat[a : a + n].view(dims) for name, (a, n, dims) in first.offsets().items()}
        tail = flat[first.size : chain.size].view(2, k - 1, batch)  # [2, k - 1, B] positions, slots
        ctx = self._context(flat, shape)
        self.attn.prepare(seg, first.kv_cap)
        h = self._head(seg["ids"], self.feats[: first.rows], seg["pos"])[seg["root_row"]]  # [B, H] h_0, the root's
        picks, outs = [self._choose_head(h, 0, ctx)], [h]
        step_seg = self._step_segments(seg["table"])
        for i in range(k - 1):
            pos = self._prepare_step(step_seg, tail, i, first.kv_cap)  # [B]
            h = self._head(picks[-1][0], h, pos)  # [B, H]: d_i fed its parent's output
            picks.append(self._choose_head(h, i + 1, ctx))
            outs.append(h)
        self._keep_outputs(torch.stack(outs, 1))  # [B, k, H]
        return self._outcome(picks)

    def _choose_head(self, h: torch.Tensor, i: int, ctx) -> tuple[torch.Tensor, ...]:
        """The head's output h [B, H] -> (target token id [B], draft probability [B])."""
        token, prob = self._pick(self._head_probs(h))
        return self._ids(token), prob


class EagleSampledChain(EagleChainStep, SampledDraftChain):
    """Sampled EAGLE-3 chains: the head's body, each forward's draw as sampled_chain_step.py's, over the draft
    vocabulary, the q's columns mapped to target ids."""

    what = "sampled EAGLE draft chain"

    def _choose_head(self, h: torch.Tensor, i: int, ctx) -> tuple[torch.Tensor, ...]:
        token, prob, ids, mass = self._choose_logits(self._head_logits(h), i, ctx)
        return self._ids(token), prob, self._ids(ids), mass
