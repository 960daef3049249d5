"""Lossless verification of a speculative token tree against the target's logits.

The walk starts at row 0 (the last committed token) and descends one accepted
child at a time; whatever it emits is distributed exactly as if the target had
sampled token by token::

    row 0 ── try children in order ── accept x? ──yes──▶ descend to x's row, repeat
                                        │no
                                        ▼
                              p <- residual(p, q, x), try the next child;
                              no child left: bonus ~ p, stop

    greedy (T = 0):  accept the child equal to argmax(p); bonus = argmax at the stop row.
    sampling:        SpecInfer's multi-step speculative sampling (Miao et al. 2024, §4.3
                     of AdaServe cites it as the verification step). A chain with q given
                     is exactly Leviathan et al.'s rejection sampling (SmartSpec §2, App. A).

Why it is lossless, one round at a time: if x ~ q is accepted with probability
min(1, p(x)/q(x)) and otherwise the target draws from norm(max(0, p - q)),
the result is distributed exactly as p. Each later sibling is an independent
fresh draw from q, so the same argument applies to the residual, and the
final bonus draw closes the induction. A child picked deterministically is the
point mass q = delta_x, for which the rule reads "accept with p(x), else draw
from p with x removed" -- again exactly p, whatever the draft picked.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from shared.engine.errors import EngineError, InvalidRequestError, InvalidTreeError
from shared.engine.sampling import dense_probs, make_generator, probs_from_logits, sample, validate_sampling
from shared.engine.tree import children_of, validate_tree
from shared.engine.types import AcceptResult, SamplingParams, SparseDist, TokenTree

ACCEPTED, REJECTED, UNREACHED = 1, 0, -1  # AcceptResult.node_status values


def accept_probability(p: torch.Tensor, q: torch.Tensor | None, token_id: int) -> float:
    """Chance the target keeps draft token ``x = token_id``; ``p``, ``q`` are ``[vocab_size]``.

    q None means the child was chosen deterministically: a point mass, q(x) = 1.
    """
    # p: target prob, q: draft prob
    # p(x) >= q(x): the target wants x at least as often as the draft proposes it -> always accept
    # p(x) <  q(x): the draft over-proposes x -> accept with p(x)/q(x) to thin it down to p(x)
    p_x = float(p[token_id])
    q_x = 1.0 if q is None else float(q[token_id])
    return min(1.0, p_x / q_x)  # q_x > 0: a sampled child lies in its q's support (checked up front)


def residual(p: torch.Tensor, q: torch.Tensor | None, token_id: int) -> torch.Tensor:
    """What the target must sample from after rejecting ``x = token_id``: norm(max(0, p - q)).

    With the point mass q = delta_x that is p with x zeroed, renormalised. The
    rejected branch must supply exactly the mass acceptance under-delivers:
        P(y) = min(p(y), q(y)) + (1 - sum_z min(p(z), q(z))) * r(y) = p(y)
    which holds for r = max(0, p - q) / sum_z max(0, p(z) - q(z)), as
    sum_z max(0, p - q) = 1 - sum_z min(p, q).
    Falls back to ``p`` when the residual has no mass left, which only happens
    through rounding (p == q up to float error, so rejection was itself a rounding event).
    """
    if q is None:
        r = p.clone()  # [vocab_size]
        r[token_id] = 0.0
    else:
        r = (p - q).clamp_min(0.0)  # [vocab_size]
    total = float(r.sum())
    if not (total > 0.0):
        return p
    return r / total


def accept_tree(
    tree: TokenTree,
    target_logits: torch.Tensor,
    params: SamplingParams,
    generator: torch.Generator | None = None,
    pruned: Sequence[int] = (),
) -> AcceptResult:
    """Verify ``tree`` against ``target_logits`` ``[1 + num_nodes, vocab_size]``.

    Row 0 holds the target's logits at the last committed token (predicting
    the children of the root), row i + 1 its logits at node i. Sampling draws
    come from ``generator`` (keep one per request, see ``make_generator``);
    None uses a fresh unseeded one. Greedy never draws.

    ``node_status``: 1 accepted, 0 tested and rejected, -1 never reached. In
    greedy mode every child of a visited row is compared against the one
    argmax, so all unchosen ones are 0; in sampling mode siblings after the
    accepted one were never tried and stay -1.
    """
    validate_sampling(params)
    num_nodes = len(tree)
    if target_logits.dim() != 2 or target_logits.shape[0] != 1 + num_nodes:
        raise EngineError(
            f"target_logits must be [1 + num_nodes, vocab_size] = [{1 + num_nodes}, V], got {list(target_logits.shape)}"
        )
    vocab_size = target_logits.shape[1]
    validate_tree(tree.token_ids, tree.parent_ids, vocab_size)
    children = children_of(tree.parent_ids)
    validate_child_dists(tree, children, vocab_size)

    stopped = frozenset(pruned)
    if params.greedy:
        result = _accept_greedy(tree, target_logits, children, stopped)
    else:
        if generator is None:
            generator = make_generator(None)
        result = _accept_sampled(tree, target_logits, params, generator, children, stopped)
    for node in stopped:
        result.node_status[node] = REJECTED  # stopped early = treated as rejected (FASER §4.2)
    result.pruned_nodes = sorted(stopped)
    return result


def _accept_greedy(
    tree: TokenTree, target_logits: torch.Tensor, children: dict[int, list[int]], pruned: frozenset[int] = frozenset()
) -> AcceptResult:
    """Follow the target's argmax down the tree; the bonus is the argmax where the walk stops."""
    best = target_logits.argmax(dim=-1).tolist()  # [1 + num_nodes]; one host sync for the whole tree
    status = [UNREACHED] * len(tree)
    path: list[int] = []
    row = 0
    while True:
        match = None
        for node in children[row]:
            # a pruned node equal to the argmax is not descended into: the bonus below is that token
            if match is None and tree.token_ids[node] == best[row] and node not in pruned:
                match = node
                status[node] = ACCEPTED
            else:
                status[node] = REJECTED
        if match is None:
            break
        path.append(match)
        row = match + 1
    tokens = [tree.token_ids[node] for node in path] + [best[row]]
    return AcceptResult(accepted_nodes=path, tokens=tokens, node_status=status)


