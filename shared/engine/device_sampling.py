"""Sampled tree and chain acceptance as batched tensor ops on the device: no host reads inside.

The host walk (``acceptance._accept_sampled``) visits one row at a time per request, turns it into
probabilities, draws with the request's generator and reads every draw back. Here a whole batch walks
together, a fixed number of levels (the deepest tree) and sibling tries (the widest row) of ``[B, V]`` ops,
so it can run after (or inside) the step's captured body and the step's outcome reaches the host in one
copy. It is SpecInfer's multi-step speculative sampling, Leviathan et al.'s rejection sampling for a
chain, with the same rule per try as the host walk::

    try child x of row r:   accept iff u_x < min(1, p(x) / q(x))      (q = delta_x without a draft dist)
    rejected:               p <- norm(max(0, p - q))                  (delta_x: p with x zeroed)
    no child accepted:      bonus ~ p, by inverse CDF on u_bonus      (then the walk stops)

The uniforms come in (``u_node[b, j]`` for node j's try, ``u_bonus[b]``), drawn on the host from each
request's own generator (``draw_uniforms``): a request's seed fixes its outcome whatever else is in the
batch. The draws are not the host walk's (it draws per visited row), so a seed gives a different, equally
distributed sample on the two paths. A greedy request is the one-hot ``p``: its walk is the greedy walk.
Batched target probabilities with each row's own temperature, top-k, top-p and min-p: ``batched_probs``.
"""

from __future__ import annotations

import torch

from shared.engine.types import SamplingParams


def sampling_columns(params: list[SamplingParams], vocab: int, device) -> dict:
    """The batch's sampling parameters as device columns (made before the step's forward is queued: a host-to-
    device copy after it would wait for it), with which filters any row wants, known on the host."""
    col = lambda values, dtype: torch.tensor(values, dtype=dtype).to(device, non_blocking=True)  # noqa: E731
    return {
        "greedy": col([p.greedy for p in params], torch.bool),  # [B]
        "temp": col([1.0 if p.greedy else p.temperature for p in params], torch.float32),  # [B]
        "top_k": col([p.top_k if 0 < p.top_k < vocab else vocab for p in params], torch.long),  # [B]
        "top_p": col([p.top_p for p in params], torch.float32),  # [B]
        "min_p": col([p.min_p for p in params], torch.float32),  # [B]
        "any": (any(0 < p.top_k < vocab for p in params), any(p.top_p < 1.0 for p in params),
                any(p.min_p > 0.0 for p in params)),  # fmt: skip
    }


def batched_probs(logits: torch.Tensor, params: list[SamplingParams] | dict) -> torch.Tensor:
    """``probs_from_logits`` for a batch whose requests sample differently: logits [B, R, V] -> probs [B, R, V].

    ``params``: the requests' SamplingParams, or their ``sampling_columns``. The order is the host's:
    softmax(logits / T), top-k, top-p, min-p, each renormalised; greedy rows are the one-hot argmax (first
    maximum on ties)."""
    logits = logits.float()  # [B, R, V]
    vocab = logits.shape[-1]
    c = sampling_columns(params, vocab, logits.device) if isinstance(params, list) else params
    want_k, want_p, want_min = c["any"]
    probs = torch.softmax(logits / c["temp"][:, None, None], dim=-1)  # [B, R, V]
    if want_k:
        ordered = probs.sort(dim=-1, descending=True).values  # [B, R, V]
        kth = ordered.gather(-1, (c["top_k"] - 1)[:, None, None].expand(-1, probs.shape[1], 1))  # [B, R, 1]
        probs = probs.masked_fill(probs < kth, 0.0)  # ties at the k-th value all stay
        probs = probs / probs.sum(-1, keepdim=True)
    if want_p:
        ordered, order = probs.sort(dim=-1, descending=True)  # [B, R, V] each
        ahead = ordered.cumsum(-1) - ordered  # [B, R, V] mass strictly ahead, in sorted order
        drop = torch.empty_like(ahead, dtype=torch.bool).scatter_(-1, order, ahead >= c["top_p"][:, None, None])
        probs = probs.masked_fill(drop, 0.0)
        probs = probs / probs.sum(-1, keepdim=True)
    if want_min:
        floor = c["min_p"][:, None, None] * probs.amax(-1, keepdim=True)  # [B, R, 1]
        probs = probs.masked_fill(probs < floor, 0.0)
        probs = probs / probs.sum(-1, keepdim=True)
    one_hot = torch.zeros_like(probs).scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)  # [B, R, V]
    return torch.where(c["greedy"][:, None, None], one_hot, probs)


