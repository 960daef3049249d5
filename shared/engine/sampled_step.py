"""Sampled verify steps on the static path: the forward, the batch's target probabilities and the walk in one body.

    host                                                   device (the body: a CUDA graph replays it)
    step_plan.build + sampled_plan.build_sampled  ──copy──▶  plan, children, sparse draft q, uniforms, params
                                                           forward (static_step.StaticStep._forward)
                                                           q dense by scatter; batched_probs with each row's
                                                           temperature / top-k / top-p / min-p
                                                           accept_sampled_batch (SpecInfer's multi-round walk)
                                                           the accepted tree path's KV moved into place
    outcome.tolist()   ◀──────── one read ──────────────   [B, 2 + M]

Everything the walk reads is staged with the plan in one array (sampled_plan.py), so a
step whose shape fits a bucket replays a CUDA graph (``cuda_graphs.GraphPool``) like a
greedy step; which filters run is part of the bucket. On CPU the body runs eagerly inside
``graph_body()``. The walk and its uniforms are device_sampling.py's, unchanged: the same
outcome as drawing the inputs there (``tests/shared/engine/test_sampled_step.py``).
"""

from __future__ import annotations

import numpy as np
import torch

from shared.engine import sampled_plan, step_plan
from shared.engine.device_sampling import accept_sampled_batch, batched_probs
from shared.engine.sampled_plan import SampledInput, SampledShape


class SampledStep:
    """The graph pool's step kind for sampled verifies; the forward and the KV move are the static step's."""

    def __init__(self, static):
        self.static = static  # static_step.StaticStep
        runner = static.runner
        self.block_size = runner.cache.block_size
        self.max_context = runner.max_context
        self.vocab = runner.vocab_size

    def stage(self, flat: np.ndarray) -> torch.Tensor:
        return self.static.stage(flat)

    def bucket(self, shape: SampledShape) -> SampledShape | None:
        return sampled_plan.bucket_for(shape, self.block_size, self.max_context, self.vocab)

    def build(self, inp: SampledInput | list, shape: SampledShape, scratch_block: int = 0) -> np.ndarray:
        steps = inp.steps if isinstance(inp, SampledInput) else []
        flat = np.zeros(shape.size, dtype=np.int64)
        flat[: shape.first.size] = step_plan.build(steps, shape.first, self.block_size, scratch_block)
        sampled_plan.build_sampled(inp, shape, self.vocab, flat)
        return flat

    def body(self, flat: torch.Tensor, shape: SampledShape) -> torch.Tensor:
        """The captured region: staged step [size] -> outcome [B, 2 + M] (count, bonus, path)."""
        seg, logits = self.static._forward(flat, shape.first)  # [B, 1 + M, vocab]
        s = {name: flat[a : a + n].view(dims) for name, (a, n, dims) in shape.offsets().items()}
        f32 = lambda name: s[name].view(torch.float64).float()  # noqa: E731 - staged as float64 bits
        m = shape.first.nodes
        q = torch.zeros(*s["q_ids"].shape[:2], self.vocab, device=flat.device)  # [B, 1 + M, V]
        q.scatter_add_(2, s["q_ids"], f32("q_mass"))  # repeated ids add up, as dense_probs
        columns = {"greedy": s["greedy"] > 0, "temp": f32("temp"), "top_k": s["top_k"], "top_p": f32("top_p"),
                   "min_p": f32("min_p"), "any": shape.filters}  # fmt: skip
        probs = batched_probs(logits[:, : 1 + m], columns)  # [B, 1 + M, V]
        u = f32("u")  # [B, M + 1]
        outcome = accept_sampled_batch(probs, seg["tokens"], s["kids"], q, s["has_q"] > 0, u[:, :m], u[:, m])
        if not shape.chains:
            self.static._move_path(seg, outcome)
        return outcome  # [B, 2 + M]
