"""Output-length prediction, the L_i of LAPS-SD eq. 6 and the key of LP-SJF.

The paper predicts L_i with a fine-tuned LLM (Zheng et al. 2024); that is out
of scope here, so prediction is an interface with one simple implementation:

``ClassHistoryPredictor``: a request's *class* is the power-of-two bucket of
its prompt length (chat one-liners, code tasks and documents to summarise
land in different buckets). Per class it keeps an exponential moving average
of the share of ``max_new_tokens`` that finished requests actually generated
(a stop token ends many early). Prediction::

    L = max_new_tokens                          fewer than min_samples in the class
    L = clamp(share_ema · max_new_tokens,       otherwise
              generated so far + 1, max_new_tokens)

so it never predicts less than what a running request already produced, nor
more than it may produce. The history is a JSON-able dict (``state`` /
``load``), so a service can keep it in Redis across restarts; the predictor
itself does no I/O.
"""

from __future__ import annotations

import math
from typing import Any, Protocol

from scheduler.request import FinishReason, Request


class LengthPredictor(Protocol):
    def predict(self, req: Request) -> float:
        """Predicted total output tokens of ``req`` (generated so far included)."""
        ...

    def observe(self, req: Request) -> None:
        """Learn from a request that ended (only those that finished normally are informative)."""
        ...


class MaxTokensPredictor:
    """L = max_new_tokens: the bound every request states, no history."""

    def predict(self, req: Request) -> float:
        return float(req.max_new_tokens)

    def observe(self, req: Request) -> None:
        pass


class ClassHistoryPredictor:
    def __init__(self, smoothing: float = 0.2, min_samples: int = 2) -> None:
        if not 0 < smoothing <= 1 or min_samples < 1:
            raise ValueError("smoothing must be in (0, 1] and min_samples >= 1")
        self.smoothing = smoothing
        self.min_samples = min_samples
        self.history: dict[str, dict[str, float]] = {}  # class -> {"share": ema, "n": samples}

    @staticmethod
    def prompt_class(req: Request) -> str:
        return f"p{max(0, math.ceil(math.log2(max(1, len(req.prompt_ids)))))}"

    def predict(self, req: Request) -> float:
        h = self.history.get(self.prompt_class(req))
        if h is None or h["n"] < self.min_samples:
            return float(req.max_new_tokens)
        guess = h["share"] * req.max_new_tokens
        return float(min(req.max_new_tokens, max(guess, req.num_generated + 1)))

    def observe(self, req: Request) -> None:
        if req.finish_reason in (None, FinishReason.ABORTED, FinishReason.ERROR) or req.max_new_tokens < 1:
            return
        share = min(1.0, req.num_generated / req.max_new_tokens)
        h = self.history.setdefault(self.prompt_class(req), {"share": share, "n": 0})
        if h["n"] > 0:
            h["share"] += self.smoothing * (share - h["share"])
        h["n"] += 1

    def state(self) -> dict[str, Any]:
        return {"version": 1, "classes": {k: dict(v) for k, v in self.history.items()}}

    def load(self, state: dict[str, Any] | None) -> None:
        if state and state.get("version") == 1:
            self.history = {k: {"share": float(v["share"]), "n": float(v["n"])} for k, v in state["classes"].items()}
