"""The host half of a sampled static step: the walk's inputs staged beside the step plan, in the same array.

A sampled verify step (device_sampling.py's walk after the forward) needs, besides the
step plan (step_plan.py), each tree's children per row, the draft distributions its
children were sampled from (sparse: token ids and their mass), each request's
uniforms and sampling parameters. All of it goes into the step's one ``int64`` staging
array after the plan's segments, floats as their float64 bit patterns (exact for the
float32 values they hold), so one copy moves the whole step and a CUDA graph reads it
from one static buffer::

    segment   shape          what
    kids      [B, R, W]      row r's children in the order they are tried, -1 past the last
    has_q     [B, R]         1 where row r's children were sampled from a draft distribution
    q_ids     [B, R, K]      that distribution's token ids (padding: token 0 ...)
    q_mass    [B, R, K]      ... and their normalised mass (padding: 0), float64 bits
    u         [B, M + 1]     the request's uniforms: node j's test, then the bonus draw (float64 bits)
    greedy    [B]            1 for a greedy request (its p is the one-hot argmax)
    top_k     [B]            its top-k (V: none)
    temp, top_p, min_p [B]   float64 bits

R = 1 + M rows (the root, then node j at row j + 1), W the widest row, K the largest
draft distribution. A bucket rounds W and K up to powers of two; its padded sequences
are greedy with no children (their walk stops at once, on the scratch block's rows).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from shared.engine import graph_buckets
from shared.engine.step_plan import AfterFirstForward, SeqStep, StepShape

MAX_GRAPH_Q_ENTRIES = 256  # widest draft distribution a CUDA graph is captured for (wider: the body runs eagerly)
MAX_GRAPH_DENSE = 1 << 28  # B x R x V elements of one [B, R, V] tensor in a graph (1 GiB in float32; the walk's
#                            probabilities and dense q stay in the graph pool's memory)


@dataclass(frozen=True)
class SampledShape(AfterFirstForward):
    first: StepShape  # the verify step's own shape (a bucket's, when graphed)
    width: int  # W
    entries: int  # K
    filters: tuple[bool, bool, bool]  # any row with top-k, top-p, min-p: which filters the body runs

    @property
    def chains(self) -> bool:
        return self.first.chains

    def offsets(self) -> dict[str, tuple[int, int, tuple[int, ...]]]:
        """(start, size, shape) of each sampled segment in the flat array (after the plan's)."""
        b, m = self.first.batch, self.first.nodes
        r = 1 + m
        dims = {"kids": (b, r, self.width), "has_q": (b, r), "q_ids": (b, r, self.entries),
                "q_mass": (b, r, self.entries), "u": (b, m + 1), "greedy": (b,), "top_k": (b,), "temp": (b,),
                "top_p": (b,), "min_p": (b,)}  # fmt: skip
        out, start = {}, self.first.size
        for name, d in dims.items():
            out[name] = (start, math.prod(d), d)
            start += math.prod(d)
        return out

    @property
    def size(self) -> int:
        start, size, _ = self.offsets()["min_p"]
        return start + size


@dataclass
class SampledInput:
    """One sampled step as the host knows it (what ``build`` stages)."""

    steps: list[SeqStep]
    trees: list  # TokenTree per sequence
    uniforms: np.ndarray  # [B, M + 1] float32: node tests, then the bonus (device_sampling.draw_uniforms' layout)
    params: list  # SamplingParams per sequence

    def __len__(self) -> int:
        return len(self.steps)


def shape_of(step: StepShape, inp: SampledInput, vocab: int) -> SampledShape:
    """The exact sampled shape of a step whose plan has shape ``step``."""
    width = 1
    for tree in inp.trees:
        counts: dict[int, int] = {}
        for p in tree.parent_ids:
            counts[p] = counts.get(p, 0) + 1
        width = max([width, *counts.values()])
    entries = max([1] + [int(d.token_ids.numel()) for t in inp.trees for d in t.child_dists.values() if d is not None])
    filters = (any(0 < p.top_k < vocab for p in inp.params), any(p.top_p < 1.0 for p in inp.params),
               any(p.min_p > 0.0 for p in inp.params))  # fmt: skip
    return SampledShape(step, width, entries, filters)


def bucket_for(shape: SampledShape, block_size: int, max_context: int, vocab: int) -> SampledShape | None:
    """The graph bucket of a sampled step: the plan's bucket, W and K rounded up to powers of two; None (eager)
    past the widest distribution or the largest dense [B, R, V] a graph keeps."""
    if shape.entries > MAX_GRAPH_Q_ENTRIES:
        return None
    first = graph_buckets.bucket_for(shape.first, block_size, max_context)
    if first is None or first.batch * (1 + first.nodes) * vocab > MAX_GRAPH_DENSE:
        return None
    width = min(1 << (shape.width - 1).bit_length(), first.nodes)
    return SampledShape(first, width, 1 << (shape.entries - 1).bit_length(), shape.filters)


def build_sampled(inp: SampledInput | list, shape: SampledShape, vocab: int, flat: np.ndarray) -> None:
    """Fill the sampled segments of ``flat`` (the plan's are filled already: step_plan.build)."""
    seg = {name: flat[a : a + n].reshape(dims) for name, (a, n, dims) in shape.offsets().items()}
    f64 = {name: seg[name].view(np.float64) for name in ("q_mass", "u", "temp", "top_p", "min_p")}
    seg["kids"][:] = -1
    seg["has_q"][:] = 0
    seg["q_ids"][:] = 0
    f64["q_mass"][:] = 0.0
    f64["u"][:] = 0.5
    seg["greedy"][:] = 1  # padded sequences: greedy, no children
    seg["top_k"][:] = vocab
    f64["temp"][:] = 1.0
    f64["top_p"][:] = 1.0
    f64["min_p"][:] = 0.0
    if not isinstance(inp, SampledInput) or not len(inp):
        return
    real = len(inp)
    u = inp.uniforms  # [b, M + 1]
    m = u.shape[1] - 1
    f64["u"][:real, :m] = u[:, :m]
    f64["u"][:real, -1] = u[:, m]
    for b, (tree, p) in enumerate(zip(inp.trees, inp.params)):
        tried = [0] * (1 + len(tree.parent_ids))
        for node, parent in enumerate(tree.parent_ids):
            seg["kids"][b, parent + 1, tried[parent + 1]] = node
            tried[parent + 1] += 1
        for row, dist in tree.child_dists.items():
            if dist is None:
                continue
            weights = dist.probs.reshape(-1).float()
            weights = weights / weights.sum()  # what was sampled from (the host walk normalises it too)
            n = weights.numel()
            seg["has_q"][b, row] = 1
            seg["q_ids"][b, row, :n] = dist.token_ids.reshape(-1).numpy()
            f64["q_mass"][b, row, :n] = weights.numpy()
        seg["greedy"][b] = int(p.greedy)
        seg["top_k"][b] = p.top_k if 0 < p.top_k < vocab else vocab
        f64["temp"][b] = 1.0 if p.greedy else np.float32(p.temperature)
        f64["top_p"][b] = np.float32(p.top_p)
        f64["min_p"][b] = np.float32(p.min_p)
