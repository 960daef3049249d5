"""What the target's logits go through before sampling or acceptance, where that depends on the context.

    raw logits [R, vocab] (row r: after the committed tokens + the tree path to row r)
      ── min_tokens: stop ids -> -inf while the row's output index < min_tokens
      ── repetition penalty: tokens seen in prompt or output: logit / r (logit x r when negative)
      ── frequency / presence penalties: minus f x count and minus p x [count > 0], over the output
      ── each registered ``LogitsProcessor``, in order (e.g. a grammar's mask)
      ──▶ processed logits [R, vocab]; sampling.probs_from_logits then applies temperature, top-k, top-p, min-p

Every row of a tree is processed with its own context: the committed tokens
followed by the tree path from the root to that row (row 0 is the root, row
j + 1 tree node j). Acceptance then tests draft tokens against exactly the
distribution plain decoding would sample from after that path, which is
what keeps speculation lossless under these parameters. The draft is never
required to apply them: acceptance only needs the ``q`` it really sampled.

The hook for other constraints: a ``LogitsProcessor`` set on a target
``Sequence`` (``Sequence.logits_processors``) is called with the rows and
each row's ``RowContext``; it returns the rows to use (masked with -inf,
biased, ...), same shape. It must be a pure function of the context, as a
tree calls it for several hypothetical continuations at once.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from dataclasses import dataclass
from typing import Protocol

import torch

from shared.engine.types import SamplingParams


@dataclass(frozen=True)
class RowContext:
    """What precedes one logits row: the prompt, and the output so far including the row's tree path."""

    prompt_ids: Seq[int]
    output_ids: Seq[int]


class LogitsProcessor(Protocol):
    def __call__(self, logits: torch.Tensor, contexts: list[RowContext]) -> torch.Tensor:
        """``logits`` [R, vocab] float32, one ``RowContext`` per row -> processed logits [R, vocab]."""
        ...


def row_paths(token_ids: Seq[int], parent_ids: Seq[int]) -> list[list[int]]:
    """Per logits row of a tree, the tree tokens from the root to that row: row 0 [], row j + 1 path to node j."""
    paths: list[list[int]] = [[]]
    for token, parent in zip(token_ids, parent_ids):
        paths.append(paths[parent + 1] + [token])
    return paths


def needs_processing(params: SamplingParams, processors: Seq[LogitsProcessor] = ()) -> bool:
    return params.uses_context or bool(processors)


def process_rows(
    logits: torch.Tensor,
    committed: Seq[int],
    output_start: int,
    paths: list[list[int]],
    params: SamplingParams,
    processors: Seq[LogitsProcessor] = (),
) -> torch.Tensor:
    """Processed logits [R, vocab] for ``logits`` [R, vocab]; row r follows ``committed + paths[r]``.

    ``committed[output_start:]`` is the request's output so far (the rest its prompt)."""
    if not needs_processing(params, processors):
        return logits
    logits = logits.float().clone()  # [R, vocab]
    num_rows, vocab = logits.shape
    device = logits.device
    output = committed[output_start:]
    if params.min_tokens > 0 and params.stop_token_ids:
        held = [r for r, path in enumerate(paths) if len(output) + len(path) < params.min_tokens]
        stops = [t for t in params.stop_token_ids if 0 <= t < vocab]
        if held and stops:
            rows = torch.tensor(held, device=device)[:, None]  # [H, 1]
            logits[rows, torch.tensor(stops, device=device)[None, :]] = -torch.inf
    if params.repetition_penalty != 1.0 or params.frequency_penalty != 0.0 or params.presence_penalty != 0.0:
        counts = _output_counts(output, paths, vocab, device)  # [R, vocab]
        if params.repetition_penalty != 1.0:
            seen = counts > 0  # [R, vocab]
            prompt = torch.tensor(list(committed[:output_start]), dtype=torch.long, device=device)  # [P]
            seen[:, prompt] = True
            r = params.repetition_penalty
            penalised = torch.where(logits > 0, logits / r, logits * r)  # [R, vocab]
            logits = torch.where(seen, penalised, logits)
        if params.frequency_penalty != 0.0:
            logits -= params.frequency_penalty * counts
        if params.presence_penalty != 0.0:
            logits -= params.presence_penalty * (counts > 0).float()
    if processors:
        prompt_ids = committed[:output_start]
        contexts = [RowContext(prompt_ids, list(output) + path) for path in paths]
        for processor in processors:
            logits = processor(logits, contexts)
    return logits


def _output_counts(output: Seq[int], paths: list[list[int]], vocab: int, device: torch.device) -> torch.Tensor:
    """How often each token occurs in the output before each row: [R, vocab] float32."""
    base = torch.bincount(torch.tensor(list(output), dtype=torch.long), minlength=vocab)[:vocab].float()  # [vocab]
    counts = base.to(device)[None].repeat(len(paths), 1)  # [R, vocab]
    flat_rows = [r for r, path in enumerate(paths) for _ in path]
    if flat_rows:
        flat_tokens = [t for path in paths for t in path]
        index = torch.tensor(flat_rows, device=device) * vocab + torch.tensor(flat_tokens, device=device)  # [N]
        counts.view(-1).index_add_(0, index, torch.ones(len(flat_rows), device=device))
    return counts
