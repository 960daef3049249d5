"""Log-probabilities of the tokens the target emits, from the distribution each one was drawn from.

    processed logits [E, vocab] (one row per emitted token, logits_process.py)
      greedy:   log_softmax(row)                        the model's distribution after penalties and masks
      sampled:  log(probs_from_logits(row, params))     after temperature, top-k, top-p, min-p (-inf: cut)
      ──▶ the chosen token's value and the ``top`` largest, read back in one copy

Under speculation the rows are the target's verify rows at the accepted
positions (row 0 for the first emitted token, node j's row for the token
after node j), so a speculative and a plain run report the same numbers:
never the draft's. Prompt tokens (``prompt_logprobs``) use the model's own
distribution: log_softmax of the raw logits, temperature 1.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from shared.engine.sampling import probs_from_logits
from shared.engine.types import SamplingParams, TokenLogprobs


def logprob_rows(processed: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """[E, vocab] processed logits -> [E, vocab] log-probabilities of the distribution sampled from."""
    if params.greedy:
        return torch.log_softmax(processed.float(), dim=-1)
    return torch.log(probs_from_logits(processed, params))


def token_logprobs(logprobs: torch.Tensor, tokens: Sequence[int], top: int) -> list[TokenLogprobs]:
    """One ``TokenLogprobs`` per row of ``logprobs`` [E, vocab] for ``tokens`` [E], with ``top`` alternatives."""
    if not len(tokens):
        return []
    index = torch.tensor(list(tokens), dtype=torch.long, device=logprobs.device)[:, None]  # [E, 1]
    chosen = logprobs.gather(1, index)[:, 0]  # [E]
    top = min(top, logprobs.shape[-1])
    if top > 0:
        values, ids = logprobs.topk(top, dim=-1)  # [E, top] each
        packed = torch.cat([chosen[:, None], values, ids.float()], dim=1).cpu().tolist()  # one read
    else:
        packed = chosen[:, None].cpu().tolist()
    return [
        TokenLogprobs(int(t), row[0], tuple(int(i) for i in row[1 + top :]), tuple(row[1 : 1 + top]))
        for t, row in zip(tokens, packed)
    ]


def emitted_logprobs(processed: torch.Tensor, rows: Sequence[int], tokens: Sequence[int],
                     params: SamplingParams) -> list[TokenLogprobs]:  # fmt: skip
    """``tokens`` [E] emitted at ``rows`` [E] of ``processed`` [R, vocab]."""
    index = torch.tensor(list(rows), dtype=torch.long, device=processed.device)  # [E]
    return token_logprobs(logprob_rows(processed[index], params), tokens, params.logprobs or 0)


def prompt_logprobs(logits: torch.Tensor, prompt_ids: Sequence[int], top: int) -> list[TokenLogprobs]:
    """Prompt tokens 1 .. P-1 under ``logits`` [P - 1, vocab] (row t: the logits after prompt token t)."""
    return token_logprobs(torch.log_softmax(logits.float(), dim=-1), list(prompt_ids[1:]), top)
