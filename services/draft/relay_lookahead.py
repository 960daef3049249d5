"""Relay lookahead, the draft's side: the next tree drafted on the optimistic prefix while the target verifies.

Frontier pipelining (scheduler/frontier.py, FASER §4.3) carried over to the draft relay. With each answer the
draft also drafts a *lookahead* for the sequence: it commits the first-child path of the tree it just gave
(optimistically, as if the target will accept all of it), then drafts one level more than the step's shape,
so the lookahead's root is its guess of the target's bonus token and the tree below the root is the next
step's tree on that prefix::

    handoff N   (tokens, shape, LOOKAHEAD)  ─▶ fresh tree T for step N+1, and lookahead L = g ─▶ T' (step N+2)
    handoff N+1 (tokens == path(T) + [g], same shape, LOOKAHEAD): taken, as the target takes it: T' is
                verified at N+2 without waiting; the draft keeps path(T) + [g], commits path(T')
                optimistically and drafts the next lookahead: ONE call, its answer says ``taken``
    handoff N+1 (any other tokens or shape): the draft rolls path(T) back and drafts afresh (two calls with
                LOOKAHEAD: the fresh tree, then its lookahead)

Both sides decide the take from the same facts (services/target/draft_relay.py): the tokens the step
committed are exactly the lookahead's assumed prefix, the shape is the one it was drafted for, and the
handoff asks for a lookahead again. So the target writes each handoff as soon as its step is done, without
waiting for the last answer, and checks the draft's ``taken`` when it reads the answer. The tree verified
after a take is the draft's own tree conditioned on the very prefix the target committed, with its draft
distributions, so verification stays lossless, as in frontier pipelining.

The optimistic tokens stay inside the draft service: a speculate from the scheduler (its own stream or the
unary call) first rolls them back (``claim``), and a release, a prefill or an offload forgets them, so the
scheduler's count of what the draft holds is the true prefix throughout.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from shared.engine.spec_cap import shape_key
from shared.engine.tree_cut import first_child_path, single_root
from shared.engine.types import LOOKAHEAD, SpecItem, TokenTree


def lookahead_shape(item: SpecItem, limits: dict[str, int | None], new_tokens: list[int] | None = None) -> SpecItem | None:
    """``item``'s shape one level deeper at the top (a chain one longer; an expansion with a single root), drafting
    after ``new_tokens``, or None where there is no such shape: a beam (its first level holds many nodes), or past
    the draft's limits."""
    if item.chain_len:
        longest = limits.get("max_chain")
        if longest is not None and item.chain_len + 1 > longest:
            return None
        return SpecItem(item.seq_id, new_tokens or [], chain_len=item.chain_len + 1,
                        confidence_threshold=item.confidence_threshold)  # fmt: skip
    if item.tree_expansion:
        deepest = limits.get("max_depth")
        if deepest is not None and item.tree_depth + 1 > deepest:
            return None
        return SpecItem(item.seq_id, new_tokens or [], tree_depth=item.tree_depth + 1, tree_width=item.tree_width,
                        tree_expansion=(1, *item.tree_expansion))  # fmt: skip
    return None


@dataclass
class Optimistic:
    """One sequence's state beyond the true prefix."""

    path: list[int]  # tokens the engine holds beyond the true prefix: the assumed accepted tokens
    guess: int | None  # the lookahead's root, the assumed bonus token (None: no lookahead came back)
    next_path: list[int]  # the first-child path of the tree below the root (committed when taken)
    shape: tuple  # shape_key of the items it answers


class Lookaheads:
    def __init__(self, limits: dict[str, int | None] | None = None) -> None:
        self.limits = limits or {}
        self.states: dict[str, Optimistic] = {}
        self.num_taken = 0  # handoffs that took a lookahead, all time
        self.num_drafted = 0  # lookaheads drafted, all time

    def claim(self, items: list[SpecItem]) -> None:
        """The scheduler speculates these itself: each first rolls back what the draft holds optimistically."""
        for item in items:
            st = self.states.pop(item.seq_id, None)
            if st is not None and st.path:
                item.rollback += len(st.path)

    def forget(self, seq_ids) -> None:
        """Released, prefilled again or offloaded: their state goes with them."""
        for seq_id in seq_ids:
            self.states.pop(seq_id, None)

    def run(self, speculate: Callable[[list[SpecItem]], list[TokenTree]], items: list[SpecItem],
            flags: bytes) -> tuple[list[TokenTree], list[TokenTree], set[int], set[int]]:  # fmt: skip
        """One handoff: (fresh trees, lookaheads, indices that could not be applied, indices that took their last
        lookahead), each list in item order. ``speculate`` is the engine's; it runs once for the fresh trees (if
        any) and once for the lookaheads."""
        n = len(items)
        flags = bytes(flags).ljust(n, b"\0")
        fresh, looks, bad, taken = [TokenTree()] * n, [TokenTree()] * n, set(), set()
        firsts: list[tuple[int, SpecItem]] = []
        seconds: list[tuple[int, SpecItem, list[int]]] = []  # (index, lookahead item, its optimistic path)
        limits, states = self.limits, self.states
        for k, item in enumerate(items):
            st = states.pop(item.seq_id, None)
            asks = flags[k] & LOOKAHEAD
            if (asks and st is not None and st.guess is not None and item.new_tokens == [*st.path, st.guess]
                    and shape_key(item) == st.shape):  # fmt: skip
                ahead = lookahead_shape(item, limits, [st.guess, *st.next_path])
                if ahead is not None:
                    taken.add(k)  # the step committed the lookahead's prefix: the target verifies it next
                    self.num_taken += 1
                    seconds.append((k, ahead, st.next_path))
                    continue
            if st is not None and st.path:
                item.rollback += len(st.path)  # the optimistic prefix failed (or was not asked for again)
            firsts.append((k, item))
        if firsts:
            for (k, item), tree in zip(firsts, speculate([item for _, item in firsts])):
                fresh[k] = tree
                if not flags[k] & LOOKAHEAD:
                    continue
                path = [tree.token_ids[i] for i in first_child_path(tree)]
                ahead = lookahead_shape(item, limits, path) if path else None
                if ahead is not None:
                    seconds.append((k, ahead, path))
        if seconds:
            try:
                drafted = speculate([item for _, item, _ in seconds])
            except Exception:  # the fresh trees stand; a taken sequence has nothing to verify next: missing
                bad.update(k for k, _, _ in seconds if k in taken)
                for k, _, _ in seconds:
                    states.pop(items[k].seq_id, None)
                raise _LookaheadFailed(fresh, looks, bad, taken - bad) from None
            for (k, item, path), tree in zip(seconds, drafted):
                self.num_drafted += 1
                rooted = single_root(tree)
                if rooted:  # the root is the guessed bonus token; below it, the next tree's first-child path
                    looks[k] = tree
                    below = [tree.token_ids[i] for i in first_child_path(tree)[1:]]
                    states[item.seq_id] = Optimistic(path, tree.token_ids[0], below, shape_key(items[k]))
                else:
                    states[item.seq_id] = Optimistic(path, None, [], shape_key(items[k]))
        return fresh, looks, bad, taken


class _LookaheadFailed(Exception):
    """The lookahead call failed after the fresh trees were drafted: what to answer anyway."""

    def __init__(self, fresh, looks, bad, taken) -> None:
        super().__init__("the relay lookahead call failed")
        self.answer = (fresh, looks, bad, taken)
