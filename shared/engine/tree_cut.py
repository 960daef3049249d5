"""Cutting a drafted tree: a subset of its nodes as a tree of their own, and a fixed expansion cut out of a candidate.

Pure functions over ``TokenTree`` (no scheduler state): the tree selectors use them (scheduler/policies/
selection.py) and so does the target, which cuts a relayed tree to the expansion the plan asked for
(services/target/relay_plan.py) where the draft answered a beam (prompt lookup, suffix trees).
"""

from __future__ import annotations

from collections.abc import Sequence

from shared.engine.spec_checks import expansion_widths
from shared.engine.types import TokenTree


def is_valid_subset(tree: TokenTree, keep: Sequence[int]) -> bool:
    """Every kept node exists, appears once, and has its parent kept (or hangs off the root)."""
    kept = set(keep)
    return len(kept) == len(keep) and all(
        0 <= i < len(tree) and (tree.parent_ids[i] == -1 or tree.parent_ids[i] in kept) for i in kept
    )


def subtree(tree: TokenTree, keep: Sequence[int]) -> TokenTree:
    """The nodes ``keep`` of ``tree`` as a tree of their own, in the candidate's (parents-first) order.

    Raises ``ValueError`` unless ``keep`` is a valid subset (see ``is_valid_subset``).
    """
    if not is_valid_subset(tree, keep):
        raise ValueError("a selected node's parent was not selected")
    order = sorted(keep)
    new_index = {old: new for new, old in enumerate(order)}
    out = TokenTree(
        token_ids=[tree.token_ids[i] for i in order],
        parent_ids=[-1 if tree.parent_ids[i] == -1 else new_index[tree.parent_ids[i]] for i in order],
        draft_probs=[tree.draft_probs[i] for i in order] if tree.draft_probs else [],
    )
    # child_dists are keyed by row: row 0 is the root, row i + 1 is node i
    new_row = {0: 0, **{old + 1: new + 1 for old, new in new_index.items()}}
    out.child_dists = {new_row[row]: dist for row, dist in tree.child_dists.items() if row in new_row}
    return out


def select_expansion(tree: TokenTree, expansion: Sequence[int]) -> list[int]:
    """A fixed tree shape cut out of a candidate: ``expansion[k]`` children (most probable first) of
    every kept node at depth k (SpecInfer's expansion config, e.g. <1,1,3,1,1,1,1,1>).

    Children the candidate does not have are simply missing (a beam keeps only w nodes per layer).
    """
    probs = tree.draft_probs or [1.0] * len(tree)
    children: list[list[int]] = [[] for _ in range(len(tree) + 1)]
    for node, parent in enumerate(tree.parent_ids):
        children[parent + 1].append(node)
    keep: list[int] = []
    layer = [-1]  # parents of the next depth (-1 = the root)
    for k in expansion:
        nxt = []
        for parent in layer:
            best = sorted(children[parent + 1], key=lambda c: (-probs[c], c))[:k]
            nxt += best
        keep += nxt
        layer = nxt
        if not layer:
            break
    return keep


def cut_to_expansion(tree: TokenTree, expansion: Sequence[int]) -> TokenTree:
    """``tree`` cut to ``expansion`` (SpecInfer's selection); one already of its size is returned as it is (a draft
    that expands natively answers exactly the expansion: the check keeps the cut off every step's path)."""
    if not expansion or len(tree) == sum(expansion_widths(expansion)):
        return tree
    return subtree(tree, select_expansion(tree, expansion))


def first_child_path(tree: TokenTree) -> list[int]:
    """The nodes from the root down through each node's first child (the draft's most likely path: a chain whole,
    the top-1 line of a fixed expansion)."""
    first: dict[int, int] = {}
    for node, parent in enumerate(tree.parent_ids):
        first.setdefault(parent, node)
    path, node = [], first.get(-1)
    while node is not None:
        path.append(node)
        node = first.get(node)
    return path


def below_root(tree: TokenTree) -> TokenTree:
    """The tree under node 0, re-rooted there: node 0 becomes the last committed token (a relay lookahead's
    root is the draft's guess of the bonus token). ``tree`` has node 0 as its only top-level node."""
    out = TokenTree(token_ids=tree.token_ids[1:], parent_ids=[p - 1 for p in tree.parent_ids[1:]],
                    draft_probs=tree.draft_probs[1:] if tree.draft_probs else [])  # fmt: skip
    # child_dists are keyed by row (row 0: the last committed token, row i + 1: node i): row 1 becomes row 0
    out.child_dists = {row - 1: dist for row, dist in tree.child_dists.items() if row >= 1}
    return out


def single_root(tree: TokenTree) -> bool:
    """Node 0 is the tree's one top-level node (a relay lookahead: the guessed bonus token, the next tree below)."""
    return len(tree) > 0 and tree.parent_ids[0] == -1 and -1 not in tree.parent_ids[1:]
