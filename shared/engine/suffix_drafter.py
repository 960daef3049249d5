"""Model-free drafting from suffix trees (SuffixDecoding, Oliaro et al., arXiv 2411.04975), behind the draft
engine's interface.

Two kinds of tree (suffix_tree.py), both cut at ``max_depth`` tokens:

    per request   prompt + output of one live sequence, updated as tokens commit (rollback: undo log)
    global        the outputs of recently released sequences (all requests), at most ``global_tokens``
                  tokens: the oldest outputs are evicted first

Each speculate call, for each tree (§4):

1. *Pattern match*: the longest suffix of the sequence (p <= ``max_match`` tokens) that occurs in the
   tree with something after it.
2. *Speculation tree*: grown best-first from that node. A candidate's score is the product of the
   empirical conditional frequencies on its path, C(child) / sum of C(siblings); candidates below
   ``min_prob`` are dropped. At most MAX_SPEC = floor(alpha * p) nodes (§4: longer matches earn longer
   speculation), and no more than the request's shape: a chain of ``chain_len`` (the best path, one node
   per depth) or a tree of ``tree_depth`` x ``tree_width`` (at most ``tree_width`` nodes per depth).
3. The tree with the higher score (the sum of its nodes' scores: the expected number of accepted
   tokens if the frequencies were the target's probabilities) wins; the per-request one on ties.

``draft_probs[i]`` is node i's conditional frequency given its parent. Every node is a deterministic
pick (``child_dists`` empty, point masses), so acceptance stays lossless under greedy and sampling
alike (acceptance.py), as for the n-gram draft.
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from pydantic import BaseModel, Field, model_validator

from shared.engine import spec_checks
from shared.engine.spec_checks import expansion_widths
from shared.engine.errors import DuplicateSequenceError, InvalidRequestError, UnknownSequenceError
from shared.engine.suffix_tree import CorpusTree, Position, SequenceTree, SuffixTree
from shared.engine.types import ForwardCost, PrefillItem, SamplingParams, SpecItem, TokenTree


class SuffixConfig(BaseModel):
    """Suffix drafting settings (``TANDEM_MODEL=suffix:KEY=VALUE,...`` on the draft service)."""

    max_depth: int = Field(
        24, ge=2, le=256, description="Depth of both trees: a matched pattern plus what is proposed after it."
    )
    max_match: int = Field(
        12, ge=1, description="Longest pattern (suffix of the sequence) matched; < max_depth, so that at least "
        "max_depth - max_match tokens can follow it.",
    )
    alpha: float = Field(
        2.0, gt=0.0, le=64.0, description="MAX_SPEC = floor(alpha * p): most tokens proposed after a match of p tokens "
        "(the reference implementation uses 1; verifying a few more tokens is nearly free on CPU).",
    )
    min_prob: float = Field(
        0.1, ge=0.0, le=1.0, description="Smallest path score (product of conditional frequencies) proposed."
    )
    global_tokens: int = Field(
        65536, ge=0, description="Most output tokens the global tree holds (oldest outputs evicted first); 0 = no "
        "global tree.",
    )

    @model_validator(mode="after")
    def _match_below_depth(self) -> SuffixConfig:
        if self.max_match >= self.max_depth:
            raise ValueError(f"max_match ({self.max_match}) must be below max_depth ({self.max_depth})")
        return self


def propose(
    tree: SuffixTree,
    pos: Position,
    *,
    budget: int,
    depth: int,
    width: int,
    min_prob: float = 0.0,
    min_cond: float = 0.0,
    expansion: Sequence[int] = (),
) -> tuple[TokenTree, float]:
    """Best-first speculation tree from ``pos``: (tree, score = sum of its nodes' path scores).

    At most ``budget`` nodes, ``depth`` levels and ``width`` nodes per level; a chain is width 1 (the
    greedy best path). ``min_prob`` bounds the path score, ``min_cond`` the conditional frequency.
    ``expansion`` (SpecInfer's, e.g. <1,1,3,1>): at most expansion[d] children per node at depth d instead
    of ``width`` per level, the most frequent continuations of each node.
    """
    out = TokenTree()
    score = 0.0
    if budget <= 0 or depth <= 0 or width <= 0:
        return out, score
    per_level = [0] * depth
    per_parent: dict[int, int] = {}  # children taken per node (-1: the root), with an expansion
    tie = itertools.count()
    # (-path score, -stamp, tie, token, conditional frequency, position after it, parent node, level)
    heap: list[tuple] = []

    def push(at: Position, parent: int, level: int, path: float) -> None:
        kids = tree.continuations(at)
        total = sum(count for _, count, _, _ in kids)
        for token, count, stamp, after in kids:
            cond = count / total
            if path * cond >= min_prob and cond >= min_cond:
                heapq.heappush(heap, (-path * cond, -stamp, next(tie), token, cond, after, parent, level))

    push(pos, -1, 0, 1.0)
    while heap and len(out) < budget:
        neg, _, _, token, cond, after, parent, level = heapq.heappop(heap)
        if expansion:
            if per_parent.get(parent, 0) >= expansion[level]:
                continue  # the node has its expansion's children: drop the candidate and everything under it
            per_parent[parent] = per_parent.get(parent, 0) + 1
        elif per_level[level] >= width:
            continue  # this depth is full: drop the candidate and everything under it
        per_level[level] += 1
        node = len(out)
        out.token_ids.append(token)
        out.parent_ids.append(parent)
        out.draft_probs.append(cond)
        score -= neg
        if level + 1 < depth:
            push(after, node, level + 1, -neg)
    return out, score


@dataclass
class SuffixSequence:
    seq_id: str
    tree: SequenceTree  # prompt + output
    num_prompt: int  # tokens given at prefill; the rest is output, which the global tree gets at release
    sampling: SamplingParams = field(default_factory=SamplingParams)

    @property
    def tokens(self) -> list[int]:
        return self.tree.tokens


class SuffixStore:
    """What the suffix draft holds: one tree per live sequence, the global tree. Shaped like TokenStore."""

    def __init__(self, vocab_size: int | None = None, config: SuffixConfig | None = None):
        self.vocab_size = vocab_size
        self.config = config or SuffixConfig()
        self.seqs: dict[str, SuffixSequence] = {}
        self.corpus = CorpusTree(max_depth=self.config.max_depth, max_tokens=self.config.global_tokens)
        self._next_key = 0  # the global tree's keys: a sequence id may come back (preemption, restart)

    def add(self, seq_id: str, token_ids: list[int], sampling: SamplingParams | None = None) -> SuffixSequence:
        if seq_id in self.seqs:
            raise DuplicateSequenceError(f"sequence {seq_id!r} is already live")
        tree = SequenceTree(token_ids, max_depth=self.config.max_depth)
        seq = SuffixSequence(seq_id, tree, len(token_ids), sampling or SamplingParams())
        self.seqs[seq_id] = seq
        return seq

    def get(self, seq_id: str) -> SuffixSequence:
        seq = self.seqs.get(seq_id)
        if seq is None:
            raise UnknownSequenceError(f"unknown sequence {seq_id!r}")
        return seq

    def release(self, seq_id: str) -> None:
        """Forget the sequence; its output joins the global tree (evicting the oldest outputs over the cap)."""
        seq = self.seqs.pop(seq_id, None)
        if seq is None:
            raise UnknownSequenceError(f"unknown sequence {seq_id!r}")
        output = seq.tokens[seq.num_prompt :]
        if output and self.config.global_tokens:
            self.corpus.add(self._next_key, output)
            self._next_key += 1

    def check_tokens(self, token_ids: list[int], *, what: str) -> None:
        if self.vocab_size is None:
            return
        for t in token_ids:
            if not (0 <= t < self.vocab_size):
                raise InvalidRequestError(f"{what}: token id {t} is outside the vocabulary [0, {self.vocab_size})")

    def check_accounting(self) -> None:
        """No KV cache; the global tree holds what it says, within its cap, and nothing once emptied."""
        corpus = self.corpus
        held = sum(len(s) for s in corpus.seqs.values())
        if held != corpus.num_tokens or held > corpus.max_tokens:
            raise AssertionError(
                f"global suffix tree holds {held} tokens, counts {corpus.num_tokens}, cap {corpus.max_tokens}"
            )
        if not corpus.seqs and (corpus.num_nodes != 1 or corpus.root.children):
            raise AssertionError(f"empty global suffix tree still has {corpus.num_nodes - 1} nodes")


class SuffixDraftEngine:
    """DraftEngine's interface (prefill / speculate / release, ``costs``) with suffix trees instead of a model.

    ``vocab_size`` (the target's) lets bad token ids fail here as they would on a model draft; None skips
    that check.
    """

    def __init__(
        self,
        vocab_size: int | None = None,
        config: SuffixConfig | None = None,
        *,
        max_chain: int = 32,
        max_depth: int = 16,
        max_width: int = 16,
    ):
        self.runner = SuffixStore(vocab_size, config)
        self.config = self.runner.config
        self.max_chain = max_chain
        self.max_depth = max_depth
        self.max_width = max_width
        self.costs: list[ForwardCost] = []  # no model forwards; one entry timing the lookups of the last call

    def prefill(self, items: list[PrefillItem]) -> None:
        items = [p for p in items if not p.resume]  # a chunked prefill's later chunks: the first one took it all
        spec_checks.check_distinct_prefill(items)
        for p in items:
            spec_checks.check_prefill_item(self.runner, p)
        start = time.perf_counter()
        for p in items:
            self.runner.add(p.seq_id, p.prompt_ids, p.sampling)
        self.costs = [_cost(start, len(items), sum(len(p.prompt_ids) for p in items))]

    def release(self, seq_ids: list[str]) -> None:
        for seq_id in seq_ids:
            self.runner.release(seq_id)

    def _validate(self, items: list[SpecItem]) -> None:
        spec_checks.check_distinct(items)
        for it in items:
            seq = self.runner.get(it.seq_id)
            self.runner.check_tokens(it.new_tokens, what=f"sequence {it.seq_id!r}")
            if not (0 <= it.rollback < len(seq.tokens)):
                raise InvalidRequestError(f"sequence {it.seq_id!r}: cannot roll back {it.rollback} committed tokens")
            spec_checks.check_shape(it, max_chain=self.max_chain, max_depth=self.max_depth, max_width=self.max_width)

    def speculate(self, items: list[SpecItem]) -> list[TokenTree]:
        self._validate(items)  # before anything changes: a bad item leaves every sequence as it was
        start = time.perf_counter()
        trees = []
        for it in items:
            seq = self.runner.get(it.seq_id)
            seq.tree.truncate(it.rollback)  # an optimistic prefix that failed (frontier pipelining)
            seq.num_prompt = min(seq.num_prompt, len(seq.tokens))
            seq.tree.extend(it.new_tokens)
            trees.append(self._propose(seq, it))
        self.costs = [_cost(start, len(items), sum(len(t) for t in trees))]
        return trees

    def _propose(self, seq: SuffixSequence, it: SpecItem) -> TokenTree:
        cfg = self.config
        if it.tree_depth:
            depth, width = it.tree_depth, it.tree_width
            limit, min_cond = depth * width, 0.0
            if it.tree_expansion:
                limit = sum(expansion_widths(it.tree_expansion))
        else:  # a chain is the best path, cut where a conditional frequency falls below the threshold (its proposals
            # are point masses fixed by the context, so any such rule stays lossless)
            depth, width = it.chain_len, 1
            limit, min_cond = it.chain_len, it.confidence_threshold
        if limit <= 0:
            return TokenTree()
        best, best_score = TokenTree(), 0.0
        matches = [(seq.tree, seq.tree.own_match(cfg.max_match))]
        if self.runner.corpus.seqs:
            matches.append((self.runner.corpus, self.runner.corpus.longest_match(seq.tokens, cfg.max_match)))
        for tree, match in matches:
            if match is None:
                continue
            p, pos = match
            budget = min(limit, int(cfg.alpha * p + 1e-9))  # MAX_SPEC = alpha * p
            proposal, score = propose(
                tree, pos, budget=budget, depth=depth, width=width, min_prob=cfg.min_prob, min_cond=min_cond,
                expansion=it.tree_expansion,
            )
            if score > best_score:
                best, best_score = proposal, score
        return best


def _cost(start: float, num_seqs: int, num_tokens: int) -> ForwardCost:
    return ForwardCost(
        duration_s=time.perf_counter() - start,
        num_seqs=num_seqs,
        num_batched_tokens=num_tokens,
        num_context_tokens=0,
    )
