"""Sampled draft chains with one host read: each forward's draft distribution and draw made on the device.

A sampling draft draws each proposal from ``draft_dist``: the request's target-style
probabilities (temperature, top-k, top-p, min-p), cut to the ``draft_top_k`` most
probable tokens and renormalised, and reports that sparse q with the tree
(SpecInfer / Leviathan acceptance is lossless given the q really sampled from).
Here every forward of the chain does it on the device::

    p      = batched_probs(logits, the request's parameters)          [B, V]
    q      = top-K of p, renormalised                                  [B, K] ids and mass
    d      = inverse CDF of q at u, u from the request's draft generator, drawn on the host and staged
    greedy requests: argmax of the plain softmax and its probability (drafting._draft_probs)

and the one read brings back every forward's token, probability, ids and mass
([B, k (2 + 2K)]). The eager drafter draws the same way (the call's k uniforms drawn at
once from the request's draft generator, ``sampling.inverse_cdf``), so a request's
proposals are the same whichever path its call took, and a seed fixes them whatever
shares its batch; the reported q is exactly the one sampled from.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from shared.engine import chain_plan, staged_columns
from shared.engine.chain_plan import ChainShape
from shared.engine.device_sampling import batched_probs
from shared.engine.draft_chain_step import DraftChainStep
from shared.engine.drafting import draft_generator
from shared.engine.sampling import inverse_cdf
from shared.engine.sequence import Sequence
from shared.engine.step_plan import AfterFirstForward, SeqStep
from shared.engine.types import ForwardCost, SparseDist, TokenTree



@dataclass(frozen=True)
class SampledChainShape(AfterFirstForward):
    chain: ChainShape
    entries: int  # K: the draft distribution's size
    filters: tuple[bool, bool, bool]  # any request with top-k, top-p, min-p

    @property
    def first(self):  # noqa: D401 - the graph pool's view: forward 0's sizes
        return self.chain.first

    @property
    def length(self) -> int:
        return self.chain.length

    @property
    def chains(self) -> bool:
        return True

    @property
    def size(self) -> int:  # the chain, five [B] columns, the uniforms [B, k]
        return self.chain.size + (staged_columns.NUM + self.chain.length) * self.chain.batch


@dataclass
class SampledChainInput:
    steps: list[SeqStep]
    params: list  # SamplingParams per sequence
    uniforms: np.ndarray  # [B, k] float32 from each request's draft generator (0.5 for greedy ones)

    def __len__(self) -> int:
        return len(self.steps)


class SampledDraftChain(DraftChainStep):
    what = "sampled draft chain"

    def applies(self, seqs: list[Sequence]) -> bool:
        return bool(seqs) and all(s.grammar is None and not len(s.tree) for s in seqs) and any(
            not s.sampling.greedy for s in seqs
        )

    def bucket(self, shape: SampledChainShape) -> SampledChainShape | None:
        chain = chain_plan.bucket_for(shape.chain, self.runner.cache.block_size, self.runner.max_context)
        return None if chain is None else SampledChainShape(chain, shape.entries, shape.filters)

    def build(self, inp: SampledChainInput | list, shape: SampledChainShape, scratch_block: int = 0) -> np.ndarray:
        steps = inp.steps if isinstance(inp, SampledChainInput) else []
        flat = np.zeros(shape.size, dtype=np.int64)
        chain, batch, k = shape.chain, shape.batch, shape.length
        flat[: chain.size] = chain_plan.build(steps, chain, self.runner.cache.block_size, scratch_block)
        staged_columns.fill(flat[chain.size : chain.size + staged_columns.NUM * batch],
                            inp.params if isinstance(inp, SampledChainInput) else [], self.columns)
        u = flat[chain.size + staged_columns.NUM * batch :].reshape(batch, k).view(np.float64)  # [B, k]
        u[:] = 0.5
        if steps:
            u[: len(steps)] = inp.uniforms
        return flat

    @torch.inference_mode()  # the trees' ancestor bits may be inference tensors (made in an eager forward)
    def run(self, seqs: list[Sequence], length: int, thresholds: list[float]) -> tuple[list[TokenTree], list[ForwardCost]]:
        """Draft a sampled chain of ``length`` for every sequence (``applies`` was checked)."""
        vocab = self.columns  # an EAGLE head's draft vocabulary, else the model's
        entries = min(self.runner.config.draft_top_k, vocab)
        params = [s.sampling for s in seqs]
        filters = staged_columns.filters(params, vocab)
        uniforms = np.stack([np.full(length, 0.5, np.float32) if s.sampling.greedy
                             else torch.rand(length, generator=draft_generator(s)).numpy() for s in seqs])  # fmt: skip
        bs = self.runner.cache.block_size
        holder = {}

        def shape_of(steps):
            holder["input"] = SampledChainInput(steps, params, uniforms)
            return SampledChainShape(chain_plan.shape_of(steps, length, bs), entries, filters)

        rows, shape, seconds = self._run(seqs, length - 1, shape_of, lambda steps: holder["input"])
        trees = [self._finish_sampled(s, row, length, entries, t) for s, row, t in zip(seqs, rows, thresholds)]
        return trees, self.costs(seconds, length, len(seqs), shape.first.rows, [len(seqs)] * (length - 1))

    def _context(self, flat: torch.Tensor, shape: SampledChainShape) -> dict:
        batch, k, start = shape.batch, shape.length, shape.chain.size
        columns = staged_columns.read(flat[start : start + staged_columns.NUM * batch], shape.filters)
        u = flat[start + staged_columns.NUM * batch : shape.size].view(batch, k).view(torch.float64).float()  # [B, k]
        return {"columns": columns, "u": u, "entries": shape.entries}

    def _choose(self, hidden: torch.Tensor, i: int, ctx: dict) -> tuple[torch.Tensor, ...]:
        """hidden [B, H] -> (token [B], probability [B], q's ids [B, K], q's mass [B, K])."""
        return self._choose_logits(self._logits(hidden), i, ctx)

    def _choose_logits(self, logits: torch.Tensor, i: int, ctx: dict) -> tuple[torch.Tensor, ...]:
        """logits [B, V] of forward i -> (column [B], probability [B], q's columns [B, K], q's mass [B, K])."""
        p = batched_probs(logits[:, None], ctx["columns"])[:, 0]  # [B, V] each request's target-style probabilities
        top, ids = p.topk(ctx["entries"], dim=-1)  # [B, K] each, most probable first
        mass = top / top.sum(-1, keepdim=True)  # [B, K]
        at = inverse_cdf(mass, ctx["u"][:, i])  # [B]
        soft = torch.softmax(logits, dim=-1)  # [B, V] greedy requests: the plain softmax's argmax
        best = soft.argmax(-1)  # [B]
        greedy = ctx["columns"]["greedy"]
        token = torch.where(greedy, best, ids.gather(1, at[:, None])[:, 0])
        prob = torch.where(greedy, soft.gather(1, best[:, None])[:, 0], mass.gather(1, at[:, None])[:, 0])
        return token, prob, ids, mass

    def _outcome(self, picks: list[tuple[torch.Tensor, ...]]) -> torch.Tensor:
        """[B, k (2 + 2K)] float64: tokens, probabilities, then per forward q's ids and mass."""
        tokens = torch.stack([p[0] for p in picks], 1).double()  # [B, k]
        probs = torch.stack([p[1] for p in picks], 1).double()  # [B, k]
        ids = torch.stack([p[2] for p in picks], 1).double().flatten(1)  # [B, k K]
        mass = torch.stack([p[3] for p in picks], 1).double().flatten(1)  # [B, k K]
        return torch.cat([tokens, probs, ids, mass], 1)

    def _finish_sampled(self, seq: Sequence, row: list[float], k: int, entries: int, threshold: float) -> TokenTree:
        tree = self._finish(seq, row[: 2 * k], k, threshold)
        if seq.sampling.greedy:
            return tree
        ids = np.asarray(row[2 * k : 2 * k + k * entries], dtype=np.int64).reshape(k, entries)
        mass = np.asarray(row[2 * k + k * entries :], dtype=np.float32).reshape(k, entries)
        for j in range(len(tree)):
            keep = int((mass[j] > 0).sum())  # positives are a prefix: the top-K is sorted (draft_dist drops zeros)
            tree.child_dists[j] = SparseDist(torch.from_numpy(ids[j, :keep].copy()), torch.from_numpy(mass[j, :keep].copy()))
        return tree
