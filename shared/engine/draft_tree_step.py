"""Beam and expansion draft trees with one host read: every level's forward in one body, chosen on the device.

AdaServe's beam of depth d and width w (§4.3 step 1) and SpecInfer's per-node expansion
<e_0, ..., e_{d-1}> (drafting.py) are d forwards: the root's (the fed committed tokens),
then one per level 0..d-2, each running that level's nodes. Only the tokens and (for a
beam) the parents are data-dependent; the positions (n + level) and the KV slots
(n + node index) follow from the level sizes, so the body derives them from forward 0's
segments (committed count n, block table) on the device::

    forward 0    fed tokens -> root probs [B, V] -> level 0: top-w (beam) / top-e_0 (expansion)
    forward s    level s-1's L nodes at n + s - 1, each seeing the committed prefix and its ancestors
                 (ancestor bits [B, M, M] kept on the device: a child's row is its parent's plus itself)
                 -> probs [B, L, V] -> level s: a beam keeps the w children of highest path probability
                 over all L x V; an expansion keeps the top-e_s children of every node
    one read     [B, 3M]: node tokens, parents, draft probabilities (M = every level's nodes)

The same tokens, parents and probabilities as the eager drafters (greedy sequences: the
draft's plain softmax), and the same KV state after: levels 0..d-2 are the sequence's
tree nodes (the last level is never run). Sampled sequences (tempered probabilities),
grammars and mixed shapes in one call take the eager drafters.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from shared.engine import graph_buckets, staged_columns, step_plan
from shared.engine.device_sampling import batched_probs
from shared.engine.sequence import Sequence
from shared.engine.static_draft import StaticDraft
from shared.engine.step_plan import AfterFirstForward, StepShape
from shared.engine.types import ForwardCost, TokenTree

MAX_GRAPH_NODES = 64  # largest tree a CUDA graph is captured for (larger trees run the same body eagerly)


@dataclass(frozen=True)
class TreeShape(AfterFirstForward):
    """Forward 0's shape and the tree's levels: a beam (every level ``width`` nodes) or an expansion."""

    first: StepShape  # its kv_cap covers the last level run
    beam: bool
    fan: tuple[int, ...]  # beam: (w,) * d; expansion: (e_0, .., e_{d-1})
    filters: tuple[bool, bool, bool] | None = None  # a request samples: which filters any wants (staged_columns)

    @property
    def levels(self) -> list[int]:
        return level_sizes(self.beam, self.fan)

    @property
    def nodes(self) -> int:  # M
        return sum(self.levels)

    @property
    def nodes_run(self) -> int:  # levels 0..d-2: the nodes whose KV the call writes
        return sum(self.levels[:-1])

    @property
    def size(self) -> int:  # forward 0's plan, then the sampling columns when a request samples
        return self.first.size + (0 if self.filters is None else staged_columns.NUM * self.first.batch)

    @property
    def chains(self) -> bool:
        return False


@dataclass
class TreeInput:
    """What a tree's staging holds beyond the step plans: each request's sampling parameters."""

    steps: list[step_plan.SeqStep]
    params: list  # SamplingParams per sequence

    def __len__(self) -> int:
        return len(self.steps)


def level_sizes(beam: bool, fan: tuple[int, ...]) -> list[int]:
    """Nodes per level, L_0 .. L_{d-1}: a beam's width each; an expansion's running product."""
    return list(fan) if beam else [math.prod(fan[: s + 1]) for s in range(len(fan))]


def tree_fan(depth: int, width: int, expansion: tuple[int, ...]) -> tuple[bool, tuple[int, ...]]:
    """(beam?, fan) of a SpecItem's tree: an expansion when it has one, else a beam of ``width`` per level."""
    return (False, tuple(expansion)) if expansion else (True, (width,) * depth)


