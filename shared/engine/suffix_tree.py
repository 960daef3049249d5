"""Suffix trees over token sequences, cut at a fixed depth: the structure behind suffix drafting.

SuffixDecoding (Oliaro et al., arXiv 2411.04975, §3) keeps every suffix of
every sequence it holds as a path from the root, cut after ``max_depth``
tokens; a node counts the occurrences of the string on its path. What followed
a pattern before is then the children of the node the pattern leads to::

    tokens  a b c a b d a b                  (max_depth 3, counts in brackets)

    root ─┬─ a[3] ── b[3] ─┬─ c[1]           pattern "a b" -> node b[3]: followed once by c,
          │                └─ d[1]           once by d (the third "a b" is the sequence's end)
          ├─ b[3] ─┬─ c[1] ── a[1]
          │        └─ d[1] ── a[1]
          ├─ c[1] ── a[1] ── b[1]
          └─ d[1] ── a[1] ── b[1]

Memory: a depth-D suffix trie has up to D nodes per token, and most of them
lie on paths taken once. So a count-1 node keeps no children: it points into
the sequence that holds its one occurrence (``src``, ``end``) and its
continuation is read from there, an *implicit tail*::

    b[3] ── c[1]  src = the tokens, end = 3: continues "a b" (tokens[3:], up to the depth)

A node gets explicit children when a second occurrence passes through it
(``_materialise``). The node count is then about the number of distinct
substrings of length <= D that occur at least twice, plus one node per branch
off them; never more than D per token (copy-heavy text comes closest).

Two ways to fill one:

* ``SequenceTree``: one growing sequence (a request's prompt and output).
  ``extend`` appends in O(D) per token; ``truncate`` undoes the last appends
  from an undo log (a rollback of optimistic tokens).
* ``CorpusTree``: whole sequences added and removed (the global tree over
  recent outputs, FIFO under a token cap).

Positions: a pattern ends either on an explicit node or ``off`` tokens into the
implicit tail below a count-1 node; ``Position = (node, off)``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

_EMPTY: list[int] = []


class Node:
    __slots__ = ("count", "depth", "children", "src", "end", "stamp")

    def __init__(self, depth: int, src: list[int], end: int, stamp: int) -> None:
        self.count = 1  # occurrences of the node's string (the path from the root)
        self.depth = depth
        self.children: dict[int, Node] | None = None  # explicit from the second occurrence on (always on the root)
        self.src = src  # one occurrence is src[end - depth : end]; a count-1 node continues at src[end]
        self.end = end
        self.stamp = stamp  # when an occurrence last reached the node: recency breaks count ties


Position = tuple[Node, int]  # (node, tokens into its implicit tail); off > 0 only on a count-1 node


class SuffixTree:
    """The shared part: a root, reading (match, continuations) and the append step."""

    def __init__(self, max_depth: int) -> None:
        if max_depth < 1:
            raise ValueError(f"max_depth must be >= 1, got {max_depth}")
        self.max_depth = max_depth
        self._reset()

    def _reset(self) -> None:
        self.root = Node(0, _EMPTY, 0, 0)
        self.root.count = 0
        self.root.children = {}
        self.num_nodes = 1
        self.clock = 0  # tokens appended so far: the stamp of the next one

    # ------------------------------------------------------------------ reading
    def match(self, pattern: Sequence[int]) -> Position | None:
        """Where ``pattern`` ends, or None when it occurs nowhere (patterns longer than the depth never do)."""
        node, off = self.root, 0
        for token in pattern:
            if node.children is not None:
                node = node.children.get(token)
                if node is None:
                    return None
            else:
                j = node.end + off
                if node.depth + off >= self.max_depth or j >= len(node.src) or node.src[j] != token:
                    return None
                off += 1
        return node, off

    def continuations(self, pos: Position) -> list[tuple[int, int, int, Position]]:
        """What followed the position's string: (token, count, stamp, position after it), count descending."""
        node, off = pos
        if node.children is not None:
            kids = [(token, c.count, c.stamp, (c, 0)) for token, c in node.children.items()]
            kids.sort(key=lambda k: (-k[1], -k[2]))
            return kids
        j = node.end + off
        if node.depth + off < self.max_depth and j < len(node.src):
            return [(node.src[j], 1, node.stamp, (node, off + 1))]
        return []

    def has_continuation(self, pos: Position) -> bool:
        node, off = pos
        if node.children is not None:
            return bool(node.children)
        return node.depth + off < self.max_depth and node.end + off < len(node.src)

    def longest_match(self, tokens: Sequence[int], max_match: int) -> tuple[int, Position] | None:
        """The longest suffix of ``tokens`` (<= max_match) that occurs here with something after it.

        Both properties only weaken as the suffix grows (a shorter suffix occurs wherever a longer one
        does, with one token more of depth left), so the search stops at the first length that fails.
        """
        best = None
        n = len(tokens)
        for m in range(1, min(max_match, self.max_depth - 1, n) + 1):
            pos = self.match(tokens[n - m :])
            if pos is None or not self.has_continuation(pos):
                break
            best = (m, pos)
        return best

    # ------------------------------------------------------------------ writing
    def _step(self, src: list[int], start: int, node: Node, log: list | None) -> Node:
        """Extend the occurrence starting at ``src[start]`` by the token just appended to ``src``.

        ``node`` is where the occurrence ended before (possibly inside its own implicit tail); returns
        where it ends now. Callers step the occurrences of one append oldest first: a tail materialised
        here then already includes the new token of the occurrence it holds.
        """
        length = len(src) - 1 - start  # before this token
        # the tail we were in may have been made explicit since: walk down to where we are
        while node.children is not None and node.depth < length:
            node = node.children[src[start + node.depth]]
        if node.children is None:  # our own implicit tail (count 1): it grows with src
            return node
        token = src[start + length]
        child = node.children.get(token)
        if child is None:
            child = Node(length + 1, src, start + length + 1, self.clock)
            node.children[token] = child
            self.num_nodes += 1
            if log is not None:
                log.append((node, token))
            return child
        made = child.count == 1 and self._materialise(child)
        if log is not None:
            log.append((child, made, child.stamp))
        child.count += 1
        child.stamp = self.clock
        return child

    def _materialise(self, node: Node) -> bool:
        """A count-1 node gets a second occurrence: its first one's next token becomes an explicit child."""
        j = node.end
        if node.depth < self.max_depth and j < len(node.src):
            node.children = {node.src[j]: Node(node.depth + 1, node.src, j + 1, node.stamp)}
            self.num_nodes += 1
            return True
        node.children = {}
        return False

    def _undo(self, log: list) -> None:
        """Revert one append's changes (``_step`` entries), newest first."""
        for entry in reversed(log):
            if len(entry) == 2:  # a new child
                parent, token = entry
                del parent.children[token]
                self.num_nodes -= 1
            else:  # a count increment, maybe with a materialised child
                node, made, stamp = entry
                node.count -= 1
                node.stamp = stamp
                if node.count == 1:
                    node.children = None
                    self.num_nodes -= made


