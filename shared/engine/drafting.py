"""Drafting primitives: chain drafting and beam-search candidate trees, batched over requests.

Each drafter is a small state machine over one sequence: ``next_work()`` says
what to run in the next batched draft forward, ``absorb(logits)`` reads the
result. The draft engine runs all drafters of a call in lock-step, one
forward per step for the whole batch.

Chain of k (SmartSpec §2; confidence stop, App. A)::

    step 0: run committed tail → d1      step i: run d_i → d_{i+1}      (d_k is never run)

With a confidence threshold T (Algorithm 3 lines 7-12) a chain drafts while its
newest token's confidence (its draft probability) is above T: the token that
falls to T or below is kept, and drafting stops after it. The length is then a
stopping rule (whether to draft d_{i+1} depends on d_1..d_i only), so the chain
stays lossless under sampling; discarding that token instead would leave every
kept token drawn from q cut to {x : q(x) > T} while acceptance tests against q.

Beam search of depth d, width w (AdaServe §4.3 step 1)::

    step 0: root → top-w children by draft probability          (layer 0, w nodes)
    step s: run layer s-1 → of its w×|V| children keep the w with the
            highest path probability (product of conditional probabilities)

Per-node expansion <e_0, e_1, ...> (SpecInfer's expansion config, e.g. <1,1,3,1,1,1,1,1>)::

    step 0: root → its top-e_0 children by draft probability
    step s: run layer s-1 → the top-e_s children of *every* node in it (e_0·…·e_s nodes)

Beam and expansion trees are point masses (the draft's top choices, no
sampling), so verification is lossless whatever their shape.
"""

from __future__ import annotations

import torch

from shared.engine.runner import Work
from shared.engine.sampling import draft_dist, inverse_cdf, make_generator, probs_from_logits
from shared.engine.sequence import Sequence
from shared.engine.types import SamplingParams, SparseDist, TokenTree


def draft_generator(seq: Sequence) -> torch.Generator:
    """The draft's own random stream for a sequence, independent of the target's."""
    if seq.generator is None:
        seed = seq.sampling.seed
        seq.generator = make_generator(None if seed is None else (seed * 0x9E3779B1 + 1) % 2**63)
    return seq.generator


