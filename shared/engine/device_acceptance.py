"""Greedy chain and tree acceptance as tensor ops on the device: no host reads inside.

The host walk (``acceptance._accept_greedy``) reads the argmax of every row back
and descends in Python. Here the whole walk is a fixed sequence of batched tensor
ops over padded trees, so it runs inside the step's captured body (a CUDA graph
replays it) and the step's outcome reaches the host in one copy::

    best[b, r]      argmax of row r (row 0 = the root, row j + 1 = node j)
    match[b, j]     node j is real and its token is the argmax of its parent's row
    chosen[b, j]    match, and no earlier sibling matched (the host walk takes the first)
    on_path[b, j]   every ancestor-or-self of j is chosen (ancestor bits: anc[b, j, i])
    path[b, d]      the on-path node at depth d; the walk's accepted nodes, root first
    bonus[b]        argmax at the deepest on-path node's row (row 0 when nothing matched)

A chain is the tree whose node j has parent j - 1, so one routine serves both.
Padded nodes have ``valid`` False and never match; ``anc`` of a padded node is its
own bit only. Identical to the host walk whenever argmax ties break the same way
(``torch.argmax`` takes the first maximum on every device, as the host walk does).
"""

from __future__ import annotations

import torch


def accept_greedy_batch(
    best: torch.Tensor, tokens: torch.Tensor, parents: torch.Tensor, anc: torch.Tensor, valid: torch.Tensor
) -> torch.Tensor:
    """Accept every padded tree of a batch against its rows' argmax; returns the outcome ``[B, 2 + M]``.

    best     [B, 1 + M] int64  argmax per row (row 0 the root, row j + 1 node j)
    tokens   [B, M] int64      node tokens (anything at padded nodes)
    parents  [B, M] int64      node parents, -1 = the root (anything >= -1 at padded nodes)
    anc      [B, M, M] bool    anc[b, j, i]: i is j or an ancestor of j
    valid    [B, M] bool       real nodes

    outcome[b] = (accepted count L, bonus token, path node at depth 0 .. M-1 or -1 past L).
    """
    batch, width = tokens.shape
    parent_rows = (parents + 1).clamp_min(0)  # [B, M] row whose argmax predicts node j
    match = valid & (tokens == best.gather(1, parent_rows))  # [B, M]
    same_parent = parents[:, :, None] == parents[:, None, :]  # [B, M(j), M(i)]
    earlier = torch.ones(width, width, dtype=torch.bool, device=tokens.device).tril(-1)  # [M(j), M(i)] i < j
    blocked = (same_parent & earlier & match[:, None, :]).any(-1)  # [B, M] an earlier sibling matched
    chosen = match & ~blocked  # [B, M]
    on_path = valid & ~(anc & ~chosen[:, None, :]).any(-1)  # [B, M] every ancestor-or-self chosen
    depth = anc.sum(-1) - 1  # [B, M] depth of each node (0 under the root)
    count = on_path.sum(-1)  # [B] accepted nodes
    node_ids = torch.arange(width, device=tokens.device).expand(batch, width)  # [B, M]
    # scatter each on-path node to its depth; off-path nodes go to a spill column dropped below
    slot = torch.where(on_path, depth, torch.full_like(depth, width))  # [B, M]
    path = torch.full((batch, width + 1), -1, dtype=torch.long, device=tokens.device)  # [B, M + 1]
    path.scatter_(1, slot, torch.where(on_path, node_ids, torch.full_like(node_ids, -1)))
    path = path[:, :width]  # [B, M]
    last = path.gather(1, (count - 1).clamp_min(0)[:, None])[:, 0]  # [B] deepest accepted node (or junk)
    stop_row = torch.where(count > 0, last + 1, torch.zeros_like(last))  # [B]
    bonus = best.gather(1, stop_row[:, None])[:, 0]  # [B]
    return torch.cat([count[:, None], bonus[:, None], path], dim=1)  # [B, 2 + M]


def node_status(parents: list[int], path: list[int]) -> list[int]:
    """Greedy statuses from the accepted path (host side, O(nodes)): 1 on the path, 0 for a child of a
    visited row that is not on it, -1 for a node whose parent row the walk never reached."""
    visited = {-1, *path}  # the root, then each accepted node's row
    on_path = set(path)
    return [1 if j in on_path else (0 if p in visited else -1) for j, p in enumerate(parents)]
