"""Model-free drafting: prompt lookup (SmartSpec's PTL), served through the draft engine's interface.

The guess is that text repeats: if the last n tokens occurred earlier in the
sequence (prompt or output), what followed them then is proposed now::

    tokens:  ... the  cat  sat  on  the  mat . The  cat  sat  [?]
                      ^^^^^^^^^ earlier match (n = 2: "cat sat")
    proposal:                   on  the  mat        (the k tokens after it)

n runs from ``max_ngram`` down to ``min_ngram``; the longest suffix with an
earlier occurrence wins, and among its occurrences the most recent. A tree of
width w keeps up to w distinct continuations, longest and most recent match
first, merged into a trie::

    row 0 ─┬─ on ── the ── mat        (match 1)
           └─ by ── the ── door       (match 2)

Every node is a deterministic pick (a point mass, ``child_dists`` empty), so
acceptance stays lossless under greedy and sampling alike (see acceptance.py).
``draft_probs`` are the share of the matches under a node's parent that
continue with the node's token: 1.0 along a chain, a ranking signal in trees.

Lookups are O(1) per n: each sequence keeps, for every n, the start positions
of each n-gram, updated as tokens are committed (append-only).
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field

from shared.engine import spec_checks
from shared.engine.errors import DuplicateSequenceError, InvalidRequestError, UnknownSequenceError
from shared.engine.types import ForwardCost, PrefillItem, SamplingParams, SpecItem, TokenTree


class NgramIndex:
    """The token history of one sequence, with the start positions of all its n-grams (min_n..max_n)."""

    def __init__(self, token_ids: list[int], *, min_ngram: int = 1, max_ngram: int = 4):
        if not (1 <= min_ngram <= max_ngram):
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        self.min_ngram = min_ngram
        self.max_ngram = max_ngram
        self.token_ids: list[int] = []
        # starts[n][gram] = ascending start positions of that n-gram in token_ids
        self.starts: dict[int, dict[tuple[int, ...], list[int]]] = {
            n: defaultdict(list) for n in range(min_ngram, max_ngram + 1)
        }
        self.extend(token_ids)

    def __len__(self) -> int:
        return len(self.token_ids)

    def extend(self, token_ids: list[int]) -> None:
        for token in token_ids:
            self.token_ids.append(token)
            end = len(self.token_ids)
            for n, table in self.starts.items():
                if end >= n:
                    table[tuple(self.token_ids[end - n : end])].append(end - n)

    def matches(self, max_matches: int) -> list[tuple[int, int]]:
        """Up to ``max_matches`` earlier occurrences of a suffix, as (n, start) pairs.

        Longest n first, then most recent. An occurrence only counts when at
        least one token follows it, which rules out the suffix matching itself.
        """
        found: list[tuple[int, int]] = []
        seen_ends: set[int] = set()  # a shorter n-gram ending where a longer one did adds nothing new
        length = len(self.token_ids)
        for n in range(min(self.max_ngram, length - 1), self.min_ngram - 1, -1):
            starts = self.starts[n].get(tuple(self.token_ids[length - n :]))
            if not starts:
                continue
            for start in reversed(starts):
                end = start + n
                if end >= length or end in seen_ends:
                    continue  # the suffix itself, or an occurrence already proposed by a longer n
                seen_ends.add(end)
                found.append((n, start))
                if len(found) >= max_matches:
                    return found
        return found

    def continuation(self, start: int, n: int, k: int) -> list[int]:
        end = start + n
        return self.token_ids[end : end + k]


def propose_chain(index: NgramIndex, k: int) -> TokenTree:
    """The k tokens after the best match (fewer when the match sits near the end; none without a match)."""
    if k <= 0:
        return TokenTree()
    found = index.matches(1)
    if not found:
        return TokenTree()
    n, start = found[0]
    tokens = index.continuation(start, n, k)
    return TokenTree.chain(tokens, [1.0] * len(tokens))


def propose_tree(index: NgramIndex, depth: int, width: int) -> TokenTree:
    """Up to ``width`` distinct continuations of length <= ``depth``, merged into a trie."""
    tree = TokenTree()
    if depth <= 0 or width <= 0:
        return tree
    # Ask for extra matches: several occurrences often continue identically and merge into one branch.
    found = index.matches(4 * width)
    children: dict[tuple[int, int], int] = {}  # (parent node, token) -> node
    counts: list[int] = []  # matches passing through each node
    parent_counts: dict[int, int] = defaultdict(int)  # matches passing through each parent row (-1: root)
    leaves: set[tuple[int, ...]] = set()
    for n, start in found:
        path = tuple(index.continuation(start, n, depth))
        if not path:
            continue
        covered = any(leaf[: len(path)] == path for leaf in leaves)  # adds no node
        extended = {leaf for leaf in leaves if path[: len(leaf)] == leaf}  # a shorter branch grows
        if not covered and not extended and len(leaves) >= width:
            continue  # the tree is full; only matches that reinforce existing branches still count
        if not covered:
            leaves -= extended
            leaves.add(path)
        parent = -1
        for token in path:
            parent_counts[parent] += 1
            node = children.get((parent, token))
            if node is None:
                node = len(tree.token_ids)
                children[(parent, token)] = node
                tree.token_ids.append(token)
                tree.parent_ids.append(parent)
                counts.append(0)
            counts[node] += 1
            parent = node
    tree.draft_probs = [counts[i] / parent_counts[p] for i, p in enumerate(tree.parent_ids)]
    return tree


@dataclass
class NgramSequence:
    seq_id: str
    index: NgramIndex
    sampling: SamplingParams = field(default_factory=SamplingParams)


class TokenStore:
    """What a model-free draft holds per sequence: its tokens. Named and shaped like ModelRunner's sequence side."""

    def __init__(self, vocab_size: int | None = None, *, min_ngram: int = 1, max_ngram: int = 4):
        self.vocab_size = vocab_size
        self.min_ngram = min_ngram
        self.max_ngram = max_ngram
        self.seqs: dict[str, NgramSequence] = {}

    def add(self, seq_id: str, token_ids: list[int], sampling: SamplingParams | None = None) -> NgramSequence:
        if seq_id in self.seqs:
            raise DuplicateSequenceError(f"sequence {seq_id!r} is already live")
        index = NgramIndex(token_ids, min_ngram=self.min_ngram, max_ngram=self.max_ngram)
        seq = NgramSequence(seq_id, index, sampling or SamplingParams())
        self.seqs[seq_id] = seq
        return seq

    def get(self, seq_id: str) -> NgramSequence:
        seq = self.seqs.get(seq_id)
        if seq is None:
            raise UnknownSequenceError(f"unknown sequence {seq_id!r}")
        return seq

    def release(self, seq_id: str) -> None:
        if self.seqs.pop(seq_id, None) is None:
            raise UnknownSequenceError(f"unknown sequence {seq_id!r}")

    def check_tokens(self, token_ids: list[int], *, what: str) -> None:
        if self.vocab_size is None:
            return
        for t in token_ids:
            if not (0 <= t < self.vocab_size):
                raise InvalidRequestError(f"{what}: token id {t} is outside the vocabulary [0, {self.vocab_size})")

    def check_accounting(self) -> None:
        """Nothing to leak: no KV cache."""