class DraftTreeStep(StaticDraft):
    what = "draft tree"

    def applies(self, seqs: list[Sequence]) -> bool:
        """Greedy or sampling sequences (a tree's children are the top choices either way) with no grammar."""
        return bool(seqs) and all(s.grammar is None and not len(s.tree) for s in seqs)

    def shape_of(self, steps: list[step_plan.SeqStep], beam: bool, fan: tuple[int, ...], filters=None) -> TreeShape:
        first = step_plan.shape_of(steps, self.runner.cache.block_size, chains=True)
        kv = max(len(s.token_ids) for s in steps) + sum(level_sizes(beam, fan)[:-1])
        return TreeShape(StepShape(first.batch, first.rows, first.q, first.nodes, first.blocks, kv, True), beam, fan, filters)

    # the graph pool's view of a step kind (cuda_graphs.GraphPool)
    def bucket(self, shape: TreeShape) -> TreeShape | None:
        if shape.nodes > MAX_GRAPH_NODES:
            return None
        first = graph_buckets.bucket_for(shape.first, self.runner.cache.block_size, self.runner.max_context)
        return None if first is None else TreeShape(first, shape.beam, shape.fan, shape.filters)

    def build(self, inp: TreeInput | list, shape: TreeShape, scratch_block: int = 0) -> np.ndarray:
        steps = inp.steps if isinstance(inp, TreeInput) else inp
        flat = np.empty(shape.size, dtype=np.int64)
        flat[: shape.first.size] = step_plan.build(steps, shape.first, self.runner.cache.block_size, scratch_block)
        if shape.filters is not None:
            params = inp.params if isinstance(inp, TreeInput) else []
            staged_columns.fill(flat[shape.first.size :], params, self.columns)
        return flat

    @torch.inference_mode()  # the trees' ancestor bits may be inference tensors (made in an eager forward)
    def run(self, seqs: list[Sequence], beam: bool, fan: tuple[int, ...]) -> tuple[list[TokenTree], list[ForwardCost]]:
        """Draft the tree ``(beam, fan)`` (``tree_fan``) for every sequence; trees and d forward costs."""
        levels = level_sizes(beam, fan)
        params = [s.sampling for s in seqs]
        filters = None if all(p.greedy for p in params) else staged_columns.filters(params, self.columns)
        rows, shape, seconds = self._run(seqs, sum(levels[:-1]), lambda steps: self.shape_of(steps, beam, fan, filters),
                                         lambda steps: TreeInput(steps, params))  # fmt: skip
        m = shape.nodes
        trees = []
        for seq, row in zip(seqs, rows):
            tokens, parents = [int(t) for t in row[:m]], [int(p) for p in row[m : 2 * m]]
            seq.tree.add_nodes(tokens[: shape.nodes_run], parents[: shape.nodes_run])
            trees.append(TokenTree(tokens, parents, row[2 * m :]))
        return trees, self.costs(seconds, len(fan), len(seqs), shape.first.rows, [len(seqs) * n for n in levels[:-1]])

    # what a level runs (eagle/static_tree.py feeds the head its parents' outputs)
    def _root_logits(self, seg: dict[str, torch.Tensor], first: StepShape) -> torch.Tensor:
        """Forward 0: the root's logits [B, V]."""
        return self._logits(self._root_hidden(seg, first.kv_cap))

    def _level_logits(self, ids: torch.Tensor, pos: torch.Tensor, above: torch.Tensor | None) -> torch.Tensor:
        """A level's forward: ids, pos [B * L] -> logits [B * L, V]; ``above`` [B, L]: each node's parent within
        the level before (None: the root)."""
        return self._logits(self._decode(ids, pos))

    @staticmethod
    def _tree_probs(logits: torch.Tensor, columns: dict | None) -> torch.Tensor:
        """logits [B, R, V] -> drafting._draft_probs per request: the plain softmax when greedy, else its own
        temperature, top-k, top-p and min-p (batched_probs)."""
        soft = torch.softmax(logits, dim=-1)  # [B, R, V]
        if columns is None:
            return soft
        return torch.where(columns["greedy"][:, None, None], soft, batched_probs(logits, columns))

    def _ids(self, columns: torch.Tensor) -> torch.Tensor:
        """Token ids of the probabilities' columns (the identity but for a reduced vocabulary)."""
        return columns

    def _level_outputs(self, shape: TreeShape) -> None:
        """Keep what the levels' forwards made beside the tree (an EAGLE head's outputs)."""

    def body(self, flat: torch.Tensor, shape: TreeShape) -> torch.Tensor:
        """The captured region: staged forward 0 [size] -> [B, 3M] float64 (tokens, parents, probabilities)."""
        first, batch, levels = shape.first, shape.batch, shape.levels
        m, run, device = shape.nodes, max(1, shape.nodes_run), flat.device
        seg = {name: flat[a : a + n].view(dims) for name, (a, n, dims) in first.offsets().items()}
        n, table = seg["ncommit"], seg["table"]  # [B], [B, NB]
        bs = self.runner.cache.block_size
        columns = None if shape.filters is None else staged_columns.read(flat[first.size : shape.size], shape.filters)
        probs = self._tree_probs(self._root_logits(seg, first)[:, None], columns)  # [B, 1, V]: the root, level -1
        path = torch.ones(batch, 1, device=device)  # [B, 1] path probability of each node of the last level
        anc = torch.zeros(batch, m, m, dtype=torch.long, device=device)  # [B, M, M] ancestor-or-self bits
        tokens, parents, picked = [], [], []
        offset = 0  # first node index of the level being chosen
        for s, size in enumerate(levels):
            if s:  # run level s-1 (its nodes at offset - L .. offset - 1) for the probabilities of its children
                prev = levels[s - 1]
                base = offset - prev
                logical = n[:, None] + base + torch.arange(prev, device=device)  # [B, L] KV positions
                slots = table.gather(1, logical // bs) * bs + logical % bs  # [B, L]
                rows = torch.arange(batch * prev, device=device)  # [B * L] packed rows
                self.attn.prepare({"table": table, "prefix": n[:, None].expand(batch, prev), "ncommit": n,
                                   "kvlen": n + offset, "tree": anc[:, base:offset, :run], "q_index": rows.view(batch, prev),
                                   "unpad": rows, "new_slots": slots.reshape(-1)}, first.kv_cap)  # fmt: skip
                pos = (n + s - 1)[:, None].expand(batch, prev).reshape(-1)  # [B * L] position n + depth
                above = parents[-1] - (base - levels[s - 2]) if s > 1 else None  # [B, L] parent within its level
                logits = self._level_logits(tokens[-1].reshape(-1), pos, above).view(batch, prev, -1)  # [B, L, V]
                probs = self._tree_probs(logits, columns)
            width = probs.shape[1]  # L: nodes of the level just run (1: the root)
            vocab = probs.shape[2]
            if shape.beam:  # the w children of highest path probability over all L x V
                scores, flat_ids = (path[:, :, None] * probs).flatten(1).topk(size, dim=-1)  # [B, w] each
                token, parent = flat_ids % vocab, flat_ids // vocab  # [B, w]
                prob = probs.flatten(1).gather(1, flat_ids)  # [B, w]
                path = scores
            else:  # the top-e_s children of every node of the level, node by node
                prob, token = probs.topk(size // width, dim=-1)  # [B, L, e_s] each
                parent = torch.arange(width, device=device)[None, :, None].expand_as(token)  # [B, L, e_s]
                prob, token, parent = prob.flatten(1), token.flatten(1), parent.flatten(1)  # [B, L_s]
            parent = parent + (offset - width) if s else torch.full_like(parent, -1)  # tree indices, -1 the root
            own = torch.zeros(size, m, dtype=torch.long, device=device)  # [L_s, M]
            own[:, offset : offset + size] = torch.eye(size, dtype=torch.long, device=device)
            if s:
                anc[:, offset : offset + size] = anc.gather(1, parent[:, :, None].expand(batch, size, m)) + own
            else:
                anc[:, :size] = own
            tokens.append(self._ids(token))
            parents.append(parent)
            picked.append(prob)
            offset += size
        self._level_outputs(shape)
        return torch.cat([torch.cat(tokens, 1).double(), torch.cat(parents, 1).double(),
                          torch.cat(picked, 1).double()], 1)  # fmt: skip  [B, 3M]
