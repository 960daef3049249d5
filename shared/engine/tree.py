"""Token-tree helpers over plain parent lists.

Rows and nodes (see ``types.py`` for the picture)::

    row 0        the last committed token (the tree's root; not a node)
    row i + 1    node i
    node i       parent_ids[i] == -1  -> child of row 0
                 parent_ids[i] == j   -> child of row j + 1

Row r's logits predict the children of row r, which is why acceptance and the
tree attention mask both index by row. Parents always precede children
(``-1 <= parent_ids[i] < i``); that single rule rules out cycles and forward
references and lets every pass below run front to back.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from shared.engine.errors import InvalidRequestError, InvalidTreeError


def validate_tree(token_ids: Sequence[int], parent_ids: Sequence[int], vocab_size: int) -> None:
    """Raise unless ``token_ids``/``parent_ids`` describe a tree over ``[0, vocab_size)``.

    A bad parent raises ``InvalidTreeError`` (naming the node); a token outside
    the vocabulary raises ``InvalidRequestError``.
    """
    if len(token_ids) != len(parent_ids):
        raise InvalidTreeError(f"token tree has {len(token_ids)} token ids but {len(parent_ids)} parent ids")
    for i, parent in enumerate(parent_ids):
        # parent < i is what makes this a tree: no cycles, no forward references
        if not (-1 <= parent < i):
            raise InvalidTreeError(
                f"node {i} has parent {parent}; a parent must be -1 (the root) or an earlier node in [0, {i})"
            )
    for i, token in enumerate(token_ids):
        if not (0 <= token < vocab_size):
            raise InvalidRequestError(f"node {i} has token id {token}, outside the vocabulary [0, {vocab_size})")


def depths(parent_ids: Sequence[int]) -> list[int]:
    """Depth of every node: 0 under the root, else depth(parent) + 1 (position id = n_committed + depth)."""
    out: list[int] = []
    for parent in parent_ids:
        out.append(0 if parent == -1 else out[parent] + 1)
    return out


def children_of(parent_ids: Sequence[int]) -> dict[int, list[int]]:
    """Children of every row, in node order: ``{row: [node, ...]}`` for rows 0..n (empty lists included).

    Row 0 is the root (children have parent -1), row i + 1 is node i.
    """
    children: dict[int, list[int]] = {row: [] for row in range(len(parent_ids) + 1)}
    for node, parent in enumerate(parent_ids):
        children[parent + 1].append(node)
    return children


def ancestors(parent_ids: Sequence[int]) -> torch.Tensor:
    """``anc[i, j]`` is True iff node j is node i or one of its ancestors (the tree attention mask).

    Built front to back: a node sees what its parent sees, plus itself.
    """
    n = len(parent_ids)
    anc = torch.zeros(n, n, dtype=torch.bool)  # [num_nodes, num_nodes]
    for i, parent in enumerate(parent_ids):
        if parent >= 0:
            anc[i] = anc[parent]
        anc[i, i] = True
    return anc
