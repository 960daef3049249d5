"""Which of a sequence's KV positions have their target feature rows stored (block_features.py).

A block may enter the prefix index as *featured* only when every position in it had its row written
by a step that returned features (of the store's layer set). Per sequence::

    feature_rows        committed positions 0 .. feature_rows-1 have rows (never past num_cached)
    tree_feature_rows   tree nodes 0 .. tree_feature_rows-1 have rows (their slots, moved at a commit)

    forward with features     attached blocks (featured ones only) and fed positions extend the run,
                              when it reaches them without a gap; the new tree nodes have rows
    forward without features  fed positions and new nodes have none: the run stops before them
    commit                    the kept tree path's rows move with its KV: they extend the run
    truncate                  the run stops at the KV's new end

Pure bookkeeping on integers: no torch, no blocks.
"""

from __future__ import annotations

from shared.engine.sequence import Sequence


def after_forward(seq: Sequence, attached_from: int, first_fed: int, first_node: int, with_features: bool) -> None:
    """The forward fed positions ``first_fed .. num_cached-1`` (after its lookup served ``attached_from ..
    first_fed-1`` from the cache) and tree nodes ``first_node ..``."""
    rows = min(seq.feature_rows, attached_from)
    if with_features:
        if first_fed > attached_from and rows == attached_from:
            rows = first_fed  # a step that asks for features shares only blocks that have them
        if rows >= first_fed:
            rows = seq.num_cached
        if seq.tree_feature_rows >= first_node:
            seq.tree_feature_rows = len(seq.tree)
    else:
        rows = min(rows, first_fed)
        seq.tree_feature_rows = min(seq.tree_feature_rows, first_node)
    seq.feature_rows = rows


def after_commit(seq: Sequence, num_before: int, path: list[int]) -> None:
    """A commit on top of ``num_before`` committed tokens kept the KV of tree ``path`` (nodes, root first)."""
    rows = seq.feature_rows
    if path and rows >= num_before and max(path) < seq.tree_feature_rows:
        rows = num_before + len(path)
    seq.feature_rows = min(rows, seq.num_cached)
    seq.tree_feature_rows = 0


def after_truncate(seq: Sequence) -> None:
    seq.feature_rows = min(seq.feature_rows, seq.num_cached)
    seq.tree_feature_rows = 0


def reset(seq: Sequence) -> None:
    """The store started over (another layer set): nothing of the sequence's is stored."""
    seq.feature_rows = seq.tree_feature_rows = 0
