"""What the EAGLE-3 head's static drafts (static_chain.py, static_tree.py) add to the token drafts' bodies.

The head reads a feature row beside every token: forward 0's fed positions their input
rows (``_FeatureState.fused``: fc of the target's features, or the head's own output along
an optimistic commit), a drafted node the head's output at its parent. The fed rows are
gathered on the device into a persistent buffer before the body (a CUDA graph reads a
fixed address); the body leaves the head's outputs (the root's, then every node it ran)
in a second one, and after the read they become each sequence's tree outputs, which a
commit along the accepted path turns into provisional rows, as after the eager drafters.
The logits are over the draft vocabulary; ``vocab_ids`` maps a column to its target id.
"""

from __future__ import annotations

import torch

from shared.engine import graph_buckets
from shared.engine.sequence import Sequence
from shared.engine.step_plan import SeqStep

MAX_GRAPH_OUTPUTS = 64  # head outputs per sequence a graphed step keeps (a chain's k, a tree's 1 + nodes run)


def supported(runner) -> bool:
    """An EAGLE head takes the static drafts on CUDA, or in float32 on CPU (as static_step.supported)."""
    return runner.device.type == "cuda" or runner.dtype == torch.float32


class EagleInputs:
    """A mixin before a static draft kind (``StaticDraft``): the head's feature input and outputs."""

    def __init__(self, runner, graphs=None):
        super().__init__(runner, graphs)
        hidden = runner.head.cfg.hidden_size
        self.vocab_ids = None if runner.logit_ids is None else runner.logit_ids.to(runner.device)  # [draft_vocab]
        graphed = graphs is not None
        rows, batch, outputs = (graph_buckets.MAX_TOKENS, graph_buckets.MAX_BATCH, MAX_GRAPH_OUTPUTS) if graphed else (1, 1, 1)
        self.feats = torch.zeros(rows, hidden, dtype=runner.dtype, device=runner.device)  # [T, H] fed rows' input
        self.outs = torch.zeros(batch, outputs, hidden, dtype=runner.dtype, device=runner.device)  # [B, O, H]
        self.num_outputs = 0  # head outputs per sequence the last body left in ``outs``

    def _check(self, seqs: list[Sequence]) -> None:
        for seq in seqs:
            n = len(seq.token_ids)
            self.runner.check_fed_rows(seq, min(seq.num_cached, n - 1), n - 1)

    def _inputs(self, seqs: list[Sequence], steps: list[SeqStep]) -> None:
        state = self.runner.state
        rows = torch.cat([state[s.seq_id].fused[st.num_cached : len(s.token_ids)] for s, st in zip(seqs, steps)])
        self._room(rows.shape[0], len(seqs), 1)
        self.feats[: rows.shape[0]].copy_(rows)  # [T, H]

    def _room(self, rows: int, batch: int, outputs: int) -> None:
        """Grow the persistent buffers, keeping what they hold, past what a step needs (graphs that read the old
        ones are dropped; on CUDA they start at the largest bucket's size, so a graphed step never grows them)."""
        feats, outs = self.feats, self.outs
        if rows > feats.shape[0]:
            self.feats = feats.new_zeros(rows, feats.shape[1])
            self.feats[: feats.shape[0]] = feats
        if batch > outs.shape[0] or outputs > outs.shape[1]:
            self.outs = outs.new_zeros(max(batch, outs.shape[0]), max(outputs, outs.shape[1]), outs.shape[2])
        if (self.feats is not feats or self.outs is not outs) and self.graphs is not None:
            self.graphs.forget(type(self).__name__)

    def _head(self, ids: torch.Tensor, feats: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """ids, pos [T], feats [T, H] -> the head's pre-norm outputs [T, H] on the prepared attention."""
        return self.runner.head(ids[None], feats[None], pos[None], backend=self.attn)[0]

    def _head_logits(self, out: torch.Tensor) -> torch.Tensor:
        """Pre-norm outputs [R, H] -> float32 logits over the draft vocabulary [R, V']."""
        return self._logits(self.runner.head.norm(out))

    def _head_probs(self, out: torch.Tensor) -> torch.Tensor:
        """Pre-norm outputs [R, H] -> greedy draft probabilities over the draft vocabulary [R, V']."""
        return self._probs(self.runner.head.norm(out))

    def _ids(self, columns: torch.Tensor) -> torch.Tensor:
        return columns if self.vocab_ids is None else self.vocab_ids[columns]

    def _keep_outputs(self, outs: torch.Tensor) -> None:
        """outs [B, O, H] (root, then each node run) into the persistent buffer (inside the body)."""
        self.outs[: outs.shape[0], : outs.shape[1]] = outs
        self.num_outputs = outs.shape[1]

    def _outputs(self, seqs: list[Sequence], shape) -> None:
        """The head's outputs become each sequence's tree outputs (row 0 the root, row j + 1 node j)."""
        state, count = self.runner.state, self.num_outputs
        for b, seq in enumerate(seqs):
            state[seq.seq_id].set_out(0, self.outs[b, :count])
            state[seq.seq_id].num_out = count
