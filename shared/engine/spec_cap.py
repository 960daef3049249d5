"""A speculation request cut to a depth, and a drafted chain cut to a length: what the target does to what is relayed.

The draft relay (services/target/draft_relay.py) hands the draft a sequence's next shape before the step
that decides how many tokens are left; the target caps it once the step is verified, to the tokens the
sequence may still emit minus the bonus token, exactly as the scheduler's ``SpecShape.capped`` does when
it plans (scheduler/spec_shape.py), so both sides agree on the shape the draft drafted.
"""

from __future__ import annotations

from dataclasses import replace

from shared.engine.spec_checks import expansion_widths
from shared.engine.types import SpecItem, TokenTree


def item_depth(item: SpecItem) -> int:
    """Longest path the item drafts: a chain's length, a tree's depth."""
    return item.chain_len or len(item.tree_expansion) or item.tree_depth


def capped_item(item: SpecItem, max_depth: int) -> SpecItem | None:
    """``item`` drafting at most ``max_depth`` levels; None when nothing is left to draft."""
    if max_depth <= 0 or item_depth(item) <= 0:
        return None
    if max_depth >= item_depth(item):
        return item
    if item.chain_len:
        return replace(item, chain_len=max_depth)
    if item.tree_expansion:
        expansion = tuple(item.tree_expansion[:max_depth])
        return replace(item, tree_expansion=expansion, tree_depth=len(expansion), tree_width=max(expansion_widths(expansion)))
    return replace(item, tree_depth=max_depth)


def cut_chain(tree: TokenTree, max_nodes: int) -> TokenTree:
    """A chain's first ``max_nodes`` nodes (what drafting that many would have drawn, the draft being causal); a tree
    that is not a chain, or no longer, is returned as it is."""
    n = len(tree.token_ids)
    if max_nodes <= 0 or n <= max_nodes or list(tree.parent_ids) != list(range(-1, n - 1)):
        return tree
    return TokenTree(list(tree.token_ids[:max_nodes]), list(tree.parent_ids[:max_nodes]), list(tree.draft_probs[:max_nodes]),
                     {row: dist for row, dist in tree.child_dists.items() if row < max_nodes})  # fmt: skip


def shape_key(item: SpecItem) -> tuple:
    """What makes two speculation requests draft the same shape."""
    return (item.chain_len, item.confidence_threshold, item.tree_depth, item.tree_width, tuple(item.tree_expansion))
