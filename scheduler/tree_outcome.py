"""Checking a drafted tree's shape, and recording on a request what the target accepted of it and its log-probabilities."""

from __future__ import annotations

from scheduler.request import Request
from shared.engine.types import AcceptResult, PrefillResult, TokenTree


_CHAINS: dict[int, list[int]] = {}  # node count -> a chain's parent ids [-1, 0, 1, ...]


def is_chain(parent_ids) -> bool:
    """Whether the parent ids are a chain's (node i's parent is i - 1): what most steps draft. One list
    comparison in C, so the per-node loops below run only for real trees (and never on tensors)."""
    if type(parent_ids) is not list:
        return False
    n = len(parent_ids)
    chain = _CHAINS.get(n)
    if chain is None:
        chain = list(range(-1, n - 1))
        if n <= 256:
            _CHAINS[n] = chain
    return parent_ids == chain


def record_acceptance(req: Request, tree: TokenTree, res: AcceptResult) -> None:
    """Per-depth drafted/accepted counters and the step's totals (the policies read them)."""
    parents = tree.parent_ids
    if parents and is_chain(parents):
        max_depth = len(parents)
    else:
        depth: list[int] = []
        for p in parents:
            depth.append(0 if p == -1 else depth[p] + 1)
        max_depth = max(depth) + 1
    drafted, accepted = req.position_drafted, req.position_accepted
    for counts in (drafted, accepted):
        if len(counts) < max_depth:
            counts.extend([0] * (max_depth - len(counts)))
    for d in range(max_depth):
        drafted[d] += 1
    num_accepted = res.num_accepted
    for d in range(num_accepted):
        accepted[d] += 1
    req.accepted_lens.append(num_accepted)
    req.drafted_depths.append(max_depth)
    req.num_drafted_tokens += len(tree)
    req.num_accepted_tokens += num_accepted


def keep_logprobs(req: Request, res: AcceptResult | PrefillResult) -> None:
    """Before the result's tokens are committed: their log-probabilities go to ``req.output_logprobs`` at the
    same output indices (anything past the output left by an earlier stop or preemption is dropped first);
    a prefill's prompt log-probabilities are kept once (a request prefilled again reports its first ones)."""
    if req.sampling.prompt_logprobs is not None and req.prompt_logprobs is None and isinstance(res, PrefillResult):
        req.prompt_logprobs = list(res.prompt_logprobs or ())
    logprobs = res.logprobs if isinstance(res, AcceptResult) else ([res.logprobs] if res.logprobs else None)
    if logprobs:
        del req.output_logprobs[len(req.output_ids) :]
        req.output_logprobs.extend(logprobs)


def tree_ok(tree: TokenTree) -> bool:
    """Parents precede their children, one parent and (if any) one draft probability per node."""
    n = len(tree.token_ids)
    if len(tree.parent_ids) != n or (tree.draft_probs and len(tree.draft_probs) != n):
        return False
    return is_chain(tree.parent_ids) or all(-1 <= p < i for i, p in enumerate(tree.parent_ids))
