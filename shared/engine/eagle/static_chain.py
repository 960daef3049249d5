"""Greedy EAGLE-3 chains with one host read: the head's k forwards in one body, each fed its parent's output.

The token draft's static chain (draft_chain_step.py) with the head's two extra inputs::

    forward 0    the fed committed positions, each with its input row (fc of the target's features, or the
                 head's own output along an optimistic commit: _FeatureState.fused) -> the root's output h_0
    forward i    d_i at n + i - 1 with feature h_{i-1}, the head's output at its parent -> h_i
    each         logits over the draft vocabulary (norm, lm_head), argmax column, its target token id

The fed rows are gathered on the device into a persistent input buffer before the body
(the body reads a fixed address, so a CUDA graph replays it), and the body leaves
h_0 .. h_{k-1} in a persistent output buffer; after the one read they become each
sequence's tree outputs (rows 0 .. k-1, root then nodes), which a commit along the
accepted path turns into provisional input rows, as after the eager chain.
"""

from __future__ import annotations

import torch

from shared.engine import graph_buckets
from shared.engine.chain_plan import MAX_GRAPH_CHAIN, ChainShape
from shared.engine.draft_chain_step import DraftChainStep
from shared.engine.sequence import Sequence
from shared.engine.step_plan import SeqStep


def supported(runner) -> bool:
    """An EAGLE head takes the static chain on CUDA, or in float32 on CPU (as static_step.supported)."""
    return runner.device.type == "cuda" or runner.dtype == torch.float32


class EagleChainStep(DraftChainStep):
    what = "EAGLE draft chain"

    def __init__(self, runner, graphs=None):
        super().__init__(runner, graphs)
        head = runner.head
        hidden = head.cfg.hidden_size
        # the target token id of each draft-vocabulary column; None: the identity
        self.vocab_ids = None if runner.logit_ids is None else runner.logit_ids.to(runner.device)  # [draft_vocab]
        graphed = graphs is not None
        rows = graph_buckets.MAX_TOKENS if graphed else 1
        self.feats = torch.zeros(rows, hidden, dtype=runner.dtype, device=runner.device)  # [T, H] fed rows' input
        self.outs = torch.zeros(graph_buckets.MAX_BATCH if graphed else 1, MAX_GRAPH_CHAIN if graphed else 1, hidden,
                                dtype=runner.dtype, device=runner.device)  # fmt: skip  [B, k, H] h_0 .. h_{k-1}

    def _check(self, seqs: list[Sequence]) -> None:
        for seq in seqs:
            n = len(seq.token_ids)
            self.runner.check_fed_rows(seq, min(seq.num_cached, n - 1), n - 1)

    def _inputs(self, seqs: list[Sequence], steps: list[SeqStep]) -> None:
        state = self.runner.state
        rows = torch.cat([state[s.seq_id].fused[st.num_cached : len(s.token_ids)] for s, st in zip(seqs, steps)])
        self._room(rows.shape[0], len(seqs), 1)
        self.feats[: rows.shape[0]].copy_(rows)  # [T, H]

    def _room(self, rows: int, batch: int, k: int) -> None:
        """Grow the persistent buffers, keeping what they hold, past what a step needs (graphs that read the old
        ones are dropped; on CUDA they start at the largest bucket's size, so a graphed step never grows them)."""
        feats, outs = self.feats, self.outs
        if rows > feats.shape[0]:
            self.feats = feats.new_zeros(rows, feats.shape[1])
            self.feats[: feats.shape[0]] = feats
        if batch > outs.shape[0] or k > outs.shape[1]:
            self.outs = outs.new_zeros(max(batch, outs.shape[0]), max(k, outs.shape[1]), outs.shape[2])
        if (self.feats is not feats or self.outs is not outs) and self.graphs is not None:
            self.graphs.forget(type(self).__name__)

    def body(self, flat: torch.Tensor, shape: ChainShape) -> torch.Tensor:
        """The captured region: staged chain [size] (+ the fed rows' features) -> [B, 2k] float64."""
        first, k, batch = shape.first, shape.length, shape.batch
        self._room(first.rows, batch, k)  # eager steps only (a bucket's sizes fit the buffers from the start)
        seg = {name: flat[a : a + n].view(dims) for name, (a, n, dims) in first.offsets().items()}
        tail = flat[first.size :].view(2, k - 1, batch)  # [2, k - 1, B] positions, slots
        self.attn.prepare(seg, first.kv_cap)
        out = self._head(seg["ids"], self.feats[: first.rows], seg["pos"])  # [T, H]
        h = out[seg["root_row"]]  # [B, H] h_0, the root's output
        token, prob = self._pick(self._probs(self.runner.head.norm(h)))
        if self.vocab_ids is not None:
            token = self.vocab_ids[token]  # [B] the target's token ids
        tokens, probs, outs = [token], [prob], [h]
        step_seg = self._step_segments(seg["table"])
        for i in range(k - 1):
            pos = self._prepare_step(step_seg, tail, i, first.kv_cap)  # [B]
            h = self._head(token, h, pos)  # [B, H]: d_i fed its parent's output
            token, prob = self._pick(self._probs(self.runner.head.norm(h)))
            if self.vocab_ids is not None:
                token = self.vocab_ids[token]
            tokens.append(token)
            probs.append(prob)
            outs.append(h)
        self.outs[:batch, :k] = torch.stack(outs, 1)  # [B, k, H]
        return torch.cat([torch.stack(tokens, 1).double(), torch.stack(probs, 1).double()], 1)  # [B, 2k]

    def _head(self, ids: torch.Tensor, feats: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """ids, pos [T], feats [T, H] -> the head's pre-norm outputs [T, H] on the prepared attention."""
        return self.runner.head(ids[None], feats[None], pos[None], backend=self.attn)[0]

    def _outputs(self, seqs: list[Sequence], shape: ChainShape) -> None:
        """h_0 .. h_{k-1} become each sequence's tree outputs (row 0 the root, row j + 1 node j)."""
        state, k = self.runner.state, shape.length
        for b, seq in enumerate(seqs):
            state[seq.seq_id].set_out(0, self.outs[b, :k])
            state[seq.seq_id].num_out = k