class SequenceTree(SuffixTree):
    """The suffix tree of one growing sequence, with rollback of its last ``max_undo`` appends."""

    def __init__(self, tokens: Sequence[int] = (), *, max_depth: int, max_undo: int = 256) -> None:
        super().__init__(max_depth)
        self.tokens: list[int] = []
        self.max_undo = max_undo
        self._ends: list[tuple[int, Node]] = []  # (start, node) of the suffixes shorter than the depth, oldest first
        self._undo_log: deque[list] = deque(maxlen=max_undo)  # one entry per append, newest last
        self.extend(tokens)

    def __len__(self) -> int:
        return len(self.tokens)

    def extend(self, tokens: Sequence[int]) -> None:
        for token in tokens:
            log: list = []
            self._ends = _append(self, self.tokens, self._ends, token, log)
            self._undo_log.append(log)

    def truncate(self, num_tokens: int) -> None:
        """Drop the last ``num_tokens`` tokens, as if they had never been appended."""
        if not 0 <= num_tokens <= len(self.tokens):
            raise ValueError(f"cannot drop {num_tokens} of {len(self.tokens)} tokens")
        if num_tokens == 0:
            return
        if num_tokens > len(self._undo_log):  # older than the log: rebuild
            kept = self.tokens[: len(self.tokens) - num_tokens]
            self._reset()
            self.tokens, self._ends = [], []
            self._undo_log.clear()
            self.extend(kept)
            return
        for _ in range(num_tokens):
            self._undo(self._undo_log.pop())
        del self.tokens[len(self.tokens) - num_tokens :]
        self.clock = len(self.tokens)
        n = len(self.tokens)
        self._ends = [(start, self._locate(start)) for start in range(max(0, n - self.max_depth + 1), n)]

    def _locate(self, start: int) -> Node:
        """The node this sequence's suffix from ``start`` ends on (or in whose implicit tail it ends)."""
        node = self.root
        for j in range(start, len(self.tokens)):
            if node.children is None:
                break  # our own implicit tail holds the rest
            node = node.children[self.tokens[j]]
        return node

    def own_match(self, max_match: int) -> tuple[int, Position] | None:
        """``longest_match`` of the sequence's own end, read off the tracked suffixes instead of walked."""
        n = len(self.tokens)
        best = None
        for start, node in reversed(self._ends):  # shortest suffix first
            m = n - start
            if m > max_match:
                break
            while node.children is not None and node.depth < m:  # made explicit since it was tracked
                node = node.children[self.tokens[start + node.depth]]
            pos = (node, m - node.depth)
            if not self.has_continuation(pos):
                break
            best = (m, pos)
        return best


