"""Where a step's tokens stop a request: the first stop token, stop string or the length limit."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from scheduler.request import FinishReason, Request

Detokenize = Callable[[Sequence[int]], str]


def first_stop(req: Request, tokens: list[int], detokenize: Detokenize | None, window: int) -> tuple[int, FinishReason | None]:
    """How many of ``tokens`` to commit, and why the request stops after them (None: it goes on).

    Token by token: a stop token ends it, else a stop string completed (past ``min_tokens``), else the length
    limit; the stopping token is kept. Without stop strings no token needs decoding: one scan of the
    tokens that fit for a stop token."""
    index = len(req.output_ids)
    room = max(1, req.max_new_tokens - index)
    if not req.stop_strings:
        stops = req.stop_token_ids
        for j, tok in enumerate(tokens[:room] if stops else ()):
            if tok in stops:
                return j + 1, FinishReason.STOP_TOKEN
        return (room, FinishReason.LENGTH) if len(tokens) >= room else (len(tokens), None)
    longest = max(len(s) for s in req.stop_strings)
    out = req.output_ids
    try:
        for j, tok in enumerate(tokens):
            out.append(tok)  # the text so far, this token included; undone below
            if tok in req.stop_token_ids:
                return j + 1, FinishReason.STOP_TOKEN
            if len(out) > req.sampling.min_tokens and detokenize is not None:
                tail = detokenize(out[-(longest + window):])
                if any(s in tail for s in req.stop_strings):
                    return j + 1, FinishReason.STOP_STRING
            if len(out) >= req.max_new_tokens:
                return j + 1, FinishReason.LENGTH
        return len(tokens), None
    finally:
        del out[index:]
