"""Greedy EAGLE-3 chains with one host read: the head's k forwards in one body, each fed its parent's output.

The token draft's static chain (draft_chain_step.py) with the head's inputs and outputs
(static_inputs.py)::

    forward 0    the fed committed positions with their input rows -> the root's output h_0
    forward i    d_i at n + i - 1 with feature h_{i-1}, the head's output at its parent -> h_i
    each         logits over the draft vocabulary (norm, lm_head), argmax column, its target token id
"""

from __future__ import annotations

import torch

from shared.engine.chain_plan import ChainShape
from shared.engine.draft_chain_step import DraftChainStep
from shared.engine.eagle.static_inputs import EagleInputs, supported  # noqa: F401 - the feature draft's check


class EagleChainStep(EagleInputs, DraftChainStep):
    what = "EAGLE draft chain"

    def body(self, flat: torch.Tensor, shape: ChainShape) -> torch.Tensor:
        """The captured region: staged chain [size] (+ the fed rows' features) -> [B, 2k] float64."""
        first, k, batch = shape.first, shape.length, shape.batch
        self._room(first.rows, batch, k)  # eager steps only (a bucket's sizes fit the buffers from the start)
        seg = {name: flat[a : a + n].view(dims) for name, (a, n, dims) in first.offsets().items()}
        tail = flat[first.size :].view(2, k - 1, batch)  # [2, k - 1, B] positions, slots
        self.attn.prepare(seg, first.kv_cap)
        h = self._head(seg["ids"], self.feats[: first.rows], seg["pos"])[seg["root_row"]]  # [B, H] h_0, the root's
        token, prob = self._pick(self._head_probs(h))
        token = self._ids(token)  # [B] the target's token ids
        tokens, probs, outs = [token], [prob], [h]
        step_seg = self._step_segments(seg["table"])
        for i in range(k - 1):
            pos = self._prepare_step(step_seg, tail, i, first.kv_cap)  # [B]
            h = self._head(token, h, pos)  # [B, H]: d_i fed its parent's output
            token, prob = self._pick(self._head_probs(h))
            token = self._ids(token)
            tokens.append(token)
            probs.append(prob)
            outs.append(h)
        self._keep_outputs(torch.stack(outs, 1))  # [B, k, H]
        return torch.cat([torch.stack(tokens, 1).double(), torch.stack(probs, 1).double()], 1)  # [B, 2k]
