"""Greedy verify steps with one host read: the step plan staged once, the body on the device.

    host                                             device (the body: a CUDA graph replays it)
    grow block tables, step_plan.build (numpy) ──copy──▶ staged segments
                                                     prepare attention (static_batch.py)
                                                     decoder layers, lm_head at root + node rows
                                                     argmax, accept (device_acceptance.py)
                                                     move the accepted tree path's KV into place
    outcome.tolist()  ◀──────── one read ───────────  outcome [B, 2 + M]
    commit tokens, free blocks past the kept KV

This is the path of every greedy verify or decode step of a target with no early
exit and no feature capture. Everything else (prefills, sampling, early exit,
features, a reduced-vocabulary head, 16-bit models on CPU, whose row exactness
needs the eager backends' per-row attention: sdpa.py) runs the eager forward.
On CPU the body runs eagerly inside ``graph_body()``, the region a CUDA graph
would capture (``shared/profiling/host_work.py`` counts what runs outside it);
on CUDA ``cuda_graphs.py`` captures it per bucket and replays it.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from shared.engine import graph_buckets, prefix_blocks, step_plan
from shared.engine.attention.static_batch import StaticBatchAttention
from shared.engine.device_acceptance import accept_greedy_batch, node_status
from shared.engine import sampled_plan
from shared.engine.device_sampling import host_uniforms, tried_status
from shared.engine.sampled_plan import SampledInput
from shared.engine.sampled_step import SampledStep
from shared.engine.errors import ContextLengthError, OutOfBlocksError
from shared.engine.runner import ModelRunner
from shared.engine.sequence import Sequence
from shared.engine.staging_buffer import StagingBuffer
from shared.engine.types import AcceptResult, ForwardCost, VerifyItem
from shared.engine.verify_rows import plain, sampled_only, verify_sequence
from shared.profiling.host_work import graph_body


def supported(runner: ModelRunner) -> bool:
    """Can this runner take static steps? CUDA, or float32 on CPU (16 bits on CPU need row exactness)."""
    if type(runner) is not ModelRunner or runner.logit_ids is not None:
        return False  # subclasses (the EAGLE head) shape their own inputs
    return runner.device.type == "cuda" or runner.dtype == torch.float32


class StaticStep:
    def __init__(self, runner: ModelRunner, graphs=None):
        self.runner = runner
        self.attn = StaticBatchAttention(runner.cache)
        self.graphs = graphs  # cuda_graphs.GraphPool on CUDA, None: the body runs eagerly
        self._staging = StagingBuffer(runner.device)  # the staged step, host and device
        self.num_host_accept = 0  # steps whose acceptance ran on the host (sampling, processed logits, logprobs)
        wanted = runner.config.device_sampling
        self.device_sampling = runner.device.type == "cuda" if wanted is None else wanted  # sampled steps on the device
        self.sampled = SampledStep(self)  # the sampled steps' body, a step kind of the graph pool

    # the graph pool's view of a step kind (cuda_graphs.GraphPool)
    def bucket(self, shape: step_plan.StepShape) -> step_plan.StepShape | None:
        return graph_buckets.bucket_for(shape, self.runner.cache.block_size, self.runner.max_context)

    def build(self, steps: list[step_plan.SeqStep], shape: step_plan.StepShape, scratch_block: int = 0) -> np.ndarray:
        return step_plan.build(steps, shape, self.runner.cache.block_size, scratch_block)

    def warm_buckets(self, rows: tuple[int, ...] = (1, 5)) -> list[step_plan.StepShape]:
        """The buckets captured at start: rows per sequence ``rows`` (decode; a 4-token chain and its bonus) at
        every batch bucket, at the first context bucket."""
        out = []
        for q in rows:
            for b in graph_buckets.BATCH_BUCKETS:
                exact = step_plan.StepShape(batch=b, rows=b * q, q=q, nodes=max(1, q - 1), blocks=1, kv_cap=1, chains=True)
                bucket = self.bucket(exact)
                if bucket is not None:
                    out.append(bucket)
        return out

    @torch.inference_mode()
    def run(self, verifies: list[VerifyItem]) -> tuple[list[AcceptResult], ForwardCost]:
        """One verify step (items already validated by ``TargetEngine._validate``). All greedy: acceptance on
        the device and one host read; any request sampling: the rows' logits come back and each request's
        acceptance runs on the host (``acceptance.accept_tree``), the preparation staying as cheap."""
        runner = self.runner
        start = time.perf_counter()
        seqs = [runner.seqs[v.seq_id] for v in verifies]
        cached = [s.num_cached for s in seqs]
        steps = self._plan(seqs, verifies)  # grows block tables; nothing else mutated yet
        if not all(plain(s) for s in seqs):  # sampling, penalties, masks, grammars or log-probabilities
            if self.device_sampling and all(sampled_only(s) for s in seqs):
                return self._run_device_sampled(seqs, verifies, steps, cached, start)
            return self._run_sampled(seqs, verifies, steps, cached, start)  # the host walk
        try:
            chains = True
            for v in verifies:
                chains = chains and v.tree.parent_ids == list(range(-1, len(v.tree.parent_ids) - 1))
            shape = step_plan.shape_of(steps, runner.cache.block_size, chains)
            if self.graphs is not None:
                outcome = self.graphs.run(self, steps, shape)  # [B, 2 + M] device
            else:
                flat = self.stage(step_plan.build(steps, shape, runner.cache.block_size))
                with graph_body():
                    outcome = self.body(flat, shape)
            rows = outcome.tolist()  # the step's one host read
        except BaseException:
            for s, c in zip(seqs, cached):
                s.num_cached = c
            raise
        results = [self._commit(s, v, row) for s, v, row in zip(seqs, verifies, rows)]
        return results, self._cost(start, steps, shape)

    @staticmethod
    def _cost(start: float, steps: list[step_plan.SeqStep], shape: step_plan.StepShape) -> ForwardCost:
        return ForwardCost(
            duration_s=time.perf_counter() - start,
            num_seqs=len(steps),
            num_batched_tokens=shape.rows,
            num_context_tokens=sum([len(s.token_ids) + len(s.tokens) for s in steps]),
        )

    def _run_sampled(self, seqs, verifies, steps, cached, start) -> tuple[list[AcceptResult], ForwardCost]:
        runner = self.runner
        self.num_host_accept += 1
        try:
            shape = step_plan.shape_of(steps, runner.cache.block_size, False)
            flat = self.stage(step_plan.build(steps, shape, runner.cache.block_size))
            with graph_body():
                logits = self.body_logits(flat, shape)  # [B, 1 + M, vocab]
        except BaseException:
            for s, c in zip(seqs, cached):
                s.num_cached = c
            raise
        results = []
        for b, (seq, v) in enumerate(zip(seqs, verifies)):
            accepted = verify_sequence(seq, v.tree, logits[b, : 1 + len(v.tree.token_ids)])
            self._move_path_host(seq, accepted.accepted_nodes)
            self._commit_tokens(seq, accepted.tokens, len(accepted.accepted_nodes))
            results.append(accepted)
        return results, self._cost(start, steps, shape)

    def _run_device_sampled(self, seqs, verifies, steps, cached, start) -> tuple[list[AcceptResult], ForwardCost]:
        """Sampling with nothing else to process: the forward, the batch's probabilities and the walk in one body
        (sampled_step.py; a CUDA graph where the step fits a bucket), and one host read, as for greedy steps."""
        runner = self.runner
        try:
            chains = all(v.tree.parent_ids == list(range(-1, len(v.tree.parent_ids) - 1)) for v in verifies)
            shape = step_plan.shape_of(steps, runner.cache.block_size, chains)
            nodes = max(len(v.tree.token_ids) for v in verifies)
            # each request's uniforms from its own generator: nodes + 1 whatever its tree (device_sampling.py)
            uniforms = host_uniforms([s.generator for s in seqs], nodes).numpy()  # [B, nodes + 1]
            inp = SampledInput(steps, [v.tree for v in verifies], uniforms, [s.sampling for s in seqs])
            sampled = sampled_plan.shape_of(shape, inp, runner.vocab_size)
            if self.graphs is not None:
                outcome = self.graphs.run(self.sampled, inp, sampled)  # [B, 2 + M] device
            else:
                flat = self.stage(self.sampled.build(inp, sampled))
                with graph_body():
                    outcome = self.sampled.body(flat, sampled)
            rows = outcome.tolist()  # the step's one host read
        except BaseException:
            for s, c in zip(seqs, cached):
                s.num_cached = c
            raise
        results = []
        for seq, v, row in zip(seqs, verifies, rows):
            result = self._commit(seq, v, row)  # a greedy request keeps the greedy walk's statuses
            if not seq.sampling.greedy:
                result.node_status = tried_status(v.tree.parent_ids, result.accepted_nodes)
            results.append(result)
        return results, self._cost(start, steps, shape)

    def _move_path_host(self, seq: Sequence, path: list[int]) -> None:
        """The accepted tree path's KV from n + node to n + depth (a chain's is already in place)."""
        if path == list(range(len(path))):
            return
        bs = self.runner.cache.block_size
        n = len(seq.token_ids)
        table = seq.block_ids
        src = [table[(n + j) // bs] * bs + (n + j) % bs for j in path]
        dst = [table[(n + d) // bs] * bs + (n + d) % bs for d in range(len(path))]
        device = self.runner.device
        self.runner.cache.move(torch.tensor(src, device=device), torch.tensor(dst, device=device))

    def _plan(self, seqs: list[Sequence], verifies: list[VerifyItem]) -> list[step_plan.SeqStep]:
        """Check context and KV space for every sequence, then grow their block tables; one plain loop."""
        runner = self.runner
        bs = runner.cache.block_size
        needed = 0
        for seq, v in zip(seqs, verifies):
            total = len(seq.token_ids) + len(v.tree.token_ids)
            if total > runner.max_context:
                raise ContextLengthError(
                    f"sequence {seq.seq_id!r}: {len(seq.token_ids)} tokens + {len(v.tree.token_ids)} speculative "
                    f"exceed the context window of {runner.max_context}"
                )
            needed += max(0, -(-total // bs) - len(seq.block_ids))
            needed += prefix_blocks.cow_blocks(runner.cache, seq, min(seq.num_cached, len(seq.token_ids) - 1))
        allocator = runner.cache.allocator
        if needed > allocator.num_free:
            raise OutOfBlocksError(
                f"{runner.name}: batch needs {needed} more KV blocks, {allocator.num_free} of "
                f"{runner.cache.num_blocks} are free"
            )
        steps = []
        for seq, v in zip(seqs, verifies):
            n = len(seq.token_ids)
            if seq.num_cached == n:
                seq.num_cached = n - 1  # re-run the last token: its logits were not kept (as the eager forward)
            prefix_blocks.writable(runner.cache, seq, seq.num_cached)  # a cached block is copied before a write
            grow = -(-(n + len(v.tree.token_ids)) // bs) - len(seq.block_ids)
            if grow > 0:
                seq.block_ids += allocator.allocate(grow, seq.seq_id)
            steps.append(step_plan.SeqStep(seq.token_ids, seq.num_cached, seq.block_ids, v.tree.token_ids, v.tree.parent_ids))
        return steps

    def stage(self, flat: np.ndarray) -> torch.Tensor:
        """Copy the staged step to the device in one non-blocking copy; returns the device view [size]."""
        return self._staging.stage(flat)

    def body(self, flat: torch.Tensor, shape: step_plan.StepShape) -> torch.Tensor:
        """The captured region: staged step [size] -> outcome [B, 2 + M]. Device ops only, no host reads."""
        seg, logits = self._forward(flat, shape)  # [B, 1 + M, vocab]
        best = logits.argmax(-1)  # [B, 1 + M]
        outcome = accept_greedy_batch(best, seg["tokens"], seg["parents"], seg["anc"] > 0, seg["valid"] > 0)
        if not shape.chains:
            self._move_path(seg, outcome)
        return outcome

    def body_logits(self, flat: torch.Tensor, shape: step_plan.StepShape) -> torch.Tensor:
        """The same forward for sampled steps: staged step [size] -> float32 logits [B, 1 + M, vocab]."""
        return self._forward(flat, shape)[1].float()

    def _forward(self, flat: torch.Tensor, shape: step_plan.StepShape):
        seg = {name: flat[a : a + n].view(dims) for name, (a, n, dims) in shape.offsets().items()}
        self.attn.prepare(seg, shape.kv_cap)
        runner = self.runner
        hidden = runner.decoder(
            input_ids=seg["ids"][None], position_ids=seg["pos"][None], use_cache=False, tandem_backend=self.attn
        ).last_hidden_state[0]  # [T, hidden]
        rows = torch.cat([seg["root_row"][:, None], seg["node_row"]], dim=1)  # [B, 1 + M]
        logits = runner.lm_head(hidden[rows.reshape(-1)]).view(*rows.shape, -1)  # [B, 1 + M, vocab]
        return seg, logits

    def _move_path(self, seg: dict[str, torch.Tensor], outcome: torch.Tensor) -> None:
        """Move each accepted path's KV from n + node to n + depth, in every layer (one gather, one scatter).

        Entries past a path's length repeat its first move (same source, same value) or, for an empty path,
        copy the root's slot onto itself: duplicates write equal values, so the scatter stays deterministic."""
        count, path = outcome[:, :1], outcome[:, 2:]  # [B, 1], [B, M]
        n = seg["ncommit"][:, None]  # [B, 1]
        depth = torch.arange(path.shape[1], device=path.device)[None]  # [1, M]
        real = depth < count  # [B, M]
        some = count > 0  # [B, 1]
        src = torch.where(real, n + path, torch.where(some, n + path[:, :1], n - 1))  # [B, M] logical
        dst = torch.where(real, n + depth, torch.where(some, n, n - 1))  # [B, M] logical
        bs = self.runner.cache.block_size
        table = seg["table"]  # [B, NB]
        src_slots = table.gather(1, src // bs) * bs + src % bs  # [B, M]
        dst_slots = table.gather(1, dst // bs) * bs + dst % bs  # [B, M]
        self.runner.cache.move(src_slots.reshape(-1), dst_slots.reshape(-1))

    def _commit(self, seq: Sequence, v: VerifyItem, row: list[int]) -> AcceptResult:
        count, bonus = row[0], row[1]
        path = row[2 : 2 + count]
        node_tokens = v.tree.token_ids
        tokens = [node_tokens[j] for j in path]
        tokens.append(bonus)
        self._commit_tokens(seq, tokens, count)
        return AcceptResult(accepted_nodes=path, tokens=tokens, node_status=node_status(v.tree.parent_ids, path))

    def _commit_tokens(self, seq: Sequence, tokens: list[int], kept: int) -> None:
        """Append the step's tokens; the KV of the fed tokens and ``kept`` path nodes stays, later blocks go."""
        n = len(seq.token_ids)
        seq.token_ids += tokens
        seq.num_cached = n + kept
        cache = self.runner.cache
        keep = -(-seq.num_cached // cache.block_size)
        if keep < len(seq.block_ids):
            cache.allocator.free(seq.block_ids[keep:])
            del seq.block_ids[keep:]
        prefix_blocks.register(cache, seq)
