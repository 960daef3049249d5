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

import time

import numpy as np
import torch

from shared.engine import chain_plan, prefix_blocks, step_plan
from shared.engine.attention.static_batch import StaticBatchAttention
from shared.engine.chain_plan import ChainShape
from shared.engine.errors import ContextLengthError, OutOfBlocksError
from shared.engine.runner import ModelRunner
from shared.engine.sequence import Sequence
from shared.engine.static_step import supported as runner_supported
from shared.engine.types import ForwardCost, TokenTree
from shared.profiling.host_work import graph_body


def applies(runner: ModelRunner, seqs: list[Sequence], lengths: list[int]) -> bool:
    """Can these chains take the static path? One length >= 1, greedy sequences with nothing to process."""
    if not seqs or not runner_supported(runner) or len(set(lengths)) != 1 or lengths[0] < 1:
        return False
    for s in seqs:
        if not s.sampling.greedy or s.grammar is not None or len(s.tree):
            return False
    return True


class DraftChainStep:
    def __init__(self, runner: ModelRunner, graphs=None):
        self.runner = runner
        self.attn = StaticBatchAttention(runner.cache)
        self.graphs = graphs  # cuda_graphs.GraphPool on CUDA, None: the body runs eagerly
        self._host: torch.Tensor | None = None  # [size] int64 staging (pinned on CUDA)
        self._dev: torch.Tensor | None = None  # [size] int64 the staged chain on the device
        self.runs = 0

    # the graph pool's view of a step kind (cuda_graphs.GraphPool)
    def bucket(self, shape: ChainShape) -> ChainShape | None:
        return chain_plan.bucket_for(shape, self.runner.cache.block_size, self.runner.max_context)

    def build(self, steps: list[step_plan.SeqStep], shape: ChainShape, scratch_block: int = 0) -> np.ndarray:
        return chain_plan.build(steps, shape, self.runner.cache.block_size, scratch_block)

    @torch.inference_mode()
    def run(self, seqs: list[Sequence], length: int, thresholds: list[float]) -> tuple[list[TokenTree], list[ForwardCost]]:
        """Draft a chain of ``length`` for every sequence (``applies`` was checked); trees and k forward costs."""
        start = time.perf_counter()
        cached = [s.num_cached for s in seqs]
        steps = self._plan(seqs, length)  # grows block tables; nothing else mutated yet
        try:
            shape = chain_plan.shape_of(steps, length, self.runner.cache.block_size)
            if self.graphs is not None:
                outcome = self.graphs.run(self, steps, shape)  # [B, 2k] device
            else:
                flat = self.stage(self.build(steps, shape))
                with graph_body():
                    outcome = self.body(flat, shape)
            rows = outcome.tolist()  # the chain's one host read
        except BaseException:
            for s, c in zip(seqs, cached):
                s.num_cached = c
            raise
        self.runs += 1
        trees = [self._commit(s, row, length, t) for s, row, t in zip(seqs, rows, thresholds)]
        duration = (time.perf_counter() - start) / length
        costs = [ForwardCost(duration, len(seqs), shape.first.rows if i == 0 else len(seqs), 0) for i in range(length)]
        return trees, costs

    def _plan(self, seqs: list[Sequence], length: int) -> list[step_plan.SeqStep]:
        """Check context and KV space, then grow the block tables to n + k - 1 positions; one plain loop."""
        runner = self.runner
        bs = runner.cache.block_size
        needed = 0
        for seq in seqs:
            total = len(seq.token_ids) + length - 1
            if total > runner.max_context:
                raise ContextLengthError(
                    f"sequence {seq.seq_id!r}: {len(seq.token_ids)} tokens + {length - 1} drafted exceed the context "
                    f"window of {runner.max_context}"
                )
            first_write = min(seq.num_cached, len(seq.token_ids) - 1)
            needed += max(0, -(-total // bs) - len(seq.block_ids))
            needed += prefix_blocks.cow_blocks(runner.cache, seq, first_write, max(total, first_write + 1))
        allocator = runner.cache.allocator
        if needed > allocator.num_free:
            raise OutOfBlocksError(
                f"{runner.name}: draft chain needs {needed} more KV blocks, {allocator.num_free} of "
                f"{runner.cache.num_blocks} are free"
            )
        steps = []
        for seq in seqs:
            n = len(seq.token_ids)
            if seq.num_cached == n:
                seq.num_cached = n - 1  # re-run the last token: its logits were not kept (as the eager forward)
            total = n + length - 1
            prefix_blocks.writable(runner.cache, seq, seq.num_cached, max(total, seq.num_cached + 1))
            grow = -(-total // bs) - len(seq.block_ids)
            if grow > 0:
                seq.block_ids += allocator.allocate(grow, seq.seq_id)
            steps.append(step_plan.SeqStep(seq.token_ids, seq.num_cached, seq.block_ids, [], []))
        return steps

    def stage(self, flat: np.ndarray) -> torch.Tensor:
        """Copy the staged chain to the device in one non-blocking copy; returns the device view [size]."""
        size = flat.size
        if self._dev is None or self._dev.numel() < size:
            device = self.runner.device
            self._dev = torch.empty(max(size, 2 * (0 if self._dev is None else self._dev.numel())), dtype=torch.long, device=device)
            self._host = torch.empty(self._dev.numel(), dtype=torch.long, pin_memory=device.type == "cuda")
        host = self._host[:size]
        host.numpy()[:] = flat  # the previous chain's copy has finished: its outcome was read
        dev = self._dev[:size]
        dev.copy_(host, non_blocking=True)
        return dev

    def body(self, flat: torch.Tensor, shape: ChainShape) -> torch.Tensor:
        """The captured region: staged chain [size] -> [B, 2k] float64 (k tokens, then their probabilities)."""
        first, k, batch = shape.first, shape.length, shape.batch
        seg = {name: flat[a : a + n].view(dims) for name, (a, n, dims) in first.offsets().items()}
        tail = flat[first.size :].view(2, k - 1, batch)  # [2, k - 1, B] positions, slots
        self.attn.prepare(seg, first.kv_cap)
        hidden = self._decode(seg["ids"], seg["pos"])  # [T, hidden]
        token, prob = self._pick(hidden[seg["root_row"]])  # [B], [B]
        tokens, probs = [token], [prob]
        rows = torch.arange(batch, device=flat.device)  # [B] forward i's packed row of sequence b
        step_seg = {"table": seg["table"], "tree": torch.zeros(batch, 1, 1, dtype=torch.long, device=flat.device),
                    "q_index": rows[:, None], "unpad": rows}  # fmt: skip
        for i in range(k - 1):
            pos = tail[0, i]  # [B]
            step_seg.update(prefix=pos[:, None] + 1, ncommit=pos + 1, kvlen=pos + 1, new_slots=tail[1, i])
            self.attn.prepare(step_seg, first.kv_cap)
            token, prob = self._pick(self._decode(token, pos))  # [B], [B]
            tokens.append(token)
            probs.append(prob)
        return torch.cat([torch.stack(tokens, 1).double(), torch.stack(probs, 1).double()], 1)  # [B, 2k]

    def _decode(self, ids: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """ids, pos [T] -> hidden [T, hidden] through the draft's decoder on the prepared attention."""
        out = self.runner.decoder(input_ids=ids[None], position_ids=pos[None], use_cache=False, tandem_backend=self.attn)
        return out.last_hidden_state[0]

    def _pick(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """hidden [B, hidden] -> the greedy token [B] and its draft probability [B] (drafting._draft_probs)."""
        probs = torch.softmax(self.runner.lm_head(hidden).float(), dim=-1)  # [B, vocab]
        token = probs.argmax(-1)  # [B]
        return token, probs.gather(1, token[:, None])[:, 0]

    def _commit(self, seq: Sequence, row: list[float], length: int, threshold: float) -> TokenTree:
        """The sequence's KV now holds its committed tokens and d_1 .. d_{k-1} as tree nodes; its drafted chain."""
        seq.num_cached = len(seq.token_ids)
        prefix_blocks.register(self.runner.cache, seq)
        tokens = [int(t) for t in row[:length]]
        probs = row[length:]
        seq.tree.add_chain(tokens[:-1])
        if threshold > 0:  # Algorithm 3 line 8: the first token at or below T is kept, then drafting stops
            cut = next((j + 1 for j, p in enumerate(probs) if p <= threshold), length)
            tokens, probs = tokens[:cut], probs[:cut]
        return TokenTree(tokens, list(range(-1, len(tokens) - 1)), list(probs))
