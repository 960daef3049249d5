"""Checking a drafted tree's shape, and recording on a request what the target accepted of it and its log-probabilities."""

from __future__ import annotations

from scheduler.request import Request
from shared.engine.types import AcceptResult, PrefillResult, TokenTree


def record_acceptance(req: Request, tree: TokenTree, res: AcceptResult) -> None:
    """Per-depth drafted/accepted counters and the step's totals (the policies read them)."""
    depth: list[int] = []
    for p in tree.parent_ids:
        depth.append(0 if p == -1 else depth[p] + 1)
    max_depth = max(depth) + 1
    for counts in (req.position_drafted, req.position_accepted):
        counts.extend([0] * (max_depth - len(counts)))
    for d in range(max_depth):
        req.position_drafted[d] += 1
    for d in range(res.num_accepted):
        req.position_accepted[d] += 1
    req.accepted_lens.append(res.num_accepted)
    req.drafted_depths.append(max_depth)
    req.num_drafted_tokens += len(tree)
    req.num_accepted_tokens += res.num_accepted


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
    return all(-1 <= p < i for i, p in enumerate(tree.parent_ids))