class NgramDraftEngine:
    """DraftEngine's interface (prefill / speculate / release, ``costs``) with prompt lookup instead of a model.

    ``vocab_size`` (the target's) lets bad token ids fail here as they would
    on a model draft; None skips that check.
    """

    def __init__(
        self,
        vocab_size: int | None = None,
        *,
        min_ngram: int = 1,
        max_ngram: int = 4,
        max_chain: int = 32,
        max_depth: int = 16,
        max_width: int = 16,
    ):
        self.runner = TokenStore(vocab_size, min_ngram=min_ngram, max_ngram=max_ngram)
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
        self.costs = [self._cost(start, len(items), sum(len(p.prompt_ids) for p in items))]

    def release(self, seq_ids: list[str]) -> None:
        for seq_id in seq_ids:
            self.runner.release(seq_id)

    def _validate(self, items: list[SpecItem]) -> None:
        spec_checks.check_distinct(items)
        for it in items:
            self.runner.get(it.seq_id)
            self.runner.check_tokens(it.new_tokens, what=f"sequence {it.seq_id!r}")
            spec_checks.check_shape(it, max_chain=self.max_chain, max_depth=self.max_depth, max_width=self.max_width)

    def speculate(self, items: list[SpecItem]) -> list[TokenTree]:
        self._validate(items)
        start = time.perf_counter()
        trees = []
        for it in items:
            index = self.runner.get(it.seq_id).index
            if it.rollback:
                raise InvalidRequestError(f"sequence {it.seq_id!r}: the n-gram draft cannot roll back tokens")
            index.extend(it.new_tokens)
            if it.tree_depth:
                trees.append(propose_tree(index, it.tree_depth, it.tree_width))
            else:
                # A prompt-lookup draft is certain of nothing, so a confidence threshold never stops it early.
                trees.append(propose_chain(index, it.chain_len))
        self.costs = [self._cost(start, len(items), sum(len(t) for t in trees))]
        return trees

    @staticmethod
    def _cost(start: float, num_seqs: int, num_tokens: int) -> ForwardCost:
        return ForwardCost(
            duration_s=time.perf_counter() - start,
            num_seqs=num_seqs,
            num_batched_tokens=num_tokens,
            num_context_tokens=0,
        )