def host_uniforms(generators: list[torch.Generator], num_nodes: int) -> torch.Tensor:
    """[B, M + 1] float32 on the host: each request's node tests, then its bonus draw, from its own generator."""
    return torch.stack([torch.rand(num_nodes + 1, generator=g) for g in generators])


def draw_uniforms(generators: list[torch.Generator], num_nodes: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Each request's uniforms for one step from its own generator: (u_node [B, M], u_bonus [B]) on ``device``.

    Every request draws M + 1 whatever its tree, so its stream of draws depends on its own steps only."""
    u = host_uniforms(generators, num_nodes).to(device, non_blocking=True)  # [B, M + 1]
    return u[:, :num_nodes], u[:, num_nodes]


def sampled_inputs(trees, num_nodes: int, vocab: int, device) -> tuple[torch.Tensor, ...]:
    """The walk's tree inputs for a batch padded to ``num_nodes``: (tokens [B, M], kids [B, 1 + M, W],
    q [B, 1 + M, V], has_q [B, 1 + M]); built on the host in plain lists, moved in a few copies."""
    batch, rows = len(trees), 1 + num_nodes
    tokens = [list(t.token_ids) + [0] * (num_nodes - len(t.token_ids)) for t in trees]
    children = [[[] for _ in range(rows)] for _ in trees]
    for b, tree in enumerate(trees):
        for node, parent in enumerate(tree.parent_ids):
            children[b][parent + 1].append(node)
    width = max([1] + [len(c) for per in children for c in per])
    kids = [[c + [-1] * (width - len(c)) for c in per] for per in children]
    has_q = torch.zeros(batch, rows, dtype=torch.bool)
    at_b, at_row, at_tok, mass = [], [], [], []
    for b, tree in enumerate(trees):
        for row, dist in tree.child_dists.items():
            if dist is None:
                continue
            weights = dist.probs.reshape(-1).float()
            weights = weights / weights.sum()  # what was sampled from (the host walk normalises it too)
            ids = dist.token_ids.reshape(-1).long()
            has_q[b, row] = True
            at_b.append(torch.full_like(ids, b))
            at_row.append(torch.full_like(ids, row))
            at_tok.append(ids)
            mass.append(weights)
    move = lambda t: t.to(device, non_blocking=True)  # noqa: E731 - host-built, copied without a wait
    q = torch.zeros(batch, rows, vocab, dtype=torch.float32, device=device)  # [B, 1 + M, V]
    if mass:
        index = tuple(move(torch.cat(x)) for x in (at_b, at_row, at_tok))
        q.index_put_(index, move(torch.cat(mass)), accumulate=True)  # repeated ids add up, as dense_probs
    tokens_t = torch.tensor(tokens, dtype=torch.long).view(batch, num_nodes)  # [B, M]
    return move(tokens_t), move(torch.tensor(kids, dtype=torch.long)), q, move(has_q)


def accept_sampled_batch(
    probs: torch.Tensor,
    tokens: torch.Tensor,
    kids: torch.Tensor,
    q: torch.Tensor,
    has_q: torch.Tensor,
    u_node: torch.Tensor,
    u_bonus: torch.Tensor,
) -> torch.Tensor:
    """Walk every padded tree of a batch; returns the outcome ``[B, 2 + M]`` (as ``accept_greedy_batch``'s).

    probs    [B, R, V] float32  target probabilities per row (R = 1 + M: row 0 the root, row j + 1 node j)
    tokens   [B, M] int64       node tokens (anything at padded nodes)
    kids     [B, R, W] int64    the children of each row in the order they are tried, -1 past the last
    q        [B, R, V] float32  the draft distribution each row's children were drawn from (where has_q)
    has_q    [B, R] bool        False: the row's children were picked deterministically (point masses)
    u_node   [B, M] float32     the uniform of node j's acceptance test
    u_bonus  [B] float32        the uniform of the bonus draw

    outcome[b] = (accepted count L, bonus token, path node at depth 0 .. M-1, -1 past L).
    """
    batch, rows, vocab = probs.shape
    width = kids.shape[2]
    device = probs.device
    at = torch.arange(batch, device=device)  # [B]
    row = torch.zeros(batch, dtype=torch.long, device=device)  # [B] the row being tried
    alive = torch.ones(batch, dtype=torch.bool, device=device)  # [B] still descending
    p = probs[:, 0]  # [B, V] what the next try (or the bonus) is drawn against
    path = torch.full((batch, rows - 1), -1, dtype=torch.long, device=device)  # [B, M]
    count = torch.zeros(batch, dtype=torch.long, device=device)  # [B]
    for depth in range(rows - 1):  # a path is at most M deep
        q_row = q[at, row]  # [B, V]
        hq = has_q[at, row]  # [B]
        chosen = torch.full((batch,), -1, dtype=torch.long, device=device)  # [B]
        for s in range(width):
            node = kids[at, row, s]  # [B]
            tried = alive & (node >= 0) & (chosen < 0)  # [B]
            j = node.clamp_min(0)  # [B]
            x = tokens[at, j]  # [B]
            p_x = p.gather(1, x[:, None])[:, 0]  # [B]
            q_x = torch.where(hq, q_row.gather(1, x[:, None])[:, 0], torch.ones_like(p_x))  # [B]
            ratio = torch.where(q_x > 0, p_x / q_x.clamp_min(1e-30), torch.ones_like(p_x)).clamp_max(1.0)  # [B]
            take = tried & (u_node[at, j] < ratio)  # [B]
            chosen = torch.where(take, node, chosen)
            rest = torch.where(hq[:, None], (p - q_row).clamp_min(0.0), p.scatter(1, x[:, None], 0.0))  # [B, V]
            total = rest.sum(1, keepdim=True)  # [B, 1]
            rest = torch.where(total > 0, rest / total.clamp_min(1e-30), p)  # no mass left: rounding, keep p
            p = torch.where((tried & ~take)[:, None], rest, p)
        took = chosen >= 0  # [B]
        path[:, depth] = chosen
        count += took.long()
        row = torch.where(took, chosen + 1, row)
        p = torch.where(took[:, None], probs[at, row], p)
        alive = alive & took
    cdf = p.cumsum(1)  # [B, V]
    bonus = (cdf <= (u_bonus[:, None] * cdf[:, -1:])).sum(1).clamp_max(vocab - 1)  # [B] first cdf past u
    bonus = torch.where(p.gather(1, bonus[:, None])[:, 0] > 0, bonus, p.argmax(1))  # rounding at the tail
    return torch.cat([count[:, None], bonus[:, None], path], dim=1)


def tried_status(parent_ids: list[int], path: list[int]) -> list[int]:
    """``AcceptResult.node_status`` of a sampled walk that took ``path``: on each row it visited, the children
    before the accepted one were tried and rejected (0), the accepted one is 1, later ones never tried (-1);
    every child of the row it stopped at was tried and rejected."""
    status = [-1] * len(parent_ids)
    rows = [-1, *path]  # parent ids of the visited rows: the root, then each accepted node
    for depth, parent in enumerate(rows):
        accepted = path[depth] if depth < len(path) else None
        for node, p in enumerate(parent_ids):
            if p != parent:
                continue
            if node == accepted:
                status[node] = 1
                break
            status[node] = 0
    return status