def _accept_sampled(
    tree: TokenTree,
    target_logits: torch.Tensor,
    params: SamplingParams,
    generator: torch.Generator,
    children: dict[int, list[int]],
    pruned: frozenset[int] = frozenset(),
) -> AcceptResult:
    """Multi-step speculative sampling: try each row's children in order, descend on the first accepted."""
    vocab_size = target_logits.shape[1]
    device = generator.device  # the walk runs where the generator lives (CPU by default)
    status = [UNREACHED] * len(tree)
    path: list[int] = []
    row = 0
    while True:
        # only visited rows are turned into probabilities: one transfer per row on the path
        p = probs_from_logits(target_logits[row : row + 1], params)[0].to(device)  # [vocab_size]
        dist = tree.child_dists.get(row)
        q = None
        if dist is not None:
            q = dense_probs(dist, vocab_size, device)  # [vocab_size]
            q = q / q.sum()  # multinomial normalises its weights, so this is the q really sampled from
        accepted = None
        bonus = None
        kids = children[row]
        uniforms = torch.rand(len(kids), generator=generator, device=device).tolist()  # one per child, drawn up front
        for node, u in zip(kids, uniforms):
            x = tree.token_ids[node]
            if u < accept_probability(p, q, x):
                if node in pruned:
                    # its own row stopped early: x is the target's draw at this row, and the walk ends here
                    bonus = x
                    status[node] = REJECTED
                    break
                accepted = node
                status[node] = ACCEPTED
                break
            status[node] = REJECTED
            p = residual(p, q, x)  # the next sibling (or the bonus) now has to make up x's shortfall
        if bonus is not None:
            break
        if accepted is None:
            # all children rejected (or a leaf): the bonus comes from what is left of p
            bonus = sample(p, generator)
            break
        path.append(accepted)
        row = accepted + 1
    tokens = [tree.token_ids[node] for node in path] + [bonus]
    return AcceptResult(accepted_nodes=path, tokens=tokens, node_status=status)


