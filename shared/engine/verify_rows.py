"""The target's decision for one sequence from its logits rows: process, accept, report log-probabilities.

    rows [1 + M, vocab]  ──logits_process──▶ processed ──accept_tree──▶ AcceptResult (path + bonus)
                                                  └──token_logprobs at the emitted rows──▶ result.logprobs

A grammar (grammar_mask.py) masks the rows before anything else. Both verify
paths (the eager forward in target_engine.py and the static step's sampled path) and the prefill's first token go through here, so the
distribution acceptance tests against, the one plain decoding samples from
and the one log-probabilities report are the same tensor.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq

import torch

from shared.engine.acceptance import accept_tree
from shared.engine.grammar_mask import constrain_tree
from shared.engine.logits_process import needs_processing, process_rows, row_paths
from shared.engine.sampling import probs_from_logits, sample
from shared.engine.sequence import Sequence
from shared.engine.token_logprobs import emitted_logprobs
from shared.engine.types import AcceptResult, TokenLogprobs, TokenTree


def plain(seq: Sequence) -> bool:
    """Greedy with nothing to process or report: the device-side greedy acceptance applies (static_step.py)."""
    params = seq.sampling
    return (params.greedy and params.logprobs is None and seq.grammar is None
            and not needs_processing(params, seq.logits_processors))


def sampled_only(seq: Sequence) -> bool:
    """Sampling (temperature, top-k, top-p, min-p) with nothing else to process or report: the device-side sampled
    acceptance applies (device_sampling.py)."""
    params = seq.sampling
    return params.logprobs is None and seq.grammar is None and not needs_processing(params, seq.logits_processors)


def _processed(seq: Sequence, tree: TokenTree, rows: torch.Tensor, paths: list[list[int]]) -> torch.Tensor:
    rows = constrain_tree(seq, tree, rows)  # grammar masks first: a disallowed token stays at -inf
    return process_rows(rows, seq.token_ids, seq.output_start, paths, seq.sampling, seq.logits_processors)


def verify_sequence(seq: Sequence, tree: TokenTree, rows: torch.Tensor, pruned: Seq[int] = ()) -> AcceptResult:
    """Accept ``tree`` against ``rows`` [1 + len(tree), vocab]; call before the tokens are committed."""
    processed = _processed(seq, tree, rows, row_paths(tree.token_ids, tree.parent_ids))  # [1 + M, vocab]
    result = accept_tree(tree, processed, seq.sampling, seq.generator, pruned=pruned)
    if seq.sampling.logprobs is not None:
        emit_rows = [0] + [node + 1 for node in result.accepted_nodes]  # the row each emitted token came from
        result.logprobs = emitted_logprobs(processed, emit_rows, result.tokens, seq.sampling)
    return result


def first_token(seq: Sequence, root: torch.Tensor) -> tuple[int, TokenLogprobs | None]:
    """The token after the prompt from its logits ``root`` [vocab], and its log-probabilities when asked for."""
    processed = _processed(seq, TokenTree(), root[None], [[]])  # [1, vocab]
    probs = probs_from_logits(processed, seq.sampling)[0]  # [vocab]
    token = int(probs.argmax()) if seq.sampling.greedy else sample(probs, seq.generator)
    if seq.sampling.logprobs is None:
        return token, None
    return token, emitted_logprobs(processed, [0], [token], seq.sampling)[0]