class CorpusTree(SuffixTree):
    """Whole sequences (e.g. finished outputs) added and removed by key, oldest first under a token cap."""

    def __init__(self, *, max_depth: int, max_tokens: int) -> None:
        super().__init__(max_depth)
        self.max_tokens = max_tokens
        self.seqs: dict[object, list[int]] = {}  # insertion order = age
        self.num_tokens = 0

    def add(self, key: object, tokens: Sequence[int]) -> None:
        """Hold ``tokens`` (its last ``max_tokens`` when longer), evicting the oldest sequences to make room."""
        if key in self.seqs:
            raise KeyError(f"sequence {key!r} is already held")
        tokens = list(tokens[max(0, len(tokens) - self.max_tokens) :]) if self.max_tokens else []
        if not tokens:
            return
        while self.num_tokens + len(tokens) > self.max_tokens:
            self.remove(next(iter(self.seqs)))
        src: list[int] = []
        ends: list[tuple[int, Node]] = []
        for token in tokens:
            ends = _append(self, src, ends, token, None)
        self.seqs[key] = src
        self.num_tokens += len(src)

    def remove(self, key: object) -> None:
        """Forget a sequence: every node on its paths loses one count per occurrence; emptied nodes go."""
        src = self.seqs.pop(key)
        self.num_tokens -= len(src)
        depth = self.max_depth
        for start in range(len(src)):
            path: list[tuple[Node, int, Node]] = []  # (parent, token, node), top down
            node = self.root
            for j in range(start, min(start + depth, len(src))):
                if node.children is None:
                    break  # inside its implicit tail: nothing explicit below
                parent, node = node, node.children[src[j]]
                path.append((parent, src[j], node))
            for parent, token, node in reversed(path):  # bottom up: a child is settled before its parent
                node.count -= 1
                if node.count == 0:
                    del parent.children[token]
                    self.num_nodes -= 1
                    continue
                if node.src is src:
                    node.src, node.end = _EMPTY, 0  # no reference to forgotten tokens; count 1 is fixed below
                if node.count == 1 and node.children is not None:
                    self._to_tail(node, src[start : start + node.depth])

    def _to_tail(self, node: Node, string: list[int]) -> None:
        """A node left with one occurrence keeps no children: its tail is that occurrence's continuation."""
        kids = list(node.children.values())
        if kids:  # the one occurrence goes on into this (count-1) child
            (child,) = kids
            node.src, node.end = child.src, child.end - 1
            self.num_nodes -= 1
        else:  # it ends here (its sequence's end, or the depth): the string alone is its source
            node.src, node.end = list(string), len(string)
        node.children = None


def _append(tree: SuffixTree, src: list[int], ends: list[tuple[int, Node]], token: int, log: list | None):
    """Append ``token`` to ``src`` and step every suffix still shorter than the depth, oldest first."""
    src.append(token)
    tree.clock += 1
    ends.append((len(src) - 1, tree.root))  # the suffix that starts with this token
    step = tree._step
    # a suffix inside its own implicit tail (no children) grows with src: nothing to do
    ends = [(start, node if node.children is None else step(src, start, node, log)) for start, node in ends]
    if len(src) - ends[0][0] >= tree.max_depth:
        del ends[0]  # a full-depth path grows no further
    return ends