def _draft_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Draft probabilities used for ranking and confidence: plain softmax when greedy, tempered otherwise."""
    if params.greedy:
        return torch.softmax(logits.float(), dim=-1)
    return probs_from_logits(logits, params)


class ChainDrafter:
    def __init__(self, seq: Sequence, length: int, confidence_threshold: float = 0.0, top_k: int = 64):
        self.seq = seq
        self.length = length
        self.threshold = confidence_threshold
        self.top_k = top_k
        self.tree = TokenTree()
        self.done = length <= 0
        # a sampling chain's uniforms, drawn at once (the static chain's draws: sampled_chain_step.py)
        self.uniforms = None if seq.sampling.greedy or self.done else torch.rand(length, generator=draft_generator(seq))

    def next_work(self) -> Work:
        k = len(self.tree)
        if k == 0:
            return Work(self.seq, want_root=True)
        return Work(self.seq, new_nodes=[(self.tree.token_ids[-1], k - 2)], want_nodes=True)

    def absorb(self, logits: torch.Tensor, vocab_ids: torch.Tensor | None = None) -> None:
        """logits [1, vocab] at the newest row; ``vocab_ids``: the token id of each column (a reduced vocabulary)."""
        logits = logits[-1]  # [vocab]
        params = self.seq.sampling
        row = len(self.tree)  # row j+1 predicts node j's children; row 0 is the root
        if params.greedy:
            probs = _draft_probs(logits, params)  # [vocab]
            column = int(probs.argmax())
            prob = float(probs[column])
            token = column if vocab_ids is None else int(vocab_ids[column])
        else:
            dist = draft_dist(logits, params, self.top_k)
            if vocab_ids is not None:
                dist = SparseDist(token_ids=vocab_ids[dist.token_ids.cpu()], probs=dist.probs)
            column = int(inverse_cdf(dist.probs.float()[None], self.uniforms[row : row + 1])[0])  # q by inverse CDF
            token = int(dist.token_ids[column])
            prob = float(dist.probs[dist.token_ids == token].sum())
        self.tree.token_ids.append(token)
        self.tree.parent_ids.append(row - 1)
        self.tree.draft_probs.append(prob)
        if not params.greedy:
            self.tree.child_dists[row] = dist
        # Algorithm 3 line 8: only requests whose confidence is above T propose again; this token is kept
        unsure = self.threshold > 0 and prob <= self.threshold
        self.done = unsure or len(self.tree) >= self.length


class BeamDrafter:
    def __init__(self, seq: Sequence, depth: int, width: int):
        self.seq = seq
        self.depth = depth
        self.width = width
        self.tree = TokenTree()
        self.path_probs: list[float] = []
        self.beam: list[int] = []  # node indices of the newest layer
        self.num_layers = 0
        self.done = depth <= 0 or width <= 0

    def next_work(self) -> Work:
        if not self.beam:
            return Work(self.seq, want_root=True)
        nodes = [(self.tree.token_ids[j], self.tree.parent_ids[j]) for j in self.beam]
        return Work(self.seq, new_nodes=nodes, want_nodes=True)

    def absorb(self, logits: torch.Tensor, vocab_ids: torch.Tensor | None = None) -> None:
        """logits [1, vocab] for the root, or [w, vocab] for the beam just run; ``vocab_ids`` as for chains."""
        probs = _draft_probs(logits, self.seq.sampling)  # [num_parents, vocab]
        if self.beam:
            parent_path = torch.tensor([self.path_probs[j] for j in self.beam], device=probs.device)  # [num_parents]
            parents = self.beam
        else:
            parent_path = torch.ones(1, device=probs.device)
            parents = [-1]
        scores = parent_path[:, None] * probs  # [num_parents, vocab] path probability of each child
        top_scores, flat = scores.flatten().topk(min(self.width, scores.numel()))
        vocab = probs.shape[-1]
        picked = probs.flatten()[flat].tolist()  # one device read for the whole layer
        self.beam = []
        for score, index, prob in zip(top_scores.tolist(), flat.tolist(), picked):
            b, token = divmod(index, vocab)
            token = token if vocab_ids is None else int(vocab_ids[token])
            self.beam.append(len(self.tree))
            self.tree.token_ids.append(token)
            self.tree.parent_ids.append(parents[b])
            self.tree.draft_probs.append(prob)
            self.path_probs.append(score)
        self.num_layers += 1
        self.done = self.num_layers >= self.depth


class ExpansionDrafter:
    """SpecInfer's tree: the top-``expansion[d]`` children (by draft probability) of every node at depth d."""

    def __init__(self, seq: Sequence, expansion: tuple[int, ...]):
        self.seq = seq
        self.expansion = tuple(expansion)
        self.tree = TokenTree()
        self.layer: list[int] = []  # node indices of the newest layer
        self.depth = -1  # of the newest layer (0: the root's children)
        self.done = not self.expansion

    def next_work(self) -> Work:
        if not self.tree.token_ids:
            return Work(self.seq, want_root=True)
        nodes = [(self.tree.token_ids[j], self.tree.parent_ids[j]) for j in self.layer]
        return Work(self.seq, new_nodes=nodes, want_nodes=True)

    def absorb(self, logits: torch.Tensor, vocab_ids: torch.Tensor | None = None) -> None:
        """logits [1, vocab] for the root, or [num_layer_nodes, vocab] for the layer just run."""
        probs = _draft_probs(logits, self.seq.sampling)  # [num_parents, vocab]
        parents = self.layer if self.tree.token_ids else [-1]
        self.depth += 1
        k = min(self.expansion[self.depth], probs.shape[-1])
        top_probs, top_ids = probs.topk(k, dim=-1)  # [num_parents, k] each, most probable first
        self.layer = []
        for parent, row_probs, row_ids in zip(parents, top_probs.tolist(), top_ids.tolist()):
            for prob, column in zip(row_probs, row_ids):
                token = column if vocab_ids is None else int(vocab_ids[column])
                self.layer.append(len(self.tree))
                self.tree.token_ids.append(token)
                self.tree.parent_ids.append(parent)
                self.tree.draft_probs.append(prob)
        self.done = self.depth + 1 >= len(self.expansion)
