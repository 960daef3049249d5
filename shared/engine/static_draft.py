"""What the static drafts share: which calls qualify, the host half of a call, the device's forward.

A static draft (draft_chain_step.py for greedy chains, draft_tree_step.py for beam and
expansion trees) runs every forward of a speculate call in one body and reads the
outcome once. Around the body each does the same::

    grow the block tables to hold n + the nodes the call runs (checked first: context, KV space)
    stage forward 0 (the fed committed tokens) and whatever else the body needs in one copy
    body (a CUDA graph replays it on a GPU; on CPU it runs eagerly inside graph_body())
    one read; the sequences' KV now holds their committed tokens and the run nodes (seq.tree)
"""

from __future__ import annotations

import time

import numpy as np
import torch

from shared.engine import prefix_blocks, step_plan
from shared.engine.attention.static_batch import StaticBatchAttention
from shared.engine.errors import ContextLengthError, OutOfBlocksError
from shared.engine.runner import ModelRunner
from shared.engine.sequence import Sequence
from shared.engine.staging_buffer import StagingBuffer
from shared.engine.static_step import supported as runner_supported  # noqa: F401 - the draft engine's check too
from shared.engine.types import ForwardCost
from shared.profiling.host_work import graph_body


class StaticDraft:
    """A static draft kind: subclasses give ``shape_of``, ``bucket``, ``build``, ``body`` and ``_finish``."""

    what = "draft"  # in error messages

    def __init__(self, runner: ModelRunner, graphs=None):
        self.runner = runner
        self.attn = StaticBatchAttention(runner.cache)
        self.graphs = graphs  # cuda_graphs.GraphPool on CUDA, None: the body runs eagerly
        self._staging = StagingBuffer(runner.device)
        self.runs = 0
        ids = getattr(runner, "logit_ids", None)
        self.columns = runner.vocab_size if ids is None else len(ids)  # what a draft's probabilities range over

    def stage(self, flat: np.ndarray) -> torch.Tensor:
        return self._staging.stage(flat)

    def applies(self, seqs: list[Sequence]) -> bool:
        """Can these sequences draft on this path? Greedy, no grammar, no tree yet (the runner was checked when
        the draft engine made this step kind: static_step.supported, or the EAGLE head's own check)."""
        return bool(seqs) and all(s.sampling.greedy and s.grammar is None and not len(s.tree) for s in seqs)

    # hooks for a head that reads more than tokens (eagle/static_chain.py)
    def _check(self, seqs: list[Sequence]) -> None:
        """Raise before anything changes when a sequence cannot run."""

    def _inputs(self, seqs: list[Sequence], steps: list[step_plan.SeqStep]) -> None:
        """Fill the body's other static inputs (the fed rows' features) once the block tables are grown."""

    def _outputs(self, seqs: list[Sequence], shape) -> None:
        """Take what the body left beside its outcome (the head's outputs) after the read."""

    @torch.inference_mode()
    def _run(self, seqs: list[Sequence], nodes_run: int, shape_of, inputs_of=None):
        """Plan, stage, run the body, read once; (rows of the outcome, its shape, seconds). ``nodes_run``: tree
        nodes each sequence's KV takes (the body writes them at n .. n + nodes_run - 1); ``inputs_of(steps)``:
        what ``build`` stages when it is more than the step plans (a sampled chain's parameters)."""
        start = time.perf_counter()
        self._check(seqs)
        cached = [s.num_cached for s in seqs]
        steps = self._plan(seqs, nodes_run)  # grows block tables; nothing else mutated yet
        try:
            self._inputs(seqs, steps)
            shape = shape_of(steps)
            staged = steps if inputs_of is None else inputs_of(steps)
            if self.graphs is not None:
                outcome = self.graphs.run(self, staged, shape)  # device
            else:
                flat = self.stage(self.build(staged, shape))
                with graph_body():
                    outcome = self.body(flat, shape)
            rows = outcome.tolist()  # the call's one host read
        except BaseException:
            for s, c in zip(seqs, cached):
                s.num_cached = c
            raise
        self.runs += 1
        runner = self.runner
        for seq, attached, step in zip(seqs, cached, steps):
            seq.num_cached = len(seq.token_ids)
            runner._ran(seq, attached, step.num_cached)  # as after the eager forward (what KV the prefix index may take)
            prefix_blocks.register(runner.cache, seq, runner._registrable(seq))
        self._outputs(seqs, shape)
        return rows, shape, time.perf_counter() - start

    def _plan(self, seqs: list[Sequence], nodes_run: int) -> list[step_plan.SeqStep]:
        """Check context and KV space, then grow the block tables to n + nodes_run positions; one plain loop."""
        runner = self.runner
        bs = runner.cache.block_size
        needed = 0
        for seq in seqs:
            total = len(seq.token_ids) + nodes_run
            if total > runner.max_context:
                raise ContextLengthError(
                    f"sequence {seq.seq_id!r}: {len(seq.token_ids)} tokens + {nodes_run} {self.what} nodes exceed the "
                    f"context window of {runner.max_context}"
                )
            first_write = min(seq.num_cached, len(seq.token_ids) - 1)
            needed += max(0, -(-total // bs) - len(seq.block_ids))
            needed += prefix_blocks.cow_blocks(runner.cache, seq, first_write, max(total, first_write + 1))
        allocator = runner.cache.allocator
        if needed > allocator.num_free:
            raise OutOfBlocksError(
                f"{runner.name}: the {self.what} needs {needed} more KV blocks, {allocator.num_free} of "
                f"{runner.cache.num_blocks} are free"
            )
        steps = []
        for seq in seqs:
            n = len(seq.token_ids)
            if seq.num_cached == n:
                seq.num_cached = n - 1  # re-run the last token: its logits were not kept (as the eager forward)
            total = n + nodes_run
            prefix_blocks.writable(runner.cache, seq, seq.num_cached, max(total, seq.num_cached + 1))
            grow = -(-total // bs) - len(seq.block_ids)
            if grow > 0:
                seq.block_ids += allocator.allocate(grow, seq.seq_id)
            steps.append(step_plan.SeqStep(seq.token_ids, seq.num_cached, seq.block_ids, [], []))
        return steps

    @staticmethod
    def costs(seconds: float, forwards: int, batch: int, first_rows: int, rows_per_forward: list[int]) -> list[ForwardCost]:
        """The call's time split evenly over its forwards (what the draft's cost profile reads per forward)."""
        each = seconds / forwards
        return [ForwardCost(each, batch, first_rows if i == 0 else rows_per_forward[i - 1], 0) for i in range(forwards)]

    # ------------------------------------------------------------------ on the device
    def _decode(self, ids: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """ids, pos [T] -> hidden [T, hidden] through the draft's decoder on the prepared attention."""
        out = self.runner.decoder(input_ids=ids[None], position_ids=pos[None], use_cache=False, tandem_backend=self.attn)
        return out.last_hidden_state[0]

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [R, hidden] -> float32 logits [R, vocab]."""
        return self.runner.lm_head(hidden).float()

    def _probs(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [R, hidden] -> the draft's probabilities [R, vocab] (drafting._draft_probs, greedy)."""
        return torch.softmax(self._logits(hidden), dim=-1)

    def _root_hidden(self, seg: dict[str, torch.Tensor], kv_cap: int) -> torch.Tensor:
        """Forward 0 from step_plan segments: the fed committed tokens -> the root's hidden state [B, hidden]."""
        self.attn.prepare(seg, kv_cap)
        return self._decode(seg["ids"], seg["pos"])[seg["root_row"]]  # [B, hidden]

    def _forward_root(self, seg: dict[str, torch.Tensor], kv_cap: int) -> torch.Tensor:
        """Forward 0: the root's probabilities [B, vocab]."""
        return self._probs(self._root_hidden(seg, kv_cap))
