"""Log-probabilities in OpenAI's two shapes, from the target's ``TokenLogprobs`` (common.proto).

    completions: {"tokens": [...], "token_logprobs": [...], "top_logprobs": [{text: lp}, ...], "text_offset": [...]}
                 (with echo, the prompt's tokens come first; the first prompt token has null values)
    chat:        {"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}]}]}

JSON has no -inf: a token the sampling filters removed reads -9999.0 (OpenAI's and vLLM's convention).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

FLOOR = -9999.0


def _value(x: float) -> float:
    return FLOOR if not math.isfinite(x) or x < FLOOR else x


class CompletionLogprobs:
    """Accumulates the completions shape over chunks (``add``), with text offsets from ``start``."""

    def __init__(self, text_of: Callable[[int], str], start: int = 0) -> None:
        self.text_of = text_of
        self.offset = start
        self.out: dict = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}

    def add_first(self, token_id: int) -> None:
        """The first prompt token, which nothing predicts."""
        self._token(token_id, None, None)

    def add(self, lps: Sequence) -> dict:
        """Append ``lps`` (TokenLogprobs messages); returns the shape of these alone (a stream chunk's)."""
        before = {k: len(v) for k, v in self.out.items()}
        for lp in lps:
            top = {}
            for tid, value in zip(lp.top_ids, lp.top_logprobs):
                top.setdefault(self.text_of(tid), _value(value))
            self._token(lp.token_id, _value(lp.logprob), top)
        return {k: v[before[k] :] for k, v in self.out.items()}

    def _token(self, token_id: int, logprob: float | None, top: dict | None) -> None:
        text = self.text_of(token_id)
        self.out["tokens"].append(text)
        self.out["token_logprobs"].append(logprob)
        self.out["top_logprobs"].append(top)
        self.out["text_offset"].append(self.offset)
        self.offset += len(text)


def chat_logprobs(lps: Sequence, text_of: Callable[[int], str], top: int) -> list[dict]:
    """The ``content`` list of chat logprobs for ``lps``, ``top`` alternatives each."""

    def entry(token_id: int, value: float) -> dict:
        text = text_of(token_id)
        return {"token": text, "logprob": _value(value), "bytes": list(text.encode("utf-8", "replace"))}

    out = []
    for lp in lps:
        item = entry(lp.token_id, lp.logprob)
        item["top_logprobs"] = [entry(t, v) for t, v in list(zip(lp.top_ids, lp.top_logprobs))[:top]]
        out.append(item)
    return out