def validate_child_dists(tree: TokenTree, children: dict[int, list[int]], vocab_size: int) -> None:
    """Each ``child_dists[row]`` must be a distribution its children could have been drawn from."""
    num_nodes = len(tree)
    supports: dict[int, set[int]] = {}  # id(dist) -> its support; rows may share one dist object
    for row, dist in tree.child_dists.items():
        if dist is None:
            continue
        if not (0 <= row <= num_nodes):
            raise InvalidTreeError(f"child_dists has row {row}; rows are 0 (root) .. {num_nodes}")
        if id(dist) not in supports:
            supports[id(dist)] = _support(dist, row, vocab_size)
        support = supports[id(dist)]
        for node in children[row]:
            if tree.token_ids[node] not in support:
                raise InvalidRequestError(
                    f"node {node} has token {tree.token_ids[node]}, which child_dists[{row}] gives "
                    f"probability 0, so it cannot have been sampled from it"
                )


def _support(dist: SparseDist, row: int, vocab_size: int) -> set[int]:
    """Tokens ``dist`` gives positive probability, after checking it is a distribution over the vocabulary."""
    token_ids = dist.token_ids.reshape(-1).tolist()
    probs = dist.probs.reshape(-1).tolist()
    if len(token_ids) != len(probs):
        raise InvalidRequestError(f"child_dists[{row}] has {len(token_ids)} token ids but {len(probs)} probabilities")
    if any(not (0 <= t < vocab_size) for t in token_ids):
        raise InvalidRequestError(f"child_dists[{row}] has a token id outside the vocabulary [0, {vocab_size})")
    if any(not (0.0 <= pr < math.inf) for pr in probs) or not sum(probs) > 0.0:
        raise InvalidRequestError(f"child_dists[{row}] must hold finite probabilities >= 0 with positive sum")
    return {t for t, pr in zip(token_ids, probs) if pr > 0.0}


def accept_chain(
    token_ids: Sequence[int],
    target_logits: torch.Tensor,
    params: SamplingParams,
    generator: torch.Generator | None = None,
    draft_dists: Sequence[SparseDist | None] | None = None,
) -> AcceptResult:
    """Leviathan et al.'s rejection sampling: a chain where token i was drawn from ``draft_dists[i]``.

    ``target_logits`` is ``[1 + k, vocab_size]``; ``draft_dists`` None (or a
    None entry) means the token was picked deterministically.
    """
    tree = TokenTree.chain(list(token_ids))
    if draft_dists is not None:
        if len(draft_dists) != len(token_ids):
            raise EngineError(f"{len(token_ids)} chain tokens but {len(draft_dists)} draft distributions")
        tree.child_dists = {i: dist for i, dist in enumerate(draft_dists) if dist is not None}
    return accept_tree(tree, target_logits, params, generator)


def accept_batch(
    trees: Sequence[TokenTree],
    logits_list: Sequence[torch.Tensor] | torch.Tensor,
    params_list: Sequence[SamplingParams],
    generators: Sequence[torch.Generator | None] | None = None,
) -> list[AcceptResult]:
    """``accept_tree`` for each request of a batch.

    ``logits_list`` is one ``[1 + num_nodes_i, vocab_size]`` tensor per tree,
    or all of them packed into one ``[sum_i (1 + num_nodes_i), vocab_size]``
    tensor in tree order (how the verify pass lays them out).
    """
    if isinstance(logits_list, torch.Tensor):
        rows = [1 + len(tree) for tree in trees]
        if logits_list.dim() != 2 or logits_list.shape[0] != sum(rows):
            raise EngineError(f"packed logits must have {sum(rows)} rows, got shape {list(logits_list.shape)}")
        logits_list = logits_list.split(rows)
    if generators is None:
        generators = [None] * len(trees)
    if not (len(trees) == len(logits_list) == len(params_list) == len(generators)):
        raise EngineError(
            f"batch sizes differ: {len(trees)} trees, {len(logits_list)} logits, "
            f"{len(params_list)} params, {len(generators)} generators"
        )
    return [
        accept_tree(tree, logits, params, generator)
        for tree, logits, params, generator in zip(trees, logits_list, params_list, generators)
    ]
